#!/bin/sh
# Sequence parallelism on this machine: one long stream through 2 processes (one compute thread
# each, --sequence scan and handoff) against 1 process with 1 compute thread pinned to one core
# (taskset), best of REPEATS; then the bytes the exchange moved per input token.
#   bench/bench_sequence.sh [BIN] [REPEATS]
# BIN: the seqflow binary (default build/seqflow); REPEATS: runs of each, the best kept (3).
# Environment: BENCH_BYTES (input size, default 400000), BENCH_MODEL (model options, default
# the built-in model with 4 layers), BENCH_CHUNKS (segments per rank per round, default 16).
set -eu
bin=${1:-build/seqflow}
repeats=${2:-3}
bytes=${BENCH_BYTES:-400000}
model=${BENCH_MODEL:---layers 4}
chunks=${BENCH_CHUNKS:-16}
tmp=$(mktemp -d /tmp/sf-bench-seq.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
head -c "$bytes" /dev/urandom > "$tmp/in.bin"
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
pin=""
command -v taskset > /dev/null && pin="taskset -c 0"
best1=999999 best2=999999 best3=999999
for i in $(seq "$repeats"); do
    t0=$(now)
    $pin "$bin" run -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/one.npy"
    t1=$(now)
    "$bin" launch -n 2 -- -q -t 1 $model --sequence scan --chunks "$chunks" -i "$tmp/in.bin" -o "$tmp/scan.npy"
    t2=$(now)
    "$bin" launch -n 2 -- -q -t 1 $model --sequence handoff --chunks "$chunks" -i "$tmp/in.bin" -o "$tmp/handoff.npy"
    t3=$(now)
    cmp -s "$tmp/one.npy" "$tmp/handoff.npy" || { echo "hand-off output differs from one process" >&2; exit 1; }
    a=$(elapsed "$t0" "$t1") b=$(elapsed "$t1" "$t2") c=$(elapsed "$t2" "$t3")
    echo "run $i: 1 process on 1 core $a s, 2 processes scan $b s, hand-off $c s"
    best1=$(awk -v x="$a" -v y="$best1" 'BEGIN { print (x < y ? x : y) }')
    best2=$(awk -v x="$b" -v y="$best2" 'BEGIN { print (x < y ? x : y) }')
    best3=$(awk -v x="$c" -v y="$best3" 'BEGIN { print (x < y ? x : y) }')
done
awk -v n="$bytes" -v a="$best1" -v b="$best2" -v c="$best3" -v k="$chunks" 'BEGIN {
    printf "tokens %d, chunks of %d segments: 1 process x 1 core %.0f tokens/s; 2 processes: scan %.0f tokens/s (%.2fx), hand-off %.0f tokens/s (%.2fx)\n",
           n, k, n / a, n / b, a / b, n / c, a / c }'
# what the exchange moved (rank 0's line: its bytes out and in)
"$bin" launch -n 2 -- -t 1 $model --sequence scan --chunks "$chunks" -i "$tmp/in.bin" -o "$tmp/scan.npy" 2>&1 |
    sed -n 's/.*exchange: \([0-9]*\) bytes out, \([0-9]*\) in.*/\1 \2/p' |
    awk -v n="$bytes" '{ o += $1; i += $2 } END { printf "exchange, all ranks: %.0f bytes sent, %.1f bytes per input token\n", o, o / n }'
