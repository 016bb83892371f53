#!/usr/bin/python3
"""How long a lost rank holds the others (issue 10): a real zerod and W train_mlp ranks; after step
3, one rank is SIGKILLed or SIGSTOPped, and the seconds until each survivor has exited (with the
error naming the lost rank) are printed beside the lease TTL the daemon was given: the bound a
survivor cannot beat, since a silent rank is lost only when its lease runs out (a killed rank's
closed connections fail the others' collectives at once, but they wait for the coordinator to
name the cause).

    /usr/bin/python3 bench/lost_rank_release.py [--world 4] [--lease-ttl 2] [--runs 3]

Prints one JSON line per run and a summary line: release time / lease TTL, per signal.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BIN = os.path.join(ROOT, "build", "bin")


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit(f"lost_rank_release: {what} did not happen within {timeout} s")
        time.sleep(0.02)


def one_run(args, sig, run):
    with tempfile.TemporaryDirectory() as work:
        sock = os.path.join(work, "zerod.sock")
        daemon = subprocess.Popen(
            [os.path.join(BIN, "zerod"), "--socket", sock, "--listen", "", "--data-dir",
             os.path.join(work, "data"), "--lease-ttl", f"{args.lease_ttl}s", "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ranks, logs = [], []
        try:
            wait_for(lambda: os.path.exists(sock), 10, "zerod's socket")
            job = f"release-{sig.name.lower()}-{run}-{os.getpid()}"
            env = dict(os.environ, ZEROD_ENDPOINT="unix://" + sock, ZEROD_JOB=job,
                       ZEROD_WORLD_SIZE=str(args.world))
            for r in range(args.world):
                log = open(os.path.join(work, f"rank{r}.log"), "w+")
                logs.append(log)
                ranks.append(subprocess.Popen(
                    [os.path.join(BIN, "train_mlp"), "--stage", "2", "--steps", "1000000"],
                    env=dict(env, ZEROD_RANK=str(r)), stdout=log, stderr=subprocess.STDOUT))

            def output(r):
                with open(logs[r].name) as f:
                    return f.read()

            wait_for(lambda: "step 3 " in output(0), 120, "step 3")
            victim = args.world - 1
            hit = time.monotonic()
            ranks[victim].send_signal(sig)
            released = {}
            deadline = hit + 120
            while len(released) < args.world - 1 and time.monotonic() < deadline:
                for r in range(args.world - 1):
                    if r not in released and ranks[r].poll() is not None:
                        released[r] = time.monotonic() - hit
                time.sleep(0.01)
            named = all(re.search(rf"rank {victim} was lost", output(r)) for r in released)
            return {"signal": sig.name, "world": args.world, "lease_ttl_s": args.lease_ttl,
                    "released_s": [round(released.get(r, float("inf")), 3)
                                   for r in range(args.world - 1)],
                    "all_released": len(released) == args.world - 1, "lost_rank_named": named}
        finally:
            for p in ranks:
                if p.poll() is None:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                p.wait()
            daemon.kill()
            daemon.wait()
            for log in logs:
                log.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for binary in ("zerod", "train_mlp"):
        if not os.access(os.path.join(BIN, binary), os.X_OK):
            sys.exit("lost_rank_release: build first (scripts/build.sh)")
    summary = {}
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        worst = []
        for run in range(args.runs):
            result = one_run(args, sig, run)
            print(json.dumps(result), flush=True)
            worst.append(max(result["released_s"]))
        summary[sig.name] = worst
    for name, worst in summary.items():
        ratios = ", ".join(f"{w / args.lease_ttl:.2f}" for w in worst)
        print(f"{name}: last survivor released after {', '.join(f'{w:.2f}' for w in worst)} s; "
              f"/ lease TTL {args.lease_ttl:g} s = {ratios}")


if __name__ == "__main__":
    main()
