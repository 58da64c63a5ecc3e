#!/usr/bin/env bash
# The timeline of the threaded `seqflow` binary on the reference model, on the GPU machine
# (after source scripts/gpu-env.sh, with BUILD_DIR's seqflow, bench_gpu_pipeline and
# sf_kernel_trace built): bench/kernel_trace.c (CUPTI) records every kernel of a run of
# TIMELINE_SEGMENTS (200) segments, and bench/timeline_summary.py reports the device's idle
# gaps, what ran beside what, the kernels' times and the host-device copies a segment. Extra
# arguments are VAR=VALUE settings for the run; TIMELINE_PIPELINE a pipeline instead of the
# binary's own; TIMELINE_MODEL a bench_gpu_pipeline preset instead of reference (e.g. attention);
# TIMELINE_ARGS more arguments for `seqflow run` (e.g. "--gpus 2": then one summary a device,
# TIMELINE_PER naming a kernel that runs once a segment; a device without it counts the
# segments by the others').
#
#   bash bench/gpu_timeline.sh BUILD_DIR [VAR=VALUE ...]
#
# Traces and summaries under $OUT (or /tmp/timeline).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:?usage: $0 BUILD_DIR [VAR=VALUE ...]}
shift
out=${OUT:-/tmp/timeline}
mkdir -p "$out"
lib=$(realpath "$B/bench/libsf_kernel_trace.so" 2>/dev/null) || { echo "gpu_timeline: no $B/bench/libsf_kernel_trace.so"; exit 1; }
D=/tmp/ab_data
N=8192 SEGS=${TIMELINE_SEGMENTS:-200} MODEL=${TIMELINE_MODEL:-reference}
mkdir -p "$D"
[ -f "$D/$MODEL.st" ] || $B/bench/bench_gpu_pipeline --make-model "$D/$MODEL.st" --preset $MODEL --seed 1 >/dev/null
[ -f "$D/long$SEGS.u32" ] || $B/bench/bench_gpu_pipeline --make-tokens "$D/long$SEGS.u32" --count $((SEGS * N)) --seed 4 >/dev/null
tag=$(echo "$MODEL ${TIMELINE_ARGS:-} $*" | tr ' =' '_-' | tr -cd 'A-Za-z0-9_.-')
env "${@:-SEQFLOW_UNUSED=1}" SEQFLOW_TRACE_OUT="/tmp/trace_$tag.csv" CUDA_INJECTION64_PATH="$lib" \
  $B/seqflow run -d cuda ${TIMELINE_ARGS:-} -m "$D/$MODEL.st" -i "$D/long$SEGS.u32" -f u32 --sink-format null -q --no-progress \
  ${TIMELINE_PIPELINE:+"$TIMELINE_PIPELINE"} >"$out/run_$tag.txt" 2>&1 || { tail -5 "$out/run_$tag.txt"; exit 1; }
devices=$(awk -F, 'NR > 1 && $5 != "" { print $5 }' "/tmp/trace_$tag.csv" | sort -u)
for dev in $devices; do
  [ "$(echo "$devices" | wc -w)" -gt 1 ] && echo "== device $dev"
  python3 bench/timeline_summary.py "/tmp/trace_$tag.csv" --device "$dev" ${TIMELINE_PER:+--per "$TIMELINE_PER"}
done >"$out/timeline_$tag.txt"
cat "$out/timeline_$tag.txt"
