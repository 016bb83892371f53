"""How torch users use their modules, at stage 3 where zerod changes the most, in this process as a
job of one, each against torch.optim.AdamW on a copy of the module: activation checkpointing, a
container whose own forward never runs, attention, weight_norm, torch.autograd.grad, state dicts,
in-place changes, learning-rate schedules, and tensors that outlive zt.shutdown."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import zerod.torch as zt
from zerod import ZerodError

LR = 1e-2


def data(step, batch=4, width=6):
    g = torch.Generator().manual_seed(step)
    return torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)


def compare(make, loss_of, stage=3, steps=3, **kwargs):
    """Trains make() under zerod and another make() under torch.optim.AdamW (the same seed, so
    the same initial values); the largest difference of the parameters after `steps` steps."""
    torch.manual_seed(0)
    module = make()
    torch.manual_seed(0)
    reference = make()
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=LR, weight_decay=0.0)
    model, opt = zt.shard(module, stage=stage, lr=LR, weight_decay=0.0, **kwargs)
    for step in range(steps):
        for m, o in ((model, opt), (reference, opt_ref)):
            o.zero_grad()
            loss_of(m, *data(step)).backward()
            o.step()
    full = zt.full_state_dict(model)
    diffs = {k: (full[k] - v).abs().max().item() for k, v in reference.state_dict().items()
             if v.is_floating_point()}
    return max(diffs.values())


class Body(nn.Module):
    def __init__(self, width=6, layers=3):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.body = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width),
                                                                        nn.Tanh())])
        self.out = nn.Linear(width, width)


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_over_several_units(one_rank_job, reentrant):
    def loss(m, x, y):
        h = m.inp(x)
        h = checkpoint(m.body, h, use_reentrant=reentrant)
        return F.mse_loss(m.out(h), y)

    assert compare(Body, loss) < 1e-6


def test_a_container_whose_forward_never_runs(one_rank_job):
    def make():
        return nn.ModuleDict({"enc": nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6)),
                              "head": nn.Linear(6, 6)})

    assert compare(make, lambda m, x, y: F.mse_loss(m["head"](m["enc"](x)), y)) < 1e-6


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        # No biases: the key bias's gradient is zero up to rounding (softmax ignores a constant
        # added to every key), which Adam magnifies into steps of arbitrary sign.
        self.attn = nn.MultiheadAttention(6, 2, bias=False, batch_first=True)
        self.out = nn.Linear(6, 6)

    def forward(self, x):
        h, _ = self.attn(x, x, x)
        return self.out(h)


def test_multihead_attention_is_one_unit_by_default(one_rank_job):
    # Its forward reads out_proj.weight without calling out_proj.
    assert compare(Attention, lambda m, x, y: F.mse_loss(m(x.unsqueeze(0)), y.unsqueeze(0))) \
        < 1e-6


def test_weight_norm(one_rank_job):
    # weight_norm's pre-hook computes the weight from weight_g and weight_v: they are gathered
    # first.
    def make():
        return nn.Sequential(nn.utils.weight_norm(nn.Linear(6, 6)), nn.Tanh(), nn.Linear(6, 6))

    assert compare(make, lambda m, x, y: F.mse_loss(m(x), y)) < 1e-6


def test_autograd_grad_is_not_a_training_backward(one_rank_job):
    # An input gradient (saliency, a gradient penalty) is computed alongside training.
    def loss(m, x, y):
        x = x.clone().requires_grad_(True)
        (saliency,) = torch.autograd.grad(m(x).sum(), x)
        return F.mse_loss(m(x + 0.01 * saliency), y)

    assert compare(lambda: nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6)), loss) \
        < 1e-6


def net():
    torch.manual_seed(6)
    return nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6))


def test_state_dict_at_stage_3_says_to_gather(one_rank_job):
    model, _ = zt.shard(net(), stage=3)
    for state_dict in (model.state_dict, lambda: model.state_dict(keep_vars=True),
                       model[0].state_dict):
        with pytest.raises(ZerodError, match=r"model.state_dict\(\) at stage 3 would copy "
                           r"placeholders.*zt.full_state_dict\(model\) gives the full state"):
            state_dict()
    with pytest.raises(ZerodError, match=r"zt.load_state_dict\(model, state_dict\)"):
        model.load_state_dict(net().state_dict())


@pytest.mark.parametrize("stage, dtype", [(3, "fp32"), (1, "bf16")])
def test_load_state_dict_sets_the_master(one_rank_job, stage, dtype):
    target = net()
    with torch.no_grad():
        for p in target.parameters():
            p.mul_(3.0)
    model, opt = zt.shard(net(), stage=stage, dtype=dtype, lr=0.0)
    zt.load_state_dict(model, target.state_dict())
    x, y = data(0)
    F.mse_loss(model(x).float(), y).backward()
    opt.step()  # lr 0: the loaded values stay (the fp32 master holds them, not a 16-bit copy)
    full = zt.full_state_dict(model)
    for name, value in target.state_dict().items():
        torch.testing.assert_close(full[name], value, rtol=0, atol=0)


@pytest.mark.parametrize("stage, dtype, message", [
    # Stage 3: the parameter is released, so the change itself is refused; 16 bits: at the step.
    (3, "fp32", r"parameter '0.weight' is used \(by clamp_\) outside model\(...\)"),
    (2, "bf16", "parameter '0.weight' was changed in place")])
def test_in_place_changes_that_would_be_lost_are_refused(one_rank_job, stage, dtype, message):
    model, opt = zt.shard(net(), stage=stage, dtype=dtype)
    x, y = data(0)
    F.mse_loss(model(x).float(), y).backward()
    opt.step()
    with pytest.raises(ZerodError, match=message):
        with torch.no_grad():
            model[0].weight.clamp_(-0.05, 0.05)
        F.mse_loss(model(x).float(), y).backward()
        opt.step()


def test_in_place_changes_to_a_gathered_unit_in_its_forward_are_refused(one_rank_job):
    # Inside the unit's forward the parameter holds the gathered copy: the change is noticed
    # when the unit is released.
    model, opt = zt.shard(net(), stage=3)

    def clamp(module, inputs):
        with torch.no_grad():
            module.weight.clamp_(-0.05, 0.05)
    model[0].register_forward_pre_hook(clamp)
    with pytest.raises(ZerodError, match="parameter '0.weight' was changed in place while its "
                                         "unit was gathered"):
        model(data(0)[0])


def test_in_place_changes_in_fp32_below_stage_3_are_kept(one_rank_job):
    model, opt = zt.shard(net(), stage=1)
    with torch.no_grad():
        model[0].weight.clamp_(-0.05, 0.05)
    assert zt.full_state_dict(model)["0.weight"].abs().max() <= 0.05


@pytest.mark.parametrize("lr", [-1e-3, float("nan"), float("inf")])
def test_a_schedule_that_leaves_the_range_is_refused(one_rank_job, lr):
    model, opt = zt.shard(net(), stage=2)
    x, y = data(0)
    F.mse_loss(model(x), y).backward()
    opt.param_groups[0]["lr"] = lr
    with pytest.raises(ZerodError, match="is not a finite number >= 0"):
        opt.step()


def test_lr_scheduler_drives_the_learning_rate(one_rank_job):
    model, opt = zt.shard(net(), stage=1, lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 if step == 0 else 0.0)
    x, y = data(0)
    F.mse_loss(model(x), y).backward()
    before = zt.full_state_dict(model)
    opt.step()
    schedule.step()
    F.mse_loss(model(x), y).backward()
    opt.step()  # lr 0 now
    F.mse_loss(model(x), y).backward()
    after_first = zt.full_state_dict(model)
    assert any((after_first[k] - v).abs().max() > 0 for k, v in before.items())
    opt.step()
    assert all(torch.equal(zt.full_state_dict(model)[k], v) for k, v in after_first.items())


def test_views_of_zerod_memory_outlive_shutdown(one_rank_job):
    # A state_dict taken while sharded aliases zerod's memory (stages 0-2): it stays readable
    # after zt.shutdown, which frees the memory only when the last such view goes.
    model, _ = zt.shard(nn.Linear(256, 256), stage=2)
    kept = model.state_dict()
    expected = kept["weight"].clone()
    zt.shutdown()
    scratch = [torch.full((256, 256), 7.0) for _ in range(64)]  # reuse freed memory, if any
    torch.testing.assert_close(kept["weight"], expected, rtol=0, atol=0)
    del scratch
