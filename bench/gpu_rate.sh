#!/usr/bin/env bash
# The quick loop for tuning the GPU pipeline, one command on the GPU machine (project root):
#
#   source scripts/gpu-env.sh && bash bench/gpu_rate.sh
#
# Builds build-rate (Release, CUDA arch 90), runs the GPU tests test_backend_ops and
# test_gpu_pipeline, measures the cuBLAS bf16 GEMM rate, then times the threaded binary
# (`seqflow run -d cuda --sink-format null`) on the reference and attention-only models: wall
# time of a 64- and a 1344-segment run (5376 for the attention-only model: ~5 s each), 3 rounds,
# steady-state rate = (1344 - 64) x 8192 tokens / (t1344 - t64) so start-up cancels out; median
# reported. RATE_UNPINNED=1 (default) adds SEQFLOW_PINNED_PACKETS=0 to each round;
# RATE_NCU=1 adds an ncu run (device time per kernel, bench/ncu_summary.py); RATE_BATCH=1
# (default) times several streams with block batch=1 against batch=B. Last, one push-mode
# run of the reference model with the per-op profile (SEQFLOW_CUDA_PROFILE=1).
# Knobs: RATE_REPS (3), RATE_MODELS ("reference attention"), RATE_SIDE (0: the binary again
# with SEQFLOW_CUDA_SIDE_QUEUE=0), RATE_CONFIGS (more label|VAR=VALUE configurations, interleaved
# the same way). Logs: $OUT (or /tmp/gpu_rate_out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_rate_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_rate.log") 2>&1
REPS=${RATE_REPS:-3}
MODELS=${RATE_MODELS:-reference attention}
B=${RATE_BUILD:-build-rate}
D=/tmp/gpu_rate_data
mkdir -p "$D"
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null; git status --short 2>/dev/null | head -20
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DSEQFLOW_BUILD_TESTS=ON \
  -DSEQFLOW_BUILD_BENCH=ON -DSEQFLOW_BUILD_EXAMPLES=OFF >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build $B -j16 --target seqflow bench_gpu_pipeline bench_gemm test_backend_ops test_gpu_pipeline test_side_queue \
  >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
echo "build ok"
for t in test_backend_ops test_gpu_pipeline test_side_queue; do
  (cd $B/tests && OPENBLAS_NUM_THREADS=1 ./$t) >"$OUT/$t.log" 2>&1
  echo "$t: exit $? $(grep -E 'passed|failed' "$OUT/$t.log" | tail -1)"
  grep -E "FAIL" "$OUT/$t.log" | head -20
done
grep -E "ffn" "$OUT/test_backend_ops.log" | head -8
$B/bench/bench_gemm --size 8192 --reps 30 | tee "$OUT/gemm.txt"
GEMM=$(grep '^RESULT' "$OUT/gemm.txt" | tail -1 | tr ' ' '\n' | sed -n 's/^gemm_tflops=//p')
N=8192
for segs in 64 1344 5376; do
  [ -f "$D/long$segs.u32" ] || $B/bench/bench_gpu_pipeline --make-tokens "$D/long$segs.u32" --count $((segs * N)) --seed 4 >/dev/null
done
$B/bench/bench_gpu_pipeline --make-tokens "$D/t12.u32" --count $((12 * N)) --seed 3 >/dev/null
# binary_rates MODEL CONFIG...: REPS rounds; each round times every CONFIG once, in turn, so that
# drift over time (clocks, temperature) falls on all of them alike. A CONFIG is a label, or
# label|VAR=VALUE to run under that environment. One run = the 64- and the long-segment run;
# the rate of each is (long - 64) x N / (t_long - t_64). Prints and records each median.
binary_rates() {
  local model=$1 long=1344 r segs t0 t1 t_64 t_long rate cfg label envs med tf pct
  shift
  # the attention-only model runs ~5x faster: a longer second run keeps the difference well
  # above the start-up's jitter
  [ "$model" = attention ] && long=5376
  declare -A rates
  for r in $(seq "$REPS"); do
    for cfg in "$@"; do
      label=${cfg%%|*}
      envs=""; [ "$cfg" != "$label" ] && envs=${cfg#*|}
      for segs in 64 $long; do
        t0=$(date +%s.%N)
        env $envs $B/seqflow run -d cuda -m "$D/$model.st" -i "$D/long$segs.u32" -f u32 --sink-format null -q --no-progress || echo "run failed"
        t1=$(date +%s.%N)
        if [ "$segs" = 64 ]; then t_64=$(python3 -c "print($t1 - $t0)"); else t_long=$(python3 -c "print($t1 - $t0)"); fi
      done
      rate=$(python3 -c "print('%.0f' % (($long - 64) * $N / ($t_long - $t_64)))")
      rates[$label]="${rates[$label]:-} $rate"
      echo "$model $label round $r: t64 $t_64 s, t$long $t_long s, $rate tokens/s"
    done
  done
  for cfg in "$@"; do
    label=${cfg%%|*}
    med=$(python3 -c "import statistics; print('%.0f' % statistics.median([float(x) for x in '${rates[$label]}'.split()]))")
    tf=$(python3 -c "print('%.1f' % ($med * ${MF[$model]} / 1e6))")
    pct=$(python3 -c "print('%.1f' % (100 * $med * ${MF[$model]} / 1e6 / $GEMM))" 2>/dev/null)
    echo "RATE $model $label: tokens/s${rates[$label]}; median $med = $tf useful TFLOP/s = $pct% of GEMM $GEMM (${MF[$model]} MFLOP/token)" | tee -a "$OUT/rates.txt"
  done
}
declare -A MF
for model in $MODELS; do
  [ -f "$D/$model.st" ] || $B/bench/bench_gpu_pipeline --make-model "$D/$model.st" --preset $model --seed 1 >/dev/null
  MF[$model]=$($B/bench/bench_gpu_pipeline --model "$D/$model.st" --tokens "$D/t12.u32" --device cuda --precision bf16 \
        --warmup-segments 2 ${GEMM:+--gemm-tflops $GEMM} | tee "$OUT/${model}_push.txt" | grep '^RESULT' | tail -1 |
        tr ' ' '\n' | sed -n 's/^mflop_per_token=//p')
  # RATE_SIDE=0: the same binary with SEQFLOW_CUDA_SIDE_QUEUE=0 (the side queue off), interleaved
  configs=(default)
  for mode in ${RATE_SIDE:-}; do configs+=("side_queue=$mode|SEQFLOW_CUDA_SIDE_QUEUE=$mode"); done
  [ "${RATE_UNPINNED:-1}" = 1 ] && configs+=("unpinned packets|SEQFLOW_PINNED_PACKETS=0")
  # RATE_CONFIGS: more label|VAR=VALUE configurations, e.g. "qkv_f32|SEQFLOW_CUDA_QKV=f32"
  for cfg in ${RATE_CONFIGS:-}; do configs+=("$cfg"); done
  binary_rates $model "${configs[@]}"
done
if [ "${RATE_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  echo "== ncu: device time per kernel (reference, push mode, 6 segments; the first 2, with the one-off work, left out)"
  $B/bench/bench_gpu_pipeline --make-tokens "$D/t6.u32" --count $((6 * N)) --seed 3 >/dev/null
  ncu --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu.csv" $B/bench/bench_gpu_pipeline --model "$D/reference.st" \
    --tokens "$D/t6.u32" --device cuda --precision bf16 --warmup-segments 2 >/dev/null 2>"$OUT/ncu.err" || tail -5 "$OUT/ncu.err"
  python3 bench/ncu_summary.py "$OUT/ncu.csv" 6 2 | tee "$OUT/ncu_summary.txt"
fi
if [ "${RATE_BATCH:-1}" = 1 ]; then
  echo "== several streams: block batch=1 vs batch=B (push mode, one segment of each stream per round)"
  # reference layers with short segments (1024: branches 256:1,512:2,1024:4), where one
  # stream's products are small, and the reference model itself
  $B/bench/bench_gpu_pipeline --make-model "$D/ref1k.st" --preset reference --seed 1 --segment 1024 \
    --branches 256:1,512:2,1024:4 >/dev/null
  $B/bench/bench_gpu_pipeline --make-tokens "$D/s8.u32" --count $((8 * 40 * 1024)) --seed 6 >/dev/null
  $B/bench/bench_gpu_pipeline --make-tokens "$D/s4.u32" --count $((4 * 8 * N)) --seed 6 >/dev/null
  for b in 1 8; do
    $B/bench/bench_gpu_pipeline --model "$D/ref1k.st" --tokens "$D/s8.u32" --streams 8 --batch $b --warmup-segments 4 \
      --precision bf16 ${GEMM:+--gemm-tflops $GEMM} | grep -v RESULT | tee -a "$OUT/rates.txt"
  done
  for b in 1 4; do
    $B/bench/bench_gpu_pipeline --model "$D/reference.st" --tokens "$D/s4.u32" --streams 4 --batch $b --warmup-segments 2 \
      --precision bf16 ${GEMM:+--gemm-tflops $GEMM} | grep -v RESULT | tee -a "$OUT/rates.txt"
  done
  if [ "${RATE_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
    # device time against wall time at segment 1024: does launch overhead show?
    $B/bench/bench_gpu_pipeline --make-tokens "$D/s8short.u32" --count $((8 * 10 * 1024)) --seed 6 >/dev/null
    for b in 1 8; do
      ncu --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu_1k_b$b.csv" $B/bench/bench_gpu_pipeline \
        --model "$D/ref1k.st" --tokens "$D/s8short.u32" --streams 8 --batch $b --warmup-segments 2 --precision bf16 \
        >/dev/null 2>>"$OUT/ncu.err" || tail -3 "$OUT/ncu.err"
      echo "-- ncu, segment 1024, 8 streams, batch=$b: device ms per stream-segment (80 segments, warm-up included)"
      python3 bench/ncu_summary.py "$OUT/ncu_1k_b$b.csv" 80 | tail -1 | tee -a "$OUT/rates.txt"
    done
  fi
fi
echo "== profile (reference, push mode, per-op waits)"
SEQFLOW_CUDA_PROFILE=1 $B/bench/bench_gpu_pipeline --model "$D/reference.st" --tokens "$D/t12.u32" --device cuda \
  --precision bf16 --warmup-segments 2 2>&1 | tail -22
cat "$OUT/rates.txt"
