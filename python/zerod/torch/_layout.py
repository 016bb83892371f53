"""What zt.shard sends to the coordinator: the module's trainable parameters, in the order the
plan lays them out, and (stage 3) the gather unit each belongs to.

A parameter belongs to the module(s) that hold it as an attribute. Its gather unit is the nearest
enclosing module that the `units` rule accepts (by default every module that holds parameters
itself); a parameter held by several modules (tied weights) goes to the innermost module that
encloses all of them, so the unit is gathered for every forward that uses it. Parameters of one
unit are consecutive in the layout (the plan forms a unit from a run of tensors with one label),
units in the order of the module tree.
"""

import collections

import torch

from zerod._native import INVALID_ARGUMENT, ZerodError

ROOT_UNIT = "<root>"


class TrainableParameter:
    __slots__ = ("index", "name", "param", "owners", "unit")

    def __init__(self, name, param):
        self.index = -1  # position in the layout, once ordered
        self.name = name  # first qualified name, as model.named_parameters() gives it
        self.param = param
        self.owners = []  # qualified names of the modules that hold it
        self.unit = ""  # qualified name of its unit module ("" = the root)


def _common_prefix(names):
    """The innermost module enclosing every module named (qualified names, "" = root)."""
    split = [n.split(".") if n else [] for n in names]
    common = []
    for parts in zip(*split):
        if all(p == parts[0] for p in parts):
            common.append(parts[0])
        else:
            break
    return ".".join(common)


def _inside_attention(name, modules):
    """Whether an enclosing module (not the module itself) is an nn.MultiheadAttention."""
    parts = name.split(".")[:-1] if name else None
    while parts is not None:
        if isinstance(modules.get(".".join(parts)), torch.nn.MultiheadAttention):
            return True
        if not parts:
            return False
        parts.pop()
    return False


def _bad_units(message):
    return ZerodError(INVALID_ARGUMENT, f"zt.shard: units={message}")


_UNITS_TAKES = ("units= takes a module class or class name, a set of them, or a "
                "callable(name, module) -> bool")


def _classes_rule(units, modules):
    """A rule from module classes and class names (as accelerate's
    transformer_layer_cls_to_wrap): each must name a class some module of the model has, so a
    misspelt name is an error rather than one unit for everything."""
    items = [units] if isinstance(units, (type, str)) else units
    try:
        items = list(items)
    except TypeError:
        raise _bad_units(f"{units!r}: {_UNITS_TAKES}") from None
    if not items:
        raise _bad_units(f"{units!r} is empty: {_UNITS_TAKES}")
    classes, names = [], set()
    for item in items:
        if isinstance(item, str):
            names.add(item)
        elif isinstance(item, type) and issubclass(item, torch.nn.Module):
            classes.append(item)
        else:
            raise _bad_units(f"{units!r}: {item!r} is neither a module class nor a class name; "
                             f"{_UNITS_TAKES}")
    classes = tuple(classes)
    present = list(dict.fromkeys(type(m).__name__ for m in modules.values()))
    missing = [n for n in sorted(names) if n not in present]
    missing += [c.__name__ for c in classes
                if not any(isinstance(m, c) for m in modules.values())]
    if missing:
        raise _bad_units(f"{units!r}: no module of the model is a {', '.join(missing)} (its "
                         f"module classes: {', '.join(present)})")
    return lambda name, module: isinstance(module, classes) or type(module).__name__ in names


def _blocks(modules):
    """The model's blocks: the innermost modules repeated in a container (two or more children of
    one class in an nn.ModuleList or nn.Sequential, such as a transformer's layers or a ResNet
    stage's blocks) that hold modules with parameters themselves. Qualified names."""
    # Modules with a descendant that holds parameters itself: every ancestor of such a module.
    above_parameters = set()
    for name, module in modules.items():
        if len(module._parameters) > 0 and name:
            parts = name.split(".")
            above_parameters.update(".".join(parts[:i]) for i in range(1, len(parts)))

    def holds_parameters(name):
        return name in above_parameters

    candidates = set()
    for name, module in modules.items():
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        classes = collections.Counter(type(child) for child in module.children())
        for child_name, child in module.named_children():
            qualified = f"{name}.{child_name}" if name else child_name
            if classes[type(child)] > 1 and holds_parameters(qualified):
                candidates.add(qualified)
    return {c for c in candidates if not any(o.startswith(c + ".") for o in candidates)}


def _inside(name, enclosing):
    return any(name.startswith(b + ".") for b in enclosing)


def _unit_rule(units, modules):
    """units: None (_default_rule), module classes or class names (_classes_rule), or a
    callable(name, module) -> bool. `modules`: the model's modules by qualified name."""
    if units is None:
        return _default_rule(modules)
    if callable(units) and not isinstance(units, type):
        return units
    return _classes_rule(units, modules)


def _default_rule(modules):
    """Each block (_blocks) is one unit, as FSDP users wrap each transformer layer: a block's
    forward (or its checkpoint's recomputation) gathers once. Outside blocks, every module that
    holds parameters is a unit; but a module whose forward uses its children's parameters directly
    keeps them: nn.MultiheadAttention reads out_proj.weight without calling out_proj."""
    blocks = _blocks(modules)

    def default(name, module):
        if name in blocks:
            return True
        if _inside(name, blocks):
            return False
        if isinstance(module, torch.nn.MultiheadAttention):
            return True
        return len(module._parameters) > 0 and not _inside_attention(name, modules)
    return default


def collect(model, units=None):
    """Returns (trainable, frozen): trainable TrainableParameter in layout order, frozen the
    (name, parameter) pairs that stay as they are."""
    modules = dict(model.named_modules())
    by_id = collections.OrderedDict()
    frozen = []
    seen_frozen = set()
    for module_name, module in modules.items():
        for attr, p in module._parameters.items():
            if p is None:
                continue
            qualified = f"{module_name}.{attr}" if module_name else attr
            if not p.requires_grad:
                if id(p) not in seen_frozen:
                    seen_frozen.add(id(p))
                    frozen.append((qualified, p))
                continue
            entry = by_id.get(id(p))
            if entry is None:
                entry = by_id[id(p)] = TrainableParameter(qualified, p)
            entry.owners.append(module_name)

    accept = _unit_rule(units, modules)
    order = {name: i for i, name in enumerate(modules)}

    def unit_of(module_name):
        # The nearest enclosing module the rule accepts; the root when none does.
        parts = module_name.split(".") if module_name else []
        while parts:
            name = ".".join(parts)
            if accept(name, modules[name]):
                return name
            parts.pop()
        return ""

    for entry in by_id.values():
        unit_names = [unit_of(owner) for owner in entry.owners]
        entry.unit = unit_names[0] if len(set(unit_names)) == 1 else _common_prefix(unit_names)
        # The common prefix of tied owners may not be a unit the rule accepts: go outwards.
        if entry.unit and not accept(entry.unit, modules[entry.unit]):
            entry.unit = unit_of(entry.unit)

    trainable = list(by_id.values())
    # Stable: parameters keep their order inside a unit; units follow the module tree.
    trainable.sort(key=lambda e: order[e.unit])
    for i, entry in enumerate(trainable):
        entry.index = i
    return trainable, frozen


def unit_label(unit):
    return unit if unit else ROOT_UNIT


def nesting_depth(trainable):
    """The most units that enclose one another (a root unit around a layer's unit is 2)."""
    names = {e.unit for e in trainable}
    depth = 1
    for name in names:
        enclosing = [o for o in names if o != name and (o == "" or name.startswith(o + "."))]
        depth = max(depth, 1 + len(enclosing))
    return depth
