#!/usr/bin/env bash
# cluster_load: the coordinator on etcd against the coordinator on SQLite, beside etcd's own write
# rate, all in one run on this machine (issue 13's benchmark):
#   1. a 3-member etcd on loopback ports, secured as docs/operators.md says (TLS on the client and
#      peer ports with certificates required, authentication on: deploy/etcd/certs.sh and
#      auth.sh); etcd's put rate as zerod's etcd user (build/bin/etcd_put_rate), the peer;
#   2. one zerod on SQLite, N simulated ranks joining one job, getting the plan and heartbeating
#      (build/bin/coordinator_load);
#   3. D zerods on that etcd (one leads, the others forward to it over mutual TLS), the same N
#      ranks spread over
#      their sockets, while bench/load_sampler.py samples every zerod's CPU and memory and every
#      etcd member's counters (write transactions, bytes in, CPU): what each phase (join+plan,
#      heartbeats, leave) put on each daemon and on etcd.
# Prints each run's JSON line and the tables.
# --interval D: each rank heartbeats every D seconds (as trainers do) instead of the closed loop
# (one heartbeat outstanding per rank: the most a daemon can serve).
#
# --lease-ttl: every zerod's (default 30s); a large job wants a lease and interval that fit its
# size (how long 100,000 ranks took to leave: bench/RESULTS.md, "zerod on etcd").
#
#   bench/cluster_load.sh [--ranks 4096] [--seconds 5] [--interval 0] [--daemons 3]
#       [--lease-ttl 30s]
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=4096 seconds=5 interval=0 daemons=3 lease_ttl=30s
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --daemons) daemons=$2; shift 2 ;;
    --lease-ttl) lease_ttl=$2; shift 2 ;;
    *) echo "cluster_load: unknown flag $1" >&2; exit 2 ;;
  esac
done
for b in zerod coordinator_load etcd_put_rate; do
  [ -x build/bin/$b ] || { echo "cluster_load: build first (scripts/build.sh)" >&2; exit 1; }
done
command -v etcd >/dev/null && command -v etcdctl >/dev/null ||
  { echo "cluster_load: needs etcd and etcdctl (scripts/setup.sh)" >&2; exit 1; }
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

# 0. Certificates, as docs/operators.md makes them: etcd's CA (its members, root, zerod) and the
# zerod cluster's (its members).
pki=$work/pki
certs=deploy/etcd/certs.sh
sh $certs ca "$pki" etcd-ca
sh $certs issue "$pki" etcd-ca etcd-member etcd IP:127.0.0.1
sh $certs issue "$pki" etcd-ca root root
sh $certs issue "$pki" etcd-ca zerod zerod
sh $certs ca "$pki" cluster-ca
sh $certs issue "$pki" cluster-ca member zerod-member IP:127.0.0.1
etcd_flags=(--etcd-ca "$pki/etcd-ca.pem" --etcd-cert "$pki/zerod.pem" --etcd-key "$pki/zerod.key")

# 1. etcd: three members, then its own put rate.
cluster="" endpoints="" urls=""
declare -a client_ports peer_ports metrics_ports
for i in 0 1 2; do
  client_ports[$i]=$(free_port) peer_ports[$i]=$(free_port) metrics_ports[$i]=$(free_port)
  cluster+="${cluster:+,}m$i=https://127.0.0.1:${peer_ports[$i]}"
  endpoints+="${endpoints:+,}127.0.0.1:${client_ports[$i]}"
  urls+="${urls:+,}https://127.0.0.1:${client_ports[$i]}"
done
for i in 0 1 2; do
  # A job's formation is one transaction holding every member (docs/operators.md, "etcd limits"):
  # etcd's defaults (128 operations, 1.5 MiB per request) are raised as that section says.
  etcd --name m$i --data-dir "$work/etcd$i" --log-level error \
    --max-txn-ops 262144 --max-request-bytes 33554432 \
    --listen-client-urls https://127.0.0.1:${client_ports[$i]} \
    --advertise-client-urls https://127.0.0.1:${client_ports[$i]} \
    --listen-peer-urls https://127.0.0.1:${peer_ports[$i]} \
    --initial-advertise-peer-urls https://127.0.0.1:${peer_ports[$i]} \
    --listen-metrics-urls http://127.0.0.1:${metrics_ports[$i]} \
    --cert-file "$pki/etcd-member.pem" --key-file "$pki/etcd-member.key" \
    --trusted-ca-file "$pki/etcd-ca.pem" --client-cert-auth \
    --peer-cert-file "$pki/etcd-member.pem" --peer-key-file "$pki/etcd-member.key" \
    --peer-trusted-ca-file "$pki/etcd-ca.pem" --peer-client-cert-auth \
    --initial-cluster "$cluster" --initial-cluster-state new >"$work/etcd$i.log" 2>&1 &
  pids+=($!)
done
as_root=(env ETCDCTL_API=3 ETCDCTL_ENDPOINTS="$urls" ETCDCTL_CACERT="$pki/etcd-ca.pem"
         ETCDCTL_CERT="$pki/root.pem" ETCDCTL_KEY="$pki/root.key")
for _ in $(seq 100); do "${as_root[@]}" etcdctl endpoint health >/dev/null 2>&1 && break; sleep 0.2; done
"${as_root[@]}" sh deploy/etcd/auth.sh /zerod-bench/ >/dev/null
echo "== etcd's own put rate (3 members, 8 threads, as zerod's user over TLS)"
build/bin/etcd_put_rate --endpoints "$endpoints" --threads 8 --seconds 3 \
  --prefix /zerod-bench/put-rate/ "${etcd_flags[@]}" | tee "$work/etcd.json"

start_zerod() {  # name, extra flags...
  local name=$1
  shift
  mkdir -m 700 -p "$work/$name"
  build/bin/zerod --socket "$work/$name.sock" --data-dir "$work/$name" --lease-ttl "$lease_ttl" "$@" \
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
  --seconds "$seconds" --interval "$interval" --daemon-pid "${pids[-1]}" |
  tail -1 | tee "$work/sqlite.json"
{ kill -9 "${pids[-1]}" && wait "${pids[-1]}"; } 2>/dev/null || true  # its CPU is not the cluster's

# 3. D zerods on etcd: the first leads, the others follow it.
url="etcd://$endpoints/zerod-bench/"
sampled=()
sockets=""
for ((n = 0; n < daemons; n++)); do
  start_zerod n$n --store "$url" --listen 127.0.0.1:0 --node n$n --etcd-max-txn-ops 262144 \
    "${etcd_flags[@]}" --tls-cert "$pki/member.pem" --tls-key "$pki/member.key" \
    --cluster-ca "$pki/cluster-ca.pem"
  sampled+=(--pid "n$n=${pids[-1]}")
  sockets+="${sockets:+,}unix://$work/n$n.sock"
  if [ $n -eq 0 ]; then
    leader_pid=${pids[-1]}
    for _ in $(seq 300); do grep -q "leads the cluster" "$work/n0.log" && break; sleep 0.1; done
  fi
done
for ((n = 1; n < daemons; n++)); do
  for _ in $(seq 300); do grep -q "follows the cluster's leader" "$work/n$n.log" && break; sleep 0.1; done
done
for i in 0 1 2; do sampled+=(--etcd "etcd$i=127.0.0.1:${metrics_ports[$i]}"); done
python3 bench/load_sampler.py --out "$work/samples.jsonl" --every 0.25 "${sampled[@]}" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/samples.jsonl" ] && break; sleep 0.1; done
echo "== $daemons zerods on etcd (n0 leads): $ranks ranks spread over their sockets"
# Each line of coordinator_load's output is stamped with the time it came: the phases' ends.
date +%s.%N >"$work/etcd-cluster.start"
build/bin/coordinator_load --endpoint "$sockets" --job load --ranks "$ranks" --seconds "$seconds" \
  --interval "$interval" --channels $((3 * daemons)) --daemon-pid "$leader_pid" |
  while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done |
  tee "$work/etcd-cluster.out"
sleep 1  # one more sample after the last phase
tail -1 "$work/etcd-cluster.out" | cut -d' ' -f2- >"$work/etcd-cluster.json"

python3 - "$work" "$daemons" <<'EOF'
import json, sys
w, daemons = sys.argv[1], int(sys.argv[2])
etcd = json.load(open(f"{w}/etcd.json"))
sq = json.load(open(f"{w}/sqlite.json"))
cl = json.load(open(f"{w}/etcd-cluster.json"))
print()
print(f"| {sq['ranks']} ranks | join+plan s | heartbeats/s | heartbeat p99 ms | errors | leader RSS MiB |")
print("|---|---|---|---|---|---|")
for name, r in (("1 zerod, SQLite", sq), (f"{daemons} zerods, etcd", cl)):
    print(f"| {name} | {r['join_plan_s']:.2f} | {r['heartbeats_per_s']:.0f} | {r['heartbeat_p99_ms']:.1f} "
          f"| {r['heartbeat_errors']} | {r['daemon_rss_kib'] / 1024:.0f} |")
print(f"| etcd's own puts (8 in flight) | | {etcd['puts_per_s']:.0f} puts/s | {etcd['p99_ms']:.1f} | {etcd['errors']} | |")
print()
print(f"etcd / SQLite: join+plan x{cl['join_plan_s'] / sq['join_plan_s']:.2f}, "
      f"heartbeat rate x{cl['heartbeats_per_s'] / max(sq['heartbeats_per_s'], 1):.2f}; "
      f"joins per second on etcd {cl['ranks'] / cl['join_plan_s']:.0f} against etcd's "
      f"{etcd['puts_per_s']:.0f} puts/s")
# What each phase of the etcd run put on each process (bench/load_sampler.py's samples).
samples = [json.loads(l) for l in open(f"{w}/samples.jsonl")]
bounds = [("start", float(open(f"{w}/etcd-cluster.start").read()))]
for line in open(f"{w}/etcd-cluster.out"):
    stamp, _, text = line.partition(" ")
    for phase in ("join+plan", "heartbeats", "leave"):
        if text.startswith(phase + ":"):
            bounds.append((phase, float(stamp)))
def at(t):  # the last sample taken at or before t
    best = samples[0]
    for s in samples:
        if s["t"] <= t:
            best = s
    return best
def delta(a, b, group, name, key):
    x, y = (a[group].get(name) or {}), (b[group].get(name) or {})
    return (y.get(key, 0) - x.get(key, 0)) if x and y else float("nan")
print()
print("| phase | s | " + " | ".join(f"n{n} CPU %" for n in range(daemons)) +
      " | etcd raft proposals/s | etcd puts/s | etcd MiB/s in | etcd CPU % (3 members) |")
print("|---|---|" + "---|" * daemons + "---|---|---|---|")
for (_, start), (name, end) in zip(bounds, bounds[1:]):
    a, b = at(start), at(end)
    dt = max(b["t"] - a["t"], 1e-9)
    cpu = [100 * delta(a, b, "processes", f"n{n}", "cpu_s") / dt for n in range(daemons)]
    etcds = [f"etcd{i}" for i in range(3)]
    proposals = delta(a, b, "etcd", "etcd0", "proposals") / dt  # every member commits each
    puts = delta(a, b, "etcd", "etcd0", "puts") / dt
    bytes_in = sum(delta(a, b, "etcd", e, "bytes_in") for e in etcds) / dt / 2**20
    etcd_cpu = sum(delta(a, b, "etcd", e, "cpu_s") for e in etcds) / dt * 100
    print(f"| {name} | {end - start:.1f} | " + " | ".join(f"{c:.0f}" for c in cpu) +
          f" | {proposals:.1f} | {puts:.0f} | {bytes_in:.2f} | {etcd_cpu:.0f} |")
last = samples[-1]["processes"]
print()
print("RSS MiB at the end: " + ", ".join(
    f"n{n} {(last.get(f'n{n}') or {}).get('rss_kib', 0) / 1024:.0f}" for n in range(daemons)))
EOF
