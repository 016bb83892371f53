#!/usr/bin/env bash
# GPU checks for a machine with an NVIDIA GPU, using a build made elsewhere and carried here (it
# compiles nothing): the gpu-labelled tests (CUDA Adam against CPU Adam, NCCL collectives on every
# visible GPU, the engine at stages 0-3 on the GPU against the CPU runtime, stage-3 gathers on
# their own communicator and stream, train_mlp on GPUs under a real zerod), then the fused-Adam
# benchmark beside a device-to-device copy and one step at 2^28 parameters; between them the
# PyTorch front end (python/zerod) on CUDA with the machine's own Python and torch; train_gpu_test
# also saves a checkpoint from GPU memory and resumes it at another stage. Writes summary.txt
# and the raw logs under $OUT when it is set. About 2 minutes.
#
#   scripts/gpu-check.sh [BUILD_DIR]     (default: build)
# A build carried to a GPU machine through the device tool is made small first:
#   scripts/gpu-bundle.sh build build-gpu; then carry build-gpu and run scripts/gpu-check.sh build-gpu
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

say "gpu-check $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$summary"
if [ ! -x "$build/bin/adam_cuda_bench" ]; then
  say "no CUDA build in $build (configure with nvcc present, or -DZEROD_CUDA=ON, and build here first)"
  exit 1
fi
# A bundle's own libraries first (scripts/gpu-bundle.sh), then the machine's CUDA runtime and NCCL:
# the toolkit's, or the one that comes with PyTorch's nvidia-nccl package.
nccl_dir=
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu \
  $(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null); do
  if [ -e "$d/libnccl.so.2" ]; then nccl_dir=$d; break; fi
done
say "nccl: ${nccl_dir:-not found}"
export LD_LIBRARY_PATH="$PWD/$build/lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64:/usr/local/cuda/lib${nccl_dir:+:$nccl_dir}"
# The integration tests start zerod, zerorun and train_mlp from this carried build.
export ZEROD_TEST_BUILD_DIR="$PWD/$build"

status=0
# The test binaries run directly: ctest's files hold the paths of the machine that configured.
for t in adam_cuda_test nccl_communicator_test zero_engine_cuda_test train_gpu_test; do
  say "== $t"
  timeout 150 "$build/tests/$t" >"$out/$t.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|skipped: no CUDA device" "$out/$t.log" | tee -a "$summary"
  if grep -q "skipped: no CUDA device" "$out/$t.log"; then status=2; fi
done
# The PyTorch front end on the GPU machine's own Python and torch (CUDA), through the carried
# libzerod_c.so: stages 0-3 against the unsharded reference, bf16 and fp16 against fp32.
say "== python front end on cuda (tests/python/gpu_equivalence.py)"
PYTHONPATH="$PWD/python" timeout 400 python3 tests/python/gpu_equivalence.py "$build" "$out/python" \
  >"$out/python-gpu.log" 2>&1 || status=1
tee -a "$summary" <"$out/python-gpu.log" | tail -n 20
say "== adam_cuda_bench --log2 28"
timeout 120 "$build/bin/adam_cuda_bench" --log2 28 >"$out/adam-bench.log" 2>&1 || status=1
tee -a "$summary" <"$out/adam-bench.log"
case $status in
  0) say "result: ok" ;;
  2) say "result: no CUDA device visible: nothing was checked" ;;
  *) say "result: FAILED" ;;
esac
exit $status
