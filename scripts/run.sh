#!/usr/bin/env bash
# Builds seqflow (installing missing packages) and runs the default pipeline on built-in text.
# Extra arguments go to `seqflow run`, e.g.  scripts/run.sh --input book.txt --out h.npy
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target seqflow >/dev/null
exec build/seqflow run "$@"
