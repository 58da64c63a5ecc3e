#!/usr/bin/env bash
# The whole-pipeline bench (push mode) with host rows (SEQFLOW_DEVICE_ROWS=0, the old
# data path) and device rows (the default), each timed plain and then once more with the
# per-stage (SEQFLOW_PROFILE=1) and per-op (SEQFLOW_CUDA_PROFILE=1) profiles, and the outputs of
# the two paths compared. Needs build-gpu (scripts/gpu-test.sh builds it). Log: $OUT/gpuperf.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpuperf_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpuperf.log") 2>&1
B=build-gpu/bench/bench_gpu_pipeline
D=/tmp/gpuperf_data
SEGMENTS=${GPUPERF_SEGMENTS:-12}
GEMM=${GPUPERF_GEMM_TFLOPS:-781.3}
mkdir -p "$D"
$B --make-model "$D/reference.st" --preset reference --seed 1
$B --make-model "$D/attention.st" --preset attention --seed 1
$B --make-tokens "$D/tokens.u32" --count $((SEGMENTS * 8192)) --seed 3
for model in reference attention; do
  for rows in 0 1; do
    echo "== $model, SEQFLOW_DEVICE_ROWS=$rows"
    SEQFLOW_DEVICE_ROWS=$rows $B --model "$D/$model.st" --tokens "$D/tokens.u32" --precision bf16 --warmup-segments 2 \
      --gemm-tflops "$GEMM" --out "$D/${model}_$rows.npy"
    echo "-- profiled (per-op waits: the totals are not the plain run's time)"
    SEQFLOW_DEVICE_ROWS=$rows SEQFLOW_PROFILE=1 SEQFLOW_CUDA_PROFILE=1 $B --model "$D/$model.st" --tokens "$D/tokens.u32" \
      --precision bf16 --warmup-segments 2
  done
  python3 -c "
import numpy as np
a = np.load('$D/${model}_1.npy'); b = np.load('$D/${model}_0.npy')
print('compare $model device rows vs host rows: rel err %.3e, finite %s' % (np.linalg.norm(a - b) / np.linalg.norm(b), np.isfinite(a).all()))"
  rm -f "$D/${model}"_*.npy
done
