#!/usr/bin/env bash
# The lab's attention variants against the product's twin (36) on the GPU machine, in one
# command from the project root:
#
#   bash bench/lab/run_attention_variants.sh [BUILD_DIR] "36 45 46" [ROUNDS] [REPS]
#
# 1. builds bench_attention_variants in BUILD_DIR (default build-gpu; configured here if new);
# 2. runs `bench_attention_variants REPS V` (checks V against the CPU on eight shapes, then times
#    it: median of REPS, default 30, CUDA events) for every V of the list, ROUNDS times
#    (default 3) in turn, one process a run, so that the machine's drift falls on every variant
#    alike;
# 3. prints each run's checks and its timing lines on the reference branches and dense windows
#    (float32 inputs with the pre-pass; bf16 inputs read in place where the variant reads them):
#    shape, variant, what, median ms, min ms, useful TFLOP/s.
# Sources scripts/gpu-env.sh where the machine needs it. Logs under $OUT (default
# /tmp/att_variants); the summary is kept in $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
case "${2:-}" in "" | -h | --help) sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 2 ;; esac
B=${1:-build-gpu}
VARIANTS=$2
ROUNDS=${3:-3}
REPS=${4:-30}
OUT=${OUT:-/tmp/att_variants}
mkdir -p "$OUT"
if [ -f .gpu/gpu-env.sh ] && ! pkg-config --exists openblas 2>/dev/null; then
  # shellcheck disable=SC1091
  source scripts/gpu-env.sh >/dev/null 2>&1
fi
if [ ! -f "$B/CMakeCache.txt" ]; then
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DSEQFLOW_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DSEQFLOW_BUILD_TESTS=OFF -DSEQFLOW_BUILD_BENCH=ON -DSEQFLOW_BUILD_EXAMPLES=OFF >"$OUT/configure.log" 2>&1 ||
    { tail -20 "$OUT/configure.log"; exit 1; }
fi
cmake --build "$B" -j"$(nproc)" --target bench_attention_variants >"$OUT/build.log" 2>&1 ||
  { grep -E "error" "$OUT/build.log" | head -20; exit 1; }
SUMMARY=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$SUMMARY"
for r in $(seq "$ROUNDS"); do
  for v in $VARIANTS; do
    log=$OUT/variant_${v}_$r.txt
    OPENBLAS_NUM_THREADS=1 "$B/bench/bench_attention_variants" "$REPS" "$v" >"$log" 2>&1
    rc=$?
    # the reference branches' lines of the timing table: shape, variant, name, ms, ms, TFLOP/s
    echo "round $r, variant $v (exit $rc): $(grep -E '^checks:' "$log")" | tee -a "$SUMMARY"
    grep -E "^(ref causal G(256|0)|dense 2048 causal) +$v " "$log" | sed -E 's/ +/ /g; s/\(max .*//' | tee -a "$SUMMARY"
  done
done
