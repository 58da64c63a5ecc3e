#!/bin/sh
# Sequence parallelism on this machine: one long stream through 2 processes (one compute thread
# each, --sequence scan and handoff) against 1 process with 1 compute thread pinned to one core
# (taskset), REPEATS repetitions, each running them back to back (interleaved, so that a noisy
# host moves all of a repetition alike); then the bytes the exchange moved per input token.
#   bench/bench_sequence.sh [BIN] [REPEATS]
# BIN: the seqflow binary (default build/seqflow); REPEATS: repetitions (3).
# Prints per repetition the times and the speed-ups against that repetition's 1-process run,
# then the median speed-up and the best of each (the best runs' tokens/s).
# Environment: BENCH_BYTES (input size, default 400000), BENCH_MODEL (model options, default
# the built-in model with 4 layers), BENCH_CHUNKS (segments per rank per round, default 16),
# BENCH_BASELINE (another seqflow binary, e.g. an older build: its scan runs too, in each
# repetition, after this one's), BENCH_CPUS (the two CPUs the runs are held to, default "0 1":
# the 1-process run to the first; on a larger machine name two physical cores).
set -eu
bin=${1:-build/seqflow}
repeats=${2:-3}
bytes=${BENCH_BYTES:-400000}
model=${BENCH_MODEL:---layers 4}
chunks=${BENCH_CHUNKS:-16}
base=${BENCH_BASELINE:-}
tmp=$(mktemp -d /tmp/sf-bench-seq.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
head -c "$bytes" /dev/urandom > "$tmp/in.bin"
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
set -- ${BENCH_CPUS:-0 1}
pin="" pin2=""
command -v taskset > /dev/null && pin="taskset -c $1" pin2="taskset -c $1,$2"
: > "$tmp/runs"
for i in $(seq "$repeats"); do
    t0=$(now)
    $pin "$bin" run -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/one.npy"
    t1=$(now)
    $pin2 "$bin" launch -n 2 -- -q -t 1 $model --sequence scan --chunks "$chunks" -i "$tmp/in.bin" -o "$tmp/scan.npy"
    t2=$(now)
    $pin2 "$bin" launch -n 2 -- -q -t 1 $model --sequence handoff --chunks "$chunks" -i "$tmp/in.bin" -o "$tmp/handoff.npy"
    t3=$(now)
    d=0
    if [ -n "$base" ]; then
        $pin2 "$base" launch -n 2 -- -q -t 1 $model --sequence scan --chunks "$chunks" -i "$tmp/in.bin" -o "$tmp/base.npy"
        d=$(elapsed "$t3" "$(now)")
    fi
    cmp -s "$tmp/one.npy" "$tmp/handoff.npy" || { echo "hand-off output differs from one process" >&2; exit 1; }
    a=$(elapsed "$t0" "$t1") b=$(elapsed "$t1" "$t2") c=$(elapsed "$t2" "$t3")
    echo "$a $b $c $d" >> "$tmp/runs"
    load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')
    awk -v i="$i" -v a="$a" -v b="$b" -v c="$c" -v d="$d" -v load="$load" 'BEGIN {
        printf "run %d: 1 process on 1 core %.3f s; 2 processes: scan %.3f s (%.2fx), hand-off %.3f s (%.2fx)", i, a, b, a / b, c, a / c
        if (d > 0) printf ", baseline scan %.3f s (%.2fx)", d, a / d
        printf "; load %s\n", load }'
done
# medians of the per-repetition speed-ups, and the best run of each
awk -v n="$bytes" -v k="$chunks" '
    function median(v, m,   i, j, t) {
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
        return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
    }
    { r++; s[r] = $1 / $2; h[r] = $1 / $3; if ($4 > 0) g[++ng] = $1 / $4
      if (r == 1 || $1 < b1) b1 = $1; if (r == 1 || $2 < b2) b2 = $2; if (r == 1 || $3 < b3) b3 = $3 }
    END {
        printf "tokens %d, chunks of %d segments, %d repetitions: median speed-up scan %.2fx, hand-off %.2fx", n, k, r, median(s, r), median(h, r)
        if (ng) printf ", baseline scan %.2fx", median(g, ng)
        printf "\nbest: 1 process x 1 core %.0f tokens/s; 2 processes: scan %.0f tokens/s, hand-off %.0f tokens/s\n", n / b1, n / b2, n / b3 }' "$tmp/runs"
# what the exchange moved (rank 0's line: its bytes out and in)
"$bin" launch -n 2 -- -t 1 $model --sequence scan --chunks "$chunks" -i "$tmp/in.bin" -o "$tmp/scan.npy" 2>&1 |
    sed -n 's/.*exchange: \([0-9]*\) bytes out, \([0-9]*\) in.*/\1 \2/p' |
    awk -v n="$bytes" '{ o += $1; i += $2 } END { printf "exchange, all ranks: %.0f bytes sent, %.1f bytes per input token\n", o, o / n }'
