#!/usr/bin/env bash
# torch_step_bench: a training step of the GPT in examples/torch/gpt_model.py through zerod.torch at
# ZeRO stages 0-3 on 2 local ranks, beside its peers measured in the same run on the same model,
# initial values, data, global batch, fp32 and AdamW: torch DDP (gloo) + torch.optim.AdamW, and
# torch DDP + ZeroRedundancyOptimizer(AdamW), torch's ZeRO stage 1 (Debian's FSDP does not import
# under Python 3.11, so stages 2-3 have no torch peer; the run says so). Each configuration is its
# own 2-process job; the zerod ones join the daemon this script starts (temporary socket and data
# dir, stopped at exit) through build/bin/zerorun. The first row, "1 process", is the time
# reference: one process doing a rank's share (half the global batch, AdamW) with no communication.
#
#   bench/torch_step_bench.sh [--small] [--steps N] [other flags of bench/torch_step_bench.py]
#
# How to read it: per configuration and rank, the median step time (forward, backward and
# opt.step() alone beside it), peak RSS (it includes Python + torch; dRSS subtracts the RSS after
# importing torch and building the model), the model-state bytes the rank holds (torch: storages of
# params, .grad and optimizer state; zerod: the engine's model_state_bytes, with allocated_bytes
# beside) and the bytes it sends per step (zerod measured by its engine; torch computed from gloo's
# ring all-reduce and ZeRO-1's broadcast, marked *). The table prints the paper's expected model
# state (16, 8+8/N, 4+12/N, 16/N bytes/param) and traffic (2(N-1)/N, or 3(N-1)/N at stage 3, x 4
# bytes/param) beside the measurement, then ratios: torch DDP and zerod stage 0 / 1 process, zerod
# stage 1 / torch ZeRO-1, zerod stage 0 / torch DDP, zerod stages 1-3 / stage 0, and the memory each
# sharded row saves against its unsharded peer. Per-rank lines show when the peak RSS was reached
# (after setup, after the first step, at the end) and the RSS still held at the end. The last loss
# column must agree across the distributed rows (same training). Debian's torch uses the reference
# BLAS, so the default keeps the ~16.8M parameters the memory figures are about but few tokens per
# step (how long a run took, and how far step times moved between runs: bench/RESULTS.md). On a
# shared machine read differences within that run-to-run spread as noise. Nothing here asserts a
# time.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin
for b in zerod zerorun; do
  [ -x "$bin/$b" ] || { echo "torch_step_bench: build first (scripts/build.sh)" >&2; exit 1; }
done
[ -e build/lib/libzerod_c.so ] || { echo "torch_step_bench: build libzerod_c first" >&2; exit 1; }
python=/usr/bin/python3  # Debian's, with python3-torch (a plain python3 may lack torch)
"$python" -c 'import torch' 2>/dev/null ||
  { echo "torch_step_bench: $python lacks torch" >&2; exit 1; }
work=$(mktemp -d)
trap 'kill "$(cat "$work/pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$work"' EXIT
"$bin/zerod" --socket "$work/s" --listen "" --data-dir "$work/d" --log-level warn \
  >"$work/log" 2>&1 &
echo $! >"$work/pid"
for _ in $(seq 200); do [ -S "$work/s" ] && break; sleep 0.05; done
[ -S "$work/s" ] ||
  { echo "torch_step_bench: zerod did not start:" >&2; cat "$work/log" >&2; exit 1; }
PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} ZEROD_ENDPOINT="unix://$work/s" \
  "$python" bench/torch_step_bench.py --zerorun "$bin/zerorun" "$@"
