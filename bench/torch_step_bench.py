"""torch_step_bench: one training step of examples/torch/gpt_model.py's GPT on 2 local ranks, with
zerod.torch at ZeRO stages 0-3 beside its peers measured in the same run: torch DDP (gloo) with
torch.optim.AdamW, and torch DDP with ZeroRedundancyOptimizer(AdamW) (torch's ZeRO stage 1).
Every configuration is its own 2-process job on the same model, initial values, data, global
batch, fp32 and AdamW hyper-parameters. Two more zerod rows checkpoint every block's activations
(torch.utils.checkpoint, non-reentrant) at stages 0 and 3 with zt.shard's default options, and
the last table gives every zerod row's peak RSS per rank against stage 0's.

The reference for time is also measured in the run: one process alone doing a rank's share (its
half of the global batch, torch.optim.AdamW) with no communication ("1 process"); the distributed
rows can only add to it.

Run it through bench/torch_step_bench.sh, which starts the zerod daemon the zerod jobs join:

    bench/torch_step_bench.sh [--small] [--steps 8]

Per configuration and rank it measures (median over the measured steps, after warm-up steps):
step time (zero_grad + forward + backward + opt.step), and forward, backward and opt.step() alone;
peak RSS (getrusage ru_maxrss, which includes Python + torch), the RSS baseline after importing
torch and building the model, and the difference; model-state bytes held per rank (torch: the
storages of the parameters, their .grad and the optimizer's state tensors after a step; zerod:
memory_stats()["model_state_bytes"] and the engine's allocated_bytes); bytes sent per step (zerod:
measured by the engine over the measured steps; torch: computed from the algorithm, since gloo
does not count them). Beside them the paper's expected figures (ZeRO, Rajbhandari et al. 2020)
for fp32 Adam: model state 16 bytes/param unsharded, 4+4+8/N at stage 1, 4+12/N at stage 2,
16/N at stage 3; traffic per rank per step 2(N-1)/N x 4 bytes/param at stages 0-2 (ring
all-reduce, or reduce-scatter + all-gather), 3(N-1)/N x 4 at stage 3.

Default model: width 528, 5 layers, 8 heads, context 64 (16.84M parameters, fp32 model state
256.9 MiB unsharded); global batch 2 x 64 tokens. Debian's torch multiplies with the reference
BLAS (~5 GFLOP/s a core), so the default keeps the parameter count, which the memory and traffic
figures are about, and cuts the tokens per step so that a full run takes ~3 minutes on 2 cores;
the "1 process" row is the compute it costs. --small: width 128, 2 layers (0.41M).
Each rank runs 1 torch thread and 1 zerod engine thread (--threads, --zerod-threads), one core
each on a 2-core machine; --zerod-bucket-mb passes bucket_cap_mb to zt.shard.

Internally the same file is also the worker: `--worker local|torch-ddp|torch-zero|zerod`.
"""

import argparse
import json
import os
import pathlib
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
GPL = "/usr/share/common-licenses/GPL-3"
MIB = 2.0 ** 20

# name, kind, stage (the paper's stage the configuration corresponds to)
CONFIGS = [
    ("1 process", "local", 0),  # a rank's share alone, no communication: the reference
    ("torch DDP+AdamW", "torch-ddp", 0),
    ("torch DDP+ZeRO-1", "torch-zero", 1),
    ("zerod stage 0", "zerod", 0),
    ("zerod stage 1", "zerod", 1),
    ("zerod stage 2", "zerod", 2),
    ("zerod stage 3", "zerod", 3),
    # Activation checkpointing of every block (torch.utils.checkpoint, non-reentrant), zt.shard's
    # default options otherwise: the memory stage 3 saves where activations are recomputed.
    ("zerod s0 ckpt", "zerod", 0),
    ("zerod s3 ckpt", "zerod", 3),
]
CHECKPOINTED = {"zerod s0 ckpt", "zerod s3 ckpt"}
DEFAULT = dict(width=528, layers=5, heads=8, context=64, batch=2, steps=8, warmup=3)
SMALL = dict(width=128, layers=2, heads=4, context=32, batch=4, steps=5, warmup=2)
LR, BETAS, EPS, WEIGHT_DECAY = 3e-4, (0.9, 0.999), 1e-8, 0.01


def paper_model_state(stage, psi, n):
    """Bytes per rank of fp32 parameters, fp32 gradients and Adam's two fp32 moments."""
    return {0: 16 * psi, 1: 8 * psi + 8 * psi / n, 2: 4 * psi + 12 * psi / n,
            3: 16 * psi / n}[stage]


def paper_traffic(stage, psi, n):
    """Bytes each rank sends per step (ring algorithms, fp32 gradients and parameters)."""
    return (3 if stage == 3 else 2) * (n - 1) / n * 4 * psi


# ---- worker ------------------------------------------------------------------------------------

def rss_kib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def current_rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def current_pss_kib():
    """Proportional set size: pages shared with other processes (stage 3's shards in shared
    memory, which every rank maps) count as the share each process has of them."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def storage_nbytes(t):
    if hasattr(t, "untyped_storage"):
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    s = t.storage()
    return s.data_ptr(), (s.nbytes() if hasattr(s, "nbytes") else s.size() * t.element_size())


def held_bytes(tensors):
    """Sum of the distinct storages behind `tensors` (views and shared storages counted once)."""
    seen = {}
    for t in tensors:
        if t is None:
            continue
        ptr, n = storage_nbytes(t)
        if n and ptr not in seen:
            seen[ptr] = n
    return sum(seen.values())


def worker(args):
    import torch
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(ROOT / "examples" / "torch"))
    from gpt_model import GPT, CharData, loss_fn

    data = CharData(GPL)
    torch.manual_seed(0)  # the same initial values on every rank and in every configuration
    model = GPT(data.vocab, args.context, args.width, args.layers, args.heads,
                checkpoint="non-reentrant" if args.checkpoint_activations else None)
    psi = sum(p.numel() for p in model.parameters())
    baseline_kib = rss_kib()
    result = {"params": psi, "baseline_rss_kib": baseline_kib}

    if args.worker == "zerod":
        import zerod.torch as zt
        extra = {}  # stage 3: zt.shard's default units, one per Block
        if args.zerod_bucket_mb is not None:
            extra["bucket_cap_mb"] = args.zerod_bucket_mb
        model, opt = zt.shard(model, stage=args.stage, dtype="fp32", lr=LR, betas=BETAS, eps=EPS,
                              weight_decay=WEIGHT_DECAY, optimizer="adamw",
                              threads=args.zerod_threads, **extra)
        rank, world = zt.rank(), zt.world_size()
        net = model
        result["planned_model_state_bytes"] = model._zerod_runtime.info["model_state_bytes"]
        result["planned_bytes"] = model._zerod_runtime.info["planned_bytes"]

        def sent():
            # Stage 3 on one host pulls the peers' shards from shared memory instead of
            # all-gathering them: the bytes it copies count as moved.
            stats = zt.memory_stats()
            moved = dict(stats["bytes_sent"])
            if stats["bytes_pulled"]:
                moved["pulled (shm)"] = stats["bytes_pulled"]
            return moved
    elif args.worker == "local":
        rank, world = 0, args.world  # rank 0's rows of each global batch, alone
        net = model
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WEIGHT_DECAY)

        def sent():
            return {}
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        rank, world = args.rank, args.world
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                                world_size=world)
        # gradient_as_bucket_view: .grad are views of DDP's all-reduce buckets, so the storages
        # counted below are all the gradient memory DDP holds (by default it holds both).
        # The causal masks are bool buffers, which gloo cannot broadcast ("Invalid scalar
        # type"); they are constant, so DDP leaves them alone (zerod syncs floating buffers only).
        DDP._set_params_and_buffers_to_ignore_for_model(
            model, [n for n, b in model.named_buffers() if not b.is_floating_point()])
        net = DDP(model, gradient_as_bucket_view=True)
        hyper = dict(lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
        if args.worker == "torch-ddp":
            opt = torch.optim.AdamW(net.parameters(), **hyper)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.AdamW,
                                          **hyper)

        def sent():
            return {}

    result["setup_rss_kib"] = rss_kib()
    local = args.batch // world
    steps = args.warmup + args.steps
    times = {"step": [], "fwd": [], "bwd": [], "opt": []}
    losses = []
    sent_before = None
    step_rss = step_pss = 0  # the most sampled after forward, backward, opt.step of measured steps
    clock = time.perf_counter
    def cpu_seconds():
        u = resource.getrusage(resource.RUSAGE_SELF)
        return u.ru_utime + u.ru_stime

    for step in range(steps):
        if step == args.warmup:
            sent_before = sent()
            cpu0, wall0 = cpu_seconds(), clock()
        x, y = data.batch(step, args.batch, args.context)
        x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
        t0 = clock()
        opt.zero_grad(set_to_none=True)
        t1 = clock()
        loss = loss_fn(net(x), y)
        t2 = clock()
        sampled = [(current_rss_kib(), current_pss_kib())]  # activations held for backward
        loss.backward()
        t3 = clock()
        sampled.append((current_rss_kib(), current_pss_kib()))
        opt.step()
        t4 = clock()
        losses.append(loss.item())
        if step == 0:
            result["first_step_rss_kib"] = rss_kib()
        if step >= args.warmup:
            sampled.append((current_rss_kib(), current_pss_kib()))
            step_rss = max([step_rss] + [rss for rss, _ in sampled])
            step_pss = max([step_pss] + [pss for _, pss in sampled])
            times["step"].append(t4 - t0)
            times["fwd"].append(t2 - t1)
            times["bwd"].append(t3 - t2)
            times["opt"].append(t4 - t3)
    cpu_share = (cpu_seconds() - cpu0) / (clock() - wall0)
    sent_after = sent()

    if args.worker == "zerod":
        stats = zt.memory_stats()
        result["model_state_bytes"] = stats["model_state_bytes"]
        result["allocated_bytes"] = stats["allocated_bytes"]
        result["peak_gather_buffers"] = stats["peak_gather_buffers"]
        result["gather_overflows"] = stats["gather_overflows"]
        result["memory"] = stats.get("memory", {})
        result["sent"] = {k: v - sent_before.get(k, 0) for k, v in sent_after.items()}
        result["sent_per_step"] = sum(result["sent"].values()) / args.steps
        result["sent_measured"] = True
        result["losses"] = [zt.average(v) for v in losses]
    else:  # torch: what the rank's storages hold
        params = list(model.parameters())
        inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer's local AdamW
        state = [v for s in inner.state.values() for v in s.values() if torch.is_tensor(v)]
        own = sum(p.numel() for g in inner.param_groups for p in g["params"])
        result["memory"] = {"params": held_bytes(params),
                            "grads": held_bytes([p.grad for p in params]),
                            "optimizer_state": held_bytes(state)}
        result["model_state_bytes"] = held_bytes(params + [p.grad for p in params] + state)
        result["optimizer_params"] = own
        allreduce = 2 * (world - 1) / world * 4 * psi  # gloo's ring all-reduce
        sent_bytes = {"all-reduce (DDP)": allreduce} if args.worker != "local" else {}
        if args.worker == "torch-zero":
            # after its step each rank broadcasts the parameters it owns to the others
            sent_bytes["broadcast (ZeRO)"] = (world - 1) * 4 * own
        result["sent"] = sent_bytes
        result["sent_per_step"] = sum(sent_bytes.values())
        result["sent_measured"] = False
        if args.worker == "local":
            result["losses"] = losses  # rank 0's half of the batch only
        else:
            t = torch.tensor(losses, dtype=torch.float64)
            dist.all_reduce(t)
            result["losses"] = (t / world).tolist()
    result.update(rank=rank, world=world, peak_rss_kib=rss_kib(), step_rss_kib=step_rss,
                  step_pss_kib=step_pss,
                  end_rss_kib=current_rss_kib(),
                  median_ms={k: 1e3 * statistics.median(v) for k, v in times.items()},
                  cpu_share=cpu_share,
                  step_range_ms=[1e3 * min(times["step"]), 1e3 * max(times["step"])])
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if args.worker == "zerod":
        zt.shutdown()
    elif args.worker != "local":
        dist.destroy_process_group()


# ---- orchestrator ------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_args(args):
    out = []
    for key in ("width", "layers", "heads", "context", "batch", "steps", "warmup", "threads",
                "zerod_threads", "zerod_bucket_mb"):
        if getattr(args, key) is not None:
            out += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    return out


def run_config(args, index, name, kind, stage, work):
    out = os.path.join(work, f"config{index}")
    os.makedirs(out)
    me = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--out", out,
          "--stage", str(stage)] + model_args(args)
    if name in CHECKPOINTED:
        me.append("--checkpoint-activations")
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(args.threads)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "python"),
                                                    env.get("PYTHONPATH", "")] if p)
    start = time.time()
    if kind == "local":
        procs = [subprocess.Popen(me, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)]
    elif kind == "zerod":
        cmd = [args.zerorun, "-n", str(args.world), "--endpoint", args.endpoint,
               "--job", f"torch-step-bench-{os.getpid()}-{index}", "--"] + me
        procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)]
    else:
        port = free_port()
        procs = [subprocess.Popen(me + ["--rank", str(r), "--world", str(args.world),
                                        "--port", str(port)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for r in range(args.world)]
    logs, failed = [], False
    for p in procs:
        try:
            text, _ = p.communicate(timeout=args.job_timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            text, _ = p.communicate()
            text += f"\n(killed after {args.job_timeout} s)"
        logs.append(text)
        failed |= p.returncode != 0
    ranks = []
    for r in range(1 if kind == "local" else args.world):
        path = os.path.join(out, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                ranks.append(json.load(f))
    if failed or not ranks or (kind != "local" and len(ranks) != args.world):
        print("  FAILED; output:\n" + "\n".join(t[-4000:] for t in logs), flush=True)
        return None
    return {"ranks": ranks, "wall_s": time.time() - start}


def fmt_pair(values, scale=1.0, digits=1):
    vals = [v / scale for v in values]
    if all(abs(v - vals[0]) < 0.5 * 10 ** -digits for v in vals):
        return f"{vals[0]:.{digits}f}"
    return "/".join(f"{v:.{digits}f}" for v in vals)


def orchestrate(args):
    if not args.endpoint:
        sys.exit("torch_step_bench: no zerod endpoint (run bench/torch_step_bench.sh)")
    import torch
    try:
        import torch.distributed.fsdp  # noqa: F401
        fsdp = "imports (not benchmarked here)"
    except Exception as e:  # Debian's torch 1.13 under Python 3.11
        fsdp = f"does not import under Python {sys.version.split()[0]} ({type(e).__name__}: {e})"
    sys.path.insert(0, str(ROOT / "examples" / "torch"))
    from gpt_model import GPT, CharData
    data = CharData(GPL)
    model = GPT(data.vocab, args.context, args.width, args.layers, args.heads)
    psi = sum(p.numel() for p in model.parameters())
    del model
    n = args.world
    tokens = args.batch // n * args.context
    blas = "generic (netlib reference BLAS)" if "BLAS_INFO=generic" in torch.__config__.show() \
        else "see torch.__config__.show()"
    print(f"torch_step_bench: GPT width {args.width}, {args.layers} layers, {args.heads} heads, "
          f"context {args.context}, vocab {data.vocab}: {psi:,} parameters ({psi / 1e6:.2f}M), "
          f"fp32, AdamW lr {LR} wd {WEIGHT_DECAY}")
    print(f"  global batch {args.batch} x {args.context} tokens ({tokens} tokens per rank), "
          f"{n} ranks, {args.warmup} warm-up + {args.steps} measured steps; torch "
          f"{torch.__version__}, {args.threads} torch thread(s) and {args.zerod_threads} zerod "
          f"engine thread(s) per rank, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}"
          + (f", zerod bucket_cap_mb {args.zerod_bucket_mb:g}" if args.zerod_bucket_mb else ""))
    print(f"  torch's BLAS: {blas}, so compute dominates the step; the reference row \"1 "
          f"process\" is rank 0's share alone (same {tokens} tokens, AdamW, no communication)")
    print(f"  torch FSDP (the peer of stages 2-3) {fsdp}: no torch peer for stages 2 and 3")
    print("  torch's bytes sent are computed (gloo counts nothing): ring all-reduce "
          "2(N-1)/N*4*Psi, plus ZeRO-1's broadcast of each rank's parameters (N-1)*4*owned; "
          "zerod's are measured", flush=True)

    work = tempfile.mkdtemp(prefix="torch-step-bench-")
    rows = []
    wanted = set(args.configs.split(",")) if args.configs else None
    for index, (name, kind, stage) in enumerate(CONFIGS):
        if wanted and str(index) not in wanted and name not in wanted:
            continue
        print(f"\n== {name} ==", flush=True)
        res = run_config(args, index, name, kind, stage, work)
        if res is None:
            rows.append((name, kind, stage, None))
            continue
        for r in res["ranks"]:
            m = r["median_ms"]
            mem = ", ".join(f"{k} {v / MIB:.1f}" for k, v in r["memory"].items()
                            if isinstance(v, (int, float)))
            sent = ", ".join(f"{k} {v / args.steps / MIB if r['sent_measured'] else v / MIB:.2f}"
                             for k, v in r["sent"].items())
            print(f"  rank {r['rank']}: step {m['step']:.1f} ms (forward {m['fwd']:.1f}, "
                  f"backward {m['bwd']:.1f}, opt.step {m['opt']:.1f}; steps "
                  f"{r['step_range_ms'][0]:.0f}-{r['step_range_ms'][1]:.0f}); CPU time / wall "
                  f"time {100 * r['cpu_share']:.0f}%")
            print(f"    RSS MiB: baseline {r['baseline_rss_kib'] / 1024:.0f}, peak after setup "
                  f"{r['setup_rss_kib'] / 1024:.0f}, after the first step "
                  f"{r['first_step_rss_kib'] / 1024:.0f}, at the end {r['peak_rss_kib'] / 1024:.0f}"
                  f" (held then {r['end_rss_kib'] / 1024:.0f})")
            extra = ""
            if kind == "zerod":
                extra = (f"; engine allocated {r['allocated_bytes'] / MIB:.1f} MiB, plan's model "
                         f"state {r['planned_model_state_bytes'] / MIB:.1f} MiB")
                if stage == 3:
                    extra += (f"; at most {r['peak_gather_buffers']} gather buffers held, "
                              f"{r['gather_overflows']} gathers beyond max_live_units")
            elif kind == "torch-zero":
                extra = (f"; its AdamW owns {r['optimizer_params']:,} of {psi:,} parameters "
                         f"({100 * r['optimizer_params'] / psi:.1f}%)")
            print(f"    model state {r['model_state_bytes'] / MIB:.1f} MiB ({mem}){extra}")
            print(f"    sent per step {r['sent_per_step'] / MIB:.2f} MiB "
                  f"({'measured' if r['sent_measured'] else 'computed'}: {sent})")
        losses = res["ranks"][0]["losses"]
        print(f"  loss ({'rank 0 half-batch' if kind == 'local' else 'mean over ranks'}): first "
              f"{losses[0]:.4f}, last {losses[-1]:.4f}; job took {res['wall_s']:.0f} s",
              flush=True)
        rows.append((name, kind, stage, res))

    # ---- the table ----
    print(f"\ntorch_step_bench summary: {psi:,} params (Psi), N={n}, fp32 AdamW; medians of "
          f"{args.steps} steps; times are the slower rank's; a/b = rank 0/rank 1")
    head = (f"{'configuration':<17} {'step ms':>8} {'fwd ms':>7} {'bwd ms':>7} {'opt ms':>7} "
            f"{'cpu%':>5} "
            f"{'peakRSS MiB':>12} {'dRSS MiB':>10} {'state MiB':>11} {'paper':>6} {'/paper':>7} "
            f"{'alloc MiB':>9} {'sent MiB/st':>12} {'paper':>6} {'last loss':>9}")
    print(head)
    print("-" * len(head))
    summary = {}
    for name, kind, stage, res in rows:
        if res is None:
            print(f"{name:<17} FAILED")
            continue
        rk = res["ranks"]
        ms = {k: max(r["median_ms"][k] for r in rk) for k in ("step", "fwd", "bwd", "opt")}
        state = [r["model_state_bytes"] for r in rk]
        paper = paper_model_state(stage, psi, n)
        vs_paper = max(state) / paper
        alloc = fmt_pair([r["allocated_bytes"] for r in rk], MIB) if kind == "zerod" else "-"
        sent = fmt_pair([r["sent_per_step"] for r in rk], MIB, 2) + ("" if rk[0]["sent_measured"]
                                                                     else "*")
        summary[name] = dict(ms=ms, state=max(state), stage=stage,
                             rss=max(r["peak_rss_kib"] for r in rk) * 1024,
                             alloc=max(r.get("allocated_bytes", 0) for r in rk))
        print(f"{name:<17} {ms['step']:>8.1f} {ms['fwd']:>7.1f} {ms['bwd']:>7.1f} "
              f"{ms['opt']:>7.1f} {100 * min(r['cpu_share'] for r in rk):>5.0f} "
              f"{fmt_pair([r['peak_rss_kib'] for r in rk], 1024, 0):>12} "
              f"{fmt_pair([r['peak_rss_kib'] - r['baseline_rss_kib'] for r in rk], 1024, 0):>10} "
              f"{fmt_pair(state, MIB):>11} {paper / MIB:>6.1f} {vs_paper:>7.3f} {alloc:>9} "
              f"{'-' if kind == 'local' else sent:>12} "
              f"{0 if kind == 'local' else paper_traffic(stage, psi, n) / MIB:>6.2f} "
              f"{'-' if kind == 'local' else format(rk[0]['losses'][-1], '.4f'):>9}")
    print("  1 process: rank 0's share alone (half the global batch, AdamW, no communication), "
          "the reference the distributed rows add to. cpu%: CPU time / wall time of the measured "
          "steps, the lower rank's; well under 100% means the rank waited or the machine's other "
          "work took its core (then its times are inflated)")
    print("  * computed from the algorithm, not measured. peakRSS includes Python + torch + the "
          "model; dRSS = peak minus the baseline after importing torch and building the model "
          f"(that baseline already holds the model's own fp32 parameters, {4 * psi / MIB:.1f} "
          "MiB, which torch trains in place and zerod replaces by its own copy)")
    print("  state: torch = storages of params + .grad + optimizer state; zerod = engine's "
          "model_state_bytes; paper = 16*Psi, 8*Psi+8*Psi/N, 4*Psi+12*Psi/N, 16*Psi/N; "
          "/paper uses the larger rank")

    def ratio(a, b, key="step"):
        if a in summary and b in summary:
            x, y = summary[a], summary[b]
            x, y = (x["ms"][key], y["ms"][key]) if key != "state" else (x["state"], y["state"])
            return f"{x / y:.3f}"
        return "n/a"

    print("ratios (step time; opt.step time; model state):")
    for a, b in (("torch DDP+AdamW", "1 process"), ("zerod stage 0", "1 process"),
                 ("zerod stage 1", "torch DDP+ZeRO-1"), ("zerod stage 0", "torch DDP+AdamW"),
                 ("zerod stage 1", "zerod stage 0"), ("zerod stage 2", "zerod stage 0"),
                 ("zerod stage 3", "zerod stage 0"), ("zerod s3 ckpt", "zerod s0 ckpt"),
                 ("torch DDP+ZeRO-1", "torch DDP+AdamW")):
        print(f"  {a + ' / ' + b:<36} {ratio(a, b):>7} {ratio(a, b, 'opt'):>7} "
              f"{ratio(a, b, 'state'):>7}")
    print("saved per rank against the unsharded peer (paper: 16*Psi minus the row's paper "
          "figure; peak RSS is the larger rank's):")
    for a, b in (("torch DDP+ZeRO-1", "torch DDP+AdamW"), ("zerod stage 1", "zerod stage 0"),
                 ("zerod stage 2", "zerod stage 0"), ("zerod stage 3", "zerod stage 0"),
                 ("zerod s3 ckpt", "zerod s0 ckpt")):
        if a not in summary or b not in summary:
            continue
        x, y = summary[a], summary[b]
        expect = (paper_model_state(y["stage"], psi, n) - paper_model_state(x["stage"], psi, n))
        line = (f"  {a + ' vs ' + b:<36} model state {(y['state'] - x['state']) / MIB:7.1f} MiB"
                f" (paper {expect / MIB:.1f}), peak RSS {(y['rss'] - x['rss']) / MIB:7.1f} MiB")
        if x["alloc"] and y["alloc"]:
            line += f", engine allocated {(y['alloc'] - x['alloc']) / MIB:7.1f} MiB"
        print(line)
    print("peak memory per rank (MiB, rank 0/rank 1): RSS of the whole run; RSS and PSS of the "
          "measured steps (sampled after forward, backward and opt.step, so the setup's transient "
          "copies are left out; PSS counts pages shared with the other ranks, stage 3's shards in "
          "shared memory, as each rank's share); each against zerod stage 0 with the same "
          "activations (checkpointed rows against zerod s0 ckpt):")
    by_name = {name: res for name, _, _, res in rows}
    for name, kind, stage, res in rows:
        if kind != "zerod" or res is None:
            continue
        base_name = "zerod s0 ckpt" if name in CHECKPOINTED else "zerod stage 0"
        base = by_name.get(base_name)
        line = f"  {name:<17}"
        for key, label in (("peak_rss_kib", "run RSS"), ("step_rss_kib", "steps RSS"),
                           ("step_pss_kib", "PSS")):
            peaks = "/".join(f"{r[key] / 1024:.0f}" for r in res["ranks"])
            line += f"  {label} {peaks:>9}"
            if base is not None:
                ratios = "/".join(f"{r[key] / b[key]:.3f}"
                                  for r, b in zip(res["ranks"], base["ranks"]))
                line += f" (x{ratios})"
        print(line + (f"  against {base_name}" if base is not None else ""))
    return 0 if all(res is not None for *_, res in rows) else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="a small model for a quick smoke test")
    for key in ("width", "layers", "heads", "context", "batch", "steps", "warmup"):
        p.add_argument(f"--{key}", type=int)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--zerod-threads", type=int, default=1, help="zerod engine threads per rank")
    p.add_argument("--zerod-bucket-mb", type=float,
                   help="zt.shard's bucket_cap_mb (default: zt.shard's own default)")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--endpoint", default=os.environ.get("ZEROD_ENDPOINT"))
    p.add_argument("--zerorun", default=str(ROOT / "build" / "bin" / "zerorun"))
    p.add_argument("--configs", help="comma-separated indices 0-8 or names (default: all)")
    p.add_argument("--checkpoint-activations", action="store_true",
                   help="worker: checkpoint every block's activations (set per configuration)")
    p.add_argument("--job-timeout", type=float, default=900)
    # worker mode
    p.add_argument("--worker", choices=("local", "torch-ddp", "torch-zero", "zerod"))
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--out")
    args = p.parse_args()
    base = SMALL if args.small else DEFAULT
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.batch % args.world:
        sys.exit("torch_step_bench: --batch must divide by the number of ranks")
    if args.worker:
        worker(args)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
