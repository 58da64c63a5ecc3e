#!/usr/bin/env bash
# A/B of one environment setting on the threaded `seqflow` binary, on the GPU machine:
#
#   bash bench/ab_binary.sh BUILD_DIR VAR=VALUE [MODEL]
#   bash bench/ab_binary.sh BUILD_DIR "--option value" [MODEL]
#
# The binary's rate as gpu_bench.sh takes it (null sink; 64 and LONG segments, start-up cancels
# out of the difference), AB_PAIRS (5) pairs, each the default then VAR=VALUE, alternating so
# that drift falls on both alike. Push mode (ab_pipeline.sh) runs every stage on one thread,
# whose host work can hide a device-side change; this times what the benchmark table reports.
# Model: a bench_gpu_pipeline preset (default reference). AB_PIPELINE: a pipeline for both sides
# (e.g. "segment ! embed device_rows=13 ! block ! norm"; default the binary's own). VAR=VALUE may
# be several settings in one quoted word ("A=1 B=2"); a word starting with "--" is command-line
# options of `seqflow run` instead (e.g. "--check-finite 0"). AB_MODEL_ARGS: more --make-model options
# (e.g. "--segment 1024 --branches 256:1,512:2,1024:4"); AB_LONG: the long run's segments of
# 8192 tokens. Logs under $OUT (or /tmp/ab_out).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 BUILD_DIR VAR=VALUE [MODEL]" >&2; exit 2; }
B=$1 SETTING=$2 MODEL=${3:-reference}
out=${OUT:-/tmp/ab_out}
D=/tmp/ab_data
N=8192
LONG=${AB_LONG:-1344}
[ "$MODEL" = attention ] && LONG=${AB_LONG:-5376}
mkdir -p "$out" "$D"
MODEL_FILE=$D/$MODEL$(echo "${AB_MODEL_ARGS:-}" | tr -cd 'A-Za-z0-9').st
[ -f "$MODEL_FILE" ] || $B/bench/bench_gpu_pipeline --make-model "$MODEL_FILE" --preset $MODEL --seed 1 ${AB_MODEL_ARGS:-} >/dev/null
for segs in 64 $LONG; do
  [ -f "$D/long$segs.u32" ] || $B/bench/bench_gpu_pipeline --make-tokens "$D/long$segs.u32" --count $((segs * N)) --seed 4 >/dev/null
done
seconds() { # env-setting segments
  local t0 t1
  t0=$(date +%s.%N)
  local vars=$1 args=""
  case "$1" in --*) vars=SEQFLOW_UNUSED=1 args=$1 ;; esac
  # shellcheck disable=SC2086 # both are lists of words
  env $vars $B/seqflow run -d cuda -m "$MODEL_FILE" -i "$D/long$2.u32" -f u32 --sink-format null -q --no-progress \
    $args ${AB_PIPELINE:+"$AB_PIPELINE"} >>"$out/ab_binary_runs.txt" 2>&1 || echo "run failed: $1 $2" >&2
  t1=$(date +%s.%N)
  python3 -c "print($t1 - $t0)"
}
rate() { # env-setting
  local short long
  short=$(seconds "$1" 64)
  long=$(seconds "$1" $LONG)
  python3 -c "print('%.0f' % (($LONG - 64) * $N / ($long - $short)))"
}
ratios=""
for r in $(seq "${AB_PAIRS:-5}"); do
  a=$(rate SEQFLOW_UNUSED=1)
  b=$(rate "$SETTING")
  ratio=$(python3 -c "print('%.4f' % ($b / $a))")
  ratios="$ratios $ratio"
  echo "AB binary $MODEL pair $r: default $a tokens/s, $SETTING $b tokens/s, ratio $ratio"
done | tee -a "$out/ab_binary.txt"
ratios=$(sed -n "s/^AB binary $MODEL pair .* ratio \([0-9.]*\)$/\1/p" "$out/ab_binary.txt" | tail -n "${AB_PAIRS:-5}")
echo "AB binary $MODEL $SETTING / default: median ratio $(python3 -c "import statistics; print('%.4f' % statistics.median([float(x) for x in '''$ratios'''.split()]))")" |
  tee -a "$out/ab_binary.txt"
