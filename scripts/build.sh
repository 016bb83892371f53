#!/usr/bin/env bash
# Configures (once) and builds zerod with CMake + Ninja.
#   ZEROD_BUILD_DIR  build folder (default: build)
#   ZEROD_SANITIZE   address,undefined | thread (default: none)
#   ZEROD_COMPILER   gcc | clang (default: the system c++, but clang when ZEROD_SANITIZE=thread);
#                    clang adds -Wthread-safety. A folder keeps the compiler it was made with
#                    unless this names another.
#   ZEROD_CUDA       AUTO | ON | OFF (default: AUTO, on when nvcc is found)
#   ZEROD_FUZZ       ON: the libFuzzer targets in tests/fuzz (clang, address,undefined; the same
#                    folder runs the ASan+UBSan suite) (default: OFF)
#   ZEROD_BENCH      ON | OFF: the benchmarks in bench/ (default: ON, OFF in sanitizer builds)
# Extra arguments are Ninja targets (default: everything).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${ZEROD_BUILD_DIR:-build}
args=(-G Ninja -DZEROD_SANITIZE="${ZEROD_SANITIZE:-}" -DZEROD_CUDA="${ZEROD_CUDA:-AUTO}"
      -DZEROD_FUZZ="${ZEROD_FUZZ:-OFF}")
compiler=${ZEROD_COMPILER:-}
if [ -z "$compiler" ] && [ "${ZEROD_SANITIZE:-}" = thread ]; then compiler=clang; fi
case "$compiler" in
  "") ;;
  gcc) args+=(-DCMAKE_CXX_COMPILER="$(command -v g++)") ;;
  clang)
    command -v clang++ >/dev/null || { echo "build: ZEROD_COMPILER=clang but clang++ is not installed (scripts/setup.sh)" >&2; exit 1; }
    args+=(-DCMAKE_CXX_COMPILER="$(command -v clang++)") ;;
  *) echo "build: ZEROD_COMPILER must be gcc or clang, not '$compiler'" >&2; exit 2 ;;
esac
if [ -n "${CMAKE_BUILD_TYPE:-}" ]; then args+=(-DCMAKE_BUILD_TYPE="$CMAKE_BUILD_TYPE"); fi
if [ -n "${ZEROD_BENCH:-}" ]; then args+=(-DZEROD_BENCH="$ZEROD_BENCH"); fi
# ccache keys on paths relative to the checkout, so a clone in another folder (CI's, a worktree)
# hits what this one compiled; the compiler is recognised by its content, not its mtime.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export CCACHE_COMPILERCHECK=${CCACHE_COMPILERCHECK:-content}
# nvcc lives outside the default PATH on CUDA toolkit installs.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
mkdir -p "$build_dir"
cmake -S . -B "$build_dir" "${args[@]}" >"$build_dir/configure.log" 2>&1 || {
  cat "$build_dir/configure.log" >&2
  echo "build: cmake configure failed (log above)" >&2
  exit 1
}
grep -E '^-- zerod:' "$build_dir/configure.log" || true
ninja -C "$build_dir" "$@"
