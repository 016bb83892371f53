"""What a checkpoint keeps of the optimizer beside the engine's state (zt.save / zt.load): each
parameter group's hyperparameters and parameters (by name), and the LR scheduler's state dict.

A checkpoint is data: this state is pickled with plain containers only and unpickled with those
classes alone, tensors travelling as tagged plain lists. zt.save converts and then reads back what
it wrote with the very unpickler zt.load uses, so a checkpoint that saves also loads; anything
else in a scheduler's state is refused at the save, naming where it is. zt.load checks everything
before it changes anything.
"""

import base64
import collections
import io
import numbers
import pickle

import torch

from zerod._native import FAILED_PRECONDITION, INVALID_ARGUMENT, ZerodError
from zerod.torch import _optimizer

TENSOR_TAG = "__zerod_tensor__"
# Containers nested deeper than this are refused, at save and at load (no recursion limit hit).
MAX_DEPTH = 64
# The tensor dtypes a scheduler state may hold, by the name saved: a fixed table, so that a name
# from the file looks up nothing else.
_DTYPES = {name: getattr(torch, name) for name in (
    "float32", "float64", "float16", "bfloat16", "complex64", "complex128", "int64", "int32",
    "int16", "int8", "uint8", "bool")}
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_MAPPINGS = (dict, collections.OrderedDict, collections.Counter)
_SEQUENCES = (list, tuple, set, frozenset)
# What the unpickler may construct: the containers above (and defaultdict) and nothing else.
_DATA_CLASSES = {("collections", "Counter"), ("collections", "OrderedDict"),
                 ("collections", "defaultdict")} | {
    ("builtins", t.__name__) for t in (set, frozenset, complex, int, float, list, dict, tuple, str,
                                       bool)}
_FACTORIES = (None, int, float, complex, str, list, dict, set, tuple)  # a defaultdict's


class _NotData(ValueError):
    pass


def _class_name(value):
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


# ---- plain data: to it (at save) and from it (at load) ---------------------------------------

def _to_data(value, where, depth=0):
    """`value` as plain data: tensors tagged, callables dropped (a LambdaLR's lambdas, a
    OneCycleLR's annealing method, as torch's own state dicts leave them out), numbers of other
    libraries as Python's; _NotData naming `where` for anything else."""
    if depth > MAX_DEPTH:
        raise _NotData(f"{where} is nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if kind in _SCALARS:
        return value
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        if dtype not in _DTYPES:
            raise _NotData(f"{where} is a tensor of dtype {value.dtype}, which a checkpoint "
                           f"does not keep (one of {', '.join(_DTYPES)})")
        return (TENSOR_TAG, dtype, list(value.shape), value.detach().cpu().reshape(-1).tolist())
    if isinstance(value, numbers.Integral):  # numpy's integers
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if kind in _MAPPINGS or kind is collections.defaultdict:
        if kind is collections.defaultdict and value.default_factory not in _FACTORIES:
            raise _NotData(f"{where} is a defaultdict of {value.default_factory!r}, which a "
                           "checkpoint does not keep")
        out = value.copy()
        out.clear()
        for k, v in value.items():
            if type(k) not in _SCALARS:
                raise _NotData(f"{where} has a key of type {_class_name(k)}")
            if not callable(v):
                out[k] = _to_data(v, f"{where}[{k!r}]", depth + 1)
        return out
    if kind in _SEQUENCES:
        items = (None if callable(v) else _to_data(v, f"{where}[{i}]", depth + 1)
                 for i, v in enumerate(value))
        return kind(items)
    raise _NotData(f"{where} is a {_class_name(value)}, which a checkpoint does not keep (plain "
                   "data only: numbers, strings, tensors, and lists, tuples, dicts and sets of "
                   "them)")


def _tensor(value, where):
    _, dtype, shape, values = value
    if dtype not in _DTYPES:
        raise _NotData(f"{where} is a tensor of unknown dtype {dtype!r}")
    if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
        raise _NotData(f"{where} is a tensor of shape {shape!r} (not sizes >= 0)")
    count = 1
    for n in shape:
        count *= n
    if not isinstance(values, list) or len(values) != count:
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise _NotData(f"{where} is a tensor of shape {shape}, which holds {count} values, not "
                       f"{got}")
    return torch.tensor(values, dtype=_DTYPES[dtype]).reshape(shape)


def _from_data(value, where, depth=0):
    """The inverse of _to_data: tagged tensors back, each checked (dtype, shape)."""
    if depth > MAX_DEPTH:
        raise _NotData(f"{where} is nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if kind is tuple and len(value) == 4 and type(value[0]) is str and value[0] == TENSOR_TAG:
        return _tensor(value, where)
    if kind in _MAPPINGS or kind is collections.defaultdict:
        out = value.copy()
        for k, v in value.items():
            out[k] = _from_data(v, f"{where}[{k!r}]", depth + 1)
        return out
    if kind in (list, tuple):
        return kind(_from_data(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
    return value


class _DataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _DATA_CLASSES:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def decode(blob):
    """The data pickled in `blob`, or _NotData saying why it is not data. Only the classes in
    _DATA_CLASSES are ever constructed; any failure of the unpickler or of the checks is one."""
    try:
        data = _DataUnpickler(io.BytesIO(blob)).load()
        if type(data) is dict:  # zt.save's: each entry named by its key
            return {k: _from_data(v, str(k), 1) for k, v in data.items()}
        return _from_data(data, "the state")
    except _NotData:
        raise
    except Exception as e:  # noqa: BLE001 -- whatever a corrupt blob makes pickle raise
        raise _NotData(f"{type(e).__name__}: {e}") from None


def encode(state, name):
    """`state` (a dict) as checkpoint text: converted to plain data, pickled, and read back with
    the unpickler zt.load uses; ZerodError (INVALID_ARGUMENT) naming what would not load."""
    try:
        data = {k: _to_data(v, k) for k, v in state.items()}
        blob = pickle.dumps(data)
        decode(blob)
    except _NotData as e:
        raise ZerodError(INVALID_ARGUMENT, f"{name}: {e}") from None
    return base64.b64encode(blob).decode("ascii")


# ---- zt.save / zt.load ----------------------------------------------------------------------

def check_scheduler(optimizer, scheduler, name):
    """A scheduler given to zt.save / zt.load must drive this job's optimizer."""
    if scheduler is None:
        return
    if not (hasattr(scheduler, "state_dict") and hasattr(scheduler, "load_state_dict")):
        raise ZerodError(INVALID_ARGUMENT, (
            f"{name}: scheduler must be a torch LR scheduler (with state_dict and "
            f"load_state_dict), not {type(scheduler).__name__}"))
    target = getattr(scheduler, "optimizer", None)
    if target is not None and target is not optimizer and \
            getattr(target, "param_groups", None) is not optimizer.param_groups:
        raise ZerodError(INVALID_ARGUMENT, (
            f"{name}: the scheduler drives another optimizer than the one zt.shard returned"))


def state_of(optimizer, scheduler):
    """What zt.save keeps: each group's hyperparameters and parameter names, and the scheduler's
    state dict (None: no scheduler given)."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    state = {"param_groups": groups, "param_names": optimizer.param_names()}
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    return state


def training_state(optimizer, scheduler):
    """The optimizer's part of the module-state file, as text."""
    return {"optimizer": encode(state_of(optimizer, scheduler), "zt.save")}


def _refuse(directory, message):
    return ZerodError(FAILED_PRECONDITION, f"zt.load: {directory} {message}")


def _checked_groups(optimizer, state, directory):
    """The updates of each group, all checked; None when the checkpoint has no groups (it was
    written before they were kept)."""
    groups = state.get("param_groups")
    if groups is None:
        return None
    mine = optimizer.param_groups
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise _refuse(directory, "holds parameter groups that are not a list of dicts")
    if len(groups) != len(mine):
        raise _refuse(directory, f"was saved with {len(groups)} parameter group(s); this "
                                 f"optimizer has {len(mine)}")
    names = state.get("param_names")
    if names is not None:
        moved = _optimizer.group_difference(names, optimizer.param_names())
        if moved is not None:
            raise _refuse(directory, f"was saved with {moved}: build the groups as the run that "
                                     "saved it did")
    updates = []
    for gi, (group, own) in enumerate(zip(groups, mine)):
        update = {k: v for k, v in group.items() if k != "params"}
        try:
            _optimizer.group_config({**own, **update}, gi, optimizer._decoupled)
        except ZerodError as e:
            raise _refuse(directory, "has a parameter group zerod cannot run: "
                                     f"{str(e).removeprefix('zerod: ')}") from None
        updates.append(update)
    return updates


def prepare_restore(optimizer, saved, scheduler, directory):
    """Checks the optimizer's part of a checkpoint (saved: the module-state dict) against this
    optimizer and scheduler, changing nothing; returns the function that restores it."""
    text = saved.get("optimizer")
    state = {}  # an older checkpoint: nothing kept of the optimizer
    if text is not None:
        try:
            state = decode(base64.b64decode(text, validate=True))
        except (_NotData, ValueError, TypeError) as e:
            raise _refuse(directory, f"holds an optimizer state that does not load as data "
                                     f"({e})") from None
        if not isinstance(state, dict):
            raise _refuse(directory, f"holds a {type(state).__name__}, not a dict, as the "
                                     "optimizer state")
    updates = _checked_groups(optimizer, state, directory)
    if scheduler is not None and not isinstance(state.get("scheduler"), dict):
        raise _refuse(directory, "holds no scheduler state (save with zt.save(dir, "
                                 "scheduler=...) to keep it)")

    def restore():
        if scheduler is not None:
            try:
                scheduler.load_state_dict(state["scheduler"])
            except Exception as e:  # noqa: BLE001 -- the scheduler's own checks, any kind
                raise _refuse(directory, (
                    f"holds a scheduler state that {type(scheduler).__name__} does not take "
                    f"({type(e).__name__}: {e})")) from None
        for group, update in zip(optimizer.param_groups, updates or ()):
            group.update(update)

    return restore
