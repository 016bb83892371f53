"""zt.shard's arguments, checked before anything joins: each wrong one is a ZerodError
(INVALID_ARGUMENT) that names the argument, the value given and what it accepts, where torch's own
TypeError from deep inside would name neither."""

import math
import numbers

import torch

from zerod._native import INVALID_ARGUMENT, ZerodError

STAGES = (0, 1, 2, 3, "auto")
OPTIMIZERS = ("adam", "adamw")
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
# The engine gathers the next unit while one runs; it has no deeper prefetch queue.
MAX_PREFETCH = 1


def bad(message):
    return ZerodError(INVALID_ARGUMENT, f"zt.shard: {message}")


def _is_integer(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and \
        math.isfinite(value)


def _number(name, value, expected):
    if not _is_number(value):
        raise bad(f"{name} must be a finite number ({expected}), not {value!r}")
    return float(value)


def _integer(name, value, low, high=None, expected=None):
    if not _is_integer(value) or value < low or (high is not None and value > high):
        if expected is None:
            expected = f"an integer >= {low}" if high is None else f"an integer {low} to {high}"
        raise bad(f"{name} must be {expected}, not {value!r}")
    return int(value)


def dtype_name(dtype):
    """"fp32", "bf16" or "fp16", from that name or the torch dtype."""
    if isinstance(dtype, torch.dtype) and dtype in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype]
    if isinstance(dtype, str) and dtype in _DTYPE_NAMES.values():
        return dtype
    raise bad(f"unknown dtype {dtype!r} (expected 'fp32', 'bf16' or 'fp16', or torch.float32, "
              "torch.bfloat16 or torch.float16)")


def check_optimizer(lr, betas, eps, weight_decay, optimizer, max_grad_norm):
    """(lr, betas, eps, weight_decay, max_grad_norm), defaults filled in for the string form
    (None for a torch optimizer, whose param_groups hold them)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        given = [n for n, v in (("lr", lr), ("betas", betas), ("eps", eps),
                                ("weight_decay", weight_decay)) if v is not None]
        if given:
            raise bad(f"{', '.join(given)} given with a torch optimizer, whose param_groups hold "
                      "the hyperparameters: set them on the optimizer (or its groups)")
        return None, None, None, None, _max_grad_norm(max_grad_norm)
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise bad(f"unknown optimizer {optimizer!r} (expected 'adam' or 'adamw', or a "
                  "torch.optim.AdamW or torch.optim.Adam built on the module's parameters)")
    lr = 1e-3 if lr is None else lr
    betas = (0.9, 0.999) if betas is None else betas
    eps = 1e-8 if eps is None else eps
    if weight_decay is None:
        weight_decay = 0.01 if optimizer == "adamw" else 0.0
    # torch.optim's range checks and messages, after a type check it does not make.
    lr = _number("lr", lr, "the learning rate, >= 0")
    if not 0.0 <= lr:
        raise bad(f"invalid learning rate: {lr} (expected lr >= 0)")
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2 and all(map(_is_number, betas))):
        raise bad(f"betas must be a pair of numbers in [0, 1) such as (0.9, 0.999), not {betas!r}")
    if not all(0.0 <= b < 1.0 for b in betas):
        raise bad(f"invalid betas: {tuple(betas)} (expected two values in [0, 1))")
    eps = _number("eps", eps, ">= 0")
    if not 0.0 <= eps:
        raise bad(f"invalid epsilon value: {eps} (expected eps >= 0)")
    weight_decay = _number("weight_decay", weight_decay, ">= 0")
    if not 0.0 <= weight_decay:
        raise bad(f"invalid weight_decay value: {weight_decay} (expected >= 0)")
    return lr, (float(betas[0]), float(betas[1])), eps, weight_decay, \
        _max_grad_norm(max_grad_norm)


def _max_grad_norm(max_grad_norm):
    max_grad_norm = _number("max_grad_norm", max_grad_norm, ">= 0; 0 turns clipping off")
    if not 0.0 <= max_grad_norm:
        raise bad(f"invalid max_grad_norm: {max_grad_norm} (expected >= 0; 0 turns clipping off)")
    return max_grad_norm


def check_accumulation_reduction(reduction):
    """Whether gradients are averaged (True) or summed over the accumulation micro-steps."""
    if reduction not in (None, "mean", "sum"):
        raise bad(f"accumulation_reduction must be 'mean' or 'sum', not {reduction!r}")
    return reduction != "sum"


def accumulation_warning(steps, reduction):
    """The warning of the first step with accumulation when the reduction was not chosen."""
    if reduction is not None or steps <= 1:
        return None
    return (f"zerod averages gradients over gradient_accumulation_steps={steps} micro-steps (as "
            f"DeepSpeed does): a loop that also divides its loss by {steps}, as plain torch "
            f"code does, trains with a gradient {steps}x too small. Pass "
            "accumulation_reduction='sum' to zt.shard for such a loop, or "
            "accumulation_reduction='mean' to confirm (either silences this)")


def check_stage(stage, budget):
    if isinstance(stage, bool) or stage not in STAGES or \
            not (_is_integer(stage) or stage == "auto"):
        raise bad(f"unknown stage {stage!r} (expected 0, 1, 2, 3 or 'auto')")
    if budget is not None and not (_is_integer(budget) and budget > 0):
        raise bad(f"budget must be a number of bytes per rank (an integer > 0), not {budget!r}")
    return stage if stage == "auto" else int(stage)


def check_engine_knobs(gradient_accumulation_steps, prefetch, max_live_units, bucket_cap_mb,
                       gather_unit_mb, initial_scale_power, cast_forward_inputs, threads,
                       collective_timeout):
    _integer("gradient_accumulation_steps", gradient_accumulation_steps, 1,
             expected="a positive integer")
    if _is_integer(prefetch) and prefetch > MAX_PREFETCH:
        raise bad(f"prefetch={prefetch}: the engine prefetches one unit ahead (it gathers the "
                  "next unit while one runs); pass prefetch=1, or 0 to turn prefetch off")
    _integer("prefetch", prefetch, 0, MAX_PREFETCH,
             expected="0 or 1 (the units gathered ahead: 1 gathers the next unit while one runs)")
    if max_live_units is not None:
        _integer("max_live_units", max_live_units, prefetch + 1,
                 expected=f"an integer >= prefetch + 1 = {prefetch + 1} (the gathered units held "
                          "at once: those running and the one prefetched)")
    for name, value in (("bucket_cap_mb", bucket_cap_mb), ("gather_unit_mb", gather_unit_mb)):
        if not (_is_number(value) and int(value * 2**20) >= 1):
            raise bad(f"{name} must be a size in MiB > 0, not {value!r}")
    _integer("initial_scale_power", initial_scale_power, 0, 127,
             expected="an integer 0 to 127 (fp16's first loss scale is 2**initial_scale_power)")
    if not isinstance(cast_forward_inputs, bool):
        raise bad(f"cast_forward_inputs must be True or False, not {cast_forward_inputs!r}")
    if threads is not None:
        _integer("threads", threads, 1, 1024)
    if not (_is_number(collective_timeout) and collective_timeout > 0):
        raise bad(f"collective_timeout must be a finite number of seconds > 0, not "
                  f"{collective_timeout!r}")


def check_job(job, rank, world_size, endpoint):
    """The job's identity when given explicitly (else the ZEROD_* environment's)."""
    for name, value in (("job", job), ("endpoint", endpoint)):
        if value is not None and not (isinstance(value, str) and value):
            raise bad(f"{name} must be a non-empty string, not {value!r}")
    if rank is not None:
        _integer("rank", rank, 0)
    if world_size is not None:
        _integer("world_size", world_size, 1)
    if rank is not None and world_size is not None and rank >= world_size:
        raise bad(f"rank {rank} is not below world_size {world_size}")


def check_device(device):
    if device is None or isinstance(device, torch.device):
        return
    if isinstance(device, str):
        try:
            torch.device(device)
            return
        except RuntimeError:
            pass
    raise bad(f"device must be a torch.device or a name such as 'cpu' or 'cuda:0', not "
              f"{device!r}")
