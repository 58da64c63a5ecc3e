#!/usr/bin/env bash
# Two GPUs of one host, on the GPU machine, in the project root, after `source scripts/gpu-env.sh`:
#   bash scripts/gpu-two.sh
# 1. scripts/gpu-heads.sh: the build, the head-parallel tests (two NCCL ranks against one, a
#    rank that fails, resume) and bench_heads (tokens/s, all-reduce time a layer, memory per GPU);
# 2. the reference model through the binary, steady rate (64 against LONG segments of 8192
#    tokens, null sink): one GPU (`seqflow run -d cuda`), head parallelism over both
#    (`--gpus 2`), and a layer pipeline of two processes over ZeroMQ, one GPU each
#    (`seqflow launch -n 2`, layers 0-1 on rank 0, 2-3 on rank 1);
# 3. the layer pipeline's output against one GPU's, byte for byte, on 4 segments.
# TWO_SKIP_HEADS=1 skips step 1; TWO_MODES (default "one heads layers") picks step 2's runs
# (headsb: --gpus 2 with the block stage TWO_BLOCK, default "block overlap=1"; headsr: --gpus 2
# with the CUDA setting normed_sums=0, whole sums on every rank; base: --gpus 2 with the binary
# TWO_BASE_BIN, another tree's build, for a comparison in the same call; one8 and heads8: one
# and heads in precision fp8; onen and headsn: one and heads with the process bound to the CPUs
# of GPU 0's NUMA node, or to TWO_CPUS (a taskset list); the layer pipeline's are long: its rate
# is the link's); TWO_REPS (default 2) repetitions of step 2. Each line gives the rate from the
# two runs' times and the long run's own steady rate (--stats-json steady_tokens_per_second:
# between a quarter and three quarters of its output, no second process's start-up in it); then
# each mode's median in-run rate and each repetition's in-run ratio against one GPU and the base.
# Logs go to $OUT (else build-gpu/two); a summary to
# $OUT/two-summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
logs=${OUT:-build-gpu/two}
mkdir -p "$logs"
summary=$logs/two-summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off
if [ -z "${TWO_SKIP_HEADS:-}" ]; then
  OUT=$logs bash scripts/gpu-heads.sh >"$logs/gpu-heads.txt" 2>&1
  note "gpu-heads.sh: exit $?"
  cat "$logs/heads-summary.txt" >>"$summary" 2>/dev/null
else # TWO_SKIP_HEADS=1: only the binary's runs below (configure and build here)
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSEQFLOW_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DSEQFLOW_BUILD_TESTS=OFF -DSEQFLOW_BUILD_BENCH=ON >"$logs/configure.log" 2>&1 || { tail -20 "$logs/configure.log"; exit 1; }
fi
cmake --build build-gpu -j16 --target seqflow bench_gpu_pipeline >"$logs/build-two.log" 2>&1 \
  || { grep -E "error|Error" "$logs/build-two.log" | head -20; exit 1; }
bin=build-gpu/seqflow
D=/tmp/gpu_two
LONG=${LONG:-448}
mkdir -p "$D"
build-gpu/bench/bench_gpu_pipeline --make-model "$D/ref.st" --preset reference --seed 1 >/dev/null
for segs in 4 64 "$LONG"; do
  build-gpu/bench/bench_gpu_pipeline --make-tokens "$D/t$segs.u32" --count $((segs * 8192)) --seed 4 >/dev/null
done
layers="segment ! embed ! block layers=0-1 ! block layers=2-3 @1 ! norm"
# the CPUs next to GPU 0 (its PCI device's local_cpulist), for onen and headsn
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 0 2>/dev/null | tr 'A-F' 'a-f' | sed 's/^0000//')
cpus=${TWO_CPUS:-$(cat "/sys/bus/pci/devices/$bus/local_cpulist" 2>/dev/null)}
case " ${TWO_MODES:-} " in
  *" onen "* | *" headsn "*)
    note "GPU 0 at $bus, bound runs on CPUs ${cpus:-?} (of $(nproc))"
    nvidia-smi topo -m >>"$summary" 2>&1 ;;
esac

# seconds MODE SEGMENTS [OUT]: the time of one run of the binary: its graph's run as the binary
# reports it (--stats-json "seconds": without the process's start-up and the model's loading,
# whose spread between runs is as large as a few hundred segments), else the wall time (the
# layer pipeline, whose driver runs no graph of its own)
seconds() {
  local mode=$1 segs=$2 out=${3:-} t0 t1 rc
  local sink=(--sink-format null)
  [ -n "$out" ] && sink=(-o "$out")
  rm -f "$D/stats.json"
  [ "$mode" != layers ] && sink+=(--stats-json "$D/stats.json")
  t0=$(date +%s.%N)
  case $mode in
    one) timeout 120 "$bin" run -q --no-progress -d cuda -m "$D/ref.st" -i "$D/t$segs.u32" -f u32 "${sink[@]}" ;;
    heads) timeout 120 "$bin" run -q --no-progress -d cuda --gpus 2 -m "$D/ref.st" -i "$D/t$segs.u32" -f u32 "${sink[@]}" ;;
    one8) timeout 120 "$bin" run -q --no-progress -d cuda --precision fp8 -m "$D/ref.st" -i "$D/t$segs.u32" -f u32 \
            "${sink[@]}" ;;
    heads8) timeout 120 "$bin" run -q --no-progress -d cuda --gpus 2 --precision fp8 -m "$D/ref.st" -i "$D/t$segs.u32" \
              -f u32 "${sink[@]}" ;;
    headsr) SEQFLOW_CUDA_NORMED_SUMS=0 timeout 120 "$bin" run -q --no-progress -d cuda --gpus 2 -m "$D/ref.st" \
              -i "$D/t$segs.u32" -f u32 "${sink[@]}" ;;
    onen) timeout 120 taskset -c "$cpus" "$bin" run -q --no-progress -d cuda -m "$D/ref.st" -i "$D/t$segs.u32" -f u32 \
            "${sink[@]}" ;;
    headsn) timeout 120 taskset -c "$cpus" "$bin" run -q --no-progress -d cuda --gpus 2 -m "$D/ref.st" \
              -i "$D/t$segs.u32" -f u32 "${sink[@]}" ;;
    base) timeout 120 "${TWO_BASE_BIN:?base: set TWO_BASE_BIN}" run -q --no-progress -d cuda --gpus 2 -m "$D/ref.st" \
            -i "$D/t$segs.u32" -f u32 "${sink[@]}" ;;
    headsb) timeout 120 "$bin" run -q --no-progress -d cuda --gpus 2 -m "$D/ref.st" -i "$D/t$segs.u32" -f u32 "${sink[@]}" \
              "segment ! embed ! ${TWO_BLOCK:-block overlap=1} ! norm" ;;
    layers) timeout 120 "$bin" launch -n 2 -- -q --no-progress -d cuda -m "$D/ref.st" -i "$D/t$segs.u32" -f u32 \
              "${sink[@]}" "$layers" ;;
  esac >>"$logs/runs.txt" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  [ $rc -ne 0 ] && note "run failed: $mode $segs (exit $rc)"
  rm -f "$D/steady.txt"
  if [ -s "$D/stats.json" ]; then
    python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); print("%.4f" % s["seconds"], end="")
open(sys.argv[2], "w").write("%.0f" % s.get("steady_tokens_per_second", 0))' "$D/stats.json" "$D/steady.txt"
  else
    echo "$t0 $t1" | awk '{printf "%.4f", $2 - $1}'
  fi
}
for rep in $(seq "${TWO_REPS:-2}"); do
  for mode in ${TWO_MODES:-one heads layers}; do
    short=$(seconds $mode 64)
    long=$(seconds $mode "$LONG")
    inrun=$(cat "$D/steady.txt" 2>/dev/null || echo "-")
    rate=$(awk -v s="$short" -v l="$long" -v n=$(((LONG - 64) * 8192)) 'BEGIN { printf "%.0f", n / (l - s) }')
    note "steady rate $mode rep $rep: $rate tokens/s (64 segments ${short} s, $LONG segments ${long} s; in the long run: $inrun)"
  done
done
# medians of the in-run rates a mode, and each repetition's ratio against one GPU and the base
python3 - "$summary" <<'PY' | while IFS= read -r line; do note "$line"; done
import re, statistics, sys
rates = {}
for line in open(sys.argv[1]):
    m = re.match(r"steady rate (\S+) rep (\d+): .*in the long run: (\d+)\)", line)
    if m and int(m.group(3)) > 0:
        rates.setdefault(m.group(1), {})[int(m.group(2))] = int(m.group(3))
for mode, by_rep in rates.items():
    print("in-run rate %s: median %d tokens/s over %d reps" % (mode, statistics.median(by_rep.values()), len(by_rep)))
for num in rates:
    for den in ("one", "base"):
        if num == den or den not in rates:
            continue
        ratios = [rates[num][r] / rates[den][r] for r in sorted(rates[num]) if r in rates[den]]
        if ratios:
            print("in-run %s / %s: %s (median %.3f)" % (num, den, " ".join("%.3f" % x for x in ratios),
                                                      statistics.median(ratios)))
PY
seconds one 4 "$D/one.f32" >/dev/null
seconds layers 4 "$D/layers.f32" >/dev/null
if [ ! -s "$D/layers.f32" ]; then
  note "layer pipeline over 2 GPUs: no output"
elif cmp -s "$D/one.f32" "$D/layers.f32"; then
  note "layer pipeline over 2 GPUs: output byte-identical to one GPU ($(stat -c %s "$D/one.f32") bytes)"
else
  note "layer pipeline over 2 GPUs: output DIFFERS from one GPU"
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader >>"$summary" 2>&1
tail -5 "$logs/runs.txt" >>"$summary"
