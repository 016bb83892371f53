"""The first forward at stage 3 (with and without grad): a parameter used while its unit is
released would fail later with a shape error far from the cause (its data is an empty
placeholder), or not at all. Under this TorchFunctionMode every torch call is looked at, and a
released parameter among its arguments is named at once with the fix (units=)."""

import torch

from zerod._native import ZerodError, INVALID_ARGUMENT
from zerod.torch._layout import unit_label

try:  # torch >= 1.13
    from torch.overrides import TorchFunctionMode
    available = True
except ImportError:  # pragma: no cover
    TorchFunctionMode = object
    available = False

# Functions that look at a tensor without reading its values: allowed on a released parameter.
_INSPECTIONS = frozenset((
    "__get__", "__set__", "__repr__", "__format__", "__hash__", "size", "dim", "numel",
    "nelement", "stride", "storage_offset", "element_size", "data_ptr", "storage",
    "untyped_storage", "_typed_storage", "is_contiguous", "is_floating_point", "is_complex",
    "register_hook", "requires_grad_", "get_device", "type", "__len__"))


class UseCheck(TorchFunctionMode):
    """The first forward at stage 3: a parameter whose unit is not gathered must not be used.
    (Looking at its size, storage or device is fine: _INSPECTIONS.)"""

    def __init__(self, runtime):
        super().__init__()
        self.runtime = runtime

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rt = self.runtime
        if rt.internal or getattr(func, "__name__", "") in _INSPECTIONS:
            return func(*args, **kwargs)
        for t in tensors_in((args, kwargs)):
            e = rt.by_id.get(id(t))
            if e is not None and rt.tensor_units[e.index] not in rt.held:
                name = getattr(func, "__name__", str(func))
                raise ZerodError(INVALID_ARGUMENT, (
                    f"zerod: parameter '{e.name}' is used (by {name}) outside the forward of its "
                    f"gather unit '{unit_label(e.unit)}'; at stage 3 a unit's parameters exist "
                    "only during its forward: pass zt.shard(..., units=...) so that one unit "
                    f"encloses every use of '{e.name}' (for instance the module class whose "
                    "forward uses it)"))
        return func(*args, **kwargs)


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
