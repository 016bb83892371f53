#!/usr/bin/env bash
# Sets up, builds zeroctl and shows zerod's memory plan for a 7.5B-parameter model on 64 ranks,
# then what a 40 GiB-per-rank budget chooses.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh zeroctl >/dev/null
echo "\$ zeroctl plan --params 7.5B --dp 64"
build/bin/zeroctl plan --params 7.5B --dp 64
echo
echo "\$ zeroctl plan --params 7.5B --dp 64 --budget 40GiB"
build/bin/zeroctl plan --params 7.5B --dp 64 --budget 40GiB
