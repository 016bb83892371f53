"""torch's optimizer contract under zt.shard, at stages 0-3 on 2 and 3 ranks, against single-process
torch on the global batch (zt_gpt.reference): a torch AdamW with two parameter groups (no weight
decay on biases and norms), OneCycleLR moving every group's lr and betas at every step, an
auxiliary head that most steps leave unused (zero_grad(set_to_none=True): torch skips it), a
zero_grad between backward and step, gradient accumulation, and checkpoints that bring the
optimizer's hyperparameters, the scheduler and every tensor's step count back."""

import json

import pytest
import torch

import zt_gpt
from conftest import HERE

WORKER = str(HERE / "zt_optim_worker.py")
# fp32 against the unsharded run on the global batch: only the order of the reductions differs.
TOL = {"rtol": 1e-5, "atol": 1e-5}
STEPS = 8


def run(run_job, tmp_path, spec, world, phase="train", expect_ok=True):
    code, output = run_job(world, [WORKER, json.dumps(spec), str(tmp_path)], expect_ok=expect_ok)
    if not expect_ok:
        return code, output
    return [torch.load(tmp_path / f"{phase}-rank{r}.pt") for r in range(world)]


def assert_matches(results, reference, first=0):
    for res in results:
        who = f"rank {res['rank']} of {res['world']}"
        assert res["losses"] == pytest.approx(reference["losses"][first:], rel=TOL["rtol"],
                                              abs=TOL["atol"]), who
        # The scheduler's arithmetic is the same on both sides: equal, not close.
        assert res["lrs"] == reference["lrs"][first:], who
        assert res["beta1s"] == reference["beta1s"][first:], who
        assert res["state"].keys() == reference["state"].keys()
        for name, expected in reference["state"].items():
            torch.testing.assert_close(res["state"][name], expected, **TOL,
                                       msg=lambda m: f"{who} {name}: {m}")
        assert res["steps"] == reference["steps"], who


def spec_for(stage, **extra):
    return {"stage": stage, "total_steps": STEPS, **extra}


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_param_groups_scheduler_and_an_unused_head_train_as_torch(run_job, tmp_path, stage, world):
    # Step 4 drops its gradients between backward and step (set_to_none=True: nothing is
    # stepped); the aux head is used on steps 0, 3 and 6 only, so it has fewer steps than the
    # rest, which torch's per-parameter step counts show.
    spec = spec_for(stage, discard_at={"4": True})
    reference = zt_gpt.reference(spec)
    assert reference["steps"]["aux_head.weight"] == 3
    assert reference["steps"]["head.weight"] == STEPS - 1
    assert_matches(run(run_job, tmp_path, spec, world), reference)


@pytest.mark.parametrize("stage", [1, 3])
def test_torch_adam_with_param_groups_trains_as_torch(run_job, tmp_path, stage):
    # torch.optim.Adam: the weight decay is added to the gradient (L2), not decoupled; the
    # matrices' group has it, the biases' and norms' group has none and its own lr.
    spec = spec_for(stage, optimizer="adam", total_steps=5)
    assert_matches(run(run_job, tmp_path, spec, 2), zt_gpt.reference(spec))


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_head_some_ranks_use_is_stepped_and_one_no_rank_uses_is_not(run_job, tmp_path, stage,
                                                                     world):
    # On steps 0, 3 and 6 only rank 1's samples go through the aux head: the other ranks give it
    # no gradient (zeros in the mean over ranks, as DDP's find_unused_parameters), and at stage 3
    # only rank 1 gathers its unit. On the other steps no rank uses it: it is not stepped.
    local = 6 // world
    spec = spec_for(stage, aux_samples=[local, 2 * local])
    reference = zt_gpt.reference(spec)
    assert reference["steps"]["aux_head.weight"] == 3
    assert_matches(run(run_job, tmp_path, spec, world), reference)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_grad_without_set_to_none_steps_on_zeros(run_job, tmp_path, stage):
    # zero_grad(set_to_none=False) keeps torch's grads as zeros: the aux head, once used, steps
    # on zeros every step after (weight decay, moment decay), and step 5's discarded gradients
    # leave a step on zeros for every parameter; torch moves parameters only by their decay.
    spec = spec_for(stage, set_to_none=False, discard_at={"5": False},
                    scheduler_on="source")  # the scheduler built on the torch optimizer
    reference = zt_gpt.reference(spec)
    assert reference["steps"]["aux_head.weight"] == STEPS
    assert_matches(run(run_job, tmp_path, spec, 2), reference)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("reduction, divide", [("mean", False), ("sum", True)])
def test_accumulation_reduction_matches_the_loop_it_is_for(run_job, tmp_path, stage, reduction,
                                                          divide):
    # "mean" (zerod's default, DeepSpeed's): the loop does not divide its loss; "sum": it does,
    # as plain torch code does. Both equal torch's accumulation of loss / 2.
    spec = spec_for(stage, accumulation=2, accumulation_reduction=reduction, divide_loss=divide,
                    total_steps=5)
    results = run(run_job, tmp_path, spec, 2)
    assert_matches(results, zt_gpt.reference(spec))
    assert not any("gradient_accumulation_steps" in w for r in results for w in r["warnings"])


@pytest.mark.parametrize("stage", [0, 3])
@pytest.mark.parametrize("how", ["opt", "model", "source"])
def test_zero_grad_after_backward_discards_what_backward_gave(one_rank_job, stage, how):
    # The case: AdamW at lr 0.1, backward, zero_grad(), step. torch moves the parameters
    # by the weight decay alone (p * lr * wd), never by the discarded gradient.
    import zerod.torch as zt
    torch.manual_seed(0)
    plain = torch.nn.Linear(4, 3)
    mine = torch.nn.Linear(4, 3)
    mine.load_state_dict(plain.state_dict())
    x = torch.randn(5, 4)
    torch_opt = torch.optim.AdamW(plain.parameters(), lr=0.1)
    plain(x).pow(2).sum().backward()
    torch_opt.zero_grad(set_to_none=False)
    torch_opt.step()
    source = torch.optim.AdamW(mine.parameters(), lr=0.1)
    model, opt = zt.shard(mine, stage=stage, optimizer=source)
    model(x).pow(2).sum().backward()
    {"opt": opt, "model": model, "source": source}[how].zero_grad(set_to_none=False)
    opt.step()
    got = zt.full_state_dict(model)
    for name, expected in plain.state_dict().items():
        torch.testing.assert_close(got[name], expected, rtol=0, atol=1e-7)


def test_accumulation_without_a_reduction_warns_once(run_job, tmp_path):
    spec = spec_for(2, accumulation=2, total_steps=3, divide_loss=False)
    results = run(run_job, tmp_path, spec, 2)
    assert_matches(results, zt_gpt.reference(spec))
    for res in results:
        said = [w for w in res["warnings"] if "gradient_accumulation_steps=2" in w]
        assert len(said) == 1, res["warnings"]
        assert "accumulation_reduction='sum'" in said[0]


@pytest.fixture(scope="module")
def uninterrupted():
    return zt_gpt.reference(spec_for(0))


@pytest.mark.parametrize("save", ["zt", "torch"])
def test_a_first_run_with_a_checkpoint_mid_run_trains_as_torch(run_job, tmp_path, uninterrupted,
                                                               save):
    spec = spec_for(2, phase="first", k=3, save=save)
    assert_matches(run(run_job, tmp_path, spec, 2, phase="first"), uninterrupted)


@pytest.mark.parametrize("world, stage", [(2, 2), (3, 3), (2, 0), (3, 1)])
def test_zt_load_with_the_scheduler_resumes_as_the_uninterrupted_run(run_job, tmp_path,
                                                                      uninterrupted, world,
                                                                      stage):
    first = tmp_path / "first"
    first.mkdir()
    run(run_job, first, spec_for(2, phase="first", k=3, save="zt"), 2, phase="first")
    resumed = run(run_job, tmp_path, spec_for(stage, phase="resume", k=3, save="zt",
                                              ckpt=str(first), seed=55), world, phase="resume")
    assert all(r["loaded_step"] == 3 for r in resumed)
    assert_matches(resumed, uninterrupted, first=3)


@pytest.mark.parametrize("stage", [1, 3])
def test_optimizer_state_dict_resumes_at_the_same_world_and_stage(run_job, tmp_path,
                                                                  uninterrupted, stage):
    first = tmp_path / "first"
    first.mkdir()
    run(run_job, first, spec_for(stage, phase="first", k=3, save="torch"), 2, phase="first")
    resumed = run(run_job, tmp_path, spec_for(stage, phase="resume", k=3, save="torch",
                                              ckpt=str(first), seed=55), 2, phase="resume")
    assert_matches(resumed, uninterrupted, first=3)


def test_a_stage_that_differs_between_ranks_is_refused_at_join(run_job, tmp_path):
    code, output = run(run_job, tmp_path, spec_for(3, stages=[3, 2]), 2, expect_ok=False)
    assert code != 0
    assert ("asked for stage 2; rank 0 formed the job with stage 3" in output or
            "asked for stage 3; rank 1 formed the job with stage 2" in output), output[-3000:]


def test_a_learning_rate_that_differs_between_ranks_is_refused_at_join(run_job, tmp_path):
    code, output = run(run_job, tmp_path, spec_for(2, lr_override=[1e-3, 2e-3]), 2,
                       expect_ok=False)
    assert code != 0
    assert "asked for param_groups[0] 'lr=0.00" in output, output[-3000:]
    assert "every rank must give the same options" in output
