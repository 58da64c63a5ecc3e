#!/usr/bin/env bash
# Builds the attention kernels, their checker/timer and tests/test_cuda_attention straight with
# nvcc (independent of the rest of the tree's build state), then checks and times every variant.
# On the GPU machine, repo root: source scripts/gpu-env.sh && bash bench/run_attention_bench.sh [reps]
# Logs go to $OUT when set (the device tool), else /tmp.
set -euo pipefail
reps=${1:-50}
out=${OUT:-/tmp}
b=/tmp/attbuild
mkdir -p "$b"
flags="-O3 -arch=sm_90 -I. -Iinclude"
nvcc $flags -Xptxas -v -c -o $b/ws.o kernels/cuda/attention_bf16_ws.cu 2> $out/ptxas_ws.txt
nvcc $flags -c -o $b/k.o kernels/cuda/attention_bf16.cu
nvcc $flags -c -o $b/bench.o bench/bench_cuda_attention.cu
nvcc -arch=sm_90 -o $b/bench_att $b/bench.o $b/k.o $b/ws.o kernels/cpu/*.c pipeline/error.c -I. -Iinclude \
  -lopenblas -Xcompiler -fopenmp
gcc -O2 -DSEQFLOW_HAVE_CUDA=1 -I. -Iinclude -Itests -I/usr/local/cuda/include -c -o $b/t.o tests/test_cuda_attention.c
nvcc -o $b/test_att $b/t.o tests/support/check.c pipeline/process_stats.c $b/k.o $b/ws.o kernels/cpu/*.c \
  pipeline/error.c -I. -Iinclude -Itests -lopenblas -Xcompiler -fopenmp
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $out/gpu.txt
set +e
$b/test_att 2>&1 | tail -5 | tee $out/test.txt
OPENBLAS_NUM_THREADS=1 $b/bench_att "$reps" 2>&1 | tee $out/bench.txt
