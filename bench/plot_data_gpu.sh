#!/usr/bin/env bash
# The GPU data behind the plots (bench/plot.py), on the GPU machine, in the project root:
#
#   source scripts/gpu-env.sh && bash bench/plot_data_gpu.sh sweep     # throughput against N
#   source scripts/gpu-env.sh && bash bench/plot_data_gpu.sh memory    # memory over a long stream
#
# sweep: the reference model's shape (D=1024 H=16 d=64, branches N/4:1,N/2:2,N:4, causal, delta
#   memory, 256 global tokens, 4 layers, SwiGLU 4096) at segment lengths N = 2048 .. 16384:
#   seqflow (bench_gpu_pipeline, bf16, 16 segments, 2 warm-up) and the PyTorch peer
#   (bench/peers/seqflow_torch.py, bf16) on the same model file and tokens; gpu_n.csv.
# memory: the reference model streamed for PLOT_MEMORY_TOKENS tokens (default 1e9) or
#   PLOT_MEMORY_SECONDS seconds (default 500), whichever comes first: tokens/s, backend peak,
#   whole-device use and resident memory every few seconds; gpu_memory.csv.
# Output in $OUT (or /tmp/plot_data), CSV with a header line, and the logs.
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ] || [ -z "${1:-}" ]; then sed -n '2,/^if /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/plot_data}
mkdir -p "$OUT"
BUILD=build-gpu
DATA=/tmp/plot_data_models
mkdir -p "$DATA"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [ ! -x "$BUILD/bench/bench_gpu_pipeline" ] || [ "${PLOT_REBUILD:-0}" = 1 ]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DSEQFLOW_BUILD_TESTS=OFF \
    -DSEQFLOW_BUILD_EXAMPLES=OFF >"$OUT/cmake.log" 2>&1 &&
    cmake --build "$BUILD" -j"$(nproc)" --target bench_gpu_pipeline >"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
fi
BENCH=$BUILD/bench/bench_gpu_pipeline
case $1 in
sweep)
  echo "n,seqflow_tokens_per_s,pytorch_tokens_per_s" >"$OUT/gpu_n.csv"
  for N in 2048 4096 8192 16384; do
    M=$DATA/ref_$N.safetensors T=$DATA/tokens_$N.u32
    "$BENCH" --make-model "$M" --preset reference --segment "$N" --branches "$((N / 4)):1,$((N / 2)):2,$N:4" --seed 1 \
      >"$OUT/make_$N.log" 2>&1 || { cat "$OUT/make_$N.log"; exit 1; }
    "$BENCH" --make-tokens "$T" --count $((16 * N)) --seed 3 >/dev/null
    "$BENCH" --model "$M" --tokens "$T" --device cuda --precision bf16 --warmup-segments 2 >"$OUT/seqflow_$N.log" 2>&1
    sf=$(sed -n 's/^RESULT tokens_per_s=\([0-9.]*\).*/\1/p' "$OUT/seqflow_$N.log")
    python3 bench/peers/seqflow_torch.py run --model "$M" --tokens "$T" --precision bf16 --warmup-segments 2 \
      --json "$OUT/pytorch_$N.json" >"$OUT/pytorch_$N.log" 2>&1
    pt=$(python3 -c "import json; print(json.load(open('$OUT/pytorch_$N.json'))['tokens_per_s'])" 2>/dev/null)
    echo "$N,${sf:-},${pt:-}" | tee -a "$OUT/gpu_n.csv"
  done
  ;;
memory)
  M=$DATA/ref_8192.safetensors
  [ -f "$M" ] || "$BENCH" --make-model "$M" --preset reference --seed 1 >/dev/null
  "$BENCH" --model "$M" --device cuda --precision bf16 --memory-run "${PLOT_MEMORY_TOKENS:-1000000000}" \
    --memory-at 1048576 --memory-seconds "${PLOT_MEMORY_SECONDS:-500}" >"$OUT/memory.log" 2>&1
  echo "tokens,seconds,tokens_per_s,backend_peak_mib,device_used_mib,rss_mib" >"$OUT/gpu_memory.csv"
  sed -n 's/^MEMLOG tokens=\([0-9]*\) seconds=\([0-9.]*\) tokens_per_s=\([0-9]*\) backend_peak_mib=\([0-9.]*\) device_used_mib=\([0-9.]*\) rss_mib=\([0-9.]*\)$/\1,\2,\3,\4,\5,\6/p' \
    "$OUT/memory.log" >>"$OUT/gpu_memory.csv"
  tail -3 "$OUT/memory.log"
  tail -3 "$OUT/gpu_memory.csv"
  ;;
*) echo "unknown step '$1': sweep or memory" >&2; exit 2 ;;
esac
