#!/bin/sh
# A layer pipeline over 2 processes against 1 process with 1 compute thread, on this machine;
# then how long a job takes to fail after a worker is killed, and how long a resumed run takes
# to write its first new output. Each repetition also runs two independent 1-process runs at
# once, one pinned to each of the two cores: the most two processes can gain on this machine
# ("ceiling": twice one run's time over the pair's), whatever seqflow does.
#   bench/bench_layer_pipeline.sh [BIN] [REPEATS]
# BIN: the seqflow binary (default build/seqflow); REPEATS: runs of each, the best kept (3).
# Environment: BENCH_BYTES (input size, default 200000), BENCH_MODEL (model options),
# BENCH_CPUS (the two CPUs every run is held to, default "0 1"; on a larger machine name two
# physical cores, so that the two processes and their I/O threads get two cores, no more).
set -eu
bin=${1:-build/seqflow}
repeats=${2:-3}
bytes=${BENCH_BYTES:-200000}
model=${BENCH_MODEL:---dim 256 --heads 4 --head-dim 64 --layers 4 --mlp 1024 --segment 256}
tmp=$(mktemp -d /tmp/sf-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
set -- ${BENCH_CPUS:-0 1}
cpu_a=$1 cpu_b=$2
pin1="taskset -c $cpu_a" pin2="taskset -c $cpu_a,$cpu_b"
head -c "$bytes" /dev/urandom > "$tmp/in.bin"
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

one="segment ! embed ! block ! norm"
two="segment ! embed ! block layers=0-1 ! block layers=2-3 @1 ! norm @1"
best1=999999 best2=999999
for i in $(seq "$repeats"); do
    t0=$(now)
    $pin1 "$bin" run -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/one.raw" "$one"
    t1=$(now)
    $pin2 "$bin" launch -n 2 -- -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/two.raw" "$two"
    t2=$(now)
    cmp -s "$tmp/one.raw" "$tmp/two.raw" || { echo "outputs differ" >&2; exit 1; }
    taskset -c "$cpu_a" "$bin" run -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/p0.raw" "$one" &
    p0=$!
    taskset -c "$cpu_b" "$bin" run -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/p1.raw" "$one"
    wait $p0
    t3=$(now)
    a=$(elapsed "$t0" "$t1") b=$(elapsed "$t1" "$t2") c=$(elapsed "$t2" "$t3")
    echo "run $i: 1 process $a s, 2 processes $b s ($(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2fx", a / b }')); two 1-process runs side by side $c s (ceiling $(awk -v a="$a" -v c="$c" 'BEGIN { printf "%.2fx", 2 * a / c }'))"
    best1=$(awk -v x="$a" -v y="$best1" 'BEGIN { print (x < y ? x : y) }')
    best2=$(awk -v x="$b" -v y="$best2" 'BEGIN { print (x < y ? x : y) }')
done
awk -v n="$bytes" -v a="$best1" -v b="$best2" 'BEGIN {
    printf "tokens %d: 1 process x 1 thread %.0f tokens/s, 2 processes (layers 0-1 | 2-3) %.0f tokens/s: %.2fx\n",
           n, n / a, n / b, a / b }'

# a worker killed mid-run: the time to the job's error, then a resume's first new output
rm -rf "$tmp/ck"
"$bin" launch -n 2 -- -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/k.raw" --checkpoint "$tmp/ck" --checkpoint-every 4 \
    "$two" 2> "$tmp/err.txt" &
lp=$!
sleep 3
for d in /proc/[0-9]*; do
    [ "$(awk '{print $4}' "$d/stat" 2> /dev/null)" = "$lp" ] || continue
    tr '\0' '\n' < "$d/environ" 2> /dev/null | grep -qx "RANK=1" && victim=${d#/proc/}
done
killed=$(now)
kill -9 "$victim"
wait $lp || true
failed=$(now)
echo "kill -9 of rank 1 -> job error: $(elapsed "$killed" "$failed") s ($(grep -m1 'stopped answering' "$tmp/err.txt"))"
size=$(stat -c %s "$tmp/k.raw.partial")
started=$(now)
"$bin" launch -n 2 -- -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/k.raw" --checkpoint "$tmp/ck" --checkpoint-every 4 \
    --resume "$two" &
lp=$!
first=""
while kill -0 $lp 2> /dev/null; do
    s=$(stat -c %s "$tmp/k.raw.partial" 2> /dev/null || echo 0)
    if [ -z "$first" ] && [ "$s" -gt "$size" ]; then first=$(now); fi
    sleep 0.01
done
wait $lp
cmp -s "$tmp/k.raw" "$tmp/one.raw" || { echo "resumed output differs" >&2; exit 1; }
echo "resume -> first new output: $(elapsed "$started" "${first:-$(now)}") s (checkpointed output $size bytes; resumed output identical)"
