#!/usr/bin/env bash
# What a kernel change needs checked and timed, one command on the GPU machine (after `source scripts/gpu-env.sh`):
# the whole test suite with the GPU tests (scripts/gpu-test.sh, Release, build-gpu), the memory
# kernels' checks and times (bench_cuda_compressive_memory, MEM_REPS runs), then an A/B of each setting in
# AB_SETTINGS ("VAR=VALUE ..."; each against the default, bench/ab_pipeline.sh, AB_PAIRS pairs,
# models AB_MODELS), SUITE_NCU=1 the device time per kernel, SUITE_NCU_KERNELS="regex" Nsight
# Compute's sections for those kernels, SUITE_ATT_SETTINGS the attention op alone under each
# setting. SUITE_TESTS=0 only builds what the benches need.
# Logs under $OUT (the device tool's folder) or /tmp/gpu_suite.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_suite}
mkdir -p "$out"
if [ "${SUITE_TESTS:-1}" = 1 ]; then
  bash scripts/gpu-test.sh > "$out/gpu-test.txt" 2>&1
  echo "gpu-test: exit $?"
  grep -E "tests passed|tests failed|^test_|FAIL" "$out/gpu-test.txt" | grep -v "rel err .* ok" | tail -20
else
  { cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSEQFLOW_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 &&
    cmake --build build-gpu -j16 --target bench_gpu_pipeline bench_cuda_compressive_memory bench_attention_variants; } > "$out/build.txt" 2>&1 ||
    { tail -20 "$out/build.txt"; exit 1; }
fi
if [ "${MEM_REPS:-30}" != 0 ]; then
  build-gpu/bench/bench_cuda_compressive_memory "${MEM_REPS:-30}" > "$out/bench_memory.txt" 2>&1
  echo "bench_cuda_compressive_memory: exit $?"
  grep -E "FAIL|all checks|^\| (memory_mix|update).*bf16 \| (fma16|mma16|dflt)" "$out/bench_memory.txt"
fi
for setting in ${AB_SETTINGS:-}; do
  AB_PAIRS=${AB_PAIRS:-4} bash bench/ab_pipeline.sh build-gpu "$setting" ${AB_MODELS:-reference} | grep -E "median|failed"
done
# SUITE_NCU=1: device time per kernel of the reference model (ncu, the GPU's own clocks; 6
# segments, the first 2 left out), as bench/gpu_rate.sh's RATE_NCU
if [ "${SUITE_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  D=/tmp/ab_data
  mkdir -p "$D"
  build-gpu/bench/bench_gpu_pipeline --make-tokens "$D/t6.u32" --count $((6 * 8192)) --seed 3 >/dev/null
  [ -f "$D/reference.st" ] || build-gpu/bench/bench_gpu_pipeline --make-model "$D/reference.st" --preset reference --seed 1 >/dev/null
  ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$out/ncu.csv" \
    build-gpu/bench/bench_gpu_pipeline --model "$D/reference.st" --tokens "$D/t6.u32" --device cuda --precision bf16 \
    --warmup-segments 2 >/dev/null 2>"$out/ncu.err" || tail -5 "$out/ncu.err"
  python3 bench/ncu_summary.py "$out/ncu.csv" 6 2 | tee "$out/ncu_summary.txt"
fi
# SUITE_NCU_KERNELS="regex": Nsight Compute sections (throughput, memory, stalls, occupancy) of the
# first two launches of the kernels the regex names, in the reference pipeline
if [ -n "${SUITE_NCU_KERNELS:-}" ] && command -v ncu >/dev/null; then
  D=/tmp/ab_data
  mkdir -p "$D"
  build-gpu/bench/bench_gpu_pipeline --make-tokens "$D/t6.u32" --count $((6 * 8192)) --seed 3 >/dev/null
  [ -f "$D/reference.st" ] || build-gpu/bench/bench_gpu_pipeline --make-model "$D/reference.st" --preset reference --seed 1 >/dev/null
  ncu --clock-control none -k "regex:$SUITE_NCU_KERNELS" -c "${SUITE_NCU_COUNT:-4}" --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
    build-gpu/bench/bench_gpu_pipeline --model "$D/reference.st" --tokens "$D/t6.u32" --device cuda --precision bf16 \
    --warmup-segments 2 > "$out/ncu_sections.txt" 2>&1 || tail -5 "$out/ncu_sections.txt"
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit|L1/TEX Hit|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Registers Per|Stall|Block Limit" \
    "$out/ncu_sections.txt" | head -80
fi
# SUITE_ATT_SETTINGS="VAR=VALUE ...": the attention op alone (bench_attention_variants, variant 36,
# 30 runs, checks first) with the default and then with each setting
if [ -n "${SUITE_ATT_SETTINGS+x}" ]; then
  for setting in "" ${SUITE_ATT_SETTINGS}; do
    echo "== bench_attention_variants 30 36 ${setting:-(default)}"
    env ${setting:-SEQFLOW_UNUSED=1} build-gpu/bench/bench_attention_variants 30 36 > "$out/att_${setting:-default}.txt" 2>&1
    echo "exit $?"; grep -E "FAIL|in place" "$out/att_${setting:-default}.txt" | tail -8
  done
fi
