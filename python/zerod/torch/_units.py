"""Stage 3: when a gather unit's parameters hold values, and for how long the engine keeps them.

A unit is gathered when a tensor of it is needed (its module's forward, a saved activation that
backward unpacks, zt.gathered) and released when nothing refers to it any more: every tensor over
a gathered unit's memory holds the unit's lease (through the buffer object torch keeps alive),
and the engine releases the unit once the lease is gone, as FSDP frees an unsharded parameter
when its last use is over. So whatever order autograd, a checkpoint's recomputation, a module
called twice or zt.gathered asks for units in, a unit in use is never overwritten, and a buffer is
free again as soon as nothing needs its unit. The engine keeps max_live_units buffers and takes
one more while every one holds a unit in use (ZeroEngine::Gather).

Between uses a parameter holds a placeholder of its full shape (an expanded scalar: p.shape and
p.numel() are the module's, no memory). In model(...) a saved_tensors_hooks pair stores an
activation that is a view of a gathered parameter (or the parameter) as (parameter, geometry), so
backward rebuilds it, gathering the unit again, rather than keeping the unit from forward to
backward. Inside a checkpointed region the checkpoint's own hooks take over: nothing is saved in
forward, and the recomputed views hold their unit until backward has used them. Where no hook of
ours saw an activation (a unit called outside model(...), a reentrant checkpoint's recomputation),
autograd may hold the parameter itself and read its data when backward runs: so a unit's
parameters are gathered again when its outputs' gradients arrive, and keep their values until
every one of them has its gradient.
"""

import weakref

import torch

from zerod.torch._backward import inside_function_backward
from zerod.torch._memory import storage_key, tensor_at
from zerod.torch._use_check import tensors_in


class _Lease:
    """Lives as long as a tensor over a gathered unit's memory (or the runtime holding the
    session's memory, through `owner`): its end queues the unit for release."""

    __slots__ = ("unit", "ended", "owner", "__weakref__")

    def __init__(self, unit, ended, owner):
        self.unit = unit
        self.ended = ended
        self.owner = owner

    def __del__(self):
        self.ended.append(self.unit)  # any thread, at any point: the runtime releases later


class SavedParameter:
    """A saved activation that is a view of a gathered parameter, by reference."""

    __slots__ = ("entry", "size", "stride", "offset")

    def __init__(self, entry, t):
        self.entry = entry
        self.size = t.size()
        self.stride = t.stride()
        self.offset = t.storage_offset()


class Units:
    def __init__(self, rt):
        self.rt = rt
        self.held = set()  # units whose parameters are views of gathered memory now
        self.materialized = set()  # units whose parameters zt.gathered copied out
        self.live = {}  # storage address -> entry, for the parameters' gathered views
        self.requested = set()  # units the engine holds for us (Gather without Release yet)
        self.leases = {}  # unit -> weakref to its lease
        self.ended = []  # units whose lease ended, not released yet
        self.running = 0  # unit forwards running now (a recompute's included)
        self.gathered_hooks = []  # saved-tensor hooks entered by zt.gathered blocks open now

    def has_values(self, e):
        unit = self.rt.tensor_units[e.index]
        return unit in self.held or unit in self.materialized

    # ---- gather and release --------------------------------------------------------------------

    def gather(self, unit):
        if unit in self.held or unit in self.materialized:
            return
        rt = self.rt
        rt.internal += 1
        try:
            for e in rt.unit_entries[unit]:
                rt.check_unchanged(e, "while its unit was released")
            self.drain()
            lease = self._lease(unit)
            rt.session.gather(unit)
            self.requested.add(unit)
            for e in rt.unit_entries[unit]:
                view = tensor_at(rt.session.param(e.index), rt.numels[e.index], rt.dtype_name,
                                 rt.device, lease)
                e.param.data = view.view(rt.shapes[e.index])
                rt.versions[e.index] = e.param._version
                self.live[storage_key(view)] = e
            self.held.add(unit)
        finally:
            rt.internal -= 1

    def _lease(self, unit):
        ref = self.leases.get(unit)
        lease = ref() if ref is not None else None
        if lease is None:
            lease = _Lease(unit, self.ended, self.rt.owner)
            self.leases[unit] = weakref.ref(lease)
        return lease

    def release(self, unit):
        """The parameters let go of the unit's memory; the engine releases it once no other
        tensor refers to it (drain)."""
        if unit not in self.held:
            return
        rt = self.rt
        rt.internal += 1
        try:
            for e in rt.unit_entries[unit]:
                rt.check_unchanged(e, "while its unit was gathered")
            for e in rt.unit_entries[unit]:
                self.live.pop(storage_key(e.param), None)
                e.param.data = rt.placeholder(e)
                rt.versions[e.index] = e.param._version
            self.held.discard(unit)
        finally:
            rt.internal -= 1

    def release_all(self):
        for unit in list(self.held):
            self.release(unit)

    def drain(self):
        """Releases in the engine every unit whose lease ended (on the trainer's thread, where
        the engine is driven: a lease may end on any thread, inside any torch call)."""
        ended = []
        while self.ended:
            ended.append(self.ended.pop())
        done = [u for u in set(ended) if u in self.requested and self._alive(u) is None]
        if not done:
            return
        if self.rt.device.type == "cuda":
            # Kernels torch queued may still read the units: their buffers must outlive them.
            torch.cuda.current_stream(self.rt.device).synchronize()
        for unit in done:
            self.requested.discard(unit)
            self.rt.session.release(unit)

    def _alive(self, unit):
        ref = self.leases.get(unit)
        return ref() if ref is not None else None

    def forget(self):
        """The engine dropped every gathered unit (a step, a restore): leases still alive refer
        to memory the engine may reuse, so nothing may be read through them any more."""
        self.release_all()
        self.requested.clear()
        self.leases.clear()
        self.ended.clear()

    # ---- forward hooks -------------------------------------------------------------------------

    def pre_forward(self, unit):
        def hook(module, inputs):
            self.gather(unit)
            self.running += 1
        return hook

    def post_forward(self, unit, backward):
        """Releases the unit, and on its outputs' gradients gathers it again for backward (until
        every parameter of it has its gradient): an activation saved without our hooks (a unit
        called outside model(...), a reentrant checkpoint's recomputation) may be the parameter
        itself, whose data backward reads when it runs. A recomputation in backward keeps the
        unit until its gradients are in."""
        def hook(module, inputs, output):
            self.running -= 1
            if torch.is_grad_enabled():
                for t in tensors_in(output):
                    if t.requires_grad:
                        t.register_hook(backward.pre_backward(unit))
            if not (backward.running or inside_function_backward()):
                self.release(unit)
        return hook

    # ---- saved activations ---------------------------------------------------------------------

    def pack(self, t):
        if not (self.live or self.materialized):
            return t
        rt = self.rt
        rt.internal += 1
        try:
            if t.layout != torch.strided:
                return t
            e = self.live.get(storage_key(t))
            if e is None and self.materialized:
                # A parameter holding zt.gathered's copy: the copy goes at the block's end.
                e = rt.by_id.get(id(t))
            return t if e is None else SavedParameter(e, t)
        finally:
            rt.internal -= 1

    def unpack(self, saved):
        """Backward's view of a saved parameter: it holds the unit (gathered again if it must)
        until autograd has used it; the parameter itself keeps its placeholder."""
        if not isinstance(saved, SavedParameter):
            return saved
        rt = self.rt
        e = saved.entry
        rt.internal += 1
        try:
            unit = rt.tensor_units[e.index]
            if unit in self.held or unit in self.materialized:
                base = e.param.data
            else:
                self.drain()
                lease = self._lease(unit)
                rt.session.gather(unit)
                self.requested.add(unit)
                base = tensor_at(rt.session.param(e.index), rt.numels[e.index], rt.dtype_name,
                                 rt.device, lease)
            return base.as_strided(saved.size, saved.stride, saved.offset)
        finally:
            rt.internal -= 1

    def saved_tensors_hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    # ---- zt.gathered ---------------------------------------------------------------------------

    def materialize(self, units):
        """Gives the parameters of `units` a private copy of their values, one unit through the
        gather buffers at a time, until `unmaterialize`. Units a running forward holds keep their
        gathered views."""
        hooks = self.saved_tensors_hooks()
        hooks.__enter__()
        self.gathered_hooks.append(hooks)
        rt = self.rt
        done = []
        rt.internal += 1
        try:
            for unit in units:
                if unit in self.held or unit in self.materialized:
                    continue
                self.gather(unit)
                for e in rt.unit_entries[unit]:
                    view = e.param.data
                    self.live.pop(storage_key(view), None)
                    e.param.data = view.clone()
                    rt.versions[e.index] = e.param._version
                self.held.discard(unit)
                self.materialized.add(unit)
                done.append(unit)
        except BaseException:
            self.unmaterialize(done, check=False)
            raise
        finally:
            rt.internal -= 1
        return done

    def unmaterialize(self, units, check=True):
        """The end of a zt.gathered block: its copies go (views of them that the program kept stay
        valid: they hold the copy). Returns a parameter changed in place (which would be lost)."""
        self.gathered_hooks.pop().__exit__(None, None, None)
        rt = self.rt
        rt.internal += 1
        changed = None
        try:
            for unit in units:
                self.materialized.discard(unit)
                for e in rt.unit_entries[unit]:
                    if changed is None and e.param._version != rt.versions[e.index]:
                        changed = e
                    e.param.data = rt.placeholder(e)
                    rt.versions[e.index] = e.param._version
        finally:
            rt.internal -= 1
        return changed if check else None

