"""zerod.torch: train any torch.nn.Module with ZeRO stages 0-3 under a zerod coordinator.

    import zerod.torch as zt
    model, opt = zt.shard(model, stage=3, dtype="fp32", lr=1e-3, optimizer="adamw")
    for x, y in my_rank_batches:            # each rank its own part of the global batch
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    state = zt.full_state_dict(model)       # every rank calls it

At stage 3 a parameter holds its values only while its unit runs; code outside model(...) that
reads parameters (a penalty on the weights) runs inside `with zt.gathered(model):`, and any other
use of a released parameter is an error naming it.

Checkpoints (every rank calls them, between steps): zt.save(dir, keep_last=3, user={"epoch": e})
writes a sharded checkpoint (parameters, Adam's state, step, loss scale, each rank's buffers and
frozen parameters, your `user` dict); zt.load(dir) restores the newest complete one at any world
size and stage, and returns zt.Checkpoint(step, user, directory), or None when there is none yet.

Launched as `torchrun --nproc_per_node N train.py` (an embedded zerod when $ZEROD_ENDPOINT is not
set), `zerorun -n N -- python3 train.py`, or `python3 train.py` (a job of one): _launch.py.
zt.shard makes torch.distributed's default group (gloo) when the script has not
(zt.process_group()). Gradients are averaged over ranks as torch DDP does, and rank 0's initial
parameters are everyone's.
"""

import atexit
import collections
import contextlib
import io
import json
import os

import torch

from zerod._native import INVALID_ARGUMENT, FAILED_PRECONDITION, Session, ZerodError
from zerod.torch import _exit
from zerod.torch import _layout
from zerod.torch import _arguments
from zerod.torch import _launch
from zerod.torch import _optimizer
from zerod.torch import _training_state
from zerod.torch._arguments import bad as _bad
from zerod.torch._memory import DTYPES
from zerod.torch._optimizer import ZeroOptimizer
from zerod.torch._runtime import Runtime
from zerod.torch._use_check import STATE_DICT_AT_STAGE_3

__all__ = ["shard", "rank", "world_size", "gathered", "full_state_dict", "load_state_dict",
           "average", "memory_stats", "save", "load", "snapshot", "resume", "Checkpoint",
           "shutdown", "process_group", "ZeroOptimizer", "ZerodError"]

_active = None  # the Runtime of this process's one session
_exit.install()  # a rank that raised out of a backward still exits


def _device_of(model, trainable, device):
    devices = collections.OrderedDict()
    for e in trainable:
        devices.setdefault(e.param.device, e.name)
    if not devices:
        raise _bad("the module has no trainable parameters (all are frozen or there are none)")
    if len(devices) > 1:
        (d0, n0), (d1, n1) = list(devices.items())[:2]
        raise _bad(f"parameters are on several devices: '{n0}' on {d0}, '{n1}' on {d1}; move "
                   "the whole module to one device (model.to(device)) before zt.shard")
    found = next(iter(devices))
    if found.type not in ("cpu", "cuda"):
        raise _bad(f"parameter '{devices[found]}' is on {found}: zerod trains on cpu or cuda")
    if device is not None and torch.device(device) != found:
        raise _bad(f"parameter '{devices[found]}' is on {found}, but device={device!r} was asked"
                   f"; move the module first (model.to({str(device)!r}))")
    if found.type == "cuda" and found.index is None:
        found = torch.device("cuda", torch.cuda.current_device())
    return found


def shard(model, stage=3, dtype="fp32", lr=None, betas=None, eps=None,
          weight_decay=None, optimizer="adamw", max_grad_norm=0.0, *,
          gradient_accumulation_steps=1, accumulation_reduction=None, units=None, prefetch=1,
          max_live_units=None,
          bucket_cap_mb=25, gather_unit_mb=64, budget=None, initial_scale_power=16,
          cast_forward_inputs=True, threads=None, device=None, job=None, rank=None,
          world_size=None, endpoint=None, collective_timeout=120.0):
    """Joins the zerod job, shards `model` under the coordinator's plan and returns
    (model, optimizer). The module is changed in place: its trainable parameters become views of
    zerod's memory (at stage 3, only while their unit runs).

    stage: 0, 1, 2, 3, or "auto" (the lowest stage whose memory fits `budget` bytes per rank).
    dtype: "fp32", "bf16" or "fp16", or the torch dtype (parameters and gradients; Adam's state
      is fp32; fp16 adds dynamic loss scaling starting at 2**initial_scale_power: call
      opt.backward(loss)).
    optimizer: a torch.optim.AdamW or torch.optim.Adam built on the module's parameters, with
      any parameter groups (each its own lr, betas, eps, weight_decay): zerod takes it over, and
      the optimizer returned shares its param_groups (read at every step). Or "adamw"
      (decoupled weight decay, torch.optim.AdamW) or "adam" (torch.optim.Adam), one group, with
      lr (default 1e-3), betas ((0.9, 0.999)), eps (1e-8) and weight_decay (torch's default:
      0.01 for AdamW, 0 for Adam) given here.
    max_grad_norm: clip by the global norm when > 0 (torch.nn.utils.clip_grad_norm_).
    gradient_accumulation_steps: backward passes per opt.step(); gradients are averaged over the
      ranks and, with accumulation_reduction="mean", over the micro-steps (DeepSpeed's way: do
      not divide the loss), or summed over them with "sum" (for a loop that divides its loss by
      the number of micro-steps, as plain torch code does). Not given: "mean", with a warning at
      the first step when gradient_accumulation_steps > 1.
    units (stage 3): which modules are gather units: a module class or class name, a set of
      them (as FSDP's transformer_auto_wrap_policy, or accelerate's class names), or a
      callable(name, module) -> bool. By default each block is one unit (a module repeated in an
      nn.ModuleList or nn.Sequential that holds modules with parameters: a transformer layer, a
      ResNet block), and outside blocks every module that holds parameters. Parameters outside
      any unit belong to the root's unit. A parameter used outside model(...) (a penalty on the
      weights) is read inside `with zt.gathered(model):`.
    prefetch: 1 gathers the next unit while one runs (stage 3), 0 does not; the engine prefetches
      one unit ahead, no more. max_live_units: gather buffers kept (default: the units' nesting
      depth + prefetch + 1; at least the nesting depth and prefetch + 1). A budget, not a limit:
      while more units are in use at once (a checkpointed region of several units being
      recomputed), more buffers are taken and given back after (memory_stats() reports
      gather_overflows and peak_gather_buffers).
    bucket_cap_mb: gradient reduction buckets (DDP's bucket_cap_mb and default, 25); at stages
      2-3 two bucket buffers of this size are allocated; gather_unit_mb: the
      largest unit formed by size when units are not labelled.
    cast_forward_inputs: with bf16/fp16, floating-point inputs of model(...) are cast to it.
    job, rank, world_size, endpoint: default to $ZEROD_JOB, $ZEROD_RANK, $ZEROD_WORLD_SIZE and
      $ZEROD_ENDPOINT (zerorun sets them); under torchrun to RANK and WORLD_SIZE, and without
      either to a job of one, with an embedded zerod unless $ZEROD_ENDPOINT is set.
    """
    global _active
    if _active is not None:
        raise ZerodError(FAILED_PRECONDITION, (
            "zt.shard: called twice; a process takes part in one zerod job with one module "
            "(shard the module that holds every trainable part, once)"))
    if not isinstance(model, torch.nn.Module):
        raise _bad(f"expected a torch.nn.Module, got {type(model).__name__}")
    if hasattr(model, "_zerod_runtime"):
        raise ZerodError(FAILED_PRECONDITION, "zt.shard: this module was sharded already")
    stage = _arguments.check_stage(stage, budget)
    dtype = _arguments.dtype_name(dtype)
    hyper = _arguments.check_optimizer(lr, betas, eps, weight_decay, optimizer, max_grad_norm)
    max_grad_norm = hyper[-1]
    average = _arguments.check_accumulation_reduction(accumulation_reduction)
    _arguments.check_engine_knobs(gradient_accumulation_steps, prefetch, max_live_units,
                                  bucket_cap_mb, gather_unit_mb, initial_scale_power,
                                  cast_forward_inputs, threads, collective_timeout)
    _arguments.check_job(job, rank, world_size, endpoint)
    _arguments.check_device(device)
    trainable, frozen = _layout.collect(model, units)
    dev = _device_of(model, trainable, device)
    for e in trainable:
        if not e.param.is_floating_point():
            raise _bad(f"parameter '{e.name}' is {e.param.dtype}: only floating-point "
                       "parameters can be trained")
        if e.param.layout != torch.strided:
            raise _bad(f"parameter '{e.name}' is {e.param.layout}: zerod shards dense tensors")

    if isinstance(optimizer, torch.optim.Optimizer):
        source = optimizer
        decoupled = _optimizer.adopt(optimizer, model, trainable)
    else:
        source = _optimizer.build(optimizer, [e.param for e in trainable], *hyper[:4])
        decoupled = optimizer == "adamw"
    labelled = stage in (3, "auto")
    layout = [{"name": e.name, "shape": list(e.param.shape), "dtype": dtype,
               **({"unit": _layout.unit_label(e.unit)} if labelled else {})} for e in trainable]
    depth = _layout.nesting_depth(trainable)
    if max_live_units is None:
        max_live_units = depth + prefetch + 1
    elif labelled and max_live_units < depth:
        raise _bad(f"max_live_units={max_live_units} is below the units' nesting depth, {depth}: "
                   f"a unit runs inside {depth - 1} enclosing unit(s) that stay gathered (pass "
                   f"max_live_units >= {max(depth, prefetch + 1)}, or units= without nesting)")
    plan = {"stage": -1 if stage == "auto" else stage, "param_dtype": dtype, "grad_dtype": dtype,
            "optimizer": "adamw" if decoupled else "adam",
            "reduce_bucket_bytes": int(bucket_cap_mb * 2**20),
            "gather_unit_bytes": int(gather_unit_mb * 2**20), "prefetch_depth": int(prefetch),
            "max_live_units": int(max_live_units)}
    device_name = "cpu" if dev.type == "cpu" else f"cuda:{dev.index}"
    options = {"layout": layout, "plan": plan, "device": device_name,
               "collective_timeout_s": float(collective_timeout),
               "agreed": _optimizer.agreed_options(source, max_grad_norm,
                                                   gradient_accumulation_steps, average)}
    if budget is not None:
        options["budget_bytes"] = int(budget)
    options.update(_launch.session_options(job, rank, world_size, endpoint))

    session = Session(options)
    try:
        info = session.describe()
        loss_scaling = info["param_dtype"] == "fp16"
        first = _optimizer.group_config(source.param_groups[0], 0, decoupled)
        engine = {"lr": first[0], "beta1": first[1], "beta2": first[2], "eps": first[3],
                  "weight_decay": first[4], "adamw": decoupled,
                  "max_grad_norm": max_grad_norm,
                  "accumulation_steps": int(gradient_accumulation_steps),
                  "average_accumulation": average,
                  "threads": int(threads or max(1, min(8, (os.cpu_count() or 1)))),
                  "loss_scale": {"enabled": loss_scaling,
                                 "initial_scale": float(2 ** initial_scale_power)}}
        session.create_engine(engine)
        _launch.joined(session, info)
        # Rank 0's values are everyone's (DDP broadcasts its module the same way).
        host = [e.param.detach().to("cpu", torch.float32).contiguous() for e in trainable]
        session.init_from(0, [t.data_ptr() for t in host])
        del host
        _broadcast_module_state(session, frozen, model)
        compute = DTYPES[info["param_dtype"]]
        if compute != torch.float32:
            # The parameters become 16-bit views; frozen parameters and floating buffers follow,
            # as DeepSpeed's module.half()/bfloat16() does, so the forward sees one dtype.
            for _, p in frozen:
                p.data = p.data.to(compute)
            for b in model.buffers():
                if b.is_floating_point():
                    b.data = b.data.to(compute)
        config = {"device": dev, "accumulation_steps": int(gradient_accumulation_steps),
                  "loss_scaling": loss_scaling, "cast_forward_inputs": cast_forward_inputs,
                  "accumulation_warning": _arguments.accumulation_warning(
                      gradient_accumulation_steps, accumulation_reduction)}
        runtime = Runtime(model, trainable, session, info, config)
        runtime.owner = _SessionOwner(session)
        runtime.bind()
    except BaseException:
        session.close()
        raise
    runtime.frozen = frozen
    _active = runtime
    model._zerod_runtime = runtime
    _guard_state_dict(model, runtime)
    atexit.register(_leave_at_exit)
    opt = ZeroOptimizer(runtime, source, decoupled)
    runtime.optimizer = opt
    if source is optimizer:
        _optimizer.delegate(source, opt)
    _optimizer.route_module_zero_grad(model, opt)
    return model, opt


class _SessionOwner:
    """Closes the session (frees zerod's memory) when the last tensor over that memory goes."""

    def __init__(self, session):
        self.session = session

    def __del__(self):
        self.session.close()


def _broadcast_module_state(session, frozen, model):
    """Rank 0's frozen parameters and buffers (any dtype, bit for bit) to every rank, as DDP
    broadcasts its module's state at construction, in one collective: the bytes travel as fp32
    words, which a broadcast copies without arithmetic."""
    tensors = [p for _, p in frozen] + list(model.buffers())
    if not tensors:
        return
    raw = [t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    total = sum(r.numel() for r in raw)
    flat = torch.zeros((total + 3) // 4 * 4, dtype=torch.uint8)
    offset = 0
    for r in raw:
        flat[offset:offset + r.numel()] = r
        offset += r.numel()
    words = flat.view(torch.float32)
    session.broadcast(words.data_ptr(), words.numel(), 0)
    offset = 0
    with torch.no_grad():
        for t, r in zip(tensors, raw):
            n = r.numel()
            t.copy_(flat[offset:offset + n].view(t.dtype).view(t.shape))
            offset += n


def _guard_state_dict(model, rt):
    """model.state_dict() at stage 3 would hold empty placeholders, and model.load_state_dict()
    at stage 3 or in 16 bits would be lost (zerod's fp32 master is the parameter): both refuse
    and say what to call instead. (In fp32 below stage 3 the parameters are the master: both
    work as in torch.)"""
    if rt.stage < 3 and rt.dtype_name == "fp32":
        return

    def on_save(module, state_dict, prefix, local_metadata):
        if rt.stage == 3 and not rt.exporting and not rt.closed:
            raise ZerodError(FAILED_PRECONDITION, STATE_DICT_AT_STAGE_3)

    def on_load(state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        if not rt.loading and not rt.closed:
            raise ZerodError(FAILED_PRECONDITION, (
                f"zerod: at stage {rt.stage} with {rt.dtype_name} the parameters are zerod's fp32 "
                "master copy: load them with zt.load_state_dict(model, state_dict) (a collective)"))

    model._register_state_dict_hook(on_save)
    model._register_load_state_dict_pre_hook(on_load)


def _require():
    if _active is None:
        raise ZerodError(FAILED_PRECONDITION, "zerod: no job yet (call zt.shard first)")
    return _active


@contextlib.contextmanager
def gathered(module):
    """Stage 3: the parameters of `module` (the sharded model or any of its submodules) hold
    their values for the block, to be used outside model(...), as FSDP's summon_full_params and
    DeepSpeed's GatheredParameters:

        out = model(x)
        with zt.gathered(model):
            penalty = sum((p ** 2).sum() for p in model.parameters())
        (loss_fn(out, y) + 1e-4 * penalty).backward()   # gradients flow as usual

    A collective (every rank enters it, in the same order as its forwards). Each unit is gathered
    in turn and copied out, so the block holds a copy of every parameter it covers; the copies go
    at its end, and a parameter saved for backward is gathered again then. For reading: a change
    made in place inside the block would be lost, and is an error at its end; opt.step() inside
    it is refused. Below stage 3 the parameters always hold their values: nothing to do."""
    rt = _require()
    if module is not rt.model and not any(module is m for m in rt.model.modules()):
        raise ZerodError(INVALID_ARGUMENT, (
            "zt.gathered: the module is not the sharded model nor one of its submodules"))
    if rt.stage < 3 or rt.closed:
        yield module
        return
    rt.backward.settle()
    wanted = {id(p) for p in module.parameters()}
    units = sorted({rt.tensor_units[e.index] for e in rt.trainable if id(e.param) in wanted})
    done = rt.units.materialize(units)
    try:
        yield module
    except BaseException:
        rt.units.unmaterialize(done, check=False)
        raise
    changed = rt.units.unmaterialize(done)
    if changed is not None and not rt.closed:
        raise ZerodError(FAILED_PRECONDITION, (
            f"zerod: parameter '{changed.name}' was changed in place inside zt.gathered(model), "
            "which gathers for reading: the change would be lost (zerod's fp32 master copy is "
            "the parameter): load new values with zt.load_state_dict"))


def rank():
    """This process's rank: the job's once zt.shard has joined, else the launch's ($ZEROD_RANK,
    $RANK, or 0)."""
    return _active.info["rank"] if _active is not None else _launch.rank()


def world_size():
    """The job's number of ranks: once joined the plan's, else the launch's ($ZEROD_WORLD_SIZE,
    $WORLD_SIZE, or 1)."""
    return _active.info["world_size"] if _active is not None else _launch.world_size()


process_group = _launch.process_group


def average(value):
    """The mean of a number over the ranks (a collective: every rank calls it)."""
    return _require().session.average(float(value))


def full_state_dict(model):
    """The unsharded model as model.state_dict() would give it unsharded: trainable parameters
    in fp32 from zerod's master copy, frozen parameters and buffers as they are, on the CPU.
    A collective: every rank calls it."""
    rt = getattr(model, "_zerod_runtime", None)
    if rt is None:
        raise ZerodError(FAILED_PRECONDITION, "zt.full_state_dict: the module was not sharded")
    flat = torch.empty(rt.info["total_numel"], dtype=torch.float32)
    rt.session.full_parameters(flat.data_ptr(), flat.numel())
    pieces = {}
    offset = 0
    for e in rt.trainable:
        n = rt.numels[e.index]
        pieces[id(e.param)] = flat[offset:offset + n].view(rt.shapes[e.index])
        offset += n
    state = collections.OrderedDict()
    rt.exporting = True
    try:
        entries = list(model.state_dict(keep_vars=True).items())
    finally:
        rt.exporting = False
    for name, value in entries:
        full = pieces.get(id(value))
        state[name] = full if full is not None else value.detach().to("cpu").clone()
    return state


def load_state_dict(model, state_dict):
    """Loads an unsharded state dict (model.state_dict() or zt.full_state_dict keys) into a
    sharded module: trainable parameters into zerod's fp32 master and its 16-bit copy, from rank
    0's dict (a collective: every rank calls it; the others' values are not read), frozen
    parameters and buffers from each rank's own. Adam's moments and step are kept, as when a
    torch module's weights are loaded under a running optimizer. Every key must be present."""
    rt = getattr(model, "_zerod_runtime", None)
    if rt is None or rt.closed:
        raise ZerodError(FAILED_PRECONDITION, "zt.load_state_dict: the module is not sharded")
    by_id = {id(e.param): e for e in rt.trainable}
    values = [None] * len(rt.trainable)
    for name, p in model.named_parameters():
        e = by_id.get(id(p))
        if e is None or values[e.index] is not None:
            continue
        if name not in state_dict:
            raise ZerodError(INVALID_ARGUMENT, f"zt.load_state_dict: '{name}' is missing")
        v = state_dict[name]
        if tuple(v.shape) != rt.shapes[e.index]:
            raise ZerodError(INVALID_ARGUMENT, (
                f"zt.load_state_dict: '{name}' has shape {tuple(v.shape)}, the module's is "
                f"{rt.shapes[e.index]}"))
        values[e.index] = v.detach().to("cpu", torch.float32).contiguous()
    rt.session.init_from(0, [v.data_ptr() for v in values])
    rt.engine_rewritten()
    rt.loading = True
    try:
        with torch.no_grad():
            others = [(n, p) for n, p in model.named_parameters() if not p.requires_grad]
            for name, value in others + list(model.named_buffers()):
                if name not in state_dict:
                    raise ZerodError(INVALID_ARGUMENT, f"zt.load_state_dict: '{name}' is missing")
                value.copy_(state_dict[name])
    finally:
        rt.loading = False


Checkpoint = collections.namedtuple("Checkpoint", ["step", "user", "directory"])
Checkpoint.__doc__ = """What zt.load restored: the optimizer step it continues from, the user dict given to
zt.save ({} when none), and the checkpoint's directory."""


def _module_state(rt, scheduler):
    """This rank's own part of a checkpoint: the module's buffers (BatchNorm statistics, which
    stay per rank as under DDP) and frozen parameters, which zerod does not hold; the optimizer's
    parameter-group hyperparameters, and the LR scheduler's state when given."""
    state = {"buffers": {n: b.detach().to("cpu").clone() for n, b in rt.model.named_buffers()},
             "frozen": {n: p.detach().to("cpu").clone() for n, p in rt.frozen},
             **_training_state.training_state(rt.optimizer, scheduler)}
    out = io.BytesIO()
    torch.save(state, out)
    return out.getvalue()


def _restore_module_state(rt, extra, directory, scheduler):
    if not extra:
        if scheduler is not None:
            raise ZerodError(FAILED_PRECONDITION, (
                f"zt.load: {directory} holds no scheduler state (it was not saved by zt.save)"))
        if list(rt.model.buffers()) or rt.frozen:
            raise ZerodError(FAILED_PRECONDITION, (
                f"zt.load: {directory} holds no buffers or frozen parameters for this rank (it "
                "was not saved by zt.save)"))
        return
    # weights_only: a checkpoint is data; a tampered one must not run code when loaded.
    state = torch.load(io.BytesIO(extra), map_location="cpu", weights_only=True)
    restore_optimizer = _training_state.prepare_restore(rt.optimizer, state, scheduler, directory)
    targets = [("buffer", dict(rt.model.named_buffers()), state.get("buffers", {})),
               ("frozen parameter", dict(rt.frozen), state.get("frozen", {}))]
    with torch.no_grad():
        for kind, mine, saved in targets:
            for name, value in mine.items():
                if name not in saved:
                    raise ZerodError(FAILED_PRECONDITION, (
                        f"zt.load: {directory} has no {kind} '{name}' (the checkpoint is of "
                        "another module)"))
                if tuple(saved[name].shape) != tuple(value.shape):
                    raise ZerodError(FAILED_PRECONDITION, (
                        f"zt.load: {kind} '{name}' has shape {tuple(saved[name].shape)} in "
                        f"{directory}, the module's is {tuple(value.shape)}"))
                value.copy_(saved[name])
    restore_optimizer()


def save(directory, keep_last=0, user=None, scheduler=None):
    """Saves a sharded checkpoint of the training state as `directory`/step-<step> and returns
    that path (a collective: every rank calls it, between optimizer steps). Each rank writes what
    it holds, in parallel: the fp32 parameters, Adam's moments, the step and loss scale, and its
    own buffers and frozen parameters; rank 0 writes the manifest last. It returns on every rank
    once the checkpoint is complete; a crash before leaves the previous one as it was.
    keep_last > 0 then removes all but the newest keep_last complete checkpoints in `directory`.
    user: a JSON-serialisable dict kept with the checkpoint (rank 0's), e.g. the data loader's
    position ({"epoch": 3, "batch": 120}); zt.load returns it. As DeepSpeed's
    engine.save_checkpoint(dir, client_state=...). The optimizer's parameter groups (lr, betas,
    eps, weight_decay and what schedulers add, such as initial_lr) are always saved; scheduler:
    a torch LR scheduler whose state_dict() is saved too (zt.load(dir, scheduler=) restores
    it)."""
    return _save(directory, keep_last, user, record=True, scheduler=scheduler)


def _save(directory, keep_last, user, record, scheduler=None):
    rt = _require()
    name = "zt.save" if record else "zt.snapshot"
    _training_state.check_scheduler(rt.optimizer, scheduler, name)
    if not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 0:
        raise ZerodError(INVALID_ARGUMENT, (
            f"{name}: keep_last must be an integer >= 0 (0 keeps every checkpoint), not "
            f"{keep_last!r}"))
    if user is not None and not isinstance(user, dict):
        raise ZerodError(INVALID_ARGUMENT, (
            f"{name}: user must be a dict (kept as JSON), not {type(user).__name__}"))
    try:
        text = None if user is None else json.dumps(user, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ZerodError(INVALID_ARGUMENT, f"{name}: user is not JSON-serialisable: {e}") from None
    _, path = rt.session.save(os.fspath(directory), keep_last, text,
                              _module_state(rt, scheduler), record)
    return path


def load(directory, scheduler=None):
    """Restores the newest complete checkpoint in `directory` (or `directory` itself when it is
    one checkpoint's step-<step> directory) into the sharded module and optimizer, whatever world
    size and stage saved it (a collective: every rank calls it, after zt.shard, between steps).
    Returns Checkpoint(step, user, directory), or None when `directory` holds no complete
    checkpoint yet, so that one script starts or resumes:

        ckpt = zt.load(dir)
        start = ckpt.user["epoch"] + 1 if ckpt else 0

    A partial checkpoint (a save that did not finish) is skipped, never loaded; a damaged one is
    set aside (step-<step>.damaged-<ms>) for the next newest; one this job's records do not list
    there (another job's, copied in) is skipped, and loads only when its directory is named: each
    is named on stderr. When the job's own checkpoints are there but none can be loaded, it raises
    rather than return None (docs/checkpoints.md). Each rank takes its own saved buffers and frozen
    parameters, or rank 0's when the saving job had no such rank. As DeepSpeed's
    engine.load_checkpoint(dir), which returns the client state. The optimizer's parameter groups
    come back as saved (the LR a schedule had reached included); scheduler: the LR scheduler to
    restore from the checkpoint (saved with zt.save(..., scheduler=))."""
    rt = _require()
    _training_state.check_scheduler(rt.optimizer, scheduler, "zt.load")
    loaded = rt.session.load(os.fspath(directory))
    return None if loaded is None else _restored(rt, loaded, scheduler)


def _restored(rt, loaded, scheduler):
    rt.engine_rewritten()
    step, user, extra, path = loaded
    _restore_module_state(rt, extra, path, scheduler)
    return Checkpoint(step, json.loads(user) if user else {}, path)


def snapshot(keep_last=2, user=None, scheduler=None):
    """Saves an in-memory snapshot into $ZEROD_SNAPSHOT_DIR, the shared-memory directory that
    `zerorun --max-restarts` gives its ranks (a collective, as zt.save), and returns its path; None
    where there is no such directory. Cheap enough for every step: it costs a copy to memory. The
    coordinator does not list snapshots (they do not outlive the node); zt.resume takes the newest
    of them and of the durable checkpoints after a restart."""
    directory = os.environ.get("ZEROD_SNAPSHOT_DIR")
    if not directory:
        _require()
        return None
    return _save(directory, keep_last, user, record=False, scheduler=scheduler)


def resume(directory=None, scheduler=None):
    """zt.load of the newest complete checkpoint among `directory` (durable checkpoints; None:
    none) and $ZEROD_SNAPSHOT_DIR (in-memory snapshots, preferred at the same step): what a script
    under `zerorun --max-restarts` calls at its start. None when neither holds one: a first run;
    it raises, as zt.load does, rather than start afresh over the job's own checkpoints.

        ckpt = zt.resume("ckpts")
        for step in range(ckpt.step if ckpt else 0, steps):
            ...; opt.step(); zt.snapshot()
            if step % 100 == 99: zt.save("ckpts", keep_last=3)
    """
    rt = _require()
    _training_state.check_scheduler(rt.optimizer, scheduler, "zt.resume")
    snapshots = os.environ.get("ZEROD_SNAPSHOT_DIR")
    if not snapshots and directory is None:
        return None
    loaded = rt.session.resume(snapshots, [] if directory is None else [os.fspath(directory)])
    return None if loaded is None else _restored(rt, loaded, scheduler)


def memory_stats():
    """What this rank's engine holds and has sent, beside the plan: step, allocated_bytes,
    model_state_bytes, memory by category, bytes_sent by collective, and the plan's figures."""
    rt = _require()
    stats = rt.session.stats()
    stats["planned_bytes"] = rt.info["planned_bytes"]
    stats["planned_memory"] = rt.info["memory"]
    stats["stage"] = rt.stage
    return stats


def shutdown():
    """Leaves the job and frees zerod's memory. Below stage 3 the module keeps a copy of its
    parameters and stays usable in this process (to evaluate or save it); at stage 3 its
    parameters lived only in zerod, so the module refuses to run: take zt.full_state_dict first."""
    _leave(keep_parameters=True)


def _leave(keep_parameters):
    global _active
    rt = _active
    if rt is None:
        return
    _active = None
    try:
        rt.session.leave()
    finally:
        _launch.left()
        rt.detach(keep_parameters)
        if not keep_parameters:
            rt.session.close()
        # Otherwise the session's memory goes with its owner: now, or when the last view of it
        # that the program still holds (a state_dict() taken earlier) goes.


def _leave_at_exit():
    _leave(keep_parameters=False)  # the interpreter is going: no copy is needed
