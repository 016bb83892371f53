#!/usr/bin/env bash
# Sets up, builds and runs every test. Same variables as scripts/build.sh; e.g. the sanitizer runs:
#   ZEROD_BUILD_DIR=build-asan ZEROD_SANITIZE=address,undefined scripts/test.sh
#   ZEROD_BUILD_DIR=build-tsan ZEROD_SANITIZE=thread scripts/test.sh   (clang; fails on any report)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build_dir=${ZEROD_BUILD_DIR:-build}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
tsan_logs=""
if [[ "${ZEROD_SANITIZE:-}" == *thread* ]]; then
  # Every process (daemons and ranks the tests start included) logs its reports to a file; they
  # are judged after the run by tests/tsan/filter.py, which drops only races inside gRPC.
  tsan_logs="$build_dir/tsan-logs"
  [[ "$tsan_logs" == /* ]] || tsan_logs="$PWD/$tsan_logs"
  rm -rf "$tsan_logs" && mkdir -p "$tsan_logs"
  # Sticky and open to all: tests run some processes as another user (runuser -u nobody).
  chmod 1777 "$tsan_logs"
  export TSAN_OPTIONS=${TSAN_OPTIONS:-suppressions=$PWD/tests/tsan/suppressions.txt:second_deadlock_stack=1:exitcode=0:log_path=$tsan_logs/tsan}
fi
status=0
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 600 || status=$?
if [ -n "$tsan_logs" ]; then
  python3 tests/tsan/filter.py "$tsan_logs" || status=1
fi
exit $status
