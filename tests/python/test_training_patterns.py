"""The training loops people write, at every stage on 2-3 ranks against single-process torch on
the global batch (zt_reference.py; zt_pattern_models.py has the modules): activation
checkpointing over several blocks, reentrant and not; a GPT whose embedding and tied head sit
outside its checkpointed blocks; a block called twice beside a tied head and a frozen layer; a
penalty on the weights inside zt.gathered; a branch that only some ranks take, between buckets.
Each failed before at stage 3 (no gather buffer left), at every stage (a reentrant checkpoint's
backward counted as a second one) or at stages 2-3 (the ranks' reduce-scatters diverged). And a
rank that raises in backward exits, at every stage, so that zerorun returns."""

import json
import time

import pytest

import zt_reference
from conftest import HERE
from test_equivalence import assert_matches, train

WORKER = str(HERE / "zt_worker.py")
# fp32: only the order of the gradient reduction differs from the reference.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
PATTERNS = {
    "checkpoint": {"model": "ckpt"},
    "reentrant checkpoint": {"model": "ckpt_reentrant"},
    "gpt checkpointed": {"model": "gpt"},
    "gpt reentrant": {"model": "gpt_reentrant"},
    "block twice tied frozen": {"model": "reused_tied_frozen"},
    "penalty in zt.gathered": {"model": "mlp4", "penalty": 0.01},
    # Buckets of about one layer each: the branch's own bucket sits between the others.
    "branch on some ranks": {"model": "branch", "shard": {"bucket_cap_mb": 0.001}},
}


def check(run_job, tmp_path, pattern, stage, world):
    spec = {**PATTERNS[pattern], "stage": stage, "steps": 3}
    results = train(run_job, tmp_path, spec, world)
    assert_matches(results, zt_reference.run(spec, world), **TOLERANCE)
    return results


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern_trains_as_torch_on_two_ranks(run_job, tmp_path, pattern, stage):
    check(run_job, tmp_path, pattern, stage, 2)


@pytest.mark.parametrize("pattern, stage", [
    ("gpt checkpointed", 3), ("checkpoint", 3), ("reentrant checkpoint", 2),
    ("branch on some ranks", 2), ("branch on some ranks", 3), ("block twice tied frozen", 3)])
def test_pattern_trains_as_torch_on_three_ranks(run_job, tmp_path, pattern, stage):
    check(run_job, tmp_path, pattern, stage, 3)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("fail, message", [
    ("two_backwards", "backward number 2 before opt.step()"),
    ("user_hook", "a hook of the user's failed in backward")])
def test_a_rank_that_raises_in_backward_exits(run_job, tmp_path, stage, fail, message):
    # The error leaves torch's tasks of that backward behind; freeing them at exit used to wait
    # for the GIL forever, so the rank never exited and zerorun never returned (run_job's
    # timeout would fail the test).
    spec = {"model": "nested", "stage": stage, "steps": 3, "fail": fail}
    code, output = run_job(2, [WORKER, json.dumps(spec), str(tmp_path)], expect_ok=False,
                           timeout=120)
    assert code != 0
    assert message in output


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_collective_some_ranks_skip_is_named_within_seconds(run_job, tmp_path, stage):
    # The last rank calls zt.average once more than the others: at every stage the next
    # collective the ranks disagree on is named at once, long before the 120 s collective timeout
    # (stage 3 used to wait for it, its gathers on a communicator of their own).
    spec = {"model": "nested", "stage": stage, "steps": 3, "fail": "extra_collective"}
    start = time.monotonic()
    code, output = run_job(2, [WORKER, json.dumps(spec), str(tmp_path)], expect_ok=False,
                           timeout=100)
    assert code != 0
    assert "collective mismatch" in output or "collective order diverged" in output, output
    assert time.monotonic() - start < 60


def test_default_units_are_the_repeated_blocks():
    # A block (a module repeated in a ModuleList or Sequential, holding modules with parameters)
    # is one unit; outside blocks every module with parameters is; a tied weight goes to the
    # innermost module enclosing its owners.
    from zerod.torch import _layout
    import torchvision
    import zt_models

    def units(model):
        return sorted({e.unit for e in _layout.collect(model)[0]})

    assert units(zt_models.build("gpt", 0)) == ["", "blocks.0", "blocks.1", "blocks.2", "ln_f",
                                                "wpe"]
    resnet = units(torchvision.models.resnet18())
    assert [u for u in resnet if u.startswith("layer1")] == ["layer1.0", "layer1.1"]
    assert "conv1" in resnet and "fc" in resnet and "layer1.0.conv1" not in resnet
    # Repeated leaf layers (a plain MLP) are units one by one, as before.
    assert units(zt_models.build("mlp4", 0)) == ["layers.0", "layers.2", "layers.4", "layers.6"]
