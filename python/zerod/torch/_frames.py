"""Where the caller runs, from the Python frames above it: the few questions torch has no API for
(whether code runs inside an autograd Function's backward, or inside Module.state_dict)."""

import sys


def called_under(code, skip=1):
    """Whether a frame running `code` (a code object) is on the caller's stack, above the `skip`
    innermost frames. False when `code` is None (not in this torch)."""
    if code is None:
        return False
    frame = sys._getframe(skip + 1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False
