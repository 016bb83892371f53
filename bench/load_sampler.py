#!/usr/bin/env python3
"""Samples what a coordinator load costs each process, for bench/cluster_load.sh.

Every --every seconds until killed, appends one JSON line to --out: the time, each named process's
CPU seconds (user + system) and RSS, and each etcd member's counters from its /metrics (raft
proposals committed: each write transaction is one, as are lease grants; puts; bytes received from clients; its own CPU).
cluster_load.sh turns the samples into per-phase rates. Standard library only.

  load_sampler.py --out FILE [--every 0.5] [--pid NAME=PID ...] [--etcd NAME=HOST:PORT ...]
"""
import argparse
import json
import os
import time
import urllib.request

ETCD_COUNTERS = {
    "etcd_server_proposals_committed_total": "proposals",
    "etcd_mvcc_put_total": "puts",
    "etcd_mvcc_txn_total": "txns",
    "etcd_network_client_grpc_received_bytes_total": "bytes_in",
    "process_cpu_seconds_total": "cpu_s",
}
TICKS = os.sysconf("SC_CLK_TCK")


def process(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None
    # After the name: state is field 3, utime 14 and stime 15 (1-based, man 5 proc).
    return {"cpu_s": (int(fields[11]) + int(fields[12])) / TICKS, "rss_kib": rss}


def etcd(address):
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ETCD_COUNTERS:
            out[ETCD_COUNTERS[name]] = float(value)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--every", type=float, default=0.5)
    ap.add_argument("--pid", action="append", default=[])
    ap.add_argument("--etcd", action="append", default=[])
    a = ap.parse_args()
    pids = dict(p.split("=", 1) for p in a.pid)
    members = dict(e.split("=", 1) for e in a.etcd)
    with open(a.out, "a") as out:
        while True:
            sample = {"t": time.time(),
                      "processes": {n: process(p) for n, p in pids.items()},
                      "etcd": {n: etcd(m) for n, m in members.items()}}
            out.write(json.dumps(sample) + "\n")
            out.flush()
            time.sleep(a.every)


if __name__ == "__main__":
    main()
