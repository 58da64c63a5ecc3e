#!/usr/bin/env bash
# The products (cuBLAS, cuBLASLt) and their effect on the pipeline, one command (bench/lab/GEMM_NOTES.md). On the GPU machine, repo root:
#   source scripts/gpu-env.sh && bash bench/run_gemm_bench.sh
# Builds build-gemm (only the targets below), runs bench_gemm_shapes (cublasGemmEx against
# cuBLASLt's candidates and the batched Q/K/V call), test_backend_ops (its bf16lt mode forces
# every product through Lt), then times the reference model in push mode (bench_gpu_pipeline,
# 12 segments of 8192, 2 warm-up), alternating SEQFLOW_CUDA_GEMM=gemmex (the old path) with
# the default (Lt plans), GEMM_AB_REPS times each. Logs go to $OUT when set, else /tmp/gemm_out.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gemm_out}
mkdir -p "$out"
B=build-gemm
D=/tmp/gemm_data
mkdir -p "$D"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/cmake.log" 2>&1 ||
  { tail -30 "$out/cmake.log"; exit 1; }
cmake --build $B -j16 --target bench_gemm_shapes test_backend_ops bench_gpu_pipeline >"$out/build.log" 2>&1 ||
  { grep -E "error" "$out/build.log" | head -30; exit 1; }
echo "build ok"
$B/bench/bench_gemm_shapes --reps 30 >"$out/bench_gemm_shapes.txt" 2>&1
echo "bench_gemm_shapes: exit $?"
(cd $B/tests && OPENBLAS_NUM_THREADS=1 ./test_backend_ops) >"$out/test_backend_ops.log" 2>&1
echo "test_backend_ops: exit $? $(grep -E 'passed|failed' "$out/test_backend_ops.log" | tail -1)"
grep -E "FAIL" "$out/test_backend_ops.log" | head -20
# the whole pipeline, cublasGemmEx everywhere against the planned paths, alternating
AB_PAIRS=${GEMM_AB_REPS:-3} bash bench/ab_pipeline.sh $B SEQFLOW_CUDA_GEMM=gemmex reference
echo "== bench_gemm_shapes"
cut -c1-170 "$out/bench_gemm_shapes.txt"
