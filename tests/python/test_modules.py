"""Modules zerod did not write: tied weights, frozen parameters, buffers, a module used twice, a
parameter the forward never reaches, a parameter used outside its owner's forward. Each is
trained at stages 2 and 3 on 2 ranks and compared with the unsharded reference."""

import json

import pytest
import torch

import zt_reference
from conftest import HERE
from test_equivalence import assert_matches, train

WORKER = str(HERE / "zt_worker.py")


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("model", ["tied", "frozen", "reused", "batchnorm"])
def test_module_equals_unsharded(run_job, tmp_path, model, stage):
    spec = {"model": model, "stage": stage, "steps": 3}
    results = train(run_job, tmp_path, spec, 2)
    reference = zt_reference.run(spec, 2)
    assert_matches(results, reference)
    if model == "batchnorm":
        # Running statistics stay per rank: each equals its own rank's replica, and the ranks
        # differ (they saw different data).
        for res in results:
            for name, value in reference["buffers"][res["rank"]].items():
                torch.testing.assert_close(res["buffers"][name], value.float())
        assert not torch.equal(results[0]["buffers"]["bn.running_mean"],
                               results[1]["buffers"]["bn.running_mean"])


def test_tied_weight_is_one_tensor_in_the_layout(run_job, tmp_path):
    spec = {"model": "tied", "stage": 3, "steps": 1}
    results = train(run_job, tmp_path, spec, 2)
    state = results[0]["state"]
    # Both names are in the state dict (as model.state_dict() has them), with one value.
    assert torch.equal(state["wte.weight"], state["head.weight"])
    # Stored once: the plan's parameters are the unique tensors only.
    unique = sum(p.numel() for p in zt_reference.zt_models.build("tied", 0).parameters())
    assert results[0]["stats"]["planned_memory"]["params"] <= unique * 4


def test_frozen_parameters_are_not_trained_and_follow_rank_0(run_job, tmp_path):
    spec = {"model": "frozen", "stage": 3, "steps": 2}
    results = train(run_job, tmp_path, spec, 2)
    initial = zt_reference.zt_models.build("frozen", 0)
    for res in results:
        torch.testing.assert_close(res["state"]["frozen.weight"], initial.frozen.weight,
                                   rtol=0, atol=0)


def test_parameter_used_outside_its_unit_is_named(run_job, tmp_path):
    spec = {"model": "outside", "stage": 3, "steps": 1}
    code, output = run_job(2, [WORKER, json.dumps(spec), str(tmp_path)], expect_ok=False)
    assert code != 0
    assert "parameter 'emb.weight' is used (by linear) outside the forward of its gather unit " \
           "'emb'" in output
    assert "units=" in output


@pytest.mark.parametrize("stage", [1, 3])
def test_parameter_used_outside_its_owner_trains_with_units(run_job, tmp_path, stage):
    # units={Linear}: the embedding is no unit of its own, its weight belongs to the root's unit,
    # which encloses the root's forward. Below stage 3 nothing needs gathering.
    spec = {"model": "outside", "stage": stage, "steps": 3, "units": ["Linear"]}
    assert_matches(train(run_job, tmp_path, spec, 2), zt_reference.run(spec, 2))


@pytest.mark.parametrize("stage", [0, 3])
def test_accumulation_and_clipping(run_job, tmp_path, stage):
    spec = {"model": "nested", "stage": stage, "steps": 3, "max_grad_norm": 0.05,
            "shard": {"gradient_accumulation_steps": 2}}
    assert_matches(train(run_job, tmp_path, spec, 2), zt_reference.run(spec, 2))


def test_buffers_of_every_dtype_come_from_rank_0(run_job, tmp_path):
    spec = {"model": "buffers", "stage": 3, "steps": 2}
    results = train(run_job, tmp_path, spec, 2)
    initial = zt_reference.zt_models.build("buffers", 0)  # rank 0's module
    for res in results:
        for name in ("perm", "table"):
            got, want = res["raw_buffers"][name], getattr(initial, name)
            assert got.dtype == want.dtype and torch.equal(got, want), (res["rank"], name)
    assert_matches(results, zt_reference.run(spec, 2))


@pytest.mark.parametrize("stage", [0, 3])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_head_used_on_some_steps_follows_zero_grad(run_job, tmp_path, stage, set_to_none):
    # The extra head is used on steps 0 and 3 only. With set_to_none=True torch skips it on the
    # other steps (no moment decay, no weight decay); with False it steps on zeros. The
    # reference follows the same zero_grad, whatever torch's default is (True from torch 2.0).
    spec = {"model": "sometimes", "stage": stage, "steps": 5, "weight_decay": 0.1,
            "set_to_none": set_to_none}
    reference = zt_reference.run(spec, 2)
    other = zt_reference.run(dict(spec, set_to_none=not set_to_none), 2)
    assert not torch.equal(reference["states"][0]["extra.weight"],
                           other["states"][0]["extra.weight"])  # the two differ: a real check
    assert_matches(train(run_job, tmp_path, spec, 2), reference)
