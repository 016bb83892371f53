#!/usr/bin/python3
"""Tables from collective_bench's and collective_bench_torch.py's JSON lines (stdin or files).

Per world size: for each op and size, zerod's time beside torch gloo's and their ratio, zerod's
bus bandwidth (what each rank moves, per second) against the loopback bandwidth measured in the
same run, and the share of the order check (the lead exchange) in zerod's time ("inline": carried
in the data's own message; "chain": a chain broadcast's sparse leads, no exchange of their own;
"shm": the data went through shared memory, where the loopback's bandwidth is no limit). Then the aims of
issue 15: every collective at most torch's time, and 4 KiB within 1.5x the loopback round trip;
beside the latter, each world's 4 KiB against the bare exchange of 4 KiB among as many processes
(what one inline exchange cannot beat here, where more processes than cores share the machine).

  bench/collective_report.py zerod.jsonl torch.jsonl
"""

import fileinput
import json
import sys


def size_name(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def moved_per_rank(op, world, size):
    """Bytes each rank sends in a ring implementation: the bus bandwidth's numerator."""
    if op == "all_reduce":
        return 2 * (world - 1) * size / world
    if op in ("reduce_scatter", "all_gather"):
        return (world - 1) * size / world
    return size  # broadcast: the root sends it, every other rank receives it


def medians(rows, kind, key, field):
    """key(row) -> the median of `field` over the rows of `kind` with that key (None if none)."""
    groups = {}
    for r in rows:
        if r["kind"] == kind:
            groups.setdefault(key(r), []).append(r[field])
    out = {}
    for k, values in groups.items():
        present = sorted(v for v in values if v is not None)
        mid = len(present) // 2
        out[k] = (None if not present else present[mid] if len(present) % 2
                  else (present[mid - 1] + present[mid]) / 2)
    return out


def main():
    rows = [json.loads(line) for line in fileinput.input() if line.strip().startswith("{")]
    # Several rounds (collective_bench.sh --rounds) give each figure several times: the median
    # round counts.
    rtt = medians(rows, "loopback_rtt", lambda r: r["bytes"], "rtt_us")
    bandwidth = medians(rows, "loopback_bandwidth", lambda r: 0, "gb_per_s").get(0)
    exchange = medians(rows, "loopback_exchange", lambda r: r["world"], "time_us")
    leads = medians(rows, "lead", lambda r: (r["impl"], r["world"]), "time_us")
    times = {}
    for key, t in medians(rows, "collective",
                          lambda r: (r["impl"], r["world"], r["op"], r["bytes"]),
                          "time_us").items():
        first = next(r for r in rows if r["kind"] == "collective" and
                     (r["impl"], r["world"], r["op"], r["bytes"]) == key)
        times[key] = dict(first, time_us=t)
    if rtt:
        print("loopback TCP round trip (two processes, TCP_NODELAY): " +
              ", ".join(f"{size_name(b)} {t:.1f} us" for b, t in sorted(rtt.items())))
    if bandwidth:
        print(f"loopback TCP bandwidth (one stream): {bandwidth:.2f} GB/s")
    worst = []
    for world in sorted({k[1] for k in times}):
        print()
        print(f"world {world}: zerod lead exchange (barrier) {leads.get(('zerod', world), 0):.1f} us,"
              f" torch barrier {leads.get(('torch', world), 0):.1f} us" +
              (f", bare 4 KiB exchange among {world} processes {exchange[world]:.1f} us"
               if world in exchange else ""))
        print(f"{'op':<15}{'size':>9}{'zerod us':>11}{'torch us':>11}{'z/torch':>9}"
              f"{'zerod GB/s':>12}{'of loopback':>13}{'check share':>13}")
        for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
            for size in sorted({k[3] for k in times if k[1] == world and k[2] == op}):
                z = times.get(("zerod", world, op, size))
                t = times.get(("torch", world, op, size))
                if z is None:
                    continue
                zt = z["time_us"]
                tt = t["time_us"] if t else None
                ratio = f"{zt / tt:.2f}" if tt else "n/a"
                bus = moved_per_rank(op, world, size) / (zt * 1e-6) / 1e9
                of_link = f"{bus / bandwidth:.2f}" if bandwidth else "-"
                share = ("inline" if z.get("inline") else "chain" if z.get("chain")
                         else f"{leads.get(('zerod', world), 0) / zt:.0%}"
                         + (" shm" if z.get("shared_memory") else ""))
                print(f"{op:<15}{size_name(size):>9}{zt:>11.1f}"
                      f"{(f'{tt:.1f}' if tt else 'n/a'):>11}{ratio:>9}{bus:>12.2f}{of_link:>13}"
                      f"{share:>13}")
                if tt:
                    worst.append((zt / tt, op, world, size))
        if any(k[0] == "torch" and k[1] == world and k[2] == "reduce_scatter" for k in times):
            print("(torch's gloo backend has no reduce_scatter)")
    grouped = sorted({(k[1], k[3]) for k in times if k[2].endswith("_grouped")})
    if grouped:
        buffers = next(r["buffers"] for k, r in times.items() if k[2].endswith("_grouped"))
        print()
        print(f"the same bytes cut into {buffers} buffers: one grouped collective, and one"
              f" collective per buffer (zerod us)")
        print(f"{'world':<7}{'size':>9}{'op':>16}{'one buffer':>12}{'grouped':>10}"
              f"{'per buffer':>12}{'grouped/one':>13}")
        for world, size in grouped:
            for op in ("reduce_scatter", "all_gather"):
                one = times.get(("zerod", world, op, size))
                group = times.get(("zerod", world, op + "_grouped", size))
                each = times.get(("zerod", world, op + "_separately", size))
                if not (one and group and each):
                    continue
                print(f"{world:<7}{size_name(size):>9}{op:>16}{one['time_us']:>12.1f}"
                      f"{group['time_us']:>10.1f}{each['time_us']:>12.1f}"
                      f"{group['time_us'] / one['time_us']:>13.2f}")
    print()
    if worst:
        ratio, op, world, size = max(worst)
        print(f"aim, every collective at most torch gloo's time: worst zerod/torch {ratio:.2f}"
              f" ({op}, world {world}, {size_name(size)})")
    small = [(r["time_us"], r["op"], r["world"]) for k, r in times.items()
             if k[0] == "zerod" and k[3] == 4096 and r.get("buffers", 1) == 1]
    if small and 4096 in rtt:
        t, op, world = max(small)
        print(f"aim, 4 KiB within 1.5x the loopback round trip ({rtt[4096]:.1f} us): worst"
              f" {t / rtt[4096]:.2f}x ({op}, world {world})")
        for w in sorted({world for _, _, world in small}):
            t, op, _ = max(x for x in small if x[2] == w)
            line = f"  world {w}: worst 4 KiB {t:.1f} us ({op}), {t / rtt[4096]:.2f}x the round trip"
            if w in exchange:
                line += f", {t / exchange[w]:.2f}x the bare exchange among {w} processes"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
