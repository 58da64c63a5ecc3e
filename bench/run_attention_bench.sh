#!/usr/bin/env bash
# Builds the product's attention kernels, the lab's variants (bench/lab/attention/), the lab
# bench and tests/test_cuda_attention straight with nvcc (independent of the rest of the tree's
# build state), then runs the product test and checks and times every variant.
# On the GPU machine, repo root: source scripts/gpu-env.sh && bash bench/run_attention_bench.sh [reps]
# (ATT_VARIANTS="6 9" checks and times only those, each in its own process).
# Logs go to $OUT when set (the device tool), else /tmp.
set -euo pipefail
reps=${1:-50}
out=${OUT:-/tmp}
b=/tmp/attbuild
mkdir -p "$b"
flags="-O3 -arch=sm_90 -I. -Iinclude"
# wgmma and setmaxnreg need the sm_90a target, and only the -gencode form of it (nvcc accepts sm_90a only that way)
flags90a="-O3 -gencode=arch=compute_90a,code=sm_90a -I. -Iinclude"
# the product: kernels/cuda/attention*.cu (attention_wgmma.cu for sm_90a)
product=""
for f in attention attention_convert attention_staged attention_f32 cuda_device; do
  nvcc $flags -c -o $b/$f.o kernels/cuda/$f.cu
  product="$product $b/$f.o"
done
nvcc $flags90a -Xptxas -v -c -o $b/wg.o kernels/cuda/attention_wgmma.cu 2> $out/ptxas_product_wgmma.txt
product="$product $b/wg.o"
# the lab
nvcc $flags -c -o $b/lab_fused.o bench/lab/attention/attention_fused_variants.cu
nvcc $flags -Xptxas -v -c -o $b/lab_staged.o bench/lab/attention/attention_staged_variants.cu 2> $out/ptxas_ws.txt
nvcc $flags90a -Xptxas -v -c -o $b/lab_wg.o bench/lab/attention/attention_wgmma_variants.cu 2> $out/ptxas_wgmma.txt
nvcc $flags90a -Xptxas -v -c -o $b/lab_wgws.o bench/lab/attention/attention_wgmma_warpspec.cu 2>> $out/ptxas_wgmma.txt
lab="$b/lab_fused.o $b/lab_staged.o $b/lab_wg.o $b/lab_wgws.o"
nvcc $flags -c -o $b/bench.o bench/lab/bench_attention_variants.cu
nvcc $flags90a -o $b/wgmma_probe bench/wgmma_probe.cu
cpu="kernels/cpu/*.c core/error.c"
nvcc -arch=sm_90 -o $b/bench_att $b/bench.o $lab $product $cpu -I. -Iinclude -lopenblas -Xcompiler -fopenmp
gcc -O2 -DSEQFLOW_HAVE_CUDA=1 -I. -Iinclude -Itests -I/usr/local/cuda/include -c -o $b/t.o tests/test_cuda_attention.c
nvcc -o $b/test_att $b/t.o tests/support/check.c core/process_stats.c $product $cpu -I. -Iinclude -Itests \
  -lopenblas -Xcompiler -fopenmp
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $out/gpu.txt
grep -E "registers|spill|C75" $out/ptxas_product_wgmma.txt $out/ptxas_wgmma.txt || true
if command -v cuobjdump > /dev/null; then
  echo "HGMMA in the product's attention_wgmma SASS: $(cuobjdump -sass $b/wg.o | grep -c HGMMA)," \
       "the lab's: $(cuobjdump -sass $b/lab_wg.o | grep -c HGMMA), warp-specialized: $(cuobjdump -sass $b/lab_wgws.o | grep -c HGMMA)"
  # per kernel of the lab's wgmma variants: instructions, MUFU (exp2: one a element, or a pair
  # with ex2.bf16x2), FMUL (O rescale), HGMMA; appended to the ptxas report
  cuobjdump -sass $b/lab_wg.o | awk '/Function :/ {f=$3} /\/\*[0-9a-f]+\*\// {n[f]++}
    /MUFU/ {m[f]++} /FMUL/ {u[f]++} /HGMMA/ {g[f]++}
    END {for (f in n) printf "sass %s: %d instr, %d MUFU, %d FMUL, %d HGMMA\n", f, n[f], m[f], u[f], g[f]}' \
    | sort | tee -a $out/ptxas_wgmma.txt | cut -c1-60,150- || true
fi
set +e
$b/wgmma_probe 2>&1 | tee $out/probe.txt
# line-buffered, so that a kernel fault still shows which path it hit
stdbuf -oL $b/test_att 2>&1 | tee $out/test_full.txt | grep -E "FAIL|passed|skipped" | head -20 | tee $out/test.txt
if [ -n "${ATT_VARIANTS:-}" ]; then
  # one process a variant (ATT_VARIANTS="6 9 12"): a fault in one cannot hide the others' numbers
  for var in $ATT_VARIANTS; do
    OPENBLAS_NUM_THREADS=1 stdbuf -oL $b/bench_att "$reps" "$var" 2>&1 | tee -a $out/bench.txt
  done
else
  OPENBLAS_NUM_THREADS=1 stdbuf -oL $b/bench_att "$reps" 2>&1 | tee $out/bench.txt
fi
