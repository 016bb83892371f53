#!/usr/bin/env bash
# Sets up, builds and runs every test. Same variables as scripts/build.sh; e.g. the sanitizer run:
#   ZEROD_BUILD_DIR=build-asan ZEROD_SANITIZE=address,undefined scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build_dir=${ZEROD_BUILD_DIR:-build}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 600
