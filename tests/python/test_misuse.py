"""Bad use fails at once with a message that names the problem. Checks of the arguments run
before anything joins; the rest run in this process against the real daemon, as a job of one."""

import pytest
import torch
import torch.nn as nn

import zerod.torch as zt
from zerod import ZerodError
import zt_models


def model():
    return zt_models.build("nested", 0)


@pytest.mark.parametrize("kwargs, message", [
    ({"stage": 4}, "unknown stage 4 (expected 0, 1, 2, 3 or 'auto')"),
    ({"stage": "three"}, "unknown stage 'three'"),
    ({"dtype": "fp8"}, "unknown dtype 'fp8' (expected 'fp32', 'bf16' or 'fp16', or torch.float32"),
    ({"dtype": torch.float64}, "unknown dtype torch.float64"),
    ({"optimizer": "sgd"}, "unknown optimizer 'sgd' (expected 'adam' or 'adamw', or a "
                           "torch.optim.AdamW or torch.optim.Adam built on the module's parameters)"),
    ({"optimizer": torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1)},
     "optimizer torch.optim.sgd.SGD is not supported: zerod runs Adam and AdamW itself"),
    ({"optimizer": torch.optim.AdamW([nn.Parameter(torch.ones(1))]), "lr": 0.1},
     "lr given with a torch optimizer, whose param_groups hold the hyperparameters"),
    ({"accumulation_reduction": "avg"}, "accumulation_reduction must be 'mean' or 'sum', not 'avg'"),
    ({"lr": -1.0}, "invalid learning rate: -1.0"),
    ({"betas": (0.9, 1.0)}, "invalid betas: (0.9, 1.0)"),
    ({"eps": -1e-8}, "invalid epsilon value: -1e-08"),
    ({"weight_decay": -0.1}, "invalid weight_decay value: -0.1"),
    ({"max_grad_norm": -1.0}, "invalid max_grad_norm: -1.0"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be a positive integer"),
    # Each argument's type, named (torch's TypeError from inside would name none of them).
    ({"stage": True}, "unknown stage True"),
    ({"stage": 3.0}, "unknown stage 3.0"),
    ({"lr": "0.1"}, "lr must be a finite number (the learning rate, >= 0), not '0.1'"),
    ({"lr": True}, "lr must be a finite number"),
    ({"betas": 0.9}, "betas must be a pair of numbers in [0, 1) such as (0.9, 0.999), not 0.9"),
    ({"betas": (0.9,)}, "betas must be a pair of numbers"),
    ({"betas": (0.9, "0.999")}, "betas must be a pair of numbers"),
    ({"eps": float("nan")}, "eps must be a finite number (>= 0), not nan"),
    ({"weight_decay": None, "optimizer": 3}, "unknown optimizer 3"),
    ({"weight_decay": "0.1"}, "weight_decay must be a finite number (>= 0), not '0.1'"),
    ({"max_grad_norm": None}, "max_grad_norm must be a finite number"),
    ({"gradient_accumulation_steps": 1.5}, "gradient_accumulation_steps must be a positive "
                                           "integer, not 1.5"),
    ({"bucket_cap_mb": 0}, "bucket_cap_mb must be a size in MiB > 0, not 0"),
    ({"bucket_cap_mb": "25"}, "bucket_cap_mb must be a size in MiB > 0, not '25'"),
    ({"gather_unit_mb": -1}, "gather_unit_mb must be a size in MiB > 0, not -1"),
    ({"prefetch": True}, "prefetch must be 0 or 1 (the units gathered ahead"),
    ({"prefetch": -1}, "prefetch must be 0 or 1"),
    ({"prefetch": 2}, "prefetch=2: the engine prefetches one unit ahead"),
    ({"max_live_units": 0}, "max_live_units must be an integer >= prefetch + 1 = 2"),
    ({"max_live_units": 2.0}, "max_live_units must be an integer >= prefetch + 1 = 2"),
    ({"initial_scale_power": 1000}, "initial_scale_power must be an integer 0 to 127"),
    ({"cast_forward_inputs": "yes"}, "cast_forward_inputs must be True or False, not 'yes'"),
    ({"threads": 0}, "threads must be an integer 1 to 1024, not 0"),
    ({"collective_timeout": 0}, "collective_timeout must be a finite number of seconds > 0"),
    ({"collective_timeout": True}, "collective_timeout must be a finite number of seconds > 0"),
    ({"budget": -5, "stage": "auto"}, "budget must be a number of bytes per rank (an integer > "
                                      "0), not -5"),
    ({"device": 3}, "device must be a torch.device or a name such as 'cpu' or 'cuda:0', not 3"),
    ({"device": "gpu0"}, "device must be a torch.device or a name"),
    ({"job": ""}, "job must be a non-empty string, not ''"),
    ({"endpoint": 5}, "endpoint must be a non-empty string, not 5"),
    ({"rank": "0"}, "rank must be an integer >= 0, not '0'"),
    ({"world_size": 0}, "world_size must be an integer >= 1, not 0"),
    ({"rank": 2, "world_size": 2}, "rank 2 is not below world_size 2"),
    # units=: a string is a class name, which must name a class of the model.
    ({"units": "Linr"}, "units='Linr': no module of the model is a Linr (its module classes: "
                        "Nested, Linear, Sequential, Block, LayerNorm)"),
    ({"units": {nn.Conv2d}}, "no module of the model is a Conv2d"),
    ({"units": 5}, "units=5: units= takes a module class or class name, a set of them, or a "
                   "callable(name, module) -> bool"),
    ({"units": [nn.Linear, 5]}, "5 is neither a module class nor a class name"),
    ({"units": []}, "units=[] is empty"),
    # Stage 3: the root's unit stays gathered while a layer's runs inside it.
    ({"max_live_units": 1, "prefetch": 0}, "max_live_units=1 is below the units' nesting "
                                           "depth, 2"),
])
def test_bad_arguments_are_named_before_joining(kwargs, message):
    with pytest.raises(ZerodError) as error:
        zt.shard(model(), **kwargs)
    assert message in str(error.value)
    assert error.value.code_name == "INVALID_ARGUMENT"


def test_module_on_a_device_zerod_does_not_train():
    with pytest.raises(ZerodError, match="parameter 'gain' is on meta: zerod trains on cpu "
                                         "or cuda"):
        zt.shard(zt_models.Nested().to("meta"))


def test_module_on_another_device_than_asked():
    with pytest.raises(ZerodError, match=r"parameter 'gain' is on cpu, but device='cuda' "
                                         r"was asked; move the module first"):
        zt.shard(model(), device="cuda")


def test_module_without_trainable_parameters():
    m = model().requires_grad_(False)
    with pytest.raises(ZerodError, match="the module has no trainable parameters"):
        zt.shard(m)


def test_not_a_module():
    with pytest.raises(ZerodError, match="expected a torch.nn.Module, got dict"):
        zt.shard({})


def test_shard_twice(one_rank_job):
    m, _ = zt.shard(model(), stage=1)
    with pytest.raises(ZerodError, match="zt.shard: called twice"):
        zt.shard(zt_models.build("tied", 0), stage=1)
    with pytest.raises(ZerodError, match="zt.shard: called twice"):
        zt.shard(m, stage=1)


def test_parameter_added_after_shard(one_rank_job):
    m, opt = zt.shard(model(), stage=2)
    m.extra = nn.Linear(3, 3)
    with pytest.raises(ZerodError, match="parameter 'extra.weight' was added \\(or made "
                                         "trainable\\) after zt.shard"):
        m(torch.randn(2, zt_models.IN))


def test_parameter_frozen_after_shard(one_rank_job):
    m, opt = zt.shard(model(), stage=0)
    m.out.weight.requires_grad_(False)
    with pytest.raises(ZerodError, match="parameter 'out.weight' was frozen after zt.shard"):
        m(torch.randn(2, zt_models.IN))


def test_step_without_backward_steps_no_parameter(one_rank_job):
    # As in torch: no parameter has a gradient, so none is stepped (not even weight decay).
    m, opt = zt.shard(model(), stage=3, weight_decay=0.5)
    before = zt.full_state_dict(m)
    opt.step()
    after = zt.full_state_dict(m)
    assert all(torch.equal(after[k], v) for k, v in before.items())


def test_step_after_part_of_the_accumulation_is_refused(one_rank_job):
    m, opt = zt.shard(model(), stage=2, gradient_accumulation_steps=2,
                      accumulation_reduction="mean")
    m(torch.randn(2, zt_models.IN)).sum().backward()
    with pytest.raises(ZerodError, match=r"opt.step\(\) after 1 backward pass\(es\); expected 2"):
        opt.step()


def test_backward_twice_without_step(one_rank_job):
    m, opt = zt.shard(model(), stage=2)
    x = torch.randn(2, zt_models.IN)
    m(x).sum().backward()
    with pytest.raises(RuntimeError, match="backward number 2 before opt.step\\(\\), with "
                                           "gradient_accumulation_steps=1"):
        m(x).sum().backward()


def test_add_param_group_takes_only_parameters_zerod_holds(one_rank_job):
    m = model()
    opt = torch.optim.AdamW([p for n, p in m.named_parameters() if not n.startswith("out.")],
                            lr=0.1)
    m, opt = zt.shard(m, stage=1, optimizer=opt)
    with pytest.raises(ZerodError, match=r"add_param_group: a tensor of shape \(1,\) is not a "
                                         "trainable parameter of the sharded module"):
        opt.add_param_group({"params": [nn.Parameter(torch.ones(1))]})
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter "
                                         "group"):
        opt.add_param_group({"params": [m.inp.weight]})
    # torch on the same module: the output layer is left out of the optimizer (torch does not
    # step it, nor does zerod) until a group takes it after the first step.
    plain = model()
    torch_opt = torch.optim.AdamW([p for n, p in plain.named_parameters()
                                   if not n.startswith("out.")], lr=0.1)
    x = torch.randn(4, zt_models.IN)
    for net, o in ((plain, torch_opt), (m, opt)):
        net(x).pow(2).mean().backward()
        o.step()
    assert torch.equal(zt.full_state_dict(m)["out.weight"], model().out.weight)
    for net, o in ((plain, torch_opt), (m, opt)):
        o.add_param_group({"params": list(net.out.parameters()), "lr": 0.05})
        o.zero_grad()
        net(x).pow(2).mean().backward()
        o.step()
    assert opt.param_groups[1]["betas"] == (0.9, 0.999)  # torch's defaults fill the group
    got = zt.full_state_dict(m)
    for name, expected in plain.state_dict().items():
        torch.testing.assert_close(got[name], expected, rtol=1e-5, atol=1e-6,
                                   msg=lambda text: f"{name}: {text}")
    assert not torch.equal(got["out.weight"], model().out.weight)


@pytest.mark.parametrize("make, message", [
    (lambda ps: type("MyAdamW", (torch.optim.AdamW,), {})(ps),
     "optimizer test_misuse.MyAdamW is not supported"),
    (lambda ps: torch.optim.Adam(ps, amsgrad=True), r"param_groups\[0\]\['amsgrad'\] is True"),
    (lambda ps: torch.optim.AdamW(list(ps) + [nn.Parameter(torch.ones(3))]),
     r"param_groups\[0\] holds a tensor of shape \(3,\) that is not one of the module's"),
])
def test_torch_optimizers_zerod_cannot_run_are_refused(make, message):
    m = model()
    with pytest.raises(ZerodError, match=message):
        zt.shard(m, optimizer=make(m.parameters()))


def test_an_optimizer_that_has_stepped_is_refused():
    m = model()
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, zt_models.IN)).sum().backward()
    opt.step()
    with pytest.raises(ZerodError, match="the AdamW has state already"):
        zt.shard(m, optimizer=opt)


def test_a_group_option_zerod_lacks_set_after_shard_is_refused_at_step(one_rank_job):
    m, opt = zt.shard(model(), stage=0)
    opt.param_groups[0]["maximize"] = True
    m(torch.randn(2, zt_models.IN)).sum().backward()
    with pytest.raises(ZerodError, match=r"param_groups\[0\]\['maximize'\] is True"):
        opt.step()


def test_rank_before_shard_needs_the_environment(monkeypatch):
    # Under zerorun's variables without a rank (the coordinator assigns one at the join).
    from zerod.torch import _launch
    monkeypatch.delenv("ZEROD_RANK", raising=False)
    monkeypatch.setenv("ZEROD_WORLD_SIZE", "2")
    monkeypatch.setattr(_launch, "_state", None)
    with pytest.raises(ZerodError, match="ZEROD_RANK is not set"):
        zt.rank()


def test_a_layer_outside_the_plan_is_refused_by_the_library(one_rank_job):
    # The C API checks its options too: a bad value that passes Python's checks is named.
    from zerod._native import Session
    with pytest.raises(ZerodError, match="layout: "):
        Session({"layout": [{"name": "w", "shape": [-3]}]})


def test_a_working_job_of_one_after_the_errors(one_rank_job):
    # The failures above left nothing behind: a job of one trains.
    m, opt = zt.shard(model(), stage=3)
    x, y = zt_models.batch("nested", 0, 4)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = zt_models.loss_fn("nested", m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_after_shutdown_below_stage_3_the_module_keeps_its_values(one_rank_job):
    m, opt = zt.shard(model(), stage=1)
    x = torch.randn(2, zt_models.IN)
    before = m(x).detach().clone()
    zt.shutdown()
    torch.testing.assert_close(m(x), before, rtol=0, atol=0)  # a copy, not zerod's freed memory


def test_after_shutdown_at_stage_3_the_module_refuses_to_run(one_rank_job):
    m, opt = zt.shard(model(), stage=3)
    zt.shutdown()
    with pytest.raises(ZerodError, match="take zt.full_state_dict\\(model\\) before leaving"):
        m(torch.randn(2, zt_models.IN))
