#!/bin/sh
# A worker killed mid-run that rejoins: a 2-process layer pipeline under `seqflow launch
# --restart 1 --checkpoint`, rank 1 killed with kill -9 a few seconds in; launch starts it again,
# it rejoins, both ranks roll back to the newest checkpoint. Prints, per repetition, the time
# from the kill to the driver's roll-back line and to the first new output byte after it, and
# checks the output against one process's.
#   bench/bench_rejoin.sh [BIN] [REPEATS]
# BIN: the seqflow binary (default build/seqflow); REPEATS: default 3. Environment: BENCH_BYTES
# (input size, default 60000), BENCH_MODEL (model options), BENCH_KILL_AFTER (seconds, 3).
set -eu
bin=${1:-build/seqflow}
repeats=${2:-3}
bytes=${BENCH_BYTES:-60000}
model=${BENCH_MODEL:---dim 256 --heads 4 --head-dim 64 --layers 4 --mlp 1024 --segment 256}
kill_after=${BENCH_KILL_AFTER:-3}
tmp=$(mktemp -d /tmp/sf-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
head -c "$bytes" /dev/urandom > "$tmp/in.bin"
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

one="segment ! embed ! block ! norm"
two="segment ! embed ! block layers=0-1 ! block layers=2-3 @1 ! norm @1"
"$bin" run -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/one.raw" "$one"
for i in $(seq "$repeats"); do
    rm -rf "$tmp/ck" "$tmp/k.raw"*
    "$bin" launch -n 2 --restart 1 -- -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/k.raw" --checkpoint "$tmp/ck" \
        --checkpoint-every 4 "$two" 2> "$tmp/err.txt" &
    lp=$!
    sleep "$kill_after"
    victim=""
    for d in /proc/[0-9]*; do
        [ "$(awk '{print $4}' "$d/stat" 2> /dev/null)" = "$lp" ] || continue
        tr '\0' '\n' < "$d/environ" 2> /dev/null | grep -qx "RANK=1" && victim=${d#/proc/}
    done
    [ -n "$victim" ] || { echo "no rank 1 to kill" >&2; exit 1; }
    killed=$(now)
    kill -9 "$victim"
    back="" first="" prev=""
    while kill -0 $lp 2> /dev/null; do
        if [ -z "$back" ] && grep -q "every rank is back" "$tmp/err.txt"; then back=$(now); fi
        if [ -n "$back" ]; then
            s=$(stat -c %s "$tmp/k.raw.partial" 2> /dev/null || echo 0)
            if [ -n "$prev" ] && [ "$s" -gt "$prev" ]; then first=$(now); break; fi
            prev=$s
        fi
        sleep 0.01
    done
    wait $lp || { cat "$tmp/err.txt" >&2; echo "the job failed" >&2; exit 1; }
    cmp -s "$tmp/k.raw" "$tmp/one.raw" || { echo "output after the rejoin differs" >&2; exit 1; }
    echo "run $i: kill -9 of rank 1 -> every rank back $(elapsed "$killed" "${back:-$killed}") s, first new output $(elapsed "$killed" "${first:-$killed}") s ($(grep -m1 'rolling back to checkpoint' "$tmp/err.txt" || echo '?'); output identical)"
done
