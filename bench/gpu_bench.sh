#!/usr/bin/env bash
# The GPU benchmark in one command, on the GPU machine, in the project root:
#
#   source scripts/gpu-env.sh && bash bench/gpu_bench.sh
#
# 1. builds seqflow (Release, CUDA arch 90) into build-gpu;
# 2. measures the cuBLAS bf16 GEMM rate (bench_gemm, 8192^3, median), and the attention kernel
#    against dense flash attention on 2048-token windows (bench_attention_variants,
#    bench/peers/dense_flash.py: the attention target's yardstick) and against the peer's own
#    attention on the same inputs (seqflow_torch.py attention), and the MLP's W1|W3 product
#    with SwiGLU fused against cuBLAS + the SwiGLU pass (bench_cuda_swiglu_gate_up), and the
#    products added into the residual (W2, O) on cuBLAS against a hand-written kernel
#    (bench_cuda_residual_product);
# 3. checks the PyTorch peer (bench/peers/seqflow_torch.py) and seqflow on the GPU against the
#    seqflow CPU pipeline on small models (float32 and bf16; causal and not; a partial segment);
# 4. makes the reference model (D=1024 H=16 d=64 N=8192, branches 2048:1,4096:2,8192:4, causal,
#    delta memory, 256 global tokens, 8 summary tokens, 4 layers, SwiGLU 4096, final norm) and
#    its attention-only variant (1 layer, no MLP) and random tokens; times seqflow
#    (bench_gpu_pipeline, bf16, without --out; then once more with it) and the peer (bf16,
#    writing its output) on each, compares their outputs with each
#    other and with seqflow's float32 CPU pipeline on the first segments;
#    The threaded binary is timed twice on each model: float32 output, and bf16 output
#    (--out-dtype bf16), the peer too (--out-dtype bf16), and the two bf16 outputs compared;
# 5. runs the attention-only model over a long stream and reports device memory;
# 6. prints the table, and what 7x the peer would take against the bounds of this run's own
#    rates (bench/target_bounds.py).
# The log, the summary and the table go to $OUT (or /tmp/gpu_bench_out).
# Knobs: GPU_BENCH_SEGMENTS (segments of each timed run, default 16), GPU_BENCH_MEM_SECONDS (the long run, default 60),
# GPU_BENCH_BINARY_REPS (repetitions of the binary's timing, default 5),
# GPU_BENCH_CPU_SEGMENTS (segments checked against the CPU, default 1; 0 skips).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_bench_out}
mkdir -p "$OUT"
DATA=${GPU_BENCH_DATA:-/tmp/gpu_bench_data}
LOGS=$DATA/logs   # per-step outputs; everything is also in $OUT/gpu_bench.log (the tool returns few files)
mkdir -p "$DATA" "$LOGS"
SEGMENTS=${GPU_BENCH_SEGMENTS:-16}
MEM_SECONDS=${GPU_BENCH_MEM_SECONDS:-60}
CPU_SEGMENTS=${GPU_BENCH_CPU_SEGMENTS:-1}
BUILD=build-gpu
PEER=bench/peers/seqflow_torch.py
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
exec > >(tee -a "$OUT/gpu_bench.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

note() { echo "$*" | tee -a "$SUMMARY"; }
# value KEY FILE: the KEY=value of the last RESULT line in FILE
value() { grep '^RESULT' "$2" 2>/dev/null | tail -1 | tr ' ' '\n' | sed -n "s/^$1=//p"; }
# compare A B TOL TAG [ROWS]
compare() {
  python3 "$PEER" compare "$1" "$2" --tol "$3" --rows "${5:-0}" --json "$LOGS/cmp_$4.json" | tee -a "$SUMMARY"
}

# binary_rate MODEL LONG TAG WHAT [seqflow args...]: the threaded binary's steady rate on MODEL
# (null sink) from 64- and LONG-segment runs, GPU_BENCH_BINARY_REPS repetitions, the median
# into BIN_TPS and a note; the note also gives the LONG runs' own steady rates (--stats-json
# steady_tokens_per_second: no second run's start-up in them).
binary_rate() {
  local model=$1 long=$2 tag=$3 what=$4 rates="" inrun="" rep segs t0 stats
  shift 4
  for rep in $(seq "${GPU_BENCH_BINARY_REPS:-5}"); do
    for segs in 64 $long; do
      [ -f "$DATA/long$segs.u32" ] || "$BENCH" --make-tokens "$DATA/long$segs.u32" --count $((segs * N)) --seed 4
      stats="$LOGS/${model}_binary${tag}_$segs.json"
      t0=$(date +%s.%N)
      "$SEQFLOW" run -d cuda -m "$DATA/$model.safetensors" -i "$DATA/long$segs.u32" -f u32 --sink-format null -q \
        --no-progress --stats-json "$stats" "$@"
      python3 -c "print($(date +%s.%N) - $t0)" >"$LOGS/${model}_binary${tag}_$segs.txt"
    done
    rates="$rates $(python3 -c "print('%.0f' % (($long - 64)*$N / ($(cat "$LOGS/${model}_binary${tag}_$long.txt") - $(cat "$LOGS/${model}_binary${tag}_64.txt"))))")"
    inrun="$inrun $(python3 -c 'import json, sys; print("%.0f" % json.load(open(sys.argv[1])).get("steady_tokens_per_second", 0))' "$stats" 2>/dev/null || echo 0)"
  done
  BIN_TPS=$(python3 -c "import statistics; print('%.0f' % statistics.median([float(x) for x in '$rates'.split()]))")
  local in_med
  in_med=$(python3 -c "import statistics; print('%.0f' % statistics.median([float(x) for x in '$inrun'.split()]))")
  note "$model: seqflow binary (threaded, $what), steady state from 64 vs $long segments, ${GPU_BENCH_BINARY_REPS:-5} repetitions:$rates tokens/s; median $BIN_TPS; in the $long-segment runs:$inrun, median $in_med"
}

echo "== machine"
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true
nvcc --version | tail -2
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
git log -1 --format='commit %h %s' 2>/dev/null || true

echo "== build"
t0=$(date +%s)
HAVE_CUDA=0
if cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DSEQFLOW_BUILD_TESTS=OFF \
      -DSEQFLOW_BUILD_EXAMPLES=OFF >"$OUT/cmake.log" 2>&1 &&
   cmake --build "$BUILD" -j"$(nproc)" --target seqflow bench_gpu_pipeline bench_gemm bench_attention_variants bench_cuda_swiglu_gate_up bench_cuda_residual_product bench_cuda_link >"$OUT/build.log" 2>&1; then
  HAVE_CUDA=1
  BIN=$BUILD
else
  note "CUDA build FAILED (see build.log); falling back to a CPU-only build for the checks"
  tail -30 "$OUT/build.log"
  BIN=build-gpu-cpu
  cmake -S . -B "$BIN" -DCMAKE_BUILD_TYPE=Release -DSEQFLOW_CUDA=OFF -DSEQFLOW_BUILD_TESTS=OFF \
    -DSEQFLOW_BUILD_EXAMPLES=OFF >"$OUT/cmake-cpu.log" 2>&1 &&
    cmake --build "$BIN" -j"$(nproc)" --target seqflow bench_gpu_pipeline >"$OUT/build-cpu.log" 2>&1 ||
    { tail -30 "$OUT/build-cpu.log"; echo "CPU build failed too"; exit 1; }
  mkdir -p "$BUILD/bench"
  nvcc -O3 -arch=sm_90 -o "$BUILD/bench/bench_gemm" bench/bench_gemm.cu -lcublas || true
fi
echo "build took $(( $(date +%s) - t0 )) s (CUDA backend built: $HAVE_CUDA)"
SEQFLOW=$BIN/seqflow
BENCH=$BIN/bench/bench_gpu_pipeline
# Does the CUDA backend run here? (built, and a GPU it can open)
SF_GPU=0
if [ "$HAVE_CUDA" = 1 ] && echo "hello" | "$SEQFLOW" run -d cuda -q >/dev/null 2>"$LOGS/cuda_probe.txt"; then SF_GPU=1; fi
[ "$SF_GPU" = 1 ] || note "seqflow --device cuda unavailable: $(tail -1 "$LOGS/cuda_probe.txt" 2>/dev/null)"

echo "== cuBLAS bf16 GEMM"
GEMM=""
if [ -x "$BUILD/bench/bench_gemm" ]; then
  "$BUILD/bench/bench_gemm" --size 8192 --reps 30 | tee "$LOGS/gemm.txt"
  GEMM=$(value gemm_tflops "$LOGS/gemm.txt")
  note "GEMM: $(head -1 "$LOGS/gemm.txt")"
fi

echo "== the host-device link (one segment's float32 output, page-locked)"
if [ "$HAVE_CUDA" = 1 ] && [ -x "$BUILD/bench/bench_cuda_link" ]; then
  "$BUILD/bench/bench_cuda_link" --reps 30 | tee "$LOGS/link.txt" | grep '^link' | tee -a "$SUMMARY"
fi

echo "== the attention kernel against dense flash attention (the attention target's yardstick)"
# seqflow's kernel on the reference branches (with and without the 256 global tokens) and on
# dense causal 2048-token windows, and PyTorch's SDPA backends on the same dense windows
if [ "$HAVE_CUDA" = 1 ] && [ -x "$BUILD/bench/bench_attention_variants" ]; then
  mkdir -p "$DATA/attention_inputs"
  ATT_DUMP="$DATA/attention_inputs" ATT_TIME_ONLY=1 "$BUILD/bench/bench_attention_variants" 50 >"$LOGS/attention_kernel.txt" 2>&1
  grep 'bf16 in place through sf_cuda_attention' "$LOGS/attention_kernel.txt" | awk '{printf "attention kernel (product, bf16 q/k/v in place): %s %s %s: %s TFLOP/s\n", $1, $2, $3, $NF}' |
    tee -a "$SUMMARY"
  # The attention alone against the peer's (its branches, global tokens and merge), on the
  # inputs the kernel bench just used (reference shape, G256), checked against its output
  if [ -f "$DATA/attention_inputs/attention.json" ]; then
    python3 "$PEER" attention --inputs "$DATA/attention_inputs" --json "$LOGS/attention_peer.json" |
      tee "$LOGS/attention_peer.txt" | tee -a "$SUMMARY"
  fi
  rm -rf "$DATA/attention_inputs"
fi
python3 bench/peers/dense_flash.py --json "$LOGS/dense_flash.json" | tee "$LOGS/dense_flash.txt"
python3 -c "import json; r=json.load(open('$LOGS/dense_flash.json'))['results']; print('dense flash attention (PyTorch SDPA, 4 x 2048 causal windows, 16 heads, d=64): ' + ', '.join('%s %.1f TFLOP/s' % (x['backend'], x['tflops']) for x in r))" 2>/dev/null |
  tee -a "$SUMMARY"

echo "== the MLP's first half: W1|W3 + SwiGLU fused (default) against cuBLAS + the SwiGLU pass"
if [ "$HAVE_CUDA" = 1 ] && [ -x "$BUILD/bench/bench_cuda_swiglu_gate_up" ]; then
  "$BUILD/bench/bench_cuda_swiglu_gate_up" 50 >"$LOGS/swiglu_gate_up.txt" 2>&1
  grep -vE " ok$" "$LOGS/swiglu_gate_up.txt"
  grep -E "^  composed:|\(default\)|FAIL" "$LOGS/swiglu_gate_up.txt" | sed 's/^ */gate\/up bench: /' | tee -a "$SUMMARY"
fi

echo "== the products added into the residual (W2, O): cuBLAS (default) against residual_product (a variant)"
if [ "$HAVE_CUDA" = 1 ] && [ -x "$BUILD/bench/bench_cuda_residual_product" ]; then
  "$BUILD/bench/bench_cuda_residual_product" 50 >"$LOGS/residual_product.txt" 2>&1
  grep -vE " ok$" "$LOGS/residual_product.txt"
  grep -E "^time|FAIL" "$LOGS/residual_product.txt" | sed 's/^/residual bench: /' | tee -a "$SUMMARY"
fi

echo "== small models: the peer and seqflow on the GPU against the seqflow CPU pipeline"
for variant in "causal delta" "noncausal linear"; do
  set -- $variant
  causal=$([ "$1" = causal ] && echo 1 || echo 0)
  tag="small_$1_$2"
  "$BENCH" --make-model "$DATA/$tag.safetensors" --preset small --seed 11 --causal "$causal" --memory "$2"
  "$BENCH" --make-tokens "$DATA/small.u32" --count 1664 --seed 5   # 6.5 segments of 256: a partial last one
  "$SEQFLOW" run -d cpu -m "$DATA/$tag.safetensors" -i "$DATA/small.u32" -f u32 -o "$DATA/${tag}_cpu.npy" -q
  note "-- $tag (D=128 H=4 d=32 N=256, 2 layers, 16 global tokens, 1664 tokens)"
  python3 "$PEER" run --model "$DATA/$tag.safetensors" --tokens "$DATA/small.u32" --precision f32 --out "$DATA/${tag}_pt32.npy" --warmup-segments 1
  compare "$DATA/${tag}_pt32.npy" "$DATA/${tag}_cpu.npy" 1e-4 "${tag}_pt32"
  python3 "$PEER" run --model "$DATA/$tag.safetensors" --tokens "$DATA/small.u32" --precision bf16 --out "$DATA/${tag}_pt16.npy" --warmup-segments 1
  compare "$DATA/${tag}_pt16.npy" "$DATA/${tag}_cpu.npy" 2e-2 "${tag}_pt16"
  if [ "$SF_GPU" = 1 ]; then
    for p in f32 bf16; do
      tol=$([ $p = f32 ] && echo 1e-4 || echo 2e-2)
      "$SEQFLOW" run -d cuda --precision $p -m "$DATA/$tag.safetensors" -i "$DATA/small.u32" -f u32 -o "$DATA/${tag}_sf_$p.npy" -q &&
        compare "$DATA/${tag}_sf_$p.npy" "$DATA/${tag}_cpu.npy" "$tol" "${tag}_sf_$p"
    done
  fi
done

echo "== reference models"
N=8192
"$BENCH" --make-tokens "$DATA/tokens.u32" --count $((SEGMENTS * N)) --seed 3
head -c $((CPU_SEGMENTS * N * 4)) "$DATA/tokens.u32" >"$DATA/tokens_head.u32"
for model in reference attention; do
  echo "-- $model"
  M=$DATA/$model.safetensors
  "$BENCH" --make-model "$M" --preset $model --seed 1
  if [ "$SF_GPU" = 1 ]; then
    # Timed without --out (the consumer takes the packets and drops them), then once more
    # writing the output for the comparisons: its host copy is not pipeline work.
    "$BENCH" --model "$M" --tokens "$DATA/tokens.u32" --device cuda --precision bf16 --warmup-segments 2 \
      ${GEMM:+--gemm-tflops $GEMM} | tee "$LOGS/${model}_seqflow.txt"
    # The threaded binary (one thread per stage, so the output download overlaps the next
    # segment's compute), null sink: two runs of different lengths, so that start-up (model
    # load, weight upload, cuBLAS init) cancels out of the rate; GPU_BENCH_BINARY_REPS (5)
    # repetitions, the median. The long runs take ~5 s on an H100 (1344 segments of the
    # reference model, 5376 of the attention-only one, which runs ~5x faster): with 1 s runs
    # the start-up's jitter spread single repetitions by 10-30% (bench/RESULTS.md).
    long=1344; [ "$model" = attention ] && long=5376
    binary_rate "$model" "$long" "" "null sink"
    echo "RESULT binary_tokens_per_s=$BIN_TPS" >"$LOGS/${model}_binary.txt"
    # The same with the hidden states sent out as bf16 (--out-dtype bf16: the GPU writes them in
    # bf16, so the download halves), and its output against the peer's bf16 output below
    binary_rate "$model" "$long" "_bf16" "null sink, --out-dtype bf16" --out-dtype bf16
    echo "RESULT binary_tokens_per_s=$BIN_TPS" >"$LOGS/${model}_binary_bf16.txt"
    "$SEQFLOW" run -d cuda -m "$M" -i "$DATA/tokens.u32" -f u32 -o "$DATA/${model}_sf16.npy" --out-dtype bf16 -q --no-progress
    echo "(again, writing the output)"
    "$BENCH" --model "$M" --tokens "$DATA/tokens.u32" --device cuda --precision bf16 --warmup-segments 2 \
      --out "$DATA/${model}_sf.npy" | tee "$LOGS/${model}_seqflow_out.txt"
  fi
  python3 "$PEER" run --model "$M" --tokens "$DATA/tokens.u32" --precision bf16 --warmup-segments 2 \
    --out "$DATA/${model}_pt.npy" --json "$LOGS/${model}_pytorch.json" | tee "$LOGS/${model}_pytorch.txt"
  python3 "$PEER" run --model "$M" --tokens "$DATA/tokens.u32" --precision bf16 --warmup-segments 2 --out-dtype bf16 \
    --out "$DATA/${model}_pt16.npy" --json "$LOGS/${model}_pytorch_bf16.json" | tee "$LOGS/${model}_pytorch_bf16.txt"
  [ "$SF_GPU" = 1 ] && compare "$DATA/${model}_sf16.npy" "$DATA/${model}_pt16.npy" 2e-2 "${model}_sf16_pt16"
  if [ "$CPU_SEGMENTS" -gt 0 ]; then
    t1=$(date +%s)
    "$SEQFLOW" run -d cpu -m "$M" -i "$DATA/tokens_head.u32" -f u32 -o "$DATA/${model}_cpu.npy" -q
    echo "CPU float32 reference of $CPU_SEGMENTS segment(s): $(( $(date +%s) - t1 )) s"
    compare "$DATA/${model}_pt.npy" "$DATA/${model}_cpu.npy" 2e-2 "${model}_pt_cpu" $((CPU_SEGMENTS * N))
    [ "$SF_GPU" = 1 ] && compare "$DATA/${model}_sf.npy" "$DATA/${model}_cpu.npy" 2e-2 "${model}_sf_cpu" $((CPU_SEGMENTS * N))
  fi
  [ "$SF_GPU" = 1 ] && compare "$DATA/${model}_sf.npy" "$DATA/${model}_pt.npy" 2e-2 "${model}_sf_pt"
  rm -f "$DATA/${model}_sf.npy" "$DATA/${model}_pt.npy" "$DATA/${model}_cpu.npy" "$DATA/${model}_sf16.npy" "$DATA/${model}_pt16.npy"
done

if [ "$SF_GPU" = 1 ] && [ "$MEM_SECONDS" != 0 ]; then
  echo "== device memory over a long stream (attention-only model, at most $MEM_SECONDS s)"
  "$BENCH" --model "$DATA/attention.safetensors" --device cuda --precision bf16 --memory-run 100000000 \
    --memory-at 1048576 --memory-seconds "$MEM_SECONDS" | tee "$LOGS/memory.txt"
fi

echo "== table"
{
  echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); cuBLAS bf16 GEMM 8192^3: ${GEMM:-n/a} TFLOP/s"
  printf '| model | useful MFLOP/token | seqflow tokens/s | useful TFLOP/s | %% of GEMM | PyTorch tokens/s | speedup | seqflow binary tokens/s (threaded) | binary %% of GEMM | seqflow backend peak MiB | PyTorch peak MiB |\n'
  printf '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n'
  for model in reference attention; do
    sf=$LOGS/${model}_seqflow.txt
    pt=$(python3 -c "import json;print('%.0f'%json.load(open('$LOGS/${model}_pytorch.json'))['tokens_per_s'])" 2>/dev/null)
    ptm=$(python3 -c "import json;print('%.1f'%(json.load(open('$LOGS/${model}_pytorch.json'))['peak_memory_bytes']/2**20))" 2>/dev/null)
    tps=$(value tokens_per_s "$sf"); tf=$(value tflops "$sf"); mf=$(value mflop_per_token "$sf"); pk=$(value peak_mib "$sf")
    pct=$([ -n "$tf" ] && [ -n "$GEMM" ] && python3 -c "print('%.1f'%(100*$tf/$GEMM))")
    spd=$([ -n "$tps" ] && [ -n "$pt" ] && python3 -c "print('%.2fx'%($tps/$pt))")
    tps=${tps%.*}
    btps=$(value binary_tokens_per_s "$LOGS/${model}_binary.txt")
    bpct=$([ -n "$btps" ] && [ -n "$mf" ] && [ -n "$GEMM" ] && python3 -c "print('%.1f'%(100*$btps*$mf*1e6/1e12/$GEMM))")
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$model" "${mf:-n/a}" "${tps:-n/a}" "${tf:-n/a}" "${pct:-n/a}" \
      "${pt:-n/a}" "${spd:-n/a}" "${btps:-n/a}" "${bpct:-n/a}" "${pk:-n/a}" "${ptm:-n/a}"
  done
  echo
  echo "hidden states sent out as bf16 (seqflow --out-dtype bf16, the peer --out-dtype bf16), threaded binary, null sink:"
  printf '| model | seqflow binary tokens/s, bf16 out | float32 out (above) | PyTorch tokens/s, bf16 out | binary / PyTorch, both bf16 out |\n'
  printf '| --- | --- | --- | --- | --- |\n'
  for model in reference attention; do
    b16=$(value binary_tokens_per_s "$LOGS/${model}_binary_bf16.txt"); b32=$(value binary_tokens_per_s "$LOGS/${model}_binary.txt")
    p16=$(python3 -c "import json;print('%.0f'%json.load(open('$LOGS/${model}_pytorch_bf16.json'))['tokens_per_s'])" 2>/dev/null)
    r16=$([ -n "$b16" ] && [ -n "$p16" ] && python3 -c "print('%.2fx'%($b16/$p16))")
    printf '| %s | %s | %s | %s | %s |\n' "$model" "${b16:-n/a}" "${b32:-n/a}" "${p16:-n/a}" "${r16:-n/a}"
  done
  [ -f "$LOGS/memory.txt" ] && grep '^memory run' "$LOGS/memory.txt"
  # What 7x the peer would take, against what this run's own rates allow (bench/target_bounds.py)
  rs=$LOGS/reference_seqflow.txt
  if [ -n "$GEMM" ] && [ -n "$(value attention_mflop_per_token "$rs")" ] && [ -f "$LOGS/reference_pytorch.json" ]; then
    rates=$(python3 -c "
import json
r = []
try:
    best = max(json.load(open('$LOGS/dense_flash.json'))['results'], key=lambda x: x['tflops'])
    r.append('--attention-rate=fastest-dense-flash-%s=%.1f' % (best['backend'], best['tflops']))
except Exception: pass
try:
    a = json.load(open('$LOGS/attention_peer.json'))
    r += ['--attention-rate=seqflow-kernel=%.1f' % a['kernel_tflops'], '--kernel-ms=%f' % a['kernel_ms'],
          '--peer-attention-ms=%f' % a['peer_ms'], '--attention-gflop=%f' % a['useful_gflop']]
except Exception: pass
try:
    a = json.load(open('$LOGS/attention_pytorch.json'))
    r += ['--link-peer-tps=%f' % a['tokens_per_s']]
except Exception: pass
print(' '.join(r))")
    link=$(value link_dtoh_gbs "$LOGS/link.txt")
    # the attention-only model sends out its D float32 hidden values a token
    dim=$("$SEQFLOW" info --model "$DATA/attention.safetensors" 2>/dev/null | awk '$1 == "dim" {print $2}')
    [ -n "$link" ] && [ -n "$dim" ] && rates="$rates --link-gbs=$link --output-bytes=$((4 * dim))"
    # shellcheck disable=SC2086
    python3 bench/target_bounds.py --gemm "$GEMM" --mflop "$(value mflop_per_token "$rs")" \
      --attention-mflop "$(value attention_mflop_per_token "$rs")" \
      --peer-tps "$(python3 -c "import json;print(json.load(open('$LOGS/reference_pytorch.json'))['tokens_per_s'])")" $rates
  fi
  grep -h '^attention kernel\|^attention against\|^dense flash' "$SUMMARY"
  echo "checks:"
  grep -h '^compare' "$SUMMARY" | sed "s|$DATA/||g"
} | tee "$OUT/table.md"
