"""Stage 3: parameters used outside model(...), where their units are released (they hold an empty
placeholder). Every such use is an error that names the parameter and the way out, at once (it
used to read as empty: a penalty of 0.0, then torch's shape error in backward); inside
`with zt.gathered(model):` the same code trains as plain torch. In this process, as a job of one,
against torch.optim.AdamW on a copy of the module."""

import contextlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zerod.torch as zt
from zerod import ZerodError

LR = 1e-2
OUTSIDE = r"outside model\(...\), while its gather unit '{unit}' is released"


class TwoLayers(nn.Module):
    """`spare` is never used by the forward: only by a penalty outside it."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.spare = nn.Linear(6, 6)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def data(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)


def l2(module):
    return sum((p ** 2).sum() for p in module.parameters())


def sharded(stage=3):
    torch.manual_seed(0)
    return zt.shard(TwoLayers(), stage=stage, lr=LR, weight_decay=0.0)


def test_a_penalty_on_the_weights_after_the_forward_names_the_parameter(one_rank_job):
    model, opt = sharded()
    x, y = data(0)
    out = model(x)
    with pytest.raises(ZerodError, match=r"parameter 'a.weight' is used \(by pow\) " +
                       OUTSIDE.format(unit="a")) as error:
        F.mse_loss(out, y) + 0.1 * l2(model)
    assert "with zt.gathered(model):" in str(error.value)
    assert error.value.code_name == "FAILED_PRECONDITION"


@pytest.mark.parametrize("read", [
    lambda m: m.b.weight.norm(),
    lambda m: m.b.weight.data.sum(),
    lambda m: torch.cat([p.view(-1) for p in m.b.parameters()]),
    lambda m: m.b.weight.T.sum(),
], ids=["norm", "data", "view in a list", "T"])
def test_reading_a_released_parameter_under_no_grad_names_it(one_rank_job, read):
    model, _ = sharded()
    with torch.no_grad(), pytest.raises(ZerodError, match="parameter 'b.weight' is used " +
                                        r"\(by [^)]+\) " + OUTSIDE.format(unit="b")):
        read(model)


def test_looking_at_a_released_parameter_is_allowed(one_rank_job):
    # Its size, dtype, device, gradient and flags do not read its values.
    model, _ = sharded()
    p = model.a.weight
    assert (p.requires_grad, p.dtype, p.device.type, p.grad, p.is_leaf) == \
        (True, torch.float32, "cpu", None, True)
    assert isinstance(p, nn.Parameter)
    # Its true size, from a placeholder of one element: sharded, it allocates nothing.
    assert p.shape == (6, 6) and p.numel() == 36 and p.storage().size() == 1
    assert sum(q.numel() for q in model.parameters()) == 3 * (36 + 6)
    assert "released" in repr(p) and "a.weight" in repr(p)


@pytest.mark.parametrize("stage", [1, 3])
def test_a_penalty_inside_zt_gathered_trains_as_torch(one_rank_job, stage):
    # Also a parameter the forward never uses (spare) and a view kept past the block (w). Below
    # stage 3 the parameters always hold their values: the block does nothing.
    torch.manual_seed(0)
    reference = TwoLayers()
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=LR, weight_decay=0.0)
    model, opt = sharded(stage)
    for step in range(3):
        x, y = data(step)
        for m, o, block in ((model, opt, zt.gathered), (reference, opt_ref, None)):
            o.zero_grad()
            out = m(x)
            with block(m) if block else contextlib.nullcontext():
                penalty = l2(m)
                w = m.spare.weight.t()
            (F.mse_loss(out, y) + 0.1 * penalty + (w @ x.T).pow(2).mean()).backward()
            o.step()
    full = zt.full_state_dict(model)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(full[name], value, rtol=2e-5, atol=1e-6)
    if stage == 3:  # the block's copies went with it
        assert [p.storage().size() for p in model.parameters()] == [1] * 6


def test_zt_gathered_of_a_submodule_gathers_only_its_units(one_rank_job):
    model, _ = sharded()
    with zt.gathered(model.a):
        assert model.a.weight.shape == (6, 6)
        assert model.a.weight.abs().sum() > 0
        with pytest.raises(ZerodError, match="parameter 'b.weight' is used"):
            model.b.weight.sum()
    with pytest.raises(ZerodError, match="parameter 'a.weight' is used"):
        model.a.weight.sum()  # released again


def test_nested_zt_gathered_blocks_keep_the_values_until_the_outer_one_ends(one_rank_job):
    model, _ = sharded()
    with zt.gathered(model):
        with zt.gathered(model.a):
            pass
        assert model.a.weight.abs().sum() > 0
    with pytest.raises(ZerodError, match="parameter 'a.weight' is used"):
        model.a.weight.sum()


def test_zt_gathered_values_are_the_parameters(one_rank_job):
    model, _ = sharded()
    with zt.gathered(model):
        inside = {n: p.detach().clone() for n, p in model.named_parameters()}
    full = zt.full_state_dict(model)
    for name, value in inside.items():
        torch.testing.assert_close(value, full[name], rtol=0, atol=0)


def test_a_change_in_place_inside_zt_gathered_is_refused(one_rank_job):
    model, _ = sharded()
    before = zt.full_state_dict(model)["a.weight"]
    with pytest.raises(ZerodError, match="parameter 'a.weight' was changed in place inside "
                                         r"zt.gathered\(model\), which gathers for reading"):
        with zt.gathered(model), torch.no_grad():
            model.a.weight.mul_(2.0)
    torch.testing.assert_close(zt.full_state_dict(model)["a.weight"], before, rtol=0, atol=0)


def test_a_step_inside_zt_gathered_is_refused(one_rank_job):
    model, opt = sharded()
    x, y = data(0)
    F.mse_loss(model(x), y).backward()
    with zt.gathered(model), pytest.raises(ZerodError, match=r"opt.step\(\) inside zt.gathered"):
        opt.step()
    opt.step()  # after the block it steps


def test_zt_gathered_of_another_module_is_refused(one_rank_job):
    sharded()
    with pytest.raises(ZerodError, match="not the sharded model nor one of its submodules"):
        with zt.gathered(nn.Linear(2, 2)):
            pass


def test_a_released_parameter_after_shutdown_says_so(one_rank_job):
    model, _ = sharded()
    zt.shutdown()
    with pytest.raises(ZerodError, match=r"parameter 'a.weight' is used \(by sum\) after "
                                         r"zt.shutdown.*take zt.full_state_dict\(model\)"):
        model.a.weight.sum()
