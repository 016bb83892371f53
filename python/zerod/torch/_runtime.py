"""The torch side of one rank: binds a module's parameters to the engine's memory and drives the
engine from torch's forward and backward.

- Stages 0-2: every trainable parameter is a view of the engine's parameter buffer (fp32, or the
  bf16/fp16 copy Adam writes); nothing moves in forward.
- Stage 3: a unit's parameters are views of a gather buffer while something needs them, and a
  placeholder of their shape otherwise (_units.py). A released parameter used by any torch call
  is an error naming it (_use_check.py). `zt.gathered(model)` gives the parameters of the units it
  covers a private copy for a block (`Units.materialize`).
- Backward: _backward.py hands the gradients to the engine, in an order every rank shares.
"""

import collections
import warnings

import torch

from zerod._native import ZerodError, FAILED_PRECONDITION
from zerod.torch._backward import Backward
from zerod.torch._memory import DTYPES, tensor_at
from zerod.torch._units import Units
from zerod.torch._use_check import sharded_parameter_class


def _cast_floats(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, tuple):
        return tuple(_cast_floats(v, dtype) for v in value)
    if isinstance(value, list):
        return [_cast_floats(v, dtype) for v in value]
    if isinstance(value, dict):
        return {k: _cast_floats(v, dtype) for k, v in value.items()}
    return value


class Runtime:
    def __init__(self, model, trainable, session, info, config):
        self.model = model
        self.trainable = trainable
        self.session = session
        self.info = info
        self.stage = info["stage"]
        self.dtype_name = info["param_dtype"]
        self.dtype = DTYPES[self.dtype_name]
        self.device = config["device"]
        self.accumulation = config["accumulation_steps"]
        self.accumulation_warning = config.get("accumulation_warning")
        self.loss_scaling = config["loss_scaling"]
        self.cast_inputs = config["cast_forward_inputs"] and self.dtype != torch.float32
        self.by_id = {id(e.param): e for e in trainable}
        # Shapes as the module made them: at stage 3 a released parameter holds a placeholder.
        self.shapes = [tuple(e.param.shape) for e in trainable]
        self.numels = [e.param.numel() for e in trainable]
        self.internal = 0  # > 0 while our own code runs (the use check skips it)
        self.closed = False  # the session is gone (zt.shutdown)
        self.exporting = False  # zt.full_state_dict is reading model.state_dict()
        self.loading = False  # zt.load_state_dict is writing buffers
        self.tensor_units = info["tensor_units"]  # layout index -> segment (= unit at stage 3)
        self.segment_size = collections.Counter(self.tensor_units)
        self.unit_entries = collections.defaultdict(list)
        for e in trainable:
            self.unit_entries[self.tensor_units[e.index]].append(e)
        base = torch.zeros((), dtype=self.dtype, device=self.device)
        # What a parameter holds where it has no values: its shape, one shared element.
        self.placeholders = [base.expand(shape) for shape in self.shapes]
        self.forward_depth = 0  # > 0 while model(...) runs
        self.versions = [0] * len(trainable)  # p._version when zerod last set the parameter
        self.owner = None  # keeps the session's memory alive while a view of it exists
        self.optimizer = None  # the ZeroOptimizer zt.shard returned
        self.units = None  # stage 3: Units, once bound
        self.backward = Backward(self)
        self._accumulators = []  # AccumulateGrad nodes: the hooks live as long as they do
        self._hook_handles = []

    # ---- binding -------------------------------------------------------------------------------

    def bind(self):
        self.internal += 1
        try:
            self._bind()
        finally:
            self.internal -= 1

    def _bind(self):
        if self.stage == 3:
            self.units = Units(self)
        for e in self.trainable:
            e.param.grad = None
            # The AccumulateGrad node records the parameter's shape and dtype when it is made,
            # and torch drops it when the data's dtype changes: so the parameter first takes the
            # engine's dtype (an expanded scalar: no memory), then the node is made and kept
            # alive with its hook, then the data becomes the engine's (or a placeholder).
            if e.param.dtype != self.dtype:
                e.param.data = self.placeholder(e)
            acc = e.param.expand_as(e.param).grad_fn.next_functions[0][0]
            acc.register_hook(self.backward.grad_hook(e))
            self._accumulators.append(acc)
            if self.stage < 3:
                self._point(e, self.session.param(e.index))
            else:
                e.param.data = self.placeholder(e)
                self.versions[e.index] = e.param._version
        if self.stage == 3:
            for unit, entries in self.unit_entries.items():
                name = entries[0].unit
                module = self.model.get_submodule(name) if name else self.model
                pre = module.register_forward_pre_hook(self.units.pre_forward(unit))
                # First of the module's pre-hooks: weight_norm's and spectral_norm's compute the
                # weight from parameters that must be gathered already.
                module._forward_pre_hooks.move_to_end(pre.id, last=False)
                self._hook_handles.append(pre)
                self._hook_handles.append(module.register_forward_hook(
                    self.units.post_forward(unit, self.backward)))
            checked = sharded_parameter_class(self)
            for e in self.trainable:
                e.param.__class__ = checked
        original = self.model.forward
        runtime = self

        def forward(*args, **kwargs):
            return runtime.forward(original, args, kwargs)

        self.model.forward = forward

    def placeholder(self, e):
        return self.placeholders[e.index]

    def _point(self, e, address):
        view = tensor_at(address, self.numels[e.index], self.dtype_name, self.device, self.owner)
        e.param.data = view.view(self.shapes[e.index])
        self.versions[e.index] = e.param._version
        return view

    def detach(self, keep_parameters):
        """The job was left: parameters stop pointing into the session's memory (a copy below
        stage 3 when `keep_parameters`), and the runtime lets go of the memory's owner, so the
        memory goes when the last other view of it does (a state_dict() taken earlier)."""
        self.closed = True
        self.internal += 1  # stage 3's parameters keep their class: a later use names the cause
        for handle in self._hook_handles:
            handle.remove()
        self.owner = None
        with torch.no_grad():
            for e in self.trainable:
                if self.stage < 3 and keep_parameters:
                    e.param.data = e.param.data.clone()
                else:
                    e.param.data = self.placeholder(e)
        if self.units is not None:
            self.units.held.clear()
            self.units.materialized.clear()
        self.internal -= 1

    def engine_rewritten(self):
        """The engine's parameters were set (zt.load_state_dict, zt.load): it dropped every
        gathered unit, and below stage 3 the views stay where they were."""
        if self.units is not None:
            self.units.forget()

    def has_values(self, e):
        """Whether a stage-3 parameter holds its values now."""
        return self.units is None or self.units.has_values(e)

    @property
    def units_running(self):
        return self.units is not None and self.units.running > 0

    # ---- forward -------------------------------------------------------------------------------

    def forward(self, original, args, kwargs):
        if self.closed:
            if self.stage == 3:
                raise ZerodError(FAILED_PRECONDITION, (
                    "zerod: the module was sharded at stage 3 and its job was left (zt.shutdown): "
                    "its parameters lived in zerod; take zt.full_state_dict(model) before leaving"))
            return original(*args, **kwargs)
        self.backward.settle()
        self.check_parameters()
        if self.cast_inputs:
            args, kwargs = _cast_floats(args, self.dtype), _cast_floats(kwargs, self.dtype)
        self.forward_depth += 1
        try:
            if self.units is None:
                return original(*args, **kwargs)
            with self.units.saved_tensors_hooks():
                return original(*args, **kwargs)
        finally:
            self.forward_depth -= 1

    def check_parameters(self):
        """A parameter added (or made trainable) after zt.shard would silently not train."""
        count = 0
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                if id(p) in self.by_id:
                    raise ZerodError(FAILED_PRECONDITION, (
                        f"zerod: parameter '{name}' was frozen after zt.shard (requires_grad=False)"
                        "; freeze parameters before zt.shard"))
                continue
            if id(p) not in self.by_id:
                raise ZerodError(FAILED_PRECONDITION, (
                    f"zerod: parameter '{name}' was added (or made trainable) after zt.shard; it "
                    "would not be trained: build the whole model before zt.shard"))
            count += 1
        return count

    # ---- step ----------------------------------------------------------------------------------

    def step(self, configs, tensor_group):
        """One optimizer step: `configs` and `tensor_group` as Session.step_groups takes them."""
        self.backward.settle()
        if self.backward.running:
            raise ZerodError(FAILED_PRECONDITION, "zerod: opt.step() during backward")
        if self.units is not None and self.units.materialized:
            raise ZerodError(FAILED_PRECONDITION, (
                "zerod: opt.step() inside zt.gathered(model): the block holds copies of the "
                "parameters that the step would leave stale; step after the block"))
        micro_steps = self.backward.micro_steps
        if micro_steps not in (0, self.accumulation):
            raise ZerodError(FAILED_PRECONDITION, (
                f"zerod: opt.step() after {micro_steps} backward pass(es); expected "
                f"{self.accumulation} (gradient_accumulation_steps)"))
        self.warn_accumulation()
        if self.units is not None:
            self.units.release_all()
            self.units.drain()
        for e in self.trainable:
            self.check_unchanged(e, "since the last step")
        result = self.session.step_groups(configs, tensor_group)
        if self.units is not None:
            self.units.forget()
        self.backward.micro_steps = 0
        return result

    def zero_grad(self, set_to_none):
        """torch's optimizer.zero_grad: discards the gradients of the backward passes since the
        last step (the engine holds them), and with set_to_none forgets which parameters had
        one, as torch's grads set to None are."""
        self.backward.settle()
        if self.backward.running:
            raise ZerodError(FAILED_PRECONDITION, "zerod: opt.zero_grad() during backward")
        if self.closed:
            return
        self.session.zero_grad(set_to_none)
        self.backward.micro_steps = 0
        self.backward.scaled = False
        for e in self.trainable:
            e.param.grad = None  # gradients live in zerod's buffers; torch holds none

    def warn_accumulation(self):
        """Once, at the first step with gradient accumulation and no accumulation_reduction
        given: zerod averages over the micro-steps, which code that divides its loss by their
        number (plain torch's habit) would do twice."""
        if self.accumulation_warning is None:
            return
        warnings.warn(self.accumulation_warning, stacklevel=4)
        self.accumulation_warning = None

    def check_unchanged(self, e, when):
        """An in-place change to a parameter (p.clamp_(), p.copy_()) that zerod would silently
        lose: at stage 3 it touches a gathered copy or a placeholder, with bf16/fp16 it touches
        the 16-bit copy and Adam's fp32 master overwrites it. (In fp32 below stage 3 the
        parameter is the master itself, so the change stays and is allowed.)"""
        if self.stage < 3 and self.dtype == torch.float32:
            return
        if e.param._version != self.versions[e.index]:
            self.versions[e.index] = e.param._version
            raise ZerodError(FAILED_PRECONDITION, (
                f"zerod: parameter '{e.name}' was changed in place {when}; at stage "
                f"{self.stage} with {self.dtype_name} zerod's fp32 master copy is the parameter, "
                "so the change would be lost: load new values with zt.load_state_dict"))
