#!/bin/sh
# The CPU data behind the plots (bench/plot.py): seqflow (`seqflow run`, float32, all cores)
# and the PyTorch peer (bench/peers/seqflow_torch.py on the CPU, float32) on the built-in
# model's shape (D=128 H=4 d=32, causal, delta memory, 16 global tokens, 2 layers, SwiGLU 256)
# at segment lengths N = 256 .. 2048, branches N/4:1,N/2:2,N:4: seqflow's steady rate from runs
# of 64 and 16 segments (start-up left out), the peer's over 16 segments after 2 of warm-up.
#   bench/plot_data_cpu.sh BUILD PYTHON [OUT_CSV]
# BUILD: a build folder with seqflow and bench/bench_gpu_pipeline (SEQFLOW_BUILD_BENCH=ON, CUDA
# not needed); PYTHON: a python3 with torch and numpy (e.g. the test venv,
# build/python-venv/bin/python); OUT_CSV default bench/plots/cpu_n.csv.
set -eu
[ "${1:-}" = --help ] && { sed -n '2,9{s/^# \{0,1\}//p}' "$0"; exit 0; }
build=${1:?BUILD}
py=${2:?PYTHON}
out=${3:-bench/plots/cpu_n.csv}
tmp=$(mktemp -d /tmp/sf-plot-cpu.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "n,seqflow_tokens_per_s,pytorch_tokens_per_s" > "$out"
for N in 256 512 1024 2048; do
    M=$tmp/m$N.safetensors T=$tmp/t$N.u32
    "$build/bench/bench_gpu_pipeline" --make-model "$M" --preset small --segment "$N" \
        --branches "$((N / 4)):1,$((N / 2)):2,$N:4" --seed 1 > /dev/null
    "$build/bench/bench_gpu_pipeline" --make-tokens "$T" --count $((16 * N)) --seed 3 > /dev/null
    "$build/bench/bench_gpu_pipeline" --make-tokens "$T.long" --count $((64 * N)) --seed 3 > /dev/null
    # the steady rate, start-up (model, threads) left out: a run of 64 segments less one of 16
    t0=$(date +%s.%N)
    "$build/seqflow" run -q -m "$M" -i "$T" -f u32 --sink-format null
    t1=$(date +%s.%N)
    "$build/seqflow" run -q -m "$M" -i "$T.long" -f u32 --sink-format null
    t2=$(date +%s.%N)
    sf=$(awk -v a="$t0" -v b="$t1" -v c="$t2" -v n=$((48 * N)) 'BEGIN { printf "%.0f", n / ((c - b) - (b - a)) }')
    "$py" bench/peers/seqflow_torch.py run --model "$M" --tokens "$T" --device cpu --precision f32 \
        --warmup-segments 2 --json "$tmp/pt$N.json" > "$tmp/pt$N.log" 2>&1 || { cat "$tmp/pt$N.log" >&2; exit 1; }
    pt=$("$py" -c "import json; print('%.0f' % json.load(open('$tmp/pt$N.json'))['tokens_per_s'])")
    echo "$N,$sf,$pt" | tee -a "$out"
done
