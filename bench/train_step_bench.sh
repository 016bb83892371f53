#!/usr/bin/env bash
# train_step_bench: one training step of train_mlp at ZeRO stages 0-3 on 2 local ranks under an
# embedded zerod: step time, peak RSS per rank and bytes sent per step, beside the peer measured
# in the same run: the unsharded single-process step on the same global batch. Stage 3 runs twice:
# gathers on their own communicator (the default), and sharing the main one ("3-shared").
#
#   bench/train_step_bench.sh [--hidden 512] [--layers 6] [--steps 8] [--dtype bf16]
set -euo pipefail
cd "$(dirname "$0")/.."
hidden=512 layers=6 steps=8 dtype=bf16
while [ $# -gt 0 ]; do
  case "$1" in
    --hidden) hidden=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    *) echo "train_step_bench: unknown flag $1" >&2; exit 2 ;;
  esac
done
bin=build/bin
for b in zerod zerorun train_mlp; do
  [ -x "$bin/$b" ] || { echo "train_step_bench: build first (scripts/build.sh)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'kill "$(cat "$work/pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$work"' EXIT
"$bin/zerod" --socket "$work/s" --listen "" --data-dir "$work/d" --log-level warn >"$work/log" 2>&1 &
echo $! >"$work/pid"
for _ in $(seq 200); do [ -S "$work/s" ] && break; sleep 0.05; done
train=("$bin/train_mlp" --hidden "$hidden" --layers "$layers" --steps "$steps" --dtype "$dtype" --batch 64)
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" | tail -n 1; }

"${train[@]}" --reference --world 2 >"$work/ref"
ref_ms=$(field step_time_ms <"$work/ref")
params=$(field params <"$work/ref")
echo "train_step_bench: MLP ${layers}x${hidden} ($params params, $dtype), global batch 64, 2 ranks"
printf '%-9s %9s %9s %9s %9s %9s %9s %14s %16s %18s\n' "stage" "step ms" "vs s0" "fwd+bwd" \
  "opt step" "w:gather" "w:reduce" "peak RSS KiB" "bytes/step/rank" "model state/rank"
printf '%-9s %9.2f %9s %9s %9s %9s %9s %14s %16s %18s\n' "unshard" "$ref_ms" - - - - - \
  "$(sed -n 's/^rank 0: peak_rss_kib \([0-9]*\).*/\1/p' "$work/ref")" 0 \
  "$(field model_state_bytes_per_rank <"$work/ref")"
s0_ms=
for stage in 0 1 2 3 3-shared; do
  extra=()
  if [ "$stage" = 3-shared ]; then extra=(--shared-gathers); fi
  "$bin/zerorun" -n 2 --endpoint "unix://$work/s" --job "bench-$stage" -- "${train[@]}" \
    --stage "${stage%-shared}" "${extra[@]}" >"$work/out$stage"
  rss=$(sed -n 's/^\[rank \([0-9]\)\] rank [0-9]*: peak_rss_kib \([0-9]*\).*/\2/p' "$work/out$stage" | paste -sd/)
  ms=$(field step_time_ms <"$work/out$stage")
  [ -n "$s0_ms" ] || s0_ms=$ms
  # step_breakdown (train_mlp's JSON): forward+backward, optimizer step, waits on gathers, reductions
  printf '%-9s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %14s %16s %18s\n' "$stage" "$ms" \
    "$(awk -v a="$ms" -v b="$s0_ms" 'BEGIN { print a / b }')" \
    "$(field forward_backward_ms <"$work/out$stage")" "$(field optimizer_step_ms <"$work/out$stage")" \
    "$(field gather <"$work/out$stage")" "$(field reduce <"$work/out$stage")" "$rss" \
    "$(field comm_bytes_per_step <"$work/out$stage")" "$(field model_state_bytes_per_rank <"$work/out$stage")"
done
