#!/usr/bin/env bash
# Sets up and builds zerod, shows the memory plan of a 7.5B-parameter model on 64 ranks, then runs
# a live coordinator: an embedded zerod (temp data dir) that 4,096 simulated ranks join.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh zeroctl zerod coordinator_load >/dev/null
bin=build/bin

echo "\$ zeroctl plan --params 7.5B --dp 64 --budget 40GiB"
$bin/zeroctl plan --params 7.5B --dp 64 --budget 40GiB

work=$(mktemp -d)
trap 'kill $(cat "$work/pid" 2>/dev/null) 2>/dev/null || true; rm -rf "$work"' EXIT
$bin/zerod --socket "$work/zerod.sock" --listen "" --data-dir "$work/data" \
  --log-level warn >"$work/zerod.log" 2>&1 &
echo $! >"$work/pid"
export ZEROD_ENDPOINT="unix://$work/zerod.sock"
for _ in $(seq 100); do [ -S "$work/zerod.sock" ] && break; sleep 0.05; done

echo
echo "\$ coordinator_load --job demo-small --ranks 8 --seconds 1 --stay   # 8 ranks form a job"
$bin/coordinator_load --endpoint "$ZEROD_ENDPOINT" --job demo-small --ranks 8 --seconds 1 \
  --peer-seconds 1 --stay --daemon-pid "$(cat "$work/pid")" | tail -n 1
echo
echo "\$ zeroctl members demo-small"
$bin/zeroctl members demo-small
echo
echo "\$ zeroctl shards demo-small --rank 0 --tensor param.7"
$bin/zeroctl shards demo-small --rank 0 --tensor param.7 | head -n 20
echo
echo "\$ coordinator_load --job demo-4k --ranks 4096 --seconds 3   # 4,096 ranks join, heartbeat, leave"
$bin/coordinator_load --endpoint "$ZEROD_ENDPOINT" --job demo-4k --ranks 4096 --seconds 3 \
  --daemon-pid "$(cat "$work/pid")"
echo
echo "\$ zeroctl jobs"
$bin/zeroctl jobs
