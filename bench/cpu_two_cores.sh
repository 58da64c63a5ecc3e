#!/bin/sh
# The two-process CPU benchmarks (bench/bench_layer_pipeline.sh, bench/bench_sequence.sh) held
# to two physical cores of a larger machine, where nothing else shares them: the "2 processes
# on 2 cores against 1 process on 1 core" figures without a shared VM's drift.
#   bench/cpu_two_cores.sh [BIN] [REPEATS]
# BIN: the seqflow binary (default build/seqflow); REPEATS: repetitions of each (5).
# Picks two CPUs of one socket that are not hyper-thread siblings of each other (and not CPU 0,
# where the kernel's own work tends to land), prints the machine, then each benchmark's lines.
# Environment: CPU_PAIR ("A B") to name the two CPUs instead; LAYER_BYTES and SEQUENCE_BYTES
# (the input of each benchmark: 100000 and 400000 tokens).
set -eu
[ "${1:-}" = --help ] && { sed -n '2,11{s/^# \{0,1\}//p}' "$0"; exit 0; }
bin=${1:-build/seqflow}
repeats=${2:-5}
here=$(dirname "$0")
topo=/sys/devices/system/cpu
pick() {
    a=""
    for c in $(seq 1 "$(($(nproc) - 1))"); do
        [ -r "$topo/cpu$c/topology/thread_siblings_list" ] || continue
        if [ -z "$a" ]; then a=$c; continue; fi
        same_pkg=$([ "$(cat "$topo/cpu$c/topology/physical_package_id")" = \
                     "$(cat "$topo/cpu$a/topology/physical_package_id")" ] && echo 1 || echo 0)
        sib=$(cat "$topo/cpu$a/topology/thread_siblings_list")
        case ",$(echo "$sib" | tr '-' ','),"
        in *",$c,"*) continue ;; esac
        [ "$same_pkg" = 1 ] && { echo "$a $c"; return; }
    done
    echo "0 1"
}
pair=${CPU_PAIR:-$(pick)}
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "CPUs used: $pair (siblings of the first: $(cat "$topo/cpu${pair%% *}/topology/thread_siblings_list" 2>/dev/null || echo '?'))"
echo "date: $(date -u +%FT%TZ); commit: $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "== layer pipeline (bench/bench_layer_pipeline.sh $bin $repeats)"
BENCH_CPUS=$pair BENCH_BYTES=${LAYER_BYTES:-100000} sh "$here/bench_layer_pipeline.sh" "$bin" "$repeats"
echo "== sequence parallelism (bench/bench_sequence.sh $bin $repeats)"
BENCH_CPUS=$pair BENCH_BYTES=${SEQUENCE_BYTES:-400000} sh "$here/bench_sequence.sh" "$bin" "$repeats"
