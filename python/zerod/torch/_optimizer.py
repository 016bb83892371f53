"""The optimizer zt.shard returns: torch's optimizer contract over zerod's sharded Adam.

- optimizer=torch.optim.AdamW(groups, ...) or torch.optim.Adam (or the string form "adamw" /
  "adam" with keyword hyperparameters, which builds one): its param_groups become the
  ZeroOptimizer's, the same dicts, read at every step as torch reads them (lr, betas, eps,
  weight_decay of every group), so LR schedulers built on either object drive the step.
- Parameters torch would not step are not stepped: one that no rank gave a gradient since the last
  zero_grad(set_to_none=True), or one in no group. Each keeps its own step count.
- zero_grad() between backward and step discards what backward gave.
- state_dict() / load_state_dict(): this rank's shard of the optimizer state (model coordinates,
  as zt.save writes it) with torch's param_groups, for the same world size and stage; zt.save /
  zt.load reshard.
"""

import ctypes
import hashlib
import inspect
import math
import numbers

import torch

from zerod._native import FAILED_PRECONDITION, INVALID_ARGUMENT, ZerodError

# Whether weight decay is decoupled (AdamW) by default, per supported class. A subclass is not
# supported: its step() (whatever it changes) would never run.
SUPPORTED = {torch.optim.AdamW: True, torch.optim.Adam: False}
# torch's own default for zero_grad's set_to_none (False in torch 1.x, True from 2.0).
TORCH_SET_TO_NONE = inspect.signature(torch.optim.Optimizer.zero_grad).parameters[
    "set_to_none"].default
_HYPER = ("lr", "betas", "eps", "weight_decay")
# Group options zerod's Adam does not have; True in a group is refused.
_UNSUPPORTED_FLAGS = ("amsgrad", "maximize")
STATE_FORMAT = 1
# Parameter groups compared one by one at join; more are compared as one digest.
_AGREED_GROUPS = 1024


def _bad(message):
    return ZerodError(INVALID_ARGUMENT, f"zt.shard: {message}")


def _class_name(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def _real(value):
    """A hyperparameter as a float: a number, or a one-element tensor (torch 2.x's tensor lr)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def group_config(group, index, decoupled):
    """The 6 numbers the engine takes for one group, or ZerodError naming what is wrong."""
    where = f"param_groups[{index}]"
    for flag in _UNSUPPORTED_FLAGS:
        if group.get(flag, False):
            raise ZerodError(INVALID_ARGUMENT, (
                f"zerod: {where}['{flag}'] is True: zerod's Adam has no {flag}; set it False"))
    lr, eps, wd = _real(group.get("lr")), _real(group.get("eps")), _real(group.get("weight_decay"))
    for name, value in (("lr", lr), ("eps", eps), ("weight_decay", wd)):
        if value is None or value < 0:
            raise ZerodError(INVALID_ARGUMENT, (
                f"zerod: {where}['{name}'] = {group.get(name)!r} is not a finite number >= 0"))
    betas = group.get("betas")
    pair = [_real(b) for b in betas] if isinstance(betas, (tuple, list)) and len(betas) == 2 \
        else None
    if pair is None or not all(b is not None and 0.0 <= b < 1.0 for b in pair):
        raise ZerodError(INVALID_ARGUMENT, (
            f"zerod: {where}['betas'] = {betas!r} is not a pair of numbers in [0, 1)"))
    decoupled = bool(group.get("decoupled_weight_decay", decoupled))
    return [lr, pair[0], pair[1], eps, wd, 1.0 if decoupled else 0.0]


def adopt(optimizer, model, trainable):
    """Checks a torch optimizer handed to zt.shard and returns whether its weight decay is
    decoupled. It must be torch.optim.Adam or AdamW itself, without state, over parameters of the
    module (trainable ones are stepped by zerod; frozen ones, which torch would never step, are
    left alone)."""
    cls = type(optimizer)
    if cls not in SUPPORTED:
        raise _bad(f"optimizer {_class_name(cls)} is not supported: zerod runs Adam and AdamW "
                   "itself, sharded; pass torch.optim.AdamW(...) or torch.optim.Adam(...) built on "
                   "the module's parameters (not a subclass: its step() would never run), or "
                   "optimizer='adamw' / 'adam' with lr=, betas=, eps=, weight_decay=")
    if optimizer.state:
        raise _bad(f"the {cls.__name__} has state already (it has stepped, or loaded a state "
                   "dict): pass a fresh one, and resume with zt.load (or opt.load_state_dict on "
                   "the optimizer zt.shard returns)")
    ours = {id(e.param) for e in trainable}
    names = {id(p): n for n, p in model.named_parameters()}
    for gi, group in enumerate(optimizer.param_groups):
        group_config(group, gi, SUPPORTED[cls])
        for p in group["params"]:
            if id(p) in ours or (id(p) in names and not p.requires_grad):
                continue
            what = f"'{names[id(p)]}'" if id(p) in names else \
                f"a tensor of shape {tuple(p.shape)} that is not one of the module's"
            raise _bad(f"param_groups[{gi}] holds {what}: the optimizer given to zt.shard must be "
                       "built on the sharded module's parameters")
    return SUPPORTED[cls]


def build(kind, params, lr, betas, eps, weight_decay):
    """The torch optimizer the string form stands for (never stepped: its groups are read)."""
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    return cls(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)


def agreed_options(source, max_grad_norm, accumulation, average):
    """What every rank must give alike, as name -> text (checked by the coordinator at join)."""
    agreed = {"optimizer": type(source).__name__, "param_groups": str(len(source.param_groups)),
              "max_grad_norm": repr(float(max_grad_norm)),
              "gradient_accumulation_steps": str(int(accumulation)),
              "accumulation_reduction": "mean" if average else "sum"}
    groups = []
    for gi, group in enumerate(source.param_groups):
        config = group_config(group, gi, SUPPORTED[type(source)])
        groups.append(f"lr={config[0]!r} betas=({config[1]!r}, {config[2]!r}) eps={config[3]!r} "
                      f"weight_decay={config[4]!r} decoupled={bool(config[5])} "
                      f"params={len(group['params'])}")
    if len(groups) <= _AGREED_GROUPS:
        agreed.update({f"param_groups[{gi}]": text for gi, text in enumerate(groups)})
    else:  # the coordinator keeps a few thousand entries: beyond, the groups go as one digest
        agreed["param_groups digest"] = hashlib.sha256("\n".join(groups).encode()).hexdigest()
    return agreed


class ZeroOptimizer(torch.optim.Optimizer):
    """The sharded Adam/AdamW: each rank updates its shard of the fp32 state, inside zerod.

    param_groups are the torch optimizer's (the one given to zt.shard, or the one the string form
    built), read at every step: lr, betas, eps and weight_decay of each group, so torch's LR
    schedulers (and anything else that edits param_groups) work. zero_grad(set_to_none) follows
    torch: a parameter no rank gave a gradient since the last zero_grad(set_to_none=True) is not
    stepped (no weight decay, no moment decay, its step count kept). state_dict() holds this
    rank's shard of the optimizer state; load it into the same rank of a job of the same world
    size and stage (zt.save / zt.load reshard)."""

    def __init__(self, runtime, source, decoupled):
        self._runtime = runtime
        self._decoupled = decoupled
        self._adding = True
        # torch's constructor sets up what its machinery needs (hooks, profiling names); the
        # groups are then the source's own list, so both objects see every change.
        super().__init__([p for g in source.param_groups for p in g["params"]], source.defaults)
        self._adding = False
        self.param_groups = source.param_groups
        self.defaults = source.defaults
        self.last_grad_norm = 0.0
        self.last_step_applied = True
        self._index = {id(e.param): e.index for e in runtime.trainable}
        self._tensor_group = None
        self._map_groups()

    def _map_groups(self):
        """Each layout tensor's group (-1: in none), for the engine."""
        groups = [-1] * len(self._runtime.trainable)
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                index = self._index.get(id(p))
                if index is not None:
                    groups[index] = gi
        self._tensor_group = (ctypes.c_int32 * max(1, len(groups)))(*groups)

    def add_param_group(self, param_group):
        if self._adding:
            super().add_param_group(param_group)
            return
        params = param_group.get("params") if isinstance(param_group, dict) else None
        params = [params] if isinstance(params, torch.Tensor) else list(params or [])
        for p in params:
            if id(p) not in self._index:
                raise ZerodError(FAILED_PRECONDITION, (
                    f"zerod: add_param_group: a tensor of shape {tuple(p.shape)} is not a "
                    "trainable parameter of the sharded module; zerod holds and steps only the "
                    "parameters zt.shard sharded (trainable parameters left out of the optimizer "
                    "given to zt.shard can be added later)"))
        super().add_param_group(param_group)  # torch's checks: duplicates, defaults
        group_config(self.param_groups[-1], len(self.param_groups) - 1, self._decoupled)
        self._map_groups()

    @property
    def loss_scale(self):
        return self._runtime.session.loss_scale()

    def backward(self, loss):
        """loss.backward() with the loss multiplied by the loss scale (needed with fp16)."""
        rt = self._runtime
        if rt.loss_scaling:
            rt.backward.scaled = True
            loss = loss * rt.session.loss_scale()
        loss.backward()

    def _configs(self):
        flat = []
        for gi, group in enumerate(self.param_groups):
            flat.extend(group_config(group, gi, self._decoupled))
        return (ctypes.c_double * max(1, len(flat)))(*flat)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        applied, norm, _ = self._runtime.step(self._configs(), self._tensor_group)
        self.last_step_applied = applied
        self.last_grad_norm = norm
        return loss

    def zero_grad(self, set_to_none=TORCH_SET_TO_NONE):
        """torch's zero_grad: between backward and step it discards what backward gave."""
        self._runtime.zero_grad(bool(set_to_none))

    # ---- state dict ----------------------------------------------------------------------------

    def _groups_out(self):
        out, index = [], {}
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [index.setdefault(id(p), len(index)) for p in group["params"]]
            out.append(packed)
        return out

    def state_dict(self):
        """{"state": {"zerod": this rank's shard}, "param_groups": torch's groups (params as
        indices)}. The shard: the elements this rank holds (model coordinates), Adam's moments
        (and the fp32 master with bf16/fp16 parameters), each tensor's step count (counters'
        tensor_steps, in the order of "tensors", with their "shapes"), the loss scale, and each
        group's parameters by name ("param_names"), which load_state_dict checks."""
        rt = self._runtime
        info = rt.session.state_info()
        entries = sorted(rt.trainable, key=lambda e: e.index)
        shard = {"format": STATE_FORMAT, "rank": rt.info["rank"],
                 "world_size": rt.info["world_size"], "stage": rt.stage,
                 "dtype": rt.dtype_name, "runs": [tuple(r) for r in info["runs"]],
                 "counters": info["counters"],
                 "tensors": [e.name for e in entries],
                 "shapes": [list(rt.shapes[e.index]) for e in entries],
                 "param_names": self.param_names()}
        for name in _held_state(rt.dtype_name):
            values = torch.empty(info["numel"], dtype=torch.float32)
            rt.session.read_state(_WHICH[name], values.data_ptr(), values.numel())
            shard[name] = values
        return {"state": {"zerod": shard}, "param_groups": self._groups_out()}

    def param_names(self):
        """Each group's parameters by name: the layout's name for those zerod holds, the
        module's for frozen ones."""
        names = {id(e.param): e.name for e in self._runtime.trainable}
        for name, p in self._runtime.model.named_parameters():
            names.setdefault(id(p), name)
        return [[names.get(id(p), f"a tensor of shape {tuple(p.shape)}") for p in g["params"]]
                for g in self.param_groups]

    def load_state_dict(self, state_dict):
        """The hyperparameters of every group, and this rank's shard (a collective at stages 1-2:
        every rank calls it). Everything is checked before anything changes."""
        groups, shard = self._checked(state_dict)
        rt = self._runtime
        for name in _held_state(rt.dtype_name):
            values = shard[name].to(torch.float32).contiguous()
            rt.session.write_state(_WHICH[name], values.data_ptr(), values.numel())
        rt.session.finish_restore(shard["counters"])
        rt.engine_rewritten()
        for group, saved in zip(self.param_groups, groups):
            group.update({k: v for k, v in saved.items() if k != "params"})

    def _checked(self, state_dict):
        """(param_groups, shard) of a state dict that loads here, or ZerodError naming why not."""
        if not isinstance(state_dict, dict) or not isinstance(state_dict.get("state"), dict) or \
                not isinstance(state_dict.get("param_groups"), list):
            raise _load_error(INVALID_ARGUMENT, (
                "expected a dict from opt.state_dict() (with 'state' and 'param_groups')"))
        groups = state_dict["param_groups"]
        for gi, g in enumerate(groups):
            if not isinstance(g, dict) or not isinstance(g.get("params"), list):
                raise _load_error(INVALID_ARGUMENT, f"param_groups[{gi}] is not a dict with "
                                                    "'params' (a list)")
        sizes = [len(g["params"]) for g in groups]
        mine = [len(g["params"]) for g in self.param_groups]
        if sizes != mine:
            raise _load_error(INVALID_ARGUMENT, (
                f"the state dict has {len(groups)} parameter group(s) of {sizes} parameters; this "
                f"optimizer has {mine}"))
        shard = state_dict["state"].get("zerod")
        if not isinstance(shard, dict):
            raise _load_error(INVALID_ARGUMENT, (
                "the state dict holds no zerod shard (state['zerod']): load one from "
                "opt.state_dict() of a sharded optimizer, or resume with zt.load"))
        problem = _shard_problem(self, shard)
        if problem is not None:
            raise _load_error(FAILED_PRECONDITION, problem)
        for gi, (saved, mine) in enumerate(zip(groups, self.param_groups)):
            group_config({**mine, **{k: v for k, v in saved.items() if k != "params"}}, gi,
                         self._decoupled)
        return groups, shard


def _load_error(code, message):
    return ZerodError(code, f"opt.load_state_dict: {message}")


def _held_state(dtype_name):
    """The state tensors a shard holds: Adam's moments, and the fp32 master below fp32."""
    return ("exp_avg", "exp_avg_sq") + (("master",) if dtype_name != "fp32" else ())


def _runs_text(runs):
    shown = ", ".join(f"[{o}, {o + n})" for o, n in runs[:4])
    return shown + (f" and {len(runs) - 4} more runs" if len(runs) > 4 else "")


def _first_difference(saved, mine):
    """(index, saved item, my item) where two lists first differ (None past an end), or None."""
    for i in range(max(len(saved), len(mine))):
        a = saved[i] if i < len(saved) else None
        b = mine[i] if i < len(mine) else None
        if a != b:
            return i, a, b
    return None


def _shard_problem(opt, shard):
    """Why `shard` (opt.state_dict()["state"]["zerod"]) is not this rank's state of this model,
    plan and dtype, or None."""
    rt = opt._runtime
    info = rt.session.state_info()
    entries = sorted(rt.trainable, key=lambda e: e.index)
    if shard.get("format") != STATE_FORMAT:
        return (f"the shard has format {shard.get('format')!r}; this zerod reads format "
                f"{STATE_FORMAT}")
    saved = (shard.get("rank"), shard.get("world_size"), shard.get("stage"))
    here = (rt.info["rank"], rt.info["world_size"], rt.stage)
    if saved != here:
        return (f"the shard is rank {saved[0]} of {saved[1]} at stage {saved[2]}; this is rank "
                f"{here[0]} of {here[1]} at stage {here[2]}: each rank's state dict holds its own "
                "part of the optimizer state, so load the one this rank saved in a job of the "
                "same world size and stage (zt.save and zt.load reshard to any)")
    if shard.get("dtype") != rt.dtype_name:
        return (f"the shard was saved in {shard.get('dtype')} training; this job trains in "
                f"{rt.dtype_name}: load one saved with the same dtype, or resume with zt.load")
    differ = _first_difference(list(shard.get("tensors") or []), [e.name for e in entries])
    if differ is not None:
        return (f"tensor {differ[0]} is {differ[1]!r} in the shard; this model's is "
                f"{differ[2]!r}: it was saved from another model")
    if "shapes" in shard:
        mine = [list(rt.shapes[e.index]) for e in entries]
        differ = _first_difference([list(s) for s in shard["shapes"]], mine)
        if differ is not None:
            return (f"{entries[differ[0]].name!r} has shape {differ[1]} in the shard; this "
                    f"model's is {differ[2]}: it was saved from another model")
    runs, held = [tuple(r) for r in shard.get("runs") or []], [tuple(r) for r in info["runs"]]
    if runs != held:
        return (f"the shard holds elements {_runs_text(runs)} of the model; this rank holds "
                f"{_runs_text(held)}: it was saved by another model or plan")
    if "param_names" in shard:
        moved = group_difference(shard["param_names"], opt.param_names())
        if moved is not None:
            return f"the shard has {moved}"
    for name in _held_state(rt.dtype_name):
        values = shard.get(name)
        if values is None:
            return f"the shard holds no {name!r}"
        if not isinstance(values, torch.Tensor) or not values.is_floating_point() or \
                values.numel() != info["numel"]:
            got = f"{values.numel()} elements" if isinstance(values, torch.Tensor) else \
                f"a {type(values).__name__}"
            return f"{name!r} has {got}; this rank holds {info['numel']} floats"
    return _counters_problem(shard.get("counters"), len(entries))


_COUNTERS = ("applied_steps", "steps_taken", "clean_steps", "hysteresis_left")


def _counters_problem(counters, tensors):
    """Why the shard's counters would not restore (the engine's checks, before any change)."""
    if not isinstance(counters, dict):
        return "counters: not a dict"
    for key in _COUNTERS + ("loss_scale", "tensor_steps"):
        if key not in counters:
            return f"counters: {key!r} is missing"
    for key in _COUNTERS:
        if type(counters[key]) is not int or counters[key] < 0:
            return f"counters: {key} = {counters[key]!r} is not an integer >= 0"
    applied = counters["applied_steps"]
    if counters["steps_taken"] < applied:
        return (f"counters: steps_taken = {counters['steps_taken']} is below applied_steps = "
                f"{applied}")
    if not (_real(counters["loss_scale"]) or 0) > 0:
        return f"counters: loss_scale = {counters['loss_scale']!r} is not a number > 0"
    steps = counters["tensor_steps"]
    if not isinstance(steps, list) or len(steps) not in (0, tensors):
        count = len(steps) if isinstance(steps, list) else type(steps).__name__
        return f"counters: tensor_steps has {count} entries for {tensors} tensors"
    for i, n in enumerate(steps):
        if type(n) is not int or not 0 <= n <= applied:
            return f"counters: tensor_steps[{i}] = {n!r} is outside [0, {applied}]"
    return None


def group_difference(saved, mine):
    """Where saved groups of parameter names (a list per group) differ from `mine` as text
    ("'x' in param_groups[0]; this optimizer has it in param_groups[1]"), or None. Order within
    a group does not matter: hyperparameters are per group, state per parameter."""
    if not isinstance(saved, list) or not all(
            isinstance(g, list) and all(isinstance(n, str) for n in g) for g in saved):
        return "parameter names that are not a list of lists of names"

    theirs = {n: gi for gi, g in enumerate(saved) for n in g}
    ours = {n: gi for gi, g in enumerate(mine) for n in g}
    for name, gi in list(theirs.items()) + [(n, None) for n in ours if n not in theirs]:
        if ours.get(name) != gi:
            return (f"{name!r} in {_group_text(gi)}; this optimizer has it in "
                    f"{_group_text(ours.get(name))}")
    return None


def _group_text(index):
    return "no group" if index is None else f"param_groups[{index}]"


_WHICH = {"master": 0, "exp_avg": 1, "exp_avg_sq": 2}


_MODULE_SET_TO_NONE = inspect.signature(torch.nn.Module.zero_grad).parameters[
    "set_to_none"].default


def route_module_zero_grad(model, zero):
    """model.zero_grad() on the sharded module also reaches the gradients zerod holds, as it
    reaches p.grad in torch (between backward and step it discards them)."""
    plain = model.zero_grad

    def zero_grad(set_to_none=_MODULE_SET_TO_NONE):
        plain(set_to_none)
        zero.zero_grad(set_to_none)

    model.zero_grad = zero_grad


def delegate(source, zero):
    """The torch optimizer given to zt.shard acts as the one returned: its step, zero_grad,
    state_dict, load_state_dict and add_param_group are the ZeroOptimizer's (its own step would
    find no gradients, zerod holds them, and silently do nothing)."""

    def step(closure=None):
        # What an LR scheduler built on `source` before zt.shard counts (torch 1.x and 2.x).
        source._step_count = getattr(source, "_step_count", 0) + 1
        source._opt_called = True
        return zero.step(closure)

    step._with_counter = True
    step._wrapped_by_lr_sched = True
    source.step = step
    source.zero_grad = zero.zero_grad
    source.state_dict = zero.state_dict
    source.load_state_dict = zero.load_state_dict
    source.add_param_group = zero.add_param_group
