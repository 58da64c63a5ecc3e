#!/usr/bin/env bash
# FP8 products, cold start and latency on the GPU machine, in one command from the project root:
#
#   bash scripts/gpu-speed.sh          (sources scripts/gpu-env.sh itself where the machine needs it)
#
# 1. builds build-gpu (Release, CUDA arch 90; only the targets below, about 70 s on 16 cores);
# 2. runs the GPU tests of these paths at once, each with its own log: test_cuda_settings,
#    test_cuda_fp8 (FP8 products against float64), test_gpu_fp8_stream (2,000 segments: the
#    memory's error against the CPU at segment 100 and at the end), test_gpu_pipeline (every
#    pipeline in f32, bf16 and fp8 against the CPU), test_gpu_warmup (the warm-up changes no
#    output), and, for what the changes touch, test_backend_ops, test_gpu_checkpoint and
#    test_side_queue;
# 3. makes the reference model (bench_gpu_pipeline --preset reference) and one of the built-in
#    model's shape (--preset small), and random tokens;
# 4. FP8 against bf16: bench_gpu_pipeline's push-mode rate on the reference model, alternating
#    pairs (and fp8 with fp8_scale=epilogue once); the relative error of one segment's output
#    against the CPU's float32 pipeline in both (if time is left);
# 5. cold start (bench_start_latency --cold, a fresh process each): model loaded to the first
#    segment's rows, and the first 10 segments' rate against the steady rate, with the backend
#    setting warmup=1 (default) and warmup=0, alternating, on the reference and small models,
#    each with a fresh plan cache (the product plans timed), then again with the plans taken
#    from the cache that one earlier run wrote;
# 6. latency (bench_start_latency --latency): tokens arriving in real time at half the measured
#    capacity, last token to rows out p50/p99, on the reference model (bf16 and fp8) and the
#    small one;
# 7. if time is left: the threaded binary's steady rate (64 against 448 segments) in bf16 and
#    fp8, and test_gpu_fp8_stream over 10,000 segments.
# Logs under $OUT (default /tmp/gpu_speed_out); the summary is printed last and kept in
# $OUT/summary.txt. GPU_SPEED_REPS (default 3) sets the pairs of 4 and the runs of 5;
# GPU_SPEED_BUDGET (default 390) the seconds after which optional steps are skipped;
# GPU_SPEED_STEPS (default "tests fp8 cold latency binary long") the steps that run: tests (2),
# fp8 (4), cold (5), latency (6), binary and long (7).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
START=$SECONDS
OUT=${OUT:-/tmp/gpu_speed_out}
DATA=${GPU_SPEED_DATA:-/tmp/gpu_speed_data}
REPS=${GPU_SPEED_REPS:-3}
BUDGET=${GPU_SPEED_BUDGET:-390}
BUILD=build-gpu
STEPS=" ${GPU_SPEED_STEPS:-tests fp8 cold latency binary long} "
mkdir -p "$OUT" "$DATA"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
exec > >(tee -a "$OUT/gpu_speed.log") 2>&1
export PYTHONDONTWRITEBYTECODE=1

note() { echo "$*" | tee -a "$SUMMARY"; }
# value KEY FILE: the KEY=value of the last RESULT line in FILE
value() { grep '^RESULT' "$2" 2>/dev/null | tail -1 | tr ' ' '\n' | sed -n "s/^$1=//p"; }
# median of the numbers on stdin
median() { sort -g | awk '{a[NR] = $1} END {if (NR == 0) print "n/a"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
elapsed() { echo $((SECONDS - START)); }
time_left() { [ $((SECONDS - START)) -lt "$1" ]; }
want() { [[ $STEPS == *" $1 "* ]]; }

if [ -f .gpu/gpu-env.sh ] && ! pkg-config --exists openblas 2>/dev/null; then
  # shellcheck disable=SC1091
  source scripts/gpu-env.sh
fi

echo "== machine"
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true
nvcc --version | tail -2
git log -1 --format='commit %h %s' 2>/dev/null || true

echo "== build ($BUILD)"
TARGETS="seqflow bench_gpu_pipeline bench_start_latency test_cuda_settings test_cuda_fp8 test_gpu_fp8_stream
         test_gpu_pipeline test_backend_ops test_gpu_checkpoint test_side_queue test_gpu_warmup
         test_gpu_plan_cache"
# shellcheck disable=SC2086 # a list of targets
if ! { cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSEQFLOW_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
         -DSEQFLOW_BUILD_TESTS=ON -DSEQFLOW_BUILD_BENCH=ON -DSEQFLOW_BUILD_EXAMPLES=OFF >"$OUT/configure.log" 2>&1 &&
       cmake --build "$BUILD" -j"$(nproc)" --target $TARGETS >"$OUT/build.log" 2>&1; }; then
  grep -E "error|Error" "$OUT/build.log" "$OUT/configure.log" | head -40
  note "BUILD FAILED (build.log)"
  exit 1
fi
grep "CUDA backend" "$OUT/configure.log"
note "build: ok after $(elapsed) s"
SEQFLOW=$PWD/$BUILD/seqflow
BENCH=$PWD/$BUILD/bench/bench_gpu_pipeline
SL=$PWD/$BUILD/bench/bench_start_latency

if want tests; then
echo "== GPU tests (at once, each its own log)"
t0=$SECONDS
run_test() { # name [args...]: exit status into $OUT/NAME.status
  local name=$1
  shift
  mkdir -p "$DATA/tmp_$name"
  (cd "$BUILD/tests" && SEQFLOW_TEST_TMP="$DATA/tmp_$name" SEQFLOW_BIN="$SEQFLOW" OPENBLAS_NUM_THREADS=1 \
     timeout 240 "./$name" "$@") >"$OUT/$name.log" 2>&1
  echo $? >"$OUT/$name.status"
}
TESTS="test_cuda_settings test_cuda_fp8 test_gpu_fp8_stream test_gpu_pipeline test_backend_ops test_gpu_checkpoint test_side_queue
       test_gpu_warmup test_gpu_plan_cache"
pids=()
for t in $TESTS; do
  run_test "$t" &
  pids+=($!)
done
# the pids, not a bare wait: that would also wait for the log's tee (a process substitution)
wait "${pids[@]}"
for t in $TESTS; do
  status=$(cat "$OUT/$t.status")
  case $status in 0) verdict=passed ;; 77) verdict=skipped ;; 124) verdict="TIMED OUT" ;; *) verdict="FAILED ($status)" ;; esac
  note "test $t: $verdict: $(grep -E 'passed, [0-9]+ failed|^skipped' "$OUT/$t.log" | tail -1)"
  [ "$status" = 0 ] || [ "$status" = 77 ] || grep -E "FAIL" "$OUT/$t.log" | head -8 | tee -a "$SUMMARY"
done
# the largest errors: test_cuda_fp8 by its "all" column, test_gpu_pipeline's fp8 runs by their last
awk '/rel err/ {print $NF, $0}' "$OUT/test_cuda_fp8.log" | sort -g | tail -3 | cut -d' ' -f2- |
  sed 's/^ */  fp8 products (largest): /' | tee -a "$SUMMARY"
awk '/ fp8 / && /rel err/ {print $NF, $0}' "$OUT/test_gpu_pipeline.log" | sort -g | tail -3 | cut -d' ' -f2- |
  sed 's/^ */  fp8 pipeline (largest): /' | tee -a "$SUMMARY"
grep -E "^  segment" "$OUT/test_gpu_fp8_stream.log" | sed 's/^/  fp8 stream: /' | tee -a "$SUMMARY"
note "tests took $((SECONDS - t0)) s"
fi

echo "== models and tokens"
N=8192
REF=$DATA/reference.safetensors
SMALL=$DATA/small.safetensors
[ -f "$REF" ] || "$BENCH" --make-model "$REF" --preset reference --seed 1 >/dev/null
[ -f "$SMALL" ] || "$BENCH" --make-model "$SMALL" --preset small --seed 1 >/dev/null
[ -f "$DATA/tokens64.u32" ] || "$BENCH" --make-tokens "$DATA/tokens64.u32" --count $((64 * N)) --seed 4 >/dev/null
[ -f "$DATA/tokens1.u32" ] || head -c $((N * 4)) "$DATA/tokens64.u32" >"$DATA/tokens1.u32"

if want fp8; then
echo "== A. FP8 against bf16 on the reference model"
for r in $(seq "$REPS"); do
  for p in bf16 fp8; do
    "$BENCH" --model "$REF" --tokens "$DATA/tokens64.u32" --precision $p --warmup-segments 4 >"$OUT/rate_${p}_$r.txt" 2>&1
    echo "pair $r $p: $(value tokens_per_s "$OUT/rate_${p}_$r.txt") tokens/s"
  done
done
BF16_TPS=$(for r in $(seq "$REPS"); do value tokens_per_s "$OUT/rate_bf16_$r.txt"; done | median)
FP8_TPS=$(for r in $(seq "$REPS"); do value tokens_per_s "$OUT/rate_fp8_$r.txt"; done | median)
note "reference model, push mode (bench_gpu_pipeline, 64 segments, 4 warm-up), median of $REPS alternating: bf16 $BF16_TPS tokens/s, fp8 $FP8_TPS tokens/s, fp8/bf16 $(python3 -c "print('%.3f' % ($FP8_TPS / $BF16_TPS))" 2>/dev/null)"
"$BENCH" --model "$REF" --tokens "$DATA/tokens64.u32" --precision fp8 --settings fp8_scale=epilogue --warmup-segments 4 \
  >"$OUT/rate_fp8_epilogue.txt" 2>&1
note "  fp8 with fp8_scale=epilogue (scales in a kernel of ours): $(value tokens_per_s "$OUT/rate_fp8_epilogue.txt") tokens/s (one run)"
"$BENCH" --model "$REF" --tokens "$DATA/tokens64.u32" --precision fp8 --settings fp8_accum=fast --warmup-segments 4 \
  >"$OUT/rate_fp8_fast.txt" 2>&1
note "  fp8 with fp8_accum=fast (cuBLASLt's FAST_ACCUM): $(value tokens_per_s "$OUT/rate_fp8_fast.txt") tokens/s (one run)"
grep -h "fp8" "$OUT"/rate_fp8_1.txt | grep -v "^RESULT" | head -3

# one segment against the CPU's float32 pipeline
if time_left $((BUDGET - 170)); then
  t1=$SECONDS
  timeout 120 "$SEQFLOW" run -d cpu -m "$REF" -i "$DATA/tokens1.u32" -f u32 -o "$DATA/ref_cpu.npy" -q
  note "CPU float32 reference of one segment: $((SECONDS - t1)) s"
  for p in bf16 fp8 fp8fast; do
    case $p in fp8fast) args=(--precision fp8 --backend-settings fp8_accum=fast) ;; *) args=(--precision "$p") ;; esac
    "$SEQFLOW" run -d cuda "${args[@]}" -m "$REF" -i "$DATA/tokens1.u32" -f u32 -o "$DATA/ref_$p.npy" -q
    python3 - "$DATA/ref_$p.npy" "$DATA/ref_cpu.npy" $p <<'EOF' | tee -a "$SUMMARY"
import sys
import numpy as np
a, b = np.load(sys.argv[1]).astype(np.float64), np.load(sys.argv[2]).astype(np.float64)
rows = np.linalg.norm(a - b, axis=1) / np.maximum(np.linalg.norm(b, axis=1), 1e-30)
print("reference model, one segment, %s against the CPU float32 pipeline: relative error %.5f (rows: median %.5f, worst %.5f)"
      % (sys.argv[3], np.linalg.norm(a - b) / np.linalg.norm(b), np.median(rows), rows.max()))
EOF
  done
else
  note "(accuracy against the CPU skipped: $(elapsed) s gone)"
fi
fi

if want cold; then
echo "== B. cold start (a fresh process each)"
cold() { # tag model settings [VAR=VALUE of the environment]; plan cache: $CACHE_DIR, else a fresh one
  local cache=${CACHE_DIR:-$DATA/cache_$1}
  [ -n "${CACHE_DIR:-}" ] || rm -rf "$cache"
  env SEQFLOW_CACHE_DIR="$cache" "${4:-SEQFLOW_UNUSED=1}" "$SL" --model "$2" --cold --segments 40 --settings "$3" \
    >"$OUT/cold_$1.txt" 2>&1 || echo "cold run failed: $1" >&2
  grep -v '^RESULT' "$OUT/cold_$1.txt"
}
for r in $(seq "$REPS"); do
  cold "ref_on_$r" "$REF" warmup=1
  cold "ref_off_$r" "$REF" warmup=0
done
# the product plans from the cache an earlier process wrote (the first run here writes it)
rm -rf "$DATA/plan_cache"
CACHE_DIR=$DATA/plan_cache cold ref_cache_fill "$REF" warmup=1 >/dev/null
for r in $(seq "$REPS"); do
  CACHE_DIR=$DATA/plan_cache cold "ref_cached_$r" "$REF" warmup=1
  CACHE_DIR=$DATA/plan_cache cold "ref_cachedoff_$r" "$REF" warmup=0
done
for w in on off cached cachedoff; do
  files=$(for r in $(seq "$REPS"); do echo "$OUT/cold_ref_${w}_$r.txt"; done)
  case $w in on) label="warmup=1" ;; off) label="warmup=0" ;; cached) label="warmup=1, plans from the cache" ;;
    *) label="warmup=0, plans from the cache" ;; esac
  # shellcheck disable=SC2086 # a list of files
  note "reference cold start, $label, median of $REPS: model loaded to first rows $(for f in $files; do value model_to_first_ms "$f"; done | median) ms (graph creation and set-up $(for f in $files; do value setup_ms "$f"; done | median) ms + first segment $(for f in $files; do value first_ms "$f"; done | median) ms); first 10 segments at $(for f in $files; do value first10_ratio "$f"; done | median) of the steady rate ($(for f in $files; do value steady_tps "$f"; done | median) tokens/s); CUDA start $(for f in $files; do value context_ms "$f"; done | median) ms, model load $(for f in $files; do value load_ms "$f"; done | median) ms"
done
# once each: how much of it is the product plans' timing (gemm=gemmex times nothing), and CUDA's
# lazy module loading (CUDA_MODULE_LOADING=EAGER loads every kernel when the context starts)
cold ref_on_gemmex "$REF" warmup=1,gemm=gemmex >/dev/null
cold ref_off_gemmex "$REF" warmup=0,gemm=gemmex >/dev/null
cold ref_off_eager "$REF" warmup=0 CUDA_MODULE_LOADING=EAGER >/dev/null
cold ref_on_eager "$REF" warmup=1 CUDA_MODULE_LOADING=EAGER >/dev/null
for tag in ref_on_gemmex ref_off_gemmex ref_off_eager ref_on_eager; do
  f=$OUT/cold_$tag.txt
  note "  reference $tag (one run): model loaded to first rows $(value model_to_first_ms "$f") ms (graph creation and set-up $(value setup_ms "$f") + first segment $(value first_ms "$f")); first 10 at $(value first10_ratio "$f") of steady; CUDA start $(value context_ms "$f") ms"
done
cold small_on "$SMALL" warmup=1 >/dev/null
cold small_off "$SMALL" warmup=0 >/dev/null
for w in on off; do
  f=$OUT/cold_small_$w.txt
  note "small model cold start, warmup=$([ $w = on ] && echo 1 || echo 0): model loaded to first rows $(value model_to_first_ms "$f") ms (graph creation and set-up $(value setup_ms "$f") ms + first segment $(value first_ms "$f") ms); first 10 segments at $(value first10_ratio "$f") of steady"
done

fi

if want latency; then
echo "== C. latency (tokens in real time at half the capacity)"
lat() { # tag model [args]
  local tag=$1 model=$2
  shift 2
  "$SL" --model "$model" --latency --segments 300 --load 0.5 "$@" >"$OUT/latency_$tag.txt" 2>&1 || echo "latency run failed: $tag" >&2
  grep -v '^RESULT' "$OUT/latency_$tag.txt"
  note "latency $tag: p50 $(value latency_p50_ms "$OUT/latency_$tag.txt") ms, p99 $(value latency_p99_ms "$OUT/latency_$tag.txt") ms, worst $(value latency_max_ms "$OUT/latency_$tag.txt") ms; first segment $(value latency_first_ms "$OUT/latency_$tag.txt") ms; first rows $(value first_out_ms "$OUT/latency_$tag.txt") ms after the first token (capacity $(value capacity_tps "$OUT/latency_$tag.txt") tokens/s, fed at $(value rate_tps "$OUT/latency_$tag.txt"))"
}
lat reference_bf16 "$REF"
lat reference_fp8 "$REF" --precision fp8
lat small_bf16 "$SMALL"
fi

# the threaded binary's steady rate: 64 against LONG segments (start-up cancels out)
LONG=448
want binary && [ ! -f "$DATA/tokens$LONG.u32" ] && "$BENCH" --make-tokens "$DATA/tokens$LONG.u32" --count $((LONG * N)) --seed 4 >/dev/null
binary_seconds() { # precision segments; the run's --stats-json in $OUT/binary_stats.json
  local t0
  t0=$(date +%s.%N)
  "$SEQFLOW" run -d cuda --precision "$1" -m "$REF" -i "$DATA/tokens$2.u32" -f u32 --sink-format null -q --no-progress \
    --stats-json "$OUT/binary_stats.json" >>"$OUT/binary_runs.txt" 2>&1 || echo "binary run failed: $1 $2" >&2
  python3 -c "print($(date +%s.%N) - $t0)"
}
if ! want binary; then
  :
elif time_left $((BUDGET - 100)); then
  for r in $(seq 2); do
    for p in bf16 fp8; do
      short=$(binary_seconds $p 64)
      long=$(binary_seconds $p $LONG)
      python3 -c "print('%.0f' % (($LONG - 64) * $N / ($long - $short)))" >"$OUT/binary_${p}_$r.txt"
      python3 -c 'import json, sys; print("%.0f" % json.load(open(sys.argv[1])).get("steady_tokens_per_second", 0))' \
        "$OUT/binary_stats.json" >"$OUT/inrun_${p}_$r.txt" 2>/dev/null || echo 0 >"$OUT/inrun_${p}_$r.txt"
      echo "binary $p pair $r: $(cat "$OUT/binary_${p}_$r.txt") tokens/s; in the $LONG-segment run $(cat "$OUT/inrun_${p}_$r.txt")"
    done
  done
  note "reference model, the threaded binary (null sink), steady from 64 vs $LONG segments, median of 2: bf16 $(cat "$OUT"/binary_bf16_*.txt | median), fp8 $(cat "$OUT"/binary_fp8_*.txt | median) tokens/s; in the $LONG-segment runs (--stats-json steady_tokens_per_second): bf16 $(cat "$OUT"/inrun_bf16_*.txt | median), fp8 $(cat "$OUT"/inrun_fp8_*.txt | median)"
else
  note "(threaded binary rates skipped: $(elapsed) s gone)"
fi

if ! want long; then
  :
elif time_left $((BUDGET - 60)); then
  echo "== FP8 over 10,000 segments"
  (cd "$BUILD/tests" && OPENBLAS_NUM_THREADS=1 timeout 120 ./test_gpu_fp8_stream 10000) >"$OUT/fp8_stream_10000.log" 2>&1
  note "test_gpu_fp8_stream 10000: exit $?: $(grep -E '^RESULT|passed, [0-9]+ failed' "$OUT/fp8_stream_10000.log" | tr '\n' ' ')"
else
  note "(10,000-segment FP8 stream skipped: $(elapsed) s gone)"
fi

echo
echo "== summary ($(elapsed) s in all)"
cat "$SUMMARY"
