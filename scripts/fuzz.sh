#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang, ASan+UBSan) in their own folder and runs each
# for a while over its seed corpus. Any crash, sanitizer report, leak, timeout or out-of-memory
# fails the run; the input that did it is kept under <build>/fuzz/artifacts/<target>/.
#   scripts/fuzz.sh [seconds] [target...]  seconds per target (default 15), every target by default
#   scripts/fuzz.sh --make-corpus          rewrites the binary seeds in tests/fuzz/corpus/
#   ZEROD_FUZZ_BUILD_DIR  build folder (default: build-fuzz)
#   ZEROD_FUZZ_NO_BUILD=1 run what is built (for a build made beforehand)
# Inputs that found new coverage go to <build>/fuzz/corpus/<target>/ and are reused by the next
# run; tests/fuzz/corpus/ holds only the committed seeds. Reproduce a crash with
#   <build>/fuzz/<target> <artifact>
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${ZEROD_FUZZ_BUILD_DIR:-build-fuzz}
all_targets=(units_fuzz layout_json_fuzz c_api_options_fuzz plan_inputs_fuzz job_records_fuzz
             sqlite_state_fuzz grpc_handlers_fuzz checkpoint_manifest_fuzz)

build() {
  [ "${ZEROD_FUZZ_NO_BUILD:-}" = 1 ] && return 0
  ZEROD_BUILD_DIR=$build_dir ZEROD_COMPILER=clang ZEROD_FUZZ=ON ZEROD_CUDA=OFF \
    scripts/build.sh "$@"
}

if [ "${1:-}" = --make-corpus ]; then
  build make_corpus
  "$build_dir/fuzz/make_corpus" tests/fuzz/corpus
  exit 0
fi

seconds=15
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then
  seconds=$1
  shift
fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  [ -d "tests/fuzz/corpus/$t" ] || { echo "fuzz: unknown target '$t' (${all_targets[*]})" >&2; exit 2; }
done
build "${targets[@]}"

# Stacks for UBSan's reports too (ASan prints them anyway).
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
failed=()
for t in "${targets[@]}"; do
  work="$build_dir/fuzz/corpus/$t"
  artifacts="$build_dir/fuzz/artifacts/$t"
  mkdir -p "$work" "$artifacts"
  echo "fuzz: $t for ${seconds} s"
  # -timeout: one input running this long is a hang (generous: the machine may be loaded).
  if ! "$build_dir/fuzz/$t" -max_total_time="$seconds" -timeout=60 -rss_limit_mb=2048 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/" \
      "$work" "tests/fuzz/corpus/$t" >"$build_dir/fuzz/$t.log" 2>&1; then
    tail -n 60 "$build_dir/fuzz/$t.log" >&2
    echo "fuzz: $t FAILED (log: $build_dir/fuzz/$t.log, input: $artifacts/)" >&2
    failed+=("$t")
  else
    grep -E '^stat::number_of_executed_units|^#[0-9]+ *DONE' "$build_dir/fuzz/$t.log" | tail -n 2
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} target(s) ran ${seconds} s each without a fault"
