#!/usr/bin/env bash
# A/B of two builds of the threaded `seqflow` binary on the GPU machine: does a change of code
# (not of a setting) move the rate?
#
#   bash bench/ab_builds.sh BUILD_A BUILD_B [MODEL]
#
# Each side's steady rate: null sink, a 64-segment and a LONG-segment run of 8192-token segments,
# tokens/s from the difference of the runs' own times (start-up cancels out), and the long run's
# own steady rate (`--stats-json` steady_tokens_per_second), whose ratios spread less. AB_PAIRS
# (default 5) pairs, A then B, alternating so that drift falls on both alike; the medians of B/A
# (the two runs' and the in-run rates') are the answer. MODEL: a bench_gpu_pipeline preset
# (default reference), made with BUILD_A's bench_gpu_pipeline, so both read the same file;
# AB_MODEL_ARGS adds --make-model options
# (e.g. "--heads 8": the reference model as 8 heads of 128), and the model is then made with
# BUILD_B's, whose options an older A may lack. AB_RUN_ARGS adds `seqflow run` options to both
# sides (e.g. "--precision fp8"); AB_ENV_A and AB_ENV_B set environment variables for one side
# (e.g. AB_ENV_A=SEQFLOW_CUDA_GATE_UP=0 with the same build twice: a setting's A/B). Logs under
# $OUT (or /tmp/ab_out).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
case "${1:-}" in -h | --help | "") echo "usage: $0 BUILD_A BUILD_B [MODEL]  (AB_PAIRS, AB_LONG, AB_MODEL_ARGS, AB_RUN_ARGS, AB_ENV_A, AB_ENV_B, OUT)"; exit 2 ;; esac
[ $# -ge 2 ] || { echo "usage: $0 BUILD_A BUILD_B [MODEL]" >&2; exit 2; }
A=$1 B=$2 MODEL=${3:-reference}
out=${OUT:-/tmp/ab_out}
D=/tmp/ab_data
N=8192
LONG=${AB_LONG:-1344}
[ "$MODEL" = attention ] && LONG=${AB_LONG:-5376}
mkdir -p "$out" "$D"
extra=${AB_MODEL_ARGS:-}
maker=$A
[ -n "$extra" ] && maker=$B
MODEL_FILE=$D/$MODEL$(echo "$extra" | tr -dc 'a-z0-9').st
# shellcheck disable=SC2086 # the options split into words
[ -f "$MODEL_FILE" ] || "$maker/bench/bench_gpu_pipeline" --make-model "$MODEL_FILE" --preset "$MODEL" --seed 1 $extra >/dev/null
for segs in 64 $LONG; do
  [ -f "$D/long$segs.u32" ] || "$A/bench/bench_gpu_pipeline" --make-tokens "$D/long$segs.u32" --count $((segs * N)) --seed 4 >/dev/null
done
# the run's own time (--stats-json "seconds": the graph, without the process's start-up and the
# model's loading, which spread by as much as a few hundred segments), else the wall time
seconds() { # build segments environment
  local t0 t1
  rm -f "$D/ab_stats.json"
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086 # the options and assignments split into words
  env $3 "$1/seqflow" run -d cuda -m "$MODEL_FILE" -i "$D/long$2.u32" -f u32 --sink-format null -q --no-progress \
    --stats-json "$D/ab_stats.json" ${AB_RUN_ARGS:-} >>"$out/ab_builds_runs.txt" 2>&1 || echo "run failed: $1 $2" >&2
  t1=$(date +%s.%N)
  if [ -s "$D/ab_stats.json" ]; then
    python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["seconds"])' "$D/ab_stats.json"
  else
    python3 -c "print($t1 - $t0)"
  fi
}
# rate BUILD ENVIRONMENT: the two runs' rate; the long run's own steady rate (--stats-json
# steady_tokens_per_second, between a quarter and three quarters of its output: no start-up in
# it, and a spread of about 1% between repetitions against several % for the two runs') goes to
# $D/ab_inrun.txt (0 where the binary does not report it)
rate() {
  local short long
  short=$(seconds "$1" 64 "$2")
  long=$(seconds "$1" "$LONG" "$2")
  python3 -c 'import json, sys
try:
    print("%.0f" % json.load(open(sys.argv[1])).get("steady_tokens_per_second", 0))
except (OSError, ValueError):
    print(0)' "$D/ab_stats.json" >"$D/ab_inrun.txt"
  python3 -c "print('%.0f' % (($LONG - 64) * $N / ($long - $short)))"
}
median() { python3 -c 'import statistics, sys; v = [float(x) for x in sys.argv[1:]]; print("%.4f" % statistics.median(v) if v else "-")' "$@"; }
for r in $(seq "${AB_PAIRS:-5}"); do
  a=$(rate "$A" "${AB_ENV_A:-}")
  ai=$(cat "$D/ab_inrun.txt")
  b=$(rate "$B" "${AB_ENV_B:-}")
  bi=$(cat "$D/ab_inrun.txt")
  echo "AB builds $MODEL$extra pair $r: $A $a tokens/s, $B $b tokens/s, ratio $(python3 -c "print('%.4f' % ($b / $a))")"
  if [ "$ai" != 0 ] && [ "$bi" != 0 ]; then
    echo "AB builds $MODEL$extra in-run pair $r: $A $ai tokens/s, $B $bi tokens/s, ratio $(python3 -c "print('%.4f' % ($bi / $ai))")"
  fi
done | tee -a "$out/ab_builds.txt"
ratios=$(sed -n "s/^AB builds $MODEL$extra pair .* ratio \([0-9.]*\)$/\1/p" "$out/ab_builds.txt" | tail -n "${AB_PAIRS:-5}")
# shellcheck disable=SC2086 # the ratios split into words
echo "AB builds $MODEL$extra $B / $A: median ratio $(median $ratios)" | tee -a "$out/ab_builds.txt"
inrun=$(sed -n "s/^AB builds $MODEL$extra in-run pair .* ratio \([0-9.]*\)$/\1/p" "$out/ab_builds.txt" | tail -n "${AB_PAIRS:-5}")
if [ -n "$inrun" ]; then
  # shellcheck disable=SC2086
  echo "AB builds $MODEL$extra $B / $A: in-run median ratio $(median $inrun)" | tee -a "$out/ab_builds.txt"
fi
