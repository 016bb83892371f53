#!/usr/bin/env bash
# cluster_load: the coordinator on etcd against the coordinator on SQLite, beside etcd's own write
# rate, all in one run on this machine (issue 13's benchmark):
#   1. a 3-member etcd on loopback ports; etcd's put rate (build/bin/etcd_put_rate), the peer;
#   2. one zerod on SQLite, N simulated ranks joining one job, getting the plan and heartbeating
#      (build/bin/coordinator_load);
#   3. three zerods on that etcd (one leads, two forward to it), the same N ranks spread over their
#      three sockets.
# Prints each run's JSON line and a table.
#
#   bench/cluster_load.sh [--ranks 4096] [--seconds 5]
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=4096 seconds=5
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    *) echo "cluster_load: unknown flag $1" >&2; exit 2 ;;
  esac
done
for b in zerod coordinator_load etcd_put_rate; do
  [ -x build/bin/$b ] || { echo "cluster_load: build first (scripts/build.sh)" >&2; exit 1; }
done
command -v etcd >/dev/null || { echo "cluster_load: needs etcd (scripts/setup.sh)" >&2; exit 1; }
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# 1. etcd: three members, then its own put rate.
cluster="" endpoints=""
declare -a client_ports peer_ports
for i in 0 1 2; do
  client_ports[$i]=$(free_port) peer_ports[$i]=$(free_port)
  cluster+="${cluster:+,}m$i=http://127.0.0.1:${peer_ports[$i]}"
  endpoints+="${endpoints:+,}127.0.0.1:${client_ports[$i]}"
done
for i in 0 1 2; do
  # A job's formation is one transaction holding every member (README "zerod on etcd"): etcd's
  # defaults (128 operations, 1.5 MiB per request) are raised as that section says.
  etcd --name m$i --data-dir "$work/etcd$i" --log-level error \
    --max-txn-ops 262144 --max-request-bytes 33554432 \
    --listen-client-urls http://127.0.0.1:${client_ports[$i]} \
    --advertise-client-urls http://127.0.0.1:${client_ports[$i]} \
    --listen-peer-urls http://127.0.0.1:${peer_ports[$i]} \
    --initial-advertise-peer-urls http://127.0.0.1:${peer_ports[$i]} \
    --initial-cluster "$cluster" --initial-cluster-state new >"$work/etcd$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 100); do
  build/bin/etcd_put_rate --endpoints "$endpoints" --threads 1 --seconds 0.05 >/dev/null 2>&1 && break
  sleep 0.2
done
echo "== etcd's own put rate (3 members, 8 threads)"
build/bin/etcd_put_rate --endpoints "$endpoints" --threads 8 --seconds 3 | tee "$work/etcd.json"

start_zerod() {  # name, extra flags...
  local name=$1
  shift
  mkdir -m 700 -p "$work/$name"
  build/bin/zerod --socket "$work/$name.sock" --data-dir "$work/$name" --lease-ttl 30s "$@" \
    >"$work/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 300); do [ -S "$work/$name.sock" ] && return; sleep 0.1; done
  echo "cluster_load: zerod $name did not start:" >&2
  cat "$work/$name.log" >&2
  exit 1
}

# 2. SQLite.
start_zerod sqlite --listen ""
echo "== one zerod on SQLite: $ranks ranks"
build/bin/coordinator_load --endpoint "unix://$work/sqlite.sock" --job load --ranks "$ranks" \
  --seconds "$seconds" --daemon-pid "${pids[-1]}" | tail -1 | tee "$work/sqlite.json"

# 3. Three zerods on etcd: the first leads, the others follow it.
url="etcd://$endpoints/zerod-bench/"
start_zerod n0 --store "$url" --listen 127.0.0.1:0 --node n0
leader_pid=${pids[-1]}
for _ in $(seq 300); do grep -q "leads the cluster" "$work/n0.log" && break; sleep 0.1; done
start_zerod n1 --store "$url" --listen 127.0.0.1:0 --node n1
start_zerod n2 --store "$url" --listen 127.0.0.1:0 --node n2
for n in n1 n2; do
  for _ in $(seq 300); do grep -q "follows the cluster's leader" "$work/$n.log" && break; sleep 0.1; done
done
echo "== three zerods on etcd (n0 leads): $ranks ranks spread over their sockets"
build/bin/coordinator_load --endpoint "unix://$work/n0.sock,unix://$work/n1.sock,unix://$work/n2.sock" \
  --job load --ranks "$ranks" --seconds "$seconds" --channels 9 --daemon-pid "$leader_pid" |
  tail -1 | tee "$work/etcd-cluster.json"

python3 - "$work" <<'EOF'
import json, sys
w = sys.argv[1]
etcd = json.load(open(f"{w}/etcd.json"))
sq = json.load(open(f"{w}/sqlite.json"))
cl = json.load(open(f"{w}/etcd-cluster.json"))
print()
print(f"| {sq['ranks']} ranks | join+plan s | heartbeats/s | heartbeat p99 ms | errors | leader RSS MiB |")
print("|---|---|---|---|---|---|")
for name, r in (("1 zerod, SQLite", sq), ("3 zerods, etcd", cl)):
    print(f"| {name} | {r['join_plan_s']:.2f} | {r['heartbeats_per_s']:.0f} | {r['heartbeat_p99_ms']:.1f} "
          f"| {r['heartbeat_errors']} | {r['daemon_rss_kib'] / 1024:.0f} |")
print(f"| etcd's own puts (8 in flight) | | {etcd['puts_per_s']:.0f} puts/s | {etcd['p99_ms']:.1f} | {etcd['errors']} | |")
print()
print(f"etcd / SQLite: join+plan x{cl['join_plan_s'] / sq['join_plan_s']:.2f}, "
      f"heartbeat rate x{cl['heartbeats_per_s'] / max(sq['heartbeats_per_s'], 1):.2f}; "
      f"joins per second on etcd {cl['ranks'] / cl['join_plan_s']:.0f} against etcd's "
      f"{etcd['puts_per_s']:.0f} puts/s")
EOF
