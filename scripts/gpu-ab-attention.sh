#!/usr/bin/env bash
# The attention kernel of this tree against another tree's, on the GPU machine, in one command
# from the project root:
#
#   bash scripts/gpu-ab-attention.sh OTHER.tgz   (a `git archive` of the other tree, gzipped)
#
# 1. unpacks OTHER.tgz to /tmp/ab_other and builds there the binary and the attention bench, and
#    here build-gpu (Release, CUDA arch 90, tests and benches), both at once;
# 2. this tree's attention tests: test_cuda_attention (every kernel against the CPU on every
#    shape), then test_backend_ops and test_gpu_pipeline;
# 3. the kernels, alternating (other, this) AB_PAIRS times (default 2): bench_attention_variants
#    REPS 36 (the product's kernel on the reference branches with and without global tokens, on
#    dense windows, at d = 64 and 128; median of REPS, default 30, CUDA events);
# 4. the binaries (bench/ab_builds.sh, AB_PAIRS pairs) on the reference model, and on it as 8
#    heads of 128, while time is left (AB_BUDGET seconds from the start, default 420).
# Sources scripts/gpu-env.sh itself where the machine needs it. Logs under $OUT (default
# /tmp/ab_attention); the summary is printed as it goes and kept in $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
case "${1:-}" in -h | --help | "") sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 2 ;; esac
START=$SECONDS
TGZ=$(realpath "$1")
OUT=${OUT:-/tmp/ab_attention}
PAIRS=${AB_PAIRS:-2} REPS=${REPS:-30} BUDGET=${AB_BUDGET:-420}
OTHER=/tmp/ab_other
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
if [ -f .gpu/gpu-env.sh ] && ! pkg-config --exists openblas 2>/dev/null; then
  # shellcheck disable=SC1091
  source scripts/gpu-env.sh >/dev/null 2>&1
fi
note "$(date -u) $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1)"

configure() { # source build tests
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DSEQFLOW_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DSEQFLOW_BUILD_TESTS="$3" -DSEQFLOW_BUILD_BENCH=ON -DSEQFLOW_BUILD_EXAMPLES=OFF
}
rm -rf "$OTHER" && mkdir -p "$OTHER" && tar -xzf "$TGZ" -C "$OTHER" || { note "cannot unpack $TGZ"; exit 1; }
{ configure "$OTHER" "$OTHER/b" OFF && cmake --build "$OTHER/b" -j8 --target seqflow bench_attention_variants \
    bench_gpu_pipeline; } >"$OUT/build_other.log" 2>&1 &
other_pid=$!
{ configure . build-gpu ON && cmake --build build-gpu -j8; } >"$OUT/build_this.log" 2>&1
this_rc=$?
wait "$other_pid"
other_rc=$?
note "builds: this $this_rc, other $other_rc ($((SECONDS - START)) s)"
if [ "$this_rc" != 0 ] || [ "$other_rc" != 0 ]; then
  grep -hE "error" "$OUT"/build_*.log | head -20 | tee -a "$SUMMARY"
  exit 1
fi

run_test() { # name
  (cd build-gpu/tests && SEQFLOW_TEST_TMP=$PWD/tmp OPENBLAS_NUM_THREADS=1 timeout 240 "./$1") >"$OUT/$1.log" 2>&1
  local rc=$?
  note "$1: exit $rc; $(grep -E "passed|FAIL" "$OUT/$1.log" | tail -1)"
  grep -E "FAIL" "$OUT/$1.log" | head -10 | tee -a "$SUMMARY"
}
run_test test_cuda_attention

# the product's lines of bench_attention_variants: shape, form, useful TFLOP/s
product_lines() { grep -E " product " "$1" | grep -vE "bitwise|sf_cuda_attention, no workspace|ok$|FAIL$"; }
for i in $(seq "$PAIRS"); do
  for side in other this; do
    b=build-gpu
    [ $side = other ] && b=$OTHER/b
    OPENBLAS_NUM_THREADS=1 "$b/bench/bench_attention_variants" "$REPS" 36 >"$OUT/kernel_${side}_$i.txt" 2>&1
    note "== kernel, $side, pair $i (exit $?)"
    product_lines "$OUT/kernel_${side}_$i.txt" | tee -a "$SUMMARY"
  done
done
grep -hE "bitwise" "$OUT"/kernel_this_*.txt | sort | uniq -c | tee -a "$SUMMARY"
grep -hE "FAIL|^checks:" "$OUT"/kernel_this_*.txt | head -5 | tee -a "$SUMMARY"

run_test test_backend_ops
run_test test_gpu_pipeline

for args in "" "--heads 8"; do
  [ $((SECONDS - START)) -lt "$BUDGET" ] || { note "binary A/B ($args) skipped: past ${BUDGET} s"; continue; }
  AB_PAIRS=$PAIRS AB_MODEL_ARGS="$args" OUT=$OUT/ab bash bench/ab_builds.sh "$OTHER/b" build-gpu reference \
    >"$OUT/ab_builds$(echo "$args" | tr -dc 'a-z0-9').txt" 2>&1
  note "== binary, other then this, reference model $args"
  grep -E "^AB builds" "$OUT/ab_builds$(echo "$args" | tr -dc 'a-z0-9').txt" | tee -a "$SUMMARY"
done
note "done in $((SECONDS - START)) s"
