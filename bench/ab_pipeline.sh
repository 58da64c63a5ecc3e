#!/usr/bin/env bash
# A/B of one environment setting on the push-mode pipeline bench, on the GPU machine:
#
#   bash bench/ab_pipeline.sh BUILD_DIR VAR=VALUE [MODEL...]
#
# For each model (presets of bench_gpu_pipeline; default "reference attention"), AB_PAIRS (4)
# pairs of runs, each pair the default then VAR=VALUE, alternating so that drift over time
# falls on both alike: 12 segments of 8192 tokens, 2 warm-up, bf16. Prints every pair's rates
# and the median ratio (B / A). Push mode spreads far less than the binary (1-2% against ~10%
# a round), which is what a change of a few percent needs. Logs under $OUT (or /tmp/ab_out).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 BUILD_DIR VAR=VALUE [MODEL...]" >&2; exit 2; }
B=$1 SETTING=$2
shift 2
MODELS=${*:-reference attention}
out=${OUT:-/tmp/ab_out}
D=/tmp/ab_data
mkdir -p "$out" "$D"
$B/bench/bench_gpu_pipeline --make-tokens "$D/t12.u32" --count $((12 * 8192)) --seed 3 >/dev/null
for model in $MODELS; do
  [ -f "$D/$model.st" ] || $B/bench/bench_gpu_pipeline --make-model "$D/$model.st" --preset $model --seed 1 >/dev/null
  ratios=""
  for r in $(seq "${AB_PAIRS:-4}"); do
    a=$($B/bench/bench_gpu_pipeline --model "$D/$model.st" --tokens "$D/t12.u32" --device cuda --precision bf16 \
          --warmup-segments 2 2>&1 | tee -a "$out/ab_${model}_default.txt" | sed -n 's/^RESULT tokens_per_s=\([0-9.]*\).*/\1/p')
    b=$(env "$SETTING" $B/bench/bench_gpu_pipeline --model "$D/$model.st" --tokens "$D/t12.u32" --device cuda \
          --precision bf16 --warmup-segments 2 2>&1 | tee -a "$out/ab_${model}_setting.txt" |
        sed -n 's/^RESULT tokens_per_s=\([0-9.]*\).*/\1/p')
    ratio=$(python3 -c "print('%.4f' % ($b / $a))" 2>/dev/null || echo nan)
    ratios="$ratios $ratio"
    echo "AB $model pair $r: default ${a:-failed} tokens/s, $SETTING ${b:-failed} tokens/s, ratio $ratio"
  done
  echo "AB $model $SETTING / default: median ratio $(python3 -c "import statistics; print('%.4f' % statistics.median([float(x) for x in '$ratios'.split()]))")"
done | tee -a "$out/ab.txt"
