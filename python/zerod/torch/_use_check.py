"""Stage 3: a released parameter's data is an empty placeholder, so any computation on it would read
nothing, silently (a sum is 0.0) or with a shape error far from the cause (in backward). Every
trainable parameter's class becomes a subclass of nn.Parameter whose __torch_function__ looks at
each torch call the parameter takes part in, and names a released parameter at once, with the way
out: `with zt.gathered(model):` for a use outside model(...), units= for a use inside another
unit's forward. (A TorchFunctionMode would see only calls made while it is entered, i.e. inside the
forward; the class sees every call, wherever it is made.)"""

import torch

from zerod._native import ZerodError, FAILED_PRECONDITION, INVALID_ARGUMENT
from zerod.torch._frames import called_under
from zerod.torch._layout import unit_label

# Calls that look at a tensor without reading its values: allowed on a released parameter.
_INSPECTIONS = frozenset((
    "__repr__", "__format__", "__hash__", "size", "dim", "numel", "nelement", "stride",
    "storage_offset", "element_size", "data_ptr", "storage", "untyped_storage", "_typed_storage",
    "is_contiguous", "is_floating_point", "is_complex", "register_hook", "requires_grad_",
    "get_device", "type", "__len__", "__reduce_ex__", "__deepcopy__"))
# As nn.Parameter's own __torch_function__: torch 2.x disables subclass handling only (a user's
# TorchFunctionMode still sees the call); torch 1.13 has only the switch for both.
_plain_results = getattr(torch._C, "DisableTorchFunctionSubclass", torch._C.DisableTorchFunction)
# Attributes whose value is the parameter's values (or a view of them); the others (grad,
# requires_grad, shape, device, _version, ...) may be read and set on a released parameter.
_VALUE_ATTRIBUTES = frozenset(("data", "T", "mT", "H", "mH", "real", "imag"))


def sharded_parameter_class(runtime):
    """The class a stage-3 runtime gives its trainable parameters (one per runtime, which it
    checks against)."""

    class ShardedParameter(torch.nn.Parameter):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not runtime.internal:
                _check(runtime, func, args, kwargs)
            with _plain_results():  # results are plain tensors, as nn.Parameter's are
                return func(*args, **kwargs)

        def __repr__(self):
            e = runtime.by_id.get(id(self))
            if e is None or runtime.has_values(e):
                return super().__repr__()
            return (f"Parameter '{e.name}' of shape {tuple(self.shape)} ({self.dtype}), released: "
                    f"at stage 3 it holds values only while its unit '{unit_label(e.unit)}' runs")

    return ShardedParameter


def _check(rt, func, args, kwargs):
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__"):
        attribute = getattr(getattr(func, "__self__", None), "__name__", "")
        if attribute not in _VALUE_ATTRIBUTES:
            return
        name = f"{'reading' if name == '__get__' else 'setting'} .{attribute}"
    elif name in _INSPECTIONS:
        return
    for t in tensors_in((args, kwargs)):
        e = rt.by_id.get(id(t))
        if e is not None and not rt.has_values(e):
            raise _released(rt, e, name or str(func))


def _released(rt, e, used_by):
    unit = unit_label(e.unit)
    if rt.closed:
        return ZerodError(FAILED_PRECONDITION, (
            f"zerod: parameter '{e.name}' is used (by {used_by}) after zt.shutdown: at stage 3 "
            "its values lived in zerod; take zt.full_state_dict(model) before leaving"))
    if _in_state_dict():
        return ZerodError(FAILED_PRECONDITION, STATE_DICT_AT_STAGE_3)
    if rt.forward_depth or rt.units_running:  # the use is in the forward (or a recompute)
        return ZerodError(INVALID_ARGUMENT, (
            f"zerod: parameter '{e.name}' is used (by {used_by}) outside the forward of its "
            f"gather unit '{unit}'; at stage 3 a unit's parameters exist only during its "
            "forward: pass zt.shard(..., units=...) so that one unit encloses every use of "
            f"'{e.name}' (for instance the module class whose forward uses it)"))
    return ZerodError(FAILED_PRECONDITION, (
        f"zerod: parameter '{e.name}' is used (by {used_by}) outside model(...), while its "
        f"gather unit '{unit}' is released: at stage 3 it holds no values between forwards, so "
        "this would read an empty tensor. Use parameters outside the forward (a penalty on the "
        "weights, a norm to log) inside `with zt.gathered(model):`, which gathers them for the "
        "block (gradients flow as usual); zt.full_state_dict(model) gathers them all into a "
        "copy"))


_STATE_DICT = torch.nn.Module.state_dict.__code__
STATE_DICT_AT_STAGE_3 = (
    "zerod: model.state_dict() at stage 3 would copy placeholders: each parameter holds its "
    "values only while its unit runs. zt.full_state_dict(model) gives the full state (a "
    "collective: every rank calls it); zt.save(dir) writes a sharded checkpoint")


def _in_state_dict():
    return called_under(_STATE_DICT, skip=2)


def tensors_in(value):
    """The tensors in a value made of tensors, lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)
