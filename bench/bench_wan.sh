#!/bin/sh
# A layer pipeline over an emulated WAN (tests/wan_env.sh: two network namespaces, a veth pair
# capped by tbf, a proxy per direction adding the one-way delay), as root:
#   - throughput (tokens/s, the driver's summary: the run after the rendezvous) of f32 links at
#     the WAN's delay against the same two namespaces and proxies without delay;
#   - bytes per token for f32, bf16 and int8 + lz4 links: the packets' bytes (the links' own
#     count, both directions) and the bytes the proxies forwarded (ZeroMQ framing, CURVE,
#     acknowledgements and heartbeats included).
#   bench/bench_wan.sh [BIN] [PROXY] [REPEATS]
# BIN: the seqflow binary (default build/seqflow); PROXY: sf_tcp_proxy (default
# build/tests/sf_tcp_proxy); REPEATS: f32 runs with and without delay, alternated, the best
# rate of each kept (default 3: a shared machine's load moves single runs by tens of %).
# Environment: BENCH_BYTES (input tokens, default 24000),
# BENCH_MODEL (model options), WAN_DELAY_MS (one-way, default 25), WAN_RATE (default 1gbit).
set -u
export SEQFLOW_BIN=${1:-build/seqflow}
export SF_TCP_PROXY=${2:-build/tests/sf_tcp_proxy}
repeats=${3:-3}
bytes=${BENCH_BYTES:-24000}
model=${BENCH_MODEL:---dim 256 --heads 4 --head-dim 64 --layers 4 --mlp 1024 --segment 256}
delay=${WAN_DELAY_MS:-25}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../tests/wan_env.sh"
tmp=$(mktemp -d /tmp/sf-bench-wan.XXXXXX)
trap 'wan_cleanup; rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM HUP PIPE
wan_setup "$tmp" || exit $?
export OMP_WAIT_POLICY=passive
head -c "$bytes" /dev/urandom > "$tmp/in.bin"
layer="segment ! embed ! block layers=0-1 ! block layers=2-3 @1 ! norm"

# one run: NAME DELAY_MS LINKS_JSON; prints its line, leaves tokens/s in $rate
run() {
    name=$1
    WAN_DELAY_MS=$2
    export WAN_DELAY_MS
    wan_topology "$tmp" "$3" || exit 1
    wan_run "$tmp" "$tmp/$name" -t 1 $model -i "$tmp/in.bin" -o "$tmp/$name.raw" "$layer" ||
        { cat "$tmp/$name.rank0" "$tmp/$name.rank1" >&2; echo "$name: failed" >&2; exit 1; }
    rate=$(sed -n 's/^seqflow: [0-9]* tokens in [0-9.]* s (\([0-9]*\) tokens\/s).*/\1/p' "$tmp/$name.rank0")
    tokens=$(sed -n 's/^seqflow: \([0-9]*\) tokens in.*/\1/p' "$tmp/$name.rank0")
    packets=$(sed -n 's/.*network: sent [0-9]* packets (\([0-9]*\) bytes), received [0-9]* packets (\([0-9]*\) bytes).*/\1 \2/p' \
        "$tmp/$name.rank0" | awk '{ printf "%.0f", $1 + $2 }')
    awk -v n="$name" -v d="$2" -v r="$rate" -v t="$tokens" -v p="$packets" -v w="$wan_wire_bytes" 'BEGIN {
        printf "%-10s delay %2d ms each way: %6d tokens/s; packets %8.1f bytes/token, wire %8.1f bytes/token (%d tokens)\n",
               n, d, r, p / t, w / t, t }'
}

echo "input $bytes tokens; model $model; link rate ${WAN_RATE:-1gbit} (tbf), $((2 * delay)) ms round trip"
best_local=0 best_wan=0
i=0
while [ $i -lt "$repeats" ]; do
    run local 0 '{}'
    best_local=$(awk -v a="$rate" -v b="$best_local" 'BEGIN { print (a > b ? a : b) }')
    run f32 "$delay" '{}'
    best_wan=$(awk -v a="$rate" -v b="$best_wan" 'BEGIN { print (a > b ? a : b) }')
    cmp -s "$tmp/local.raw" "$tmp/f32.raw" || { echo "f32 over the WAN: output differs" >&2; exit 1; }
    i=$((i + 1))
done
run bf16 "$delay" '{"default": {"quant": "bf16"}}'
run int8-lz4 "$delay" '{"default": {"codec": "lz4", "quant": "int8", "error_feedback": true}}'
awk -v a="$best_wan" -v b="$best_local" -v rt="$((2 * delay))" 'BEGIN {
    printf "f32, best of each: %d tokens/s at %d ms round trip, %d tokens/s without delay: %.1f %% (target >= 90 %%)\n",
           a, rt, b, 100 * a / b }'
