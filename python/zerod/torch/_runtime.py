"""The torch side of one rank: binds a module's parameters to the engine's memory and drives the
engine from torch's forward and backward.

- Stages 0-2: every trainable parameter is a view of the engine's parameter buffer (fp32, or the
  bf16/fp16 copy Adam writes); nothing moves in forward.
- Stage 3: a unit's parameters are views of a gather buffer from the unit's forward pre-hook to
  its forward hook, and again from the first gradient of its outputs until every one of its
  parameters has its gradient; otherwise each holds an empty placeholder (no memory). Saved
  activations that are views of a gathered parameter are packed as (parameter, geometry) and
  rebuilt from the parameter when backward needs them, since the gather buffer they pointed to may
  hold another unit by then (gathering again if it must). A released parameter used by any torch
  call is an error naming it (_use_check.py). `zt.gathered(model)` gives the parameters of the
  units it covers a private copy for a block (`materialize`), so that code outside model(...) can
  read them; the parameter itself, if saved for backward, is packed by reference like a gathered
  view, so the copy goes when the block ends.
- Gradients: a hook on each parameter's AccumulateGrad node fires once per backward, after every
  use has contributed; the gradient goes to the engine as fp32 (whole segments at stages 2-3, so
  a bucket fills at a time) and p.grad is cleared. At the end of backward, parameters that got
  no gradient are given to the engine as having none (zeros in the reduction, so every rank
  reduces the same tensors in the same order; a tensor no rank gave one is not stepped).
"""

import collections
import warnings

import torch
from torch.autograd.graph import saved_tensors_hooks

from zerod._native import ZerodError, FAILED_PRECONDITION
from zerod.torch._memory import DTYPES, storage_key, tensor_at

from zerod.torch._use_check import sharded_parameter_class, tensors_in


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


class _SavedParameter:
    """A saved activation that is a view of a gathered parameter, by reference."""

    __slots__ = ("entry", "size", "stride", "offset")

    def __init__(self, entry, t):
        self.entry = entry
        self.size = t.size()
        self.stride = t.stride()
        self.offset = t.storage_offset()


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
        self.placeholder = torch.empty(0, dtype=self.dtype, device=self.device)
        self.held = set()  # stage 3: units gathered for torch
        self.materialized = set()  # stage 3: units whose parameters zt.gathered copied out
        self.live = {}  # stage 3: storage address -> entry, for gathered parameters
        self.saved_hooks = []  # saved-tensor hooks entered by units running now
        self.forward_depth = 0  # > 0 while model(...) runs
        self.gathered_hooks = []  # saved-tensor hooks entered by zt.gathered blocks open now
        self.versions = [0] * len(trainable)  # p._version when zerod last set the parameter
        self.owner = None  # keeps the session's memory alive while a view of it exists
        self.optimizer = None  # the ZeroOptimizer zt.shard returned
        self.micro_steps = 0
        self.scaled_backward = False  # the running backward's loss was multiplied by the scale
        self.keepalive = []  # fp32 gradients the device may still read (GPU)
        self._reset_backward()
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
        for e in self.trainable:
            e.param.grad = None
            # The AccumulateGrad node records the parameter's shape and dtype when it is made,
            # and torch drops it when the data's dtype changes: so the parameter first takes the
            # engine's dtype (an expanded scalar: no memory), then the node is made and kept
            # alive with its hook, then the data becomes the engine's (or a placeholder).
            if e.param.dtype != self.dtype:
                e.param.data = torch.zeros(1, dtype=self.dtype, device=self.device).expand(
                    self.shapes[e.index])
            acc = e.param.expand_as(e.param).grad_fn.next_functions[0][0]
            acc.register_hook(self._grad_hook(e))
            self._accumulators.append(acc)
            if self.stage < 3:
                self._point(e, self.session.param(e.index))
            else:
                e.param.data = self.placeholder
                self.versions[e.index] = e.param._version
        if self.stage == 3:
            for unit, entries in self.unit_entries.items():
                name = entries[0].unit
                module = self.model.get_submodule(name) if name else self.model
                pre = module.register_forward_pre_hook(self._pre_forward(unit))
                # First of the module's pre-hooks: weight_norm's and spectral_norm's compute the
                # weight from parameters that must be gathered already.
                module._forward_pre_hooks.move_to_end(pre.id, last=False)
                self._hook_handles.append(pre)
                self._hook_handles.append(module.register_forward_hook(self._post_forward(unit)))
            checked = sharded_parameter_class(self)
            for e in self.trainable:
                e.param.__class__ = checked
        original = self.model.forward
        runtime = self

        def forward(*args, **kwargs):
            return runtime.forward(original, args, kwargs)

        self.model.forward = forward

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
        while self.saved_hooks:
            self.saved_hooks.pop().__exit__(None, None, None)
        self.owner = None
        with torch.no_grad():
            for e in self.trainable:
                if self.stage < 3 and keep_parameters:
                    e.param.data = e.param.data.clone()
                else:
                    e.param.data = self.placeholder
        self.materialized.clear()
        self.internal -= 1

    # ---- forward -------------------------------------------------------------------------------

    def forward(self, original, args, kwargs):
        if self.closed:
            if self.stage == 3:
                raise ZerodError(FAILED_PRECONDITION, (
                    "zerod: the module was sharded at stage 3 and its job was left (zt.shutdown): "
                    "its parameters lived in zerod; take zt.full_state_dict(model) before leaving"))
            return original(*args, **kwargs)
        self.check_parameters()
        if self.cast_inputs:
            args, kwargs = _cast_floats(args, self.dtype), _cast_floats(kwargs, self.dtype)
        self.forward_depth += 1
        try:
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

    def _pre_forward(self, unit):
        def hook(module, inputs):
            self.gather(unit)
            # While a unit runs, activations saved as views of its parameters are kept by
            # reference (whoever calls the unit: the root's forward, a container's user, a
            # checkpoint's recompute in backward, on any thread).
            hooks = saved_tensors_hooks(self._pack, self._unpack)
            hooks.__enter__()
            self.saved_hooks.append(hooks)
        return hook

    def _post_forward(self, unit):
        def hook(module, inputs, output):
            if self.saved_hooks:
                self.saved_hooks.pop().__exit__(None, None, None)
            if torch.is_grad_enabled():
                for t in tensors_in(output):
                    if t.requires_grad:
                        t.register_hook(self._pre_backward(unit))
            if not self.in_backward:  # a checkpoint's recompute: backward releases it
                self.release(unit)
        return hook

    def _pre_backward(self, unit):
        def hook(grad):
            self._start_backward(counts=False)
            if self.units_left[unit] > 0:
                self.gather(unit)
        return hook

    def has_values(self, e):
        """Whether a stage-3 parameter holds its values now (gathered, or copied by
        zt.gathered)."""
        unit = self.tensor_units[e.index]
        return unit in self.held or unit in self.materialized

    def gather(self, unit):
        if unit in self.held or unit in self.materialized:
            return
        self.internal += 1
        try:
            for e in self.unit_entries[unit]:
                self._check_unchanged(e, "while its unit was released")
            self.session.gather(unit)
            for e in self.unit_entries[unit]:
                view = self._point(e, self.session.param(e.index))
                self.live[storage_key(view)] = e
            self.held.add(unit)
        finally:
            self.internal -= 1

    def release(self, unit):
        if unit not in self.held:
            return
        self.internal += 1
        try:
            if self.device.type == "cuda":
                # Kernels torch queued may still read the unit: its buffer must outlive them.
                torch.cuda.current_stream(self.device).synchronize()
            for e in self.unit_entries[unit]:
                self._check_unchanged(e, "while its unit was gathered")
            self.session.release(unit)
            for e in self.unit_entries[unit]:
                self.live.pop(storage_key(e.param), None)
                e.param.data = self.placeholder
                self.versions[e.index] = e.param._version
            self.held.discard(unit)
        finally:
            self.internal -= 1

    def release_all(self):
        for unit in list(self.held):
            self.release(unit)

    def _pack(self, t):
        if not (self.live or self.materialized):
            return t
        self.internal += 1
        try:
            if t.layout != torch.strided:
                return t
            e = self.live.get(storage_key(t))
            if e is None and self.materialized:
                # A parameter holding zt.gathered's copy: the copy goes at the block's end.
                e = self.by_id.get(id(t))
            return t if e is None else _SavedParameter(e, t)
        finally:
            self.internal -= 1

    def _unpack(self, saved):
        if not isinstance(saved, _SavedParameter):
            return saved
        unit = self.tensor_units[saved.entry.index]
        self.gather(unit)  # normally gathered by the unit's backward hook already
        self.internal += 1
        try:
            return saved.entry.param.data.as_strided(saved.size, saved.stride, saved.offset)
        finally:
            self.internal -= 1

    # ---- zt.gathered ---------------------------------------------------------------------------

    def materialize(self, units):
        """Gives the parameters of `units` a private copy of their values, one unit through the
        gather buffers at a time, until `unmaterialize`. Units a running forward holds keep their
        gathered views."""
        hooks = saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self.gathered_hooks.append(hooks)
        done = []
        self.internal += 1
        try:
            for unit in units:
                if unit in self.held or unit in self.materialized:
                    continue
                self.gather(unit)
                for e in self.unit_entries[unit]:
                    view = e.param.data
                    self.live.pop(storage_key(view), None)
                    e.param.data = view.clone()
                    self.versions[e.index] = e.param._version
                if self.device.type == "cuda":
                    # The copies are queued on torch's stream: the buffer must outlive them.
                    torch.cuda.current_stream(self.device).synchronize()
                self.session.release(unit)
                self.held.discard(unit)
                self.materialized.add(unit)
                done.append(unit)
        except BaseException:
            self.unmaterialize(done, check=False)
            raise
        finally:
            self.internal -= 1
        return done

    def unmaterialize(self, units, check=True):
        """The end of a zt.gathered block: its copies go (views of them that the program kept stay
        valid: they hold the copy). A change made to a copy in place would be lost: an error."""
        self.gathered_hooks.pop().__exit__(None, None, None)
        self.internal += 1
        try:
            changed = None
            for unit in units:
                self.materialized.discard(unit)
                for e in self.unit_entries[unit]:
                    if changed is None and e.param._version != self.versions[e.index]:
                        changed = e
                    e.param.data = self.placeholder
                    self.versions[e.index] = e.param._version
        finally:
            self.internal -= 1
        if check and changed is not None and not self.closed:
            raise ZerodError(FAILED_PRECONDITION, (
                f"zerod: parameter '{changed.name}' was changed in place inside zt.gathered"
                "(model), which gathers for reading: the change would be lost (zerod's fp32 "
                "master copy is the parameter): load new values with zt.load_state_dict"))

    # ---- backward ------------------------------------------------------------------------------

    def _reset_backward(self):
        self.in_backward = False
        self.counted = False  # a parameter gradient arrived in this backward
        self.grad_seen = [False] * len(self.trainable)
        self.pending = collections.defaultdict(list)
        self.units_left = {u: len(es) for u, es in self.unit_entries.items()}

    def _start_backward(self, counts):
        """The first hook of a backward queues the end-of-backward callback. A micro-step starts
        with the first parameter gradient (`counts`), not with an output's gradient alone, which
        torch.autograd.grad(outputs, inputs) also produces."""
        if not self.in_backward:
            self.in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        if not counts or self.counted:
            return
        self.counted = True
        if self.micro_steps >= self.accumulation:
            raise ZerodError(FAILED_PRECONDITION, (
                f"zerod: backward number {self.micro_steps + 1} before opt.step(), with "
                f"gradient_accumulation_steps={self.accumulation}: call opt.step() after "
                f"{self.accumulation} backward pass(es)"))

    def _grad_hook(self, e):
        def hook(*unused):
            if self.closed:
                return  # after zt.shutdown the module trains as plain torch would
            grad = e.param.grad
            e.param.grad = None
            if grad is not None:
                self._start_backward(counts=True)
                self._deliver(e, grad)
        return hook

    def _deliver(self, e, grad):
        if self.grad_seen[e.index]:
            raise ZerodError(FAILED_PRECONDITION,
                             f"zerod: gradient of '{e.name}' given twice in one backward")
        self.grad_seen[e.index] = True
        g = None  # no gradient: the engine counts zeros, and the tensor as unused by this rank
        if grad is not None:
            g = grad.detach().to(dtype=torch.float32, memory_format=torch.contiguous_format)
            if self.loss_scaling and not self.scaled_backward:
                g = g * self.session.loss_scale()  # the engine unscales what it is given
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
        segment = self.tensor_units[e.index]
        if self.stage < 2:
            self._accumulate(e.index, g)
        else:
            waiting = self.pending[segment]
            waiting.append((e.index, g))
            if len(waiting) == self.segment_size[segment]:
                for index, gradient in waiting:
                    self._accumulate(index, gradient)
                del self.pending[segment]
        if self.stage == 3:
            self.units_left[segment] -= 1
            if self.units_left[segment] == 0:
                self.release(segment)

    def _accumulate(self, index, g):
        self.session.accumulate_grad(index, None if g is None else g.data_ptr())
        if self.device.type == "cuda" and g is not None:
            self.keepalive.append(g)  # the engine's stream may still read it

    def _end_backward(self):
        if not self.counted:  # no parameter gradient (torch.autograd.grad): no micro-step
            self.release_all()
            self._reset_backward()
            return
        # Parameters the graph did not reach have no gradient: every rank gives every tensor.
        for e in self.trainable:
            if not self.grad_seen[e.index]:
                self._deliver(e, None)
        self.release_all()
        if self.keepalive:
            self.session.synchronize()
            self.keepalive.clear()
        self.micro_steps += 1
        self.scaled_backward = False
        self._reset_backward()

    # ---- step ----------------------------------------------------------------------------------

    def step(self, configs, tensor_group):
        """One optimizer step: `configs` and `tensor_group` as Session.step_groups takes them."""
        if self.in_backward:
            raise ZerodError(FAILED_PRECONDITION, "zerod: opt.step() during backward")
        if self.materialized:
            raise ZerodError(FAILED_PRECONDITION, (
                "zerod: opt.step() inside zt.gathered(model): the block holds copies of the "
                "parameters that the step would leave stale; step after the block"))
        if self.micro_steps not in (0, self.accumulation):
            raise ZerodError(FAILED_PRECONDITION, (
                f"zerod: opt.step() after {self.micro_steps} backward pass(es); expected "
                f"{self.accumulation} (gradient_accumulation_steps)"))
        self.warn_accumulation()
        self.release_all()
        for e in self.trainable:
            self._check_unchanged(e, "since the last step")
        result = self.session.step_groups(configs, tensor_group)
        self.micro_steps = 0
        return result

    def zero_grad(self, set_to_none):
        """torch's optimizer.zero_grad: discards the gradients of the backward passes since the
        last step (the engine holds them), and with set_to_none forgets which parameters had
        one, as torch's grads set to None are."""
        if self.in_backward:
            raise ZerodError(FAILED_PRECONDITION, "zerod: opt.zero_grad() during backward")
        if self.closed:
            return
        self.session.zero_grad(set_to_none)
        self.micro_steps = 0
        self.scaled_backward = False
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

    def _check_unchanged(self, e, when):
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
