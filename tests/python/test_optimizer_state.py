"""What zt.save / zt.load and opt.state_dict() / load_state_dict() keep of the optimizer, in this
process as a job of one: a scheduler state that saves always loads (or the save names what it
cannot keep), parameter groups restored by their parameters and not by position, a checkpoint
treated as data (a tampered one is refused with a ZerodError and runs no code), and a shard
checked whole before anything changes."""

import base64
import os
import pickle

import pytest
import torch
import torch.nn as nn

import zerod.torch as zt
from zerod import ZerodError
from zerod._native import FAILED_PRECONDITION, INVALID_ARGUMENT
from zerod.torch import _training_state


def two_layers(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))


def sharded(stage, seed=0, weights_first=True):
    m = two_layers(seed)
    return zt.shard(m, stage=stage, optimizer=grouped(m, weights_first))


def grouped(model, weights_first=True):
    """nanoGPT's split: weight decay on the matrices, none on the biases, in either order."""
    weights = {"params": [p for p in model.parameters() if p.dim() == 2], "weight_decay": 0.1}
    biases = {"params": [p for p in model.parameters() if p.dim() == 1], "weight_decay": 0.0,
              "lr": 0.005}
    groups = [weights, biases] if weights_first else [biases, weights]
    return torch.optim.AdamW(groups, lr=0.01)


def train(model, opt, sched=None, steps=1):
    x = torch.linspace(-1, 1, 12).reshape(4, 3)
    for _ in range(steps):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if sched is not None:
            sched.step()


def new_job(monkeypatch, suffix):
    """Leaves this process's job and names a new one (a resumed run of the same script)."""
    zt.shutdown()
    monkeypatch.setenv("ZEROD_JOB", f"{os.environ['ZEROD_JOB']}-{suffix}")


def newest_step(root):
    """The newest step directory zt.save made under `root`: a new job loads another job's
    checkpoint only when its directory is named (docs/checkpoints.md)."""
    return sorted(root.glob("step-*"))[-1]


def sequential(opt):
    # torch 1.13's OneCycleLR keeps its annealing function as a bound method in its state dict,
    # here nested in SequentialLR's: pickled as it is, it would drag the optimizer and the model
    # into the checkpoint, which then would not load as data.
    return torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=2),
        torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.02, 0.01], total_steps=8)],
        milestones=[2])


# ---- M1: what zt.save writes, zt.load reads ---------------------------------------------------

def test_a_nested_scheduler_state_saves_and_loads_back(one_rank_job, monkeypatch, tmp_path):
    torch_model = two_layers()
    torch_opt = grouped(torch_model)
    torch_sched = sequential(torch_opt)
    train(torch_model, torch_opt, torch_sched, steps=5)  # the uninterrupted run, plain torch
    model, opt = sharded(1)
    sched = sequential(opt)
    train(model, opt, sched, steps=3)
    zt.save(tmp_path, scheduler=sched)
    new_job(monkeypatch, "resumed")
    model, opt = sharded(2, seed=1)
    sched = sequential(opt)
    assert zt.load(newest_step(tmp_path), scheduler=sched).step == 3
    assert sched.last_epoch == 3 and sched._schedulers[1].last_epoch == 1
    train(model, opt, sched, steps=2)
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in torch_opt.param_groups]
    got = zt.full_state_dict(model)
    for name, value in torch_model.state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6)


class _Ramp:
    """Not plain data: a checkpoint keeps no instances of the user's classes."""

    def __init__(self, length):
        self.length = length


class _Warmup:
    """A callable object as a LambdaLR's lambda: torch saves its __dict__."""

    def __init__(self):
        self.ramp = _Ramp(4)

    def __call__(self, step):
        return min(1.0, (step + 1) / self.ramp.length)


def test_a_scheduler_state_that_is_not_data_fails_the_save_naming_it(one_rank_job, tmp_path):
    model, opt = zt.shard(two_layers(), stage=1, lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _Warmup())
    train(model, opt, sched)
    with pytest.raises(ZerodError, match=r"zt.save: scheduler\['lr_lambdas'\]\[0\]\['ramp'\] is "
                                         r"a test_optimizer_state._Ramp") as raised:
        zt.save(tmp_path, scheduler=sched)
    assert raised.value.code == INVALID_ARGUMENT
    assert not any(tmp_path.iterdir())  # nothing written
    zt.save(tmp_path)  # without the scheduler it saves


# ---- M2: groups are restored by their parameters ----------------------------------------------

def test_zt_load_refuses_groups_built_in_another_order(one_rank_job, monkeypatch, tmp_path):
    model, opt = sharded(1)
    train(model, opt)
    zt.save(tmp_path)
    new_job(monkeypatch, "reordered")
    model, opt = sharded(1, weights_first=False)
    before = [dict(g, params=None) for g in opt.param_groups]
    with pytest.raises(ZerodError, match=r"zt.load: .* was saved with '0.weight' in "
                                         r"param_groups\[0\]; this optimizer has it in "
                                         r"param_groups\[1\]") as raised:
        zt.load(newest_step(tmp_path))
    assert raised.value.code == FAILED_PRECONDITION
    assert [dict(g, params=None) for g in opt.param_groups] == before


def test_zt_load_refuses_a_parameter_moved_out_of_every_group(one_rank_job, monkeypatch,
                                                                tmp_path):
    model, opt = sharded(1)
    zt.save(tmp_path)
    new_job(monkeypatch, "fewer")
    m = two_layers()
    model, opt = zt.shard(m, stage=1, optimizer=torch.optim.AdamW(
        [{"params": [m[0].weight, m[1].weight]}, {"params": [m[0].bias]}]))
    with pytest.raises(ZerodError, match=r"was saved with '1.bias' in param_groups\[1\]; this "
                                         "optimizer has it in no group"):
        zt.load(newest_step(tmp_path))


def test_zt_load_keeps_the_parameters_of_each_group(one_rank_job, monkeypatch, tmp_path):
    # A checkpoint whose saved groups carry "params" (hand-edited, or tampered) restores the
    # hyperparameters only: a group's parameters are the optimizer's own.
    model, opt = sharded(1)

    def with_params(optimizer, scheduler):  # failure injection: a hand-made checkpoint
        state = _training_state.state_of(optimizer, scheduler)
        state["param_groups"][0]["params"] = [0, 1, 2, 3]
        state["param_groups"][0]["lr"] = 0.125
        return {"optimizer": _training_state.encode(state, "zt.save")}

    with monkeypatch.context() as patch:
        patch.setattr(_training_state, "training_state", with_params)
        zt.save(tmp_path)
    params = [list(g["params"]) for g in opt.param_groups]
    zt.load(tmp_path)
    assert opt.param_groups[0]["lr"] == 0.125
    assert [g["params"] for g in opt.param_groups] == params


# ---- M3: a checkpoint is data --------------------------------------------------------------------

class _Reduce:
    """Pickles as a call of fn(*args) when unpickled: what a tampered checkpoint would hold."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _deep(depth):
    """Pickle bytes of a list nested `depth` deep, made without recursion."""
    return b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."


def _tag(dtype, shape, values):
    return (_training_state.TENSOR_TAG, dtype, shape, values)


@pytest.mark.parametrize("payload, message", [
    (lambda marker: pickle.dumps({"param_groups": _Reduce(os.system, f"touch {marker}")}),
     r"(posix|os).system is not plain data"),
    (lambda marker: pickle.dumps({"param_groups": _Reduce(getattr, "x", "upper")}),
     r"builtins.getattr is not plain data"),
    (lambda marker: pickle.dumps({"scheduler": {"x": _tag("Tensor", [1], [1.0])}}),
     r"unknown dtype 'Tensor'"),
    (lambda marker: pickle.dumps({"scheduler": {"x": _tag("float32", [2, 3], [1.0])}}),
     r"shape \[2, 3\], which holds 6 values, not 1"),
    (lambda marker: pickle.dumps({"scheduler": {"x": _tag("float32", [-1], [1.0])}}),
     r"shape \[-1\]"),
    (lambda marker: pickle.dumps({"scheduler": {"x": _tag("float32", [1], ["a"])}}),
     r"does not load as data"),
    (lambda marker: _deep(100000), r"nested deeper than \d+ levels"),
    (lambda marker: pickle.dumps(["not", "a", "dict"]), r"holds a list, not a dict"),
    (lambda marker: pickle.dumps({"param_groups": [{"lr": "high"}, {}]}),
     r"param_groups\[0\]\['lr'\] = 'high' is not a finite number"),
    (lambda marker: b"\x80\x04garbage", r"does not load as data"),
])
def test_a_tampered_checkpoint_is_refused_and_runs_nothing(one_rank_job, monkeypatch, tmp_path,
                                                           payload, message):
    model, opt = sharded(1)
    marker = tmp_path / "ran"
    text = base64.b64encode(payload(marker)).decode("ascii")
    with monkeypatch.context() as patch:  # failure injection: the tampering
        patch.setattr(_training_state, "training_state",
                      lambda optimizer, scheduler: {"optimizer": text})
        zt.save(tmp_path / "ckpt")
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5)
    groups = [dict(g) for g in opt.param_groups]
    with pytest.raises(ZerodError, match=message) as raised:
        zt.load(tmp_path / "ckpt", scheduler=sched)
    assert raised.value.code == FAILED_PRECONDITION
    assert "zt.load:" in str(raised.value)
    assert not marker.exists()
    assert [dict(g) for g in opt.param_groups] == groups
    assert sched.last_epoch == 0


def test_zt_load_with_a_scheduler_needs_one_saved(one_rank_job, tmp_path):
    model, opt = zt.shard(two_layers(), stage=1, lr=0.01)
    zt.save(tmp_path)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5)
    with pytest.raises(ZerodError, match="holds no scheduler state"):
        zt.load(tmp_path, scheduler=sched)


def test_tensors_in_a_scheduler_state_come_back_as_saved(one_rank_job, tmp_path):
    model, opt = zt.shard(two_layers(), stage=1, lr=0.01)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5)
    sched.extra = {"table": torch.arange(6, dtype=torch.int64).reshape(2, 3),
                   "half": torch.tensor([0.5], dtype=torch.bfloat16)}
    zt.save(tmp_path, scheduler=sched)
    sched.extra = None
    zt.load(tmp_path, scheduler=sched)
    assert torch.equal(sched.extra["table"], torch.arange(6).reshape(2, 3))
    assert sched.extra["half"].dtype == torch.bfloat16


# ---- M4: opt.load_state_dict checks everything before it changes anything --------------------

def _snapshot(opt):
    state = opt.state_dict()
    return [dict(g) for g in opt.param_groups], state["state"]["zerod"]


def _unchanged(opt, before):
    groups, shard = _snapshot(opt)
    assert groups == before[0]
    for name in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(shard[name], before[1][name]), name
    assert shard["counters"] == before[1]["counters"]


def _bad_shards(shard):
    steps = shard["counters"]["tensor_steps"]
    return [
        (dict(shard, format=2), r"format 2; this zerod reads format 1"),
        (dict(shard, dtype="bf16"), r"saved in bf16 training; this job trains in fp32"),
        (dict(shard, tensors=list(reversed(shard["tensors"]))),
         r"tensor 0 is '1.bias' in the shard; this model's is '0.weight'"),
        (dict(shard, shapes=[[9, 1]] + shard["shapes"][1:]),
         r"'0.weight' has shape \[9, 1\] in the shard; this model's is \[3, 3\]"),
        (dict(shard, runs=[(0, 6)]), r"the shard holds elements \[0, 6\) of the model; this "
                                     r"rank holds \[0, 24\): it was saved by another model"),
        ({k: v for k, v in shard.items() if k != "exp_avg_sq"}, r"holds no 'exp_avg_sq'"),
        (dict(shard, exp_avg=shard["exp_avg"][:5]), r"'exp_avg' has 5 elements; this rank "
                                                    "holds 24"),
        (dict(shard, counters=dict(shard["counters"], tensor_steps=steps + [1])),
         r"counters: tensor_steps has 5 entries for 4 tensors"),
        (dict(shard, counters=dict(shard["counters"], tensor_steps=[99] * len(steps))),
         r"counters: tensor_steps\[0\] = 99 is outside \[0, 1\]"),
        (dict(shard, counters={}), r"counters: 'applied_steps' is missing"),
        (dict(shard, param_names=[["0.weight"], ["1.weight", "0.bias", "1.bias"]]),
         r"the shard has '1.weight' in param_groups\[1\]; this optimizer has it in "
         r"param_groups\[0\]"),
    ]


def test_load_state_dict_refuses_another_shard_changing_nothing(one_rank_job):
    model, opt = sharded(1)
    train(model, opt)
    saved = opt.state_dict()
    shard = saved["state"]["zerod"]
    saved["param_groups"][0]["lr"] = 0.5  # would change, if the shard loaded
    train(model, opt)
    before = _snapshot(opt)
    for bad, message in _bad_shards(shard):
        with pytest.raises(ZerodError, match=message):
            opt.load_state_dict({"state": {"zerod": bad}, "param_groups": saved["param_groups"]})
        _unchanged(opt, before)
    message = str(pytest.raises(ZerodError, opt.load_state_dict,
                                {"state": {"zerod": dict(shard, runs=[(0, 6)])},
                                 "param_groups": saved["param_groups"]}).value)
    assert "rank 0 of 1" not in message  # the same on both sides: not the problem
    broken = [dict(saved["param_groups"][0], lr="high"), saved["param_groups"][1]]
    with pytest.raises(ZerodError, match=r"param_groups\[0\]\['lr'\] = 'high'"):
        opt.load_state_dict({"state": {"zerod": shard}, "param_groups": broken})
    _unchanged(opt, before)
    no_params = [{"lr": 0.1}, saved["param_groups"][1]]
    with pytest.raises(ZerodError, match=r"param_groups\[0\] is not a dict with 'params'"):
        opt.load_state_dict({"state": {"zerod": shard}, "param_groups": no_params})
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["lr"] == 0.5


def test_load_state_dict_refuses_groups_built_in_another_order(one_rank_job, monkeypatch):
    model, opt = sharded(1)
    train(model, opt)
    saved = opt.state_dict()
    new_job(monkeypatch, "reordered")
    model, opt = sharded(1, weights_first=False)
    before = _snapshot(opt)
    with pytest.raises(ZerodError, match=r"the shard has '0.weight' in param_groups\[0\]; this "
                                         r"optimizer has it in param_groups\[1\]"):
        opt.load_state_dict(saved)
    _unchanged(opt, before)
