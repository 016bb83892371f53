#!/usr/bin/env bash
# collective_bench: zerod's Gloo collectives (build/bin/collective_bench) and torch.distributed's
# gloo (bench/collective_bench_torch.py, Debian's /usr/bin/python3) at the same worlds and sizes,
# one after the other in the same run, beside the loopback TCP round trip and bandwidth; then the
# table (bench/collective_report.py). With --rounds N the two take turns N times and each figure
# is the median round's (a slow stretch of a shared machine then lands on both, not on one).
#
#   bench/collective_bench.sh [--worlds 2,3,4] [--sizes 4KiB,...,64MiB] [--min-time 0.3]
#                             [--ops all_reduce,reduce_scatter,all_gather,broadcast] [--rounds 1]
set -euo pipefail
cd "$(dirname "$0")/.."
worlds=2,3,4 sizes=4KiB,16KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB min_time=0.3
ops=all_reduce,reduce_scatter,all_gather,broadcast rounds=1
while [ $# -gt 0 ]; do
  case "$1" in
    --worlds) worlds=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --min-time) min_time=$2; shift 2 ;;
    --ops) ops=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "collective_bench: unknown flag $1" >&2; exit 2 ;;
  esac
done
[ -x build/bin/collective_bench ] || { echo "collective_bench: build first (scripts/build.sh)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
case "$rounds" in ''|*[!0-9]*|0) echo "collective_bench: --rounds takes a positive count" >&2; exit 2 ;; esac
# torch takes sizes in bytes
bytes=$(python3 -c "import sys
u={'KiB':1<<10,'MiB':1<<20,'GiB':1<<30}
out=[]
for s in sys.argv[1].split(','):
    n=next((int(s[:-3])*m for k,m in u.items() if s.endswith(k)), None)
    out.append(str(n if n is not None else int(s)))
print(','.join(out))" "$sizes")
for ((round = 1; round <= rounds; round++)); do
  build/bin/collective_bench --worlds "$worlds" --sizes "$sizes" --min-time "$min_time" \
    --ops "$ops" >>"$work/zerod.jsonl"
  /usr/bin/python3 bench/collective_bench_torch.py --worlds "$worlds" --sizes "$bytes" \
    --min-time "$min_time" --ops "$ops" >>"$work/torch.jsonl"
done
/usr/bin/python3 bench/collective_report.py "$work/zerod.jsonl" "$work/torch.jsonl"
