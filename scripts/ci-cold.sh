#!/usr/bin/env bash
# Runs CI as a fresh machine would: .ci/run on a new clone of this checkout's HEAD, in a
# temporary folder, with an empty ccache, and reports the total time against CI's 45-minute aim.
# Packages are not removed (scripts/setup.sh is idempotent; a fresh machine adds its install
# time, printed by the 'setup' stage). The clone and its cache are deleted afterwards unless
# ZEROD_CI_KEEP=1.
#   scripts/ci-cold.sh            HEAD, committed changes only
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/zerod-ci-cold.XXXXXX)
cleanup() { [ "${ZEROD_CI_KEEP:-}" = 1 ] || rm -rf "$work"; }
trap cleanup EXIT
git clone -q --no-hardlinks . "$work/zerod"
echo "ci-cold: $(git rev-parse --short HEAD) in $work/zerod, empty ccache in $work/ccache"
start=$SECONDS
status=0
(cd "$work/zerod" && CCACHE_DIR="$work/ccache" .ci/run) 2>&1 | tee "$work/ci.log" || status=$?
elapsed=$((SECONDS - start))
grep -E '^ci: ' "$work/ci.log" || true
echo "ci-cold: $( [ $status = 0 ] && echo passed || echo FAILED ) in ${elapsed} s" \
     "($((elapsed / 60)) min; aim: at most 45 min)"
exit $status
