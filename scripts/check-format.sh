#!/usr/bin/env bash
# Fails, listing the files, when a tracked or new C++ file is not clang-formatted (.clang-format).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check-format: clang-format not installed (scripts/setup.sh)" >&2; exit 1; }
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
  '*.cc' '*.h' '*.cu' '*.cuh' | while read -r f; do [ -f "$f" ] && echo "$f"; done)
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: not formatted (run: clang-format -i ${bad[*]})" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
