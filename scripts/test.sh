#!/usr/bin/env bash
# usage: scripts/test.sh [--help]
# Builds seqflow and runs every test (installing missing packages):
#   1. a Release build (CUDA compiled when nvcc is present; GPU tests skip without a GPU), its
#      tests, then its .deb installed with apt-get, used and removed (scripts/deb-install.sh),
#   2. the libFuzzer targets (scripts/fuzz.sh, clang) for a bounded time each,
#   3. a build under AddressSanitizer + UndefinedBehaviorSanitizer, running the same tests
#      (last, so that ctest's summary line closes the output).
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
if [ $# -gt 0 ]; then echo "test.sh: unknown argument '$1' (it takes none; --help for what it does)" >&2; exit 2; fi
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --fuzz
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSEQFLOW_BUILD_TESTS=ON -DSEQFLOW_BUILD_EXAMPLES=ON
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")
# ctest lists skipped tests without their output: say why the GPU tests skipped, if they did
for t in test_backend_ops test_cuda_attention test_gpu_pipeline test_gpu_checkpoint test_side_queue test_cuda_any_non_finite \
         test_cuda_fp8 test_gpu_fp8_stream test_gpu_heads; do
  if [ -x "build/tests/$t" ] && ! nvidia-smi -L >/dev/null 2>&1; then
    said=$(SEQFLOW_TEST_TMP=build/tests/tmp "build/tests/$t" 2>&1 || true)
    # the first 'skipped' line alone; a here-string, not a pipe: under pipefail `printf | grep -m1`
    # fails when grep stops reading early, which printed "did not skip" after the reason
    why=$(grep -m1 'skipped' <<<"$said" || true)
    echo "$t: ${why:-did not skip}"
  fi
done
# the .deb installed with apt-get, used from PATH and by an example, and removed (needs root)
if [ "$(id -u)" -eq 0 ] || sudo -n true 2>/dev/null; then
  scripts/deb-install.sh build
else
  echo "deb-install: skipped (needs root or password-less sudo)"
fi
# every libFuzzer target of tests/fuzz for FUZZ_SECONDS (default 20) seconds each
scripts/fuzz.sh
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DSEQFLOW_SANITIZE=ON -DSEQFLOW_CUDA=OFF -DSEQFLOW_BUILD_BENCH=OFF -DSEQFLOW_BUILD_TESTS=ON -DSEQFLOW_BUILD_EXAMPLES=ON
cmake --build build-sanitize -j"$jobs"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd build-sanitize && ctest --output-on-failure -j"$jobs")
