#!/usr/bin/env bash
# `seqflow serve` on the GPU against the same streams in one `seqflow run -d cuda`, on the GPU
# machine (project root, after `source scripts/gpu-env.sh`, with BUILD_DIR's seqflow,
# bench_serve and bench_gpu_pipeline built):
#
#   bash bench/gpu_serve.sh BUILD_DIR
#
# The reference model (bench_gpu_pipeline --make-model --preset reference: D=1024, 16 heads,
# N=8192, 4 layers), bf16, float32 rows out. Points: 1 stream x 64 segments, 64 x 8, 1024 x 2;
# latency at 50% load with 4 segments a stream (1 for 1024 streams, whose 4 would take minutes).
# Each point's output and the summary go to $OUT (or /tmp/gpu_serve).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:?usage: $0 BUILD_DIR}
out=${OUT:-/tmp/gpu_serve}
mkdir -p "$out"
D=/tmp/gpu_serve_data
mkdir -p "$D"
[ -f "$D/ref.st" ] || "$B/bench/bench_gpu_pipeline" --make-model "$D/ref.st" --preset reference --seed 1 >/dev/null
summary=$out/serve-summary.txt
: >"$summary"
for point in "1 64 4" "64 8 4" "1024 2 1"; do
  set -- $point
  log=$out/serve_$1x$2.txt
  timeout 300 "$B/bench/bench_serve" --seqflow "$B/seqflow" --streams "$1" --segments "$2" --segment 8192 \
    --latency-segments "$3" -- -d cuda -m "$D/ref.st" >"$log" 2>&1
  echo "$1 streams x $2 segments: exit $?" | tee -a "$summary"
  grep -E "^serve:|^latency|^run:|^RESULT" "$log" | tee -a "$summary"
done
