"""One micro-step's backward on the torch side: when it starts and ends, and the gradients it
hands to the engine.

- Gradients leave torch through a hook on each parameter's AccumulateGrad node, which fires once
  per backward after every use has contributed; the gradient goes to the engine as fp32 and
  p.grad is cleared.
- Order: at stages 2-3 a segment's gradients go to the engine together, and segments go in one
  fixed order (the last segment first, as backward usually reaches them), whatever order autograd
  produced them in. Every rank reduces every segment in that order, so ranks that used different
  parameters (a branch taken on some ranks only) still issue the same reduce-scatters; a segment
  that completes early waits here until the ones before it in the order have gone.
- End: a callback queued on autograd's engine at the first hook of the outermost backward runs
  when that backward ends: parameters that got no gradient are given to the engine as having
  none (zeros in the reduction, DDP's find_unused_parameters meaning; a tensor no rank gave one
  is not stepped, as torch skips a parameter whose grad is None), every waiting segment goes, and
  the micro-step is counted. A
  reentrant checkpoint runs a backward of its own inside the outer one; hooks that fire inside it
  neither queue the callback nor end the micro-step. When every hook of a backward fired inside
  such a nested backward, the micro-step ends at the next call into zerod (`settle`).
"""

import collections

import torch

from zerod._native import ZerodError, FAILED_PRECONDITION
from zerod.torch._frames import called_under

# A custom autograd Function's backward runs under this frame; a reentrant checkpoint's nested
# backward (torch.utils.checkpoint with use_reentrant=True) is called from one.
_FUNCTION_BACKWARD = getattr(getattr(getattr(torch.autograd.function, "BackwardCFunction", None),
                                     "apply", None), "__code__", None)


def inside_function_backward():
    """Whether the caller runs inside an autograd Function's backward (so inside a backward
    that is not over when a backward nested in it is)."""
    return called_under(_FUNCTION_BACKWARD, skip=1)


class Backward:
    def __init__(self, rt):
        self.rt = rt
        self.micro_steps = 0
        self.scaled = False  # the running backward's loss was multiplied by the loss scale
        self.keepalive = []  # fp32 gradients the device may still read (GPU)
        self.segments = rt.info["num_units"]
        self.reset()

    def reset(self):
        rt = self.rt
        self.running = False  # a backward has started and its micro-step is not over
        self.counted = False  # a parameter gradient arrived in it
        self.callback_queued = False  # the end callback is queued on the outermost backward
        self.grad_seen = [False] * len(rt.trainable)
        self.pending = collections.defaultdict(list)  # segment -> [(index, fp32 gradient)]
        self.complete = set()  # segments whose every gradient is pending
        self.next_segment = self.segments - 1  # the next segment the engine takes
        self.units_left = {u: len(es) for u, es in rt.unit_entries.items()}  # stage 3

    # ---- start and end -------------------------------------------------------------------------

    def start(self, counts):
        """Called by every hook. A micro-step starts with the first parameter gradient
        (`counts`), not with an output's gradient alone, which torch.autograd.grad(outputs,
        inputs) also produces."""
        self.running = True
        if not self.callback_queued and not inside_function_backward():
            torch.autograd.Variable._execution_engine.queue_callback(self.finish)
            self.callback_queued = True
        if not counts or self.counted:
            return
        self.counted = True
        accumulation = self.rt.accumulation
        if self.micro_steps >= accumulation:
            raise ZerodError(FAILED_PRECONDITION, (
                f"zerod: backward number {self.micro_steps + 1} before opt.step(), with "
                f"gradient_accumulation_steps={accumulation}: call opt.step() after "
                f"{accumulation} backward pass(es)"))

    def settle(self):
        """Ends a micro-step whose backward ran entirely inside nested backwards, once zerod is
        called from outside any backward."""
        if self.running and not self.callback_queued and not inside_function_backward():
            self.finish()

    def finish(self):
        rt = self.rt
        if not self.counted:  # no parameter gradient (torch.autograd.grad): no micro-step
            if rt.units is not None:
                rt.units.release_all()
            self.reset()
            return
        # Parameters the graph did not reach have no gradient: every rank gives every tensor.
        for e in rt.trainable:
            if not self.grad_seen[e.index]:
                self.deliver(e, None)
        if rt.units is not None:
            rt.units.release_all()
            rt.units.drain()
        if self.keepalive:
            rt.session.synchronize()
            self.keepalive.clear()
        self.micro_steps += 1
        self.scaled = False
        self.reset()

    # ---- hooks ---------------------------------------------------------------------------------

    def grad_hook(self, e):
        def hook(*unused):
            if self.rt.closed:
                return  # after zt.shutdown the module trains as plain torch would
            grad = e.param.grad
            e.param.grad = None
            if grad is not None:
                self.start(counts=True)
                self.deliver(e, grad)
        return hook

    def pre_backward(self, unit):
        """Stage 3: on the gradient of a unit's output, gathers the unit for its backward."""
        def hook(grad):
            self.start(counts=False)
            if self.units_left[unit] > 0:
                self.rt.units.gather(unit)
        return hook

    # ---- gradients to the engine ---------------------------------------------------------------

    def deliver(self, e, grad):
        rt = self.rt
        if self.grad_seen[e.index]:
            raise ZerodError(FAILED_PRECONDITION,
                             f"zerod: gradient of '{e.name}' given twice in one backward")
        self.grad_seen[e.index] = True
        g = None  # no gradient: the engine counts zeros, and the tensor as unused by this rank
        if grad is not None:
            g = grad.detach().to(dtype=torch.float32, memory_format=torch.contiguous_format)
            if rt.loss_scaling and not self.scaled:
                g = g * rt.session.loss_scale()  # the engine unscales what it is given
            if rt.device.type == "cuda":
                torch.cuda.current_stream(rt.device).synchronize()
        segment = rt.tensor_units[e.index]
        if rt.stage < 2:
            self._accumulate(e.index, g)  # reduced at the step, all segments together
        else:
            waiting = self.pending[segment]
            waiting.append((e.index, g))
            if len(waiting) == rt.segment_size[segment]:
                self.complete.add(segment)
                self._hand_over()
        if rt.stage == 3:
            self.units_left[segment] -= 1
            if self.units_left[segment] == 0:
                rt.units.release(segment)

    def _hand_over(self):
        """Complete segments go to the engine in the fixed order, each as soon as every segment
        before it in the order has gone."""
        while self.next_segment in self.complete:
            self.complete.discard(self.next_segment)
            for index, gradient in self.pending.pop(self.next_segment):
                self._accumulate(index, gradient)
            self.next_segment -= 1

    def _accumulate(self, index, g):
        self.rt.session.accumulate_grad(index, None if g is None else g.data_ptr())
        if self.rt.device.type == "cuda" and g is not None:
            self.keepalive.append(g)  # the engine's stream may still read it
