"""ctypes binding of libzerod_c.so (client/c_api/zerod_c.h).

One shared library with a C ABI serves every Python and torch version (no compiled extension
module to rebuild per interpreter). Every call that fails raises ZerodError with the library's
status code and message.
"""

import ctypes
import json
import math
import os
import pathlib
import shutil

# absl::StatusCode values the front end tells apart.
INVALID_ARGUMENT = 3
FAILED_PRECONDITION = 9
UNAVAILABLE = 14

_CODE_NAMES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class ZerodError(RuntimeError):
    """A failed zerod call: `code` is the status code, the message says what went wrong."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.code_name = _CODE_NAMES.get(code, str(code))


_PACKAGE = pathlib.Path(__file__).resolve().parent


def _checkout_build():
    """The build folder of the checkout this package runs from (python/zerod in it):
    $ZEROD_BUILD_DIR, relative to the checkout's root unless absolute, default build/."""
    candidate = pathlib.Path(os.environ.get("ZEROD_BUILD_DIR", "build"))
    return candidate if candidate.is_absolute() else _PACKAGE.parents[1] / candidate


def _library_path():
    """$ZEROD_LIB, else the library installed inside this package (pip install), else the
    checkout's build."""
    explicit = os.environ.get("ZEROD_LIB")
    if explicit:
        if not os.path.exists(explicit):
            raise ZerodError(5, f"ZEROD_LIB={explicit}: no such file")
        return explicit
    packaged = _PACKAGE / "_lib" / "libzerod_c.so"
    if packaged.exists():
        return str(packaged)
    candidate = _checkout_build() / "lib" / "libzerod_c.so"
    if not candidate.exists():
        raise ZerodError(5, f"libzerod_c.so was not found: not installed in the package "
                            f"({packaged}: pip install --no-build-isolation . from the "
                            f"checkout) nor built in the checkout ({candidate}: scripts/build.sh "
                            "zerod_c); or set ZEROD_LIB to the library")
    return str(candidate)


def program_path(name):
    """Where zerod's program `name` (zerod, zerorun, zeroctl) is, found as the library is: inside
    this package, else beside $ZEROD_LIB's build (its ../bin/), else the checkout's build, else
    on the PATH; None when nowhere."""
    places = [_PACKAGE / "_bin"]
    if os.environ.get("ZEROD_LIB"):
        places.append(pathlib.Path(os.environ["ZEROD_LIB"]).resolve().parent.parent / "bin")
    places.append(_checkout_build() / "bin")
    for folder in places:
        if os.access(folder / name, os.X_OK):
            return str(folder / name)
    return shutil.which(name)


_lib = None
_c_float_p = ctypes.POINTER(ctypes.c_float)


def _declare(lib):
    s = ctypes.c_void_p
    i64 = ctypes.c_int64
    d = ctypes.c_double
    table = {
        "zerod_last_error": (ctypes.c_char_p, []),
        "zerod_free": (None, [ctypes.c_void_p]),
        "zerod_session_start": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(s)]),
        "zerod_session_destroy": (None, [s]),
        "zerod_session_leave": (ctypes.c_int, [s]),
        "zerod_session_describe": (ctypes.c_int, [s, ctypes.POINTER(ctypes.c_void_p)]),
        "zerod_engine_create": (ctypes.c_int, [s, ctypes.c_char_p]),
        "zerod_engine_init_from": (ctypes.c_int, [s, i64, ctypes.POINTER(ctypes.c_void_p)]),
        "zerod_engine_broadcast": (ctypes.c_int, [s, ctypes.c_void_p, i64, i64]),
        "zerod_engine_gather": (ctypes.c_int, [s, i64]),
        "zerod_engine_release": (ctypes.c_int, [s, i64]),
        "zerod_engine_param": (ctypes.c_int, [s, i64, ctypes.POINTER(ctypes.c_void_p)]),
        "zerod_engine_accumulate_grad": (ctypes.c_int, [s, i64, ctypes.c_void_p]),
        "zerod_engine_step": (ctypes.c_int, [s, d, ctypes.POINTER(ctypes.c_int),
                                             ctypes.POINTER(d), ctypes.POINTER(d)]),
        "zerod_engine_loss_scale": (ctypes.c_int, [s, ctypes.POINTER(d)]),
        "zerod_engine_step_groups": (ctypes.c_int, [s, ctypes.c_void_p, i64, ctypes.c_void_p, i64,
                                                    ctypes.POINTER(ctypes.c_int),
                                                    ctypes.POINTER(d), ctypes.POINTER(d)]),
        "zerod_engine_zero_grad": (ctypes.c_int, [s, ctypes.c_int]),
        "zerod_engine_state_info": (ctypes.c_int, [s, ctypes.POINTER(ctypes.c_void_p)]),
        "zerod_engine_read_state": (ctypes.c_int, [s, ctypes.c_int, ctypes.c_void_p, i64]),
        "zerod_engine_write_state": (ctypes.c_int, [s, ctypes.c_int, ctypes.c_void_p, i64]),
        "zerod_engine_finish_restore": (ctypes.c_int, [s, ctypes.c_char_p]),
        "zerod_engine_average": (ctypes.c_int, [s, d, ctypes.POINTER(d)]),
        "zerod_engine_full_parameters": (ctypes.c_int, [s, ctypes.c_void_p, i64]),
        "zerod_engine_stats": (ctypes.c_int, [s, ctypes.POINTER(ctypes.c_void_p)]),
        "zerod_engine_synchronize": (ctypes.c_int, [s]),
        "zerod_engine_save": (ctypes.c_int, [s, ctypes.c_char_p, i64, ctypes.c_int,
                                             ctypes.c_char_p, ctypes.c_char_p, i64,
                                             ctypes.POINTER(i64), ctypes.POINTER(ctypes.c_void_p)]),
        "zerod_engine_resume": (ctypes.c_int, [s, ctypes.c_char_p, ctypes.c_char_p,
                                               ctypes.POINTER(i64),
                                               ctypes.POINTER(ctypes.c_void_p),
                                               ctypes.POINTER(ctypes.c_void_p),
                                               ctypes.POINTER(i64),
                                               ctypes.POINTER(ctypes.c_void_p)]),
        "zerod_engine_load": (ctypes.c_int, [s, ctypes.c_char_p, ctypes.POINTER(i64),
                                             ctypes.POINTER(ctypes.c_void_p),
                                             ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(i64),
                                             ctypes.POINTER(ctypes.c_void_p)]),
    }
    for name, (restype, argtypes) in table.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def library():
    global _lib
    if _lib is None:
        path = _library_path()
        try:
            lib = ctypes.CDLL(path)
            _declare(lib)
        except (OSError, AttributeError) as e:  # not a library, or another library's symbols
            source = "ZEROD_LIB=" if os.environ.get("ZEROD_LIB") else ""
            raise ZerodError(5, f"{source}{path}: not zerod's C library ({e})") from None
        _lib = lib
    return _lib


def _check(code):
    if code != 0:
        message = library().zerod_last_error().decode("utf-8", "replace")
        raise ZerodError(code, message)


def _encode(options):
    try:
        return json.dumps(options, allow_nan=False).encode()
    except ValueError:
        bad = [k for k, v in options.items() if isinstance(v, float) and not math.isfinite(v)]
        raise ZerodError(INVALID_ARGUMENT, f"options {bad} are not finite numbers") from None


def _json_out(fn, handle):
    out = ctypes.c_void_p()
    _check(fn(handle, ctypes.byref(out)))
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        library().zerod_free(out)


class Session:
    """A TrainerSession and its engine (zerod_c.h), one per process."""

    def __init__(self, options):
        lib = library()
        handle = ctypes.c_void_p()
        _check(lib.zerod_session_start(_encode(options), ctypes.byref(handle)))
        self._handle = handle
        self._lib = lib

    def describe(self):
        return _json_out(self._lib.zerod_session_describe, self._handle)

    def create_engine(self, options):
        _check(self._lib.zerod_engine_create(self._handle, _encode(options)))

    def init_from(self, root, pointers):
        """pointers: host fp32 addresses, one per tensor (ignored off the root)."""
        array = (ctypes.c_void_p * max(len(pointers), 1))(*pointers)
        _check(self._lib.zerod_engine_init_from(self._handle, root, array))

    def broadcast(self, pointer, count, root):
        """Rank `root`'s `count` host floats at `pointer` into every rank's (a collective)."""
        _check(self._lib.zerod_engine_broadcast(self._handle, pointer, count, root))

    def gather(self, unit):
        _check(self._lib.zerod_engine_gather(self._handle, unit))

    def release(self, unit):
        _check(self._lib.zerod_engine_release(self._handle, unit))

    def param(self, tensor):
        out = ctypes.c_void_p()
        _check(self._lib.zerod_engine_param(self._handle, tensor, ctypes.byref(out)))
        return out.value

    def accumulate_grad(self, tensor, pointer):
        """pointer None: this rank has no gradient for the tensor in this micro-step."""
        _check(self._lib.zerod_engine_accumulate_grad(self._handle, tensor, pointer))

    def step(self, lr=None):
        applied = ctypes.c_int()
        norm = ctypes.c_double()
        scale = ctypes.c_double()
        _check(self._lib.zerod_engine_step(self._handle, -1.0 if lr is None else float(lr),
                                           ctypes.byref(applied), ctypes.byref(norm),
                                           ctypes.byref(scale)))
        return bool(applied.value), norm.value, scale.value

    def step_groups(self, configs, tensor_group):
        """One step over parameter groups: `configs` a ctypes array of 6 doubles per group (lr,
        beta1, beta2, eps, weight_decay, 1.0 for AdamW / 0.0 for Adam), `tensor_group` a ctypes
        int32 array, each tensor's group or -1. Returns (applied, grad_norm, loss_scale)."""
        applied = ctypes.c_int()
        norm = ctypes.c_double()
        scale = ctypes.c_double()
        _check(self._lib.zerod_engine_step_groups(
            self._handle, ctypes.addressof(configs), len(configs) // 6,
            ctypes.addressof(tensor_group), len(tensor_group), ctypes.byref(applied),
            ctypes.byref(norm), ctypes.byref(scale)))
        return bool(applied.value), norm.value, scale.value

    def zero_grad(self, set_to_none):
        _check(self._lib.zerod_engine_zero_grad(self._handle, 1 if set_to_none else 0))

    def state_info(self):
        """{"runs": [[offset, numel], ...], "numel": n, "counters": {...}}: what this rank holds
        of the optimizer state."""
        return _json_out(self._lib.zerod_engine_state_info, self._handle)

    def read_state(self, which, pointer, count):
        """State tensor `which` (0 master, 1 m, 2 v) of the held runs into `count` host floats."""
        _check(self._lib.zerod_engine_read_state(self._handle, which, pointer, count))

    def write_state(self, which, pointer, count):
        _check(self._lib.zerod_engine_write_state(self._handle, which, pointer, count))

    def finish_restore(self, counters):
        """After write_state: the counters, and the parameters rebuilt (a collective)."""
        _check(self._lib.zerod_engine_finish_restore(self._handle, _encode(counters)))

    def loss_scale(self):
        out = ctypes.c_double()
        _check(self._lib.zerod_engine_loss_scale(self._handle, ctypes.byref(out)))
        return out.value

    def average(self, value):
        out = ctypes.c_double()
        _check(self._lib.zerod_engine_average(self._handle, float(value), ctypes.byref(out)))
        return out.value

    def full_parameters(self, pointer, count):
        _check(self._lib.zerod_engine_full_parameters(self._handle, pointer, count))

    def stats(self):
        return _json_out(self._lib.zerod_engine_stats, self._handle)

    def synchronize(self):
        _check(self._lib.zerod_engine_synchronize(self._handle))

    def save(self, root, keep_last, user, extra, record=True):
        """A sharded checkpoint under `root` (a collective); returns (step, directory).
        record=False: an in-memory snapshot the coordinator does not list."""
        step = ctypes.c_int64()
        directory = ctypes.c_void_p()
        _check(self._lib.zerod_engine_save(
            self._handle, os.fsencode(root), int(keep_last), 1 if record else 0,
            None if user is None else user.encode(), extra, len(extra), ctypes.byref(step),
            ctypes.byref(directory)))
        return step.value, self._take(directory).decode()

    def load(self, path):
        """(step, user text, extra bytes, directory), or None when `path` is a root holding no
        complete checkpoint (a collective)."""
        return self._loaded(self._lib.zerod_engine_load, os.fsencode(path))

    def resume(self, snapshots, roots):
        """As load, of the newest complete checkpoint among the in-memory `snapshots` directory
        (None: none; it wins a tie) and the durable `roots`."""
        return self._loaded(self._lib.zerod_engine_resume,
                            os.fsencode(snapshots) if snapshots else b"",
                            b"\n".join(os.fsencode(r) for r in roots))

    def _loaded(self, fn, *where):
        step = ctypes.c_int64()
        user, extra, directory = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        extra_len = ctypes.c_int64()
        _check(fn(self._handle, *where, ctypes.byref(step), ctypes.byref(user),
                  ctypes.byref(extra), ctypes.byref(extra_len), ctypes.byref(directory)))
        if step.value < 0:
            return None
        # Every buffer is taken (and freed) before anything is decoded.
        taken = (self._take(user), self._take(extra, extra_len.value), self._take(directory))
        return (step.value, taken[0].decode("utf-8", "replace"), taken[1],
                os.fsdecode(taken[2]))

    def _take(self, pointer, size=None):
        """The bytes a zerod_* call returned, freed."""
        if not pointer.value:
            return b""
        try:
            return ctypes.string_at(pointer.value, size) if size is not None else \
                ctypes.string_at(pointer.value)
        finally:
            self._lib.zerod_free(pointer)

    def leave(self):
        if self._handle.value:
            _check(self._lib.zerod_session_leave(self._handle))

    def close(self):
        if self._handle.value:
            self._lib.zerod_session_destroy(self._handle)
            self._handle = ctypes.c_void_p()
