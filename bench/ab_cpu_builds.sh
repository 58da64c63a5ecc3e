#!/bin/sh
# A/B of two CPU builds of `seqflow` on this machine: the same input through each, one compute
# thread pinned to core 0, PAIRS pairs alternated (A then B) so that a shared machine's drift
# falls on both alike; prints each pair's seconds and the median of B/A (the rate of B against
# A is its inverse).
#   bench/ab_cpu_builds.sh BIN_A BIN_B [PAIRS]
# Environment: AB_BYTES (input bytes, default 60000), AB_MODEL (model options, default the
# built-in model with 4 layers), AB_CLOCK (wall: elapsed seconds, the default; cpu: the run's
# user + system seconds, which time spent waiting for a core shared with other jobs leaves out).
set -eu
[ "${1:-}" = --help ] && { sed -n '2,9{s/^# \{0,1\}//p}' "$0"; exit 0; }
a=${1:?BIN_A} b=${2:?BIN_B} pairs=${3:-5}
bytes=${AB_BYTES:-60000}
model=${AB_MODEL:---layers 4}
clock=${AB_CLOCK:-wall}
case $clock in wall | cpu) ;; *) echo "AB_CLOCK must be wall or cpu, not '$clock'" >&2; exit 2 ;; esac
tmp=$(mktemp -d /tmp/sf-ab-cpu.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
head -c "$bytes" /dev/urandom > "$tmp/in.bin"
pin=""
command -v taskset > /dev/null && pin="taskset -c 0"
time_of() {
    if [ "$clock" = cpu ]; then
        /usr/bin/time -f "%U %S" -o "$tmp/time" $pin "$1" run -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/out.npy"
        awk '{ printf "%.3f", $1 + $2 }' "$tmp/time"
        return
    fi
    t0=$(date +%s.%N)
    $pin "$1" run -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/out.npy"
    t1=$(date +%s.%N)
    awk -v x="$t0" -v y="$t1" 'BEGIN { printf "%.3f", y - x }'
}
"$a" run -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/a.npy"
"$b" run -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/b.npy"
cmp -s "$tmp/a.npy" "$tmp/b.npy" && same="identical" || same="different"
ratios=""
i=0
while [ $i -lt "$pairs" ]; do
    ta=$(time_of "$a") tb=$(time_of "$b")
    echo "pair $((i + 1)): A $ta s, B $tb s ($clock)"
    ratios="$ratios $(awk -v x="$ta" -v y="$tb" 'BEGIN { printf "%.4f", y / x }')"
    i=$((i + 1))
done
echo "$ratios" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk -v s="$same" -v n="$bytes" '{ r[NR] = $1 }
    END { m = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
          printf "%d tokens; median B/A time %.3f (B runs at %.3fx A'"'"'s rate), pairs from %.3f to %.3f; outputs %s\n", n, m, 1 / m, r[1], r[NR], s }'
