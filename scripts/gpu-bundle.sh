#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs into a folder small enough for the device tool to carry
# (it moves at most 64 MiB): the binaries stripped, in the build's layout (bin/, tests/), and in
# lib/ the C API library the Python front end loads (python/zerod comes with the repository) and
# the shared libraries they all load from this machine's Debian packages, since the GPU machine's
# image has none of them. Not packed: the C library (the GPU machine has a newer one) and NCCL
# (218 MB; gpu-check.sh finds the GPU machine's own libnccl.so.2).
#
#   scripts/gpu-bundle.sh [BUILD_DIR] [BUNDLE_DIR]    (default: build, build-gpu)
#   then, through the device tool: carry BUNDLE_DIR, run scripts/gpu-check.sh BUNDLE_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bundle=${2:-build-gpu}
binaries=(bin/zerod bin/zeroctl bin/zerorun bin/train_mlp bin/adam_cuda_bench
  tests/adam_cuda_test tests/nccl_communicator_test tests/zero_engine_cuda_test
  tests/train_gpu_test tests/join_client lib/libzerod_c.so)
for b in "${binaries[@]}"; do
  [ -x "$build/$b" ] || { echo "gpu-bundle: $build/$b is missing: build with CUDA first (scripts/build.sh)" >&2; exit 1; }
done
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/tests" "$bundle/lib"
for b in "${binaries[@]}"; do strip -o "$bundle/$b" "$build/$b"; done
# Every library the binaries load, but the C library's own and NCCL.
ldd "${binaries[@]/#/$build/}" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux-x86-64)\.so|/libnccl\.so' |
  while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
echo "gpu-bundle: $bundle holds $(du -sh "$bundle" | cut -f1) ($(ls "$bundle/lib" | wc -l) libraries)"
