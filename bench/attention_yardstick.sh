#!/usr/bin/env bash
# The attention target's yardstick in one call on the GPU machine: seqflow's attention kernel
# on the reference branches against dense causal flash attention of the same useful work.
#
#   source scripts/gpu-env.sh && bash bench/attention_yardstick.sh [BUILD_DIR] [REPS]
#
# 1. builds bench_attention_variants in BUILD_DIR (default build-gpu; configured here if new)
#    and times the product's default kernel (median of REPS, default 30, CUDA events): the
#    reference branches 2048:1, 4096:2, 8192:4 over an 8192-token segment with and without 256
#    global tokens (16 heads, d = 64), dense 2048-token causal windows, and the same two at
#    d = 128 (8 heads);
# 2. bench/peers/dense_flash.py (PyTorch SDPA: cuDNN, FlashAttention-2, memory-efficient) on dense
#    causal 2048-token windows: 112 windows at d = 64 (7 x 16 heads: the reference branches' work
#    as dense windows), 64 windows (4 x 16, the reference segment's branch 2048:1 alone), and at
#    d = 128 56 windows (7 x 8, the same work as 112 at d = 64) and 32 (4 x 8).
# Logs and dense_flash_*.json under $OUT (or /tmp/yardstick); a summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-gpu}
REPS=${2:-30}
out=${OUT:-/tmp/yardstick}
mkdir -p "$out"
if [ ! -f "$B/CMakeCache.txt" ]; then
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DSEQFLOW_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DSEQFLOW_BUILD_TESTS=OFF -DSEQFLOW_BUILD_BENCH=ON -DSEQFLOW_BUILD_EXAMPLES=OFF >"$out/configure.log" 2>&1 ||
    { tail -20 "$out/configure.log"; exit 1; }
fi
cmake --build "$B" -j"$(nproc)" --target bench_attention_variants >"$out/build.log" 2>&1 ||
  { grep -E "error" "$out/build.log" | head -20; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
# variant 36 is the product's kernel (bench/lab/attention/attention_variants.h, SF_LAB_ATTENTION_WGMMA)
OPENBLAS_NUM_THREADS=1 "$B/bench/bench_attention_variants" "$REPS" 36 >"$out/kernel.txt" 2>&1
echo "bench_attention_variants: exit $?" | tee -a "$out/kernel.txt"
for cfg in "7 16 64" "4 16 64" "7 8 128" "4 8 128"; do
  set -- $cfg
  python3 bench/peers/dense_flash.py --windows "$1" --heads "$2" --head-dim "$3" --reps "$REPS" \
    --json "$out/dense_flash_$1x$2_d$3.json" >"$out/dense_flash_$1x$2_d$3.txt" 2>&1
done
echo "== seqflow's kernel (useful TFLOP/s, last column)"
grep -E "^(ref causal|dense 2048|ref G256)" "$out/kernel.txt" | grep -E "product|useful|36 " | grep -v "as 18"
echo "== dense causal flash attention, PyTorch SDPA"
for f in "$out"/dense_flash_*.txt; do
  grep -E "^shape|^(flash|cudnn) " "$f"
done
