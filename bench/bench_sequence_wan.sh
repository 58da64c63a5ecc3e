#!/bin/sh
# Sequence parallelism over an emulated WAN (tests/wan_env.sh: two network namespaces, a veth
# pair capped by tbf, a proxy per direction adding the one-way delay), as root: rank 0 in
# datacenter a, rank 1 in datacenter b, each its datacenter's gateway, --sequence scan.
#   - throughput (rank 0's tokens/s, after the rendezvous) at the WAN's delay against the same
#     namespaces and proxies without delay, exact tier, best of REPEATS each;
#   - per tier (exact raw, exact lz4 and zstd with the byte shuffle, int8 + lz4, int4 + zstd,
#     federation): bytes per input token crossing between the datacenters (the exchange's own
#     count, both ways; and what the proxies forwarded: ZeroMQ, CURVE, acks, heartbeats
#     included) and the output's worst segment error against one process (relative, L2).
#   bench/bench_sequence_wan.sh [BIN] [PROXY] [REPEATS]
# BIN: the seqflow binary (default build/seqflow); PROXY: sf_tcp_proxy (default
# build/tests/sf_tcp_proxy); REPEATS (default 2).
# Environment: BENCH_BYTES (input tokens, default 262144), BENCH_MODEL (model options, default
# the built-in model with 4 layers), BENCH_CHUNKS (segments per rank per round, default 128),
# WAN_DELAY_MS (one-way, default 25), WAN_RATE (default 1gbit).
set -u
export SEQFLOW_BIN=${1:-build/seqflow}
export SF_TCP_PROXY=${2:-build/tests/sf_tcp_proxy}
repeats=${3:-2}
bytes=${BENCH_BYTES:-262144}
model=${BENCH_MODEL:---layers 4}
chunks=${BENCH_CHUNKS:-128}
delay=${WAN_DELAY_MS:-25}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../tests/wan_env.sh"
tmp=$(mktemp -d /tmp/sf-bench-seqwan.XXXXXX)
trap 'wan_cleanup; rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM HUP PIPE
wan_setup "$tmp" || exit $?
export OMP_WAIT_POLICY=passive
head -c "$bytes" /dev/urandom > "$tmp/in.bin"
"$SEQFLOW_BIN" run -q -t 1 $model -i "$tmp/in.bin" -o "$tmp/ref.npy" || exit 1
N=$("$SEQFLOW_BIN" info $model | awk '$1 == "segment" { print $2 }')
D=$("$SEQFLOW_BIN" info $model | awk '$1 == "dim" { print $2 }')

# worst segment error of .npy B against A
error() {
    python3 - "$1" "$2" "$((N * D))" << 'PY'
import array, math, sys
def rows(p):
    a = array.array("f"); a.frombytes(open(p, "rb").read()[128:]); return a
a, b, n = rows(sys.argv[1]), rows(sys.argv[2]), int(sys.argv[3])
worst = 0.0
for s in range(0, len(a), n):
    e = sum((x - y) ** 2 for x, y in zip(a[s:s + n], b[s:s + n]))
    w = sum(x * x for x in a[s:s + n])
    worst = max(worst, math.sqrt(e) / (math.sqrt(w) + 1e-30))
print("%.2e" % worst)
PY
}

# one run: NAME DELAY_MS LINKS_JSON [MORE OPTIONS]; prints its line, leaves tokens/s in $rate
run() {
    name=$1
    WAN_DELAY_MS=$2
    export WAN_DELAY_MS
    wan_topology "$tmp" "$3" || exit 1
    shift 3
    wan_run "$tmp" "$tmp/$name" -t 1 $model --sequence scan --chunks "$chunks" "$@" -i "$tmp/in.bin" -o "$tmp/$name.npy" ||
        { cat "$tmp/$name.rank0" "$tmp/$name.rank1" >&2; echo "$name: failed" >&2; exit 1; }
    rate=$(sed -n 's/^seqflow: [0-9]* tokens in [0-9.]* s (\([0-9]*\) tokens\/s).*/\1/p' "$tmp/$name.rank0")
    across=$(sed -n 's/.*across datacenters \([0-9]*\) out, \([0-9]*\) in.*/\1 \2/p' "$tmp/$name.rank0" |
        awk '{ printf "%.0f", $1 + $2 }')
    err=$(error "$tmp/ref.npy" "$tmp/$name.npy")
    awk -v n="$name" -v d="$WAN_DELAY_MS" -v r="$rate" -v t="$bytes" -v a="$across" -v w="$wan_wire_bytes" -v e="$err" 'BEGIN {
        printf "%-12s delay %2d ms each way: %6d tokens/s; across the tier %7.2f bytes/token (wire %7.2f); worst segment error %s\n",
               n, d, r, a / t, w / t, e }'
}

echo "input $bytes tokens; model $model (N=$N, D=$D); chunks of $chunks segments; link ${WAN_RATE:-1gbit} (tbf), $((2 * delay)) ms round trip"
best_local=0 best_wan=0
i=0
while [ $i -lt "$repeats" ]; do
    run local 0 '{}'
    best_local=$(awk -v a="$rate" -v b="$best_local" 'BEGIN { print (a > b ? a : b) }')
    run exact "$delay" '{}'
    best_wan=$(awk -v a="$rate" -v b="$best_wan" 'BEGIN { print (a > b ? a : b) }')
    cmp -s "$tmp/local.npy" "$tmp/exact.npy" || { echo "exact over the WAN: output differs from without delay" >&2; exit 1; }
    i=$((i + 1))
done
run lz4-shuffle "$delay" '{"across_datacenters": {"codec": "lz4", "shuffle": true}}'
run zstd-shuffle "$delay" '{"across_datacenters": {"codec": "zstd", "shuffle": true}}'
run int8-lz4 "$delay" '{"across_datacenters": {"codec": "lz4", "quant": "int8"}}'
run int4-zstd "$delay" '{"across_datacenters": {"codec": "zstd", "quant": "int4"}}'
run federation "$delay" '{"across_datacenters": {"codec": "zstd", "shuffle": true}}' --federation
awk -v a="$best_wan" -v b="$best_local" -v rt="$((2 * delay))" 'BEGIN {
    printf "exact, best of each: %d tokens/s at %d ms round trip, %d tokens/s without delay: %.1f %% (target >= 90 %%)\n",
           a, rt, b, 100 * a / b }'
