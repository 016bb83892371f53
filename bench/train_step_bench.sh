#!/usr/bin/env bash
# train_step_bench: one training step of train_mlp at ZeRO stages 0-3 on local ranks under an
# embedded zerod: step time, peak RSS per rank and bytes sent per step, beside the peer measured
# in the same run: the unsharded single-process step on the same global batch. Stage 3 runs three
# ways: gathers copied from the peers' shards in shared memory (the default on one host: "3"),
# all-gathered on their own communicator ("3-allgather", ZEROD_GLOO_SHARD_EXCHANGE=0, the route of
# NCCL and of ranks on several hosts), and all-gathered sharing the main one ("3-shared").
#
#   bench/train_step_bench.sh [--hidden 512] [--layers 6] [--steps 8] [--dtype bf16] [--rounds 3]
#                             [--ranks 2] [--batch 64] [--stages 0,1,2,3,3-allgather,3-shared]
#
# The demo's job (scripts/demo.sh): --ranks 4 --hidden 128 --layers 4 --dtype fp32 --batch 48.
#
# The stages run in turn, --rounds times (0, 1, 2, 3, 3-allgather, 3-shared, 0, 1, ...), so that a slow
# stretch of a shared machine falls on every stage alike; "step ms" and "vs s0" are the medians
# over the rounds (the ratio taken within each round), the other columns come from the last round.
set -euo pipefail
cd "$(dirname "$0")/.."
hidden=512 layers=6 steps=8 dtype=bf16 rounds=3 ranks=2 batch=64
stage_list=0,1,2,3,3-allgather,3-shared
while [ $# -gt 0 ]; do
  case "$1" in
    --hidden) hidden=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --stages) stage_list=$2; shift 2 ;;
    *) echo "train_step_bench: unknown flag $1" >&2; exit 2 ;;
  esac
done
IFS=, read -r -a stages <<<"$stage_list"
[ "${stages[0]}" = 0 ] || { echo "train_step_bench: --stages must start with 0 (the ratios' base)" >&2; exit 2; }
bin=build/bin
for b in zerod zerorun train_mlp; do
  [ -x "$bin/$b" ] || { echo "train_step_bench: build first (scripts/build.sh)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'kill "$(cat "$work/pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$work"' EXIT
"$bin/zerod" --socket "$work/s" --listen "" --data-dir "$work/d" --log-level warn >"$work/log" 2>&1 &
echo $! >"$work/pid"
for _ in $(seq 200); do [ -S "$work/s" ] && break; sleep 0.05; done
train=("$bin/train_mlp" --hidden "$hidden" --layers "$layers" --steps "$steps" --dtype "$dtype" --batch "$batch")
# From rank 0's JSON line (every rank's own breakdown is on its "rank N:" line).
field() { grep '"plan_digest"' | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" | tail -n 1; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

"${train[@]}" --reference --world "$ranks" >"$work/ref"
ref_ms=$(field step_time_ms <"$work/ref")
params=$(field params <"$work/ref")
for round in $(seq "$rounds"); do
  for stage in "${stages[@]}"; do
    extra=() exchange=1
    case "$stage" in
      3-allgather) exchange=0 ;;
      3-shared) exchange=0 extra=(--shared-gathers) ;;
    esac
    ZEROD_GLOO_SHARD_EXCHANGE=$exchange "$bin/zerorun" -n "$ranks" --endpoint "unix://$work/s" \
      --job "bench-$stage-$round" -- "${train[@]}" --stage "${stage%%-*}" "${extra[@]}" \
      >"$work/out$stage"
    field step_time_ms <"$work/out$stage" >>"$work/ms$stage"
  done
  s0=$(tail -n 1 "$work/ms0")
  for stage in "${stages[@]}"; do
    awk -v a="$(tail -n 1 "$work/ms$stage")" -v b="$s0" 'BEGIN { print a / b }' >>"$work/ratio$stage"
  done
done

echo "train_step_bench: MLP ${layers}x${hidden} ($params params, $dtype), global batch $batch, $ranks ranks," \
  "median of $rounds rounds"
printf '%-9s %9s %9s %9s %9s %9s %9s %14s %16s %18s  %s\n' "stage" "step ms" "vs s0" "fwd+bwd" \
  "opt step" "w:gather" "w:reduce" "peak RSS KiB" "bytes/step/rank" "model state/rank" \
  "step ms by round"
printf '%-9s %9.2f %9s %9s %9s %9s %9s %14s %16s %18s\n' "unshard" "$ref_ms" - - - - - \
  "$(sed -n 's/^rank 0: peak_rss_kib \([0-9]*\).*/\1/p' "$work/ref")" 0 \
  "$(field model_state_bytes_per_rank <"$work/ref")"
for stage in "${stages[@]}"; do
  out="$work/out$stage"
  rss=$(sed -n 's/^\[rank \([0-9]\)\] rank [0-9]*: peak_rss_kib \([0-9]*\).*/\2/p' "$out" | paste -sd/)
  # step_breakdown (train_mlp's JSON): forward+backward, optimizer step, waits on gathers, reductions
  printf '%-9s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %14s %16s %18s  %s\n' "$stage" \
    "$(median <"$work/ms$stage")" "$(median <"$work/ratio$stage")" \
    "$(field forward_backward_ms <"$out")" "$(field optimizer_step_ms <"$out")" \
    "$(field gather <"$out")" "$(field reduce <"$out")" "$rss" \
    "$(field comm_bytes_per_step <"$out")" "$(field model_state_bytes_per_rank <"$out")" \
    "$(paste -sd' ' "$work/ms$stage")"
done
