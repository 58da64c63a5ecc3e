#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan) into build-fuzz and runs
# each for FUZZ_SECONDS (default 20), starting from a copy of its seed corpus in
# tests/fuzz/corpus/<target> so that the repository is not modified. Exits non-zero on any
# crash, leak, timeout, out-of-memory or sanitizer report; the failing input is kept under
# build-fuzz/artifacts/<target>/. Arguments: target names to run (default: all).
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-20}
jobs=$(nproc)
command -v clang >/dev/null || { echo "fuzz: clang is missing (scripts/install-deps.sh --fuzz installs it)" >&2; exit 1; }

cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSEQFLOW_FUZZ=ON \
      -DSEQFLOW_CUDA=OFF -DSEQFLOW_BUILD_TESTS=OFF -DSEQFLOW_BUILD_BENCH=OFF -DSEQFLOW_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build-fuzz -j"$jobs" --target seqflow_fuzzers

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for src in tests/fuzz/fuzz_*.c; do targets+=("$(basename "$src" .c)"); done
fi

# One compute thread: the inputs are tiny and threads only blur what the fuzzer measures.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1
work=$(mktemp -d "${TMPDIR:-/tmp}/seqflow-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
failed=()
for target in "${targets[@]}"; do
  name=${target#fuzz_}
  bin=build-fuzz/tests/fuzz/$target
  [ -x "$bin" ] || { echo "fuzz: no target $target" >&2; exit 1; }
  mkdir -p "$work/$name" "build-fuzz/artifacts/$name"
  [ -d "tests/fuzz/corpus/$name" ] && cp -R "tests/fuzz/corpus/$name/." "$work/$name/"
  dict=()
  [ -f "tests/fuzz/$name.dict" ] && dict=(-dict="tests/fuzz/$name.dict")
  log="build-fuzz/artifacts/$name/fuzz.log"
  echo "fuzz: $target for ${seconds}s"
  status=0
  "$bin" "$work/$name" "${dict[@]}" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 \
         -detect_leaks=1 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$name/" \
         >"$log" 2>&1 || status=$?
  # A sanitizer report that somehow did not stop the run still fails it.
  if [ $status -ne 0 ] || grep -qE "ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:" "$log"; then
    echo "fuzz: $target FAILED (exit $status); log $log:" >&2
    tail -n 60 "$log" >&2
    failed+=("$target")
  else
    grep -E "^stat::(number_of_executed_units|new_units_added)" "$log" | sed "s/^/fuzz:   /"
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: failures in ${failed[*]} (inputs under build-fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets clean"
