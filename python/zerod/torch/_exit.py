"""A process that raised out of a backward must still exit.

torch (1.13 and 2.x) leaves the ready tasks of a backward that raised in the thread-local queue of
the thread that ran it. Their nodes may hold tensors whose Python objects torch keeps alive from
C++ (a parameter saved for backward); freeing those in the thread's TLS destructors, after the
interpreter has finalized, waits for the GIL forever, so the process never exits (and zerorun
never returns). At exit, while Python is still there, a backward through a node older than every
left-over task pops them all first (the queue runs newer nodes first), which frees them."""

import atexit

import torch

_oldest = None


def install():
    """Called at zerod.torch's import, before any training graph on this thread: the node made
    here is the oldest there is."""
    global _oldest
    if _oldest is None:
        _oldest = torch.zeros(1, requires_grad=True).expand(1)
        atexit.register(_drain_left_over_backward_tasks)


def _drain_left_over_backward_tasks():
    _oldest.sum().backward(retain_graph=True)
