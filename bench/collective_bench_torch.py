#!/usr/bin/python3
"""torch.distributed on gloo, timed like build/bin/collective_bench times zerod's collectives.

Same worlds, sizes, iteration rule (warm-up, then as many as fill --min-time, at least 5; the
median of the slowest rank's time counts) and output (one JSON object per line), so bench/collective_report.py can put
both side by side. Each rank is its own process (torch.multiprocessing, spawn); rendezvous
through a FileStore. torch's gloo backend has no reduce_scatter: that row says so.

  /usr/bin/python3 bench/collective_bench_torch.py [--worlds 2,3,4] [--sizes 4096,65536]
      [--ops all_reduce,broadcast]
"""

import argparse
import json
import os
import sys
import tempfile
import time


def median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else 0.0


def time_it(dist, torch, min_time, body):
    """The median iteration, each taking as long as its slowest rank took (as collective_bench)."""
    for _ in range(3):
        body()
    start = time.perf_counter()
    body()
    once = time.perf_counter() - start
    iterations = torch.tensor([min(2000.0, max(5.0, min_time / max(once, 1e-7)))])
    dist.broadcast(iterations, 0)
    times = []
    for _ in range(int(iterations.item())):
        t0 = time.perf_counter()
        body()
        times.append(time.perf_counter() - t0)
    mine = torch.tensor(times, dtype=torch.float64)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return median(torch.stack(every).max(dim=0).values.tolist())


def run_rank(rank, world, store_file, sizes, min_time, only_ops, queue):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store_file, rank=rank,
                            world_size=world)
    rows = []
    lead = time_it(dist, torch, min_time, dist.barrier)
    rows.append({"kind": "lead", "impl": "torch", "world": world, "time_us": lead * 1e6})
    for size in sizes:
        elements = size // 4
        data = torch.ones(elements, dtype=torch.float32)
        chunk = elements // world
        pieces = [torch.empty(chunk, dtype=torch.float32) for _ in range(world)]
        mine = torch.ones(chunk, dtype=torch.float32)
        ops = [
            ("all_reduce", lambda: dist.all_reduce(data)),
            ("all_gather", lambda: dist.all_gather(pieces, mine)),
            ("broadcast", lambda: dist.broadcast(data, 0)),
        ]
        for name, body in ops:
            if name not in only_ops:
                continue
            t = time_it(dist, torch, min_time, body)
            rows.append({"kind": "collective", "impl": "torch", "op": name, "world": world,
                         "bytes": size, "time_us": t * 1e6})
        if "reduce_scatter" in only_ops:
            rows.append({"kind": "collective", "impl": "torch", "op": "reduce_scatter",
                         "world": world, "bytes": size, "time_us": None,
                         "note": "torch's gloo backend has no reduce_scatter"})
    dist.destroy_process_group()
    if rank == 0:
        queue.put(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,3,4")
    parser.add_argument("--sizes", default="4096,16384,65536,262144,1048576,4194304,16777216,"
                                           "67108864")
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--ops", default="all_reduce,reduce_scatter,all_gather,broadcast")
    args = parser.parse_args()
    try:
        import torch.multiprocessing as mp
    except ImportError:
        print(json.dumps({"kind": "skipped", "impl": "torch",
                          "why": "python3-torch is not installed for " + sys.executable}))
        return 0
    ctx = mp.get_context("spawn")
    sizes = [int(s) for s in args.sizes.split(",")]
    for world in [int(w) for w in args.worlds.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            store_file = os.path.join(tmp, "store")
            queue = ctx.Queue()
            procs = [ctx.Process(target=run_rank,
                                 args=(r, world, store_file, sizes, args.min_time,
                                       args.ops.split(","), queue))
                     for r in range(world)]
            for p in procs:
                p.start()
            rows = queue.get(timeout=3600)
            for p in procs:
                p.join()
                if p.exitcode != 0:
                    print(f"collective_bench_torch: a rank failed (world {world})",
                          file=sys.stderr)
                    return 1
            for row in rows:
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
