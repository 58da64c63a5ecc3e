#!/bin/sh
# A distributed run over an emulated WAN: rank 0 and rank 1 in two network namespaces joined by
# a veth pair capped at 1 Gbit/s (tbf), every connection through a proxy that holds each byte
# 25 ms each way (a 50 ms round trip; tests/wan_env.sh). A layer pipeline across it
#   - with float32 links gives `seqflow run`'s bytes (cmp), also when the proxy resets the
#     connections to rank 1 mid-run;
#   - with int8 + lz4 links (the topology's across_datacenters) gives other bytes, within a
#     tolerance of them, and fewer bytes on the wire (the links' count and the proxies').
# Skipped (77) when not root or when namespaces, veth or tbf are not available.
# Usage: wan_netns.sh (SEQFLOW_BIN: the binary; SF_TCP_PROXY: tests' sf_tcp_proxy)
set -u
export SEQFLOW_BIN=${SEQFLOW_BIN:?SEQFLOW_BIN must name the seqflow binary}
export SF_TCP_PROXY=${SF_TCP_PROXY:?SF_TCP_PROXY must name sf_tcp_proxy}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/wan_env.sh"
tmp=$(mktemp -d /tmp/sf-wan-test.XXXXXX)
trap 'wan_cleanup; rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM HUP PIPE
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v python3 > /dev/null || { echo "skipped: no python3"; exit 77; }
wan_setup "$tmp"
status=$?
[ $status -eq 77 ] && exit 77
[ $status -eq 0 ] || fail "setting up the namespaces"
export OMP_WAIT_POLICY=passive
model="--layers 2 -t 1"
# a sanitizer build runs several times slower: a smaller input
input=16000
grep -q __asan_init "$SEQFLOW_BIN" && input=4000
head -c "${SEQFLOW_TEST_INPUT_BYTES:-$input}" /dev/urandom > "$tmp/in.bin"
plain="segment ! embed ! block layers=0-0 ! block layers=1-1 ! norm"
layer="segment ! embed ! block layers=0-0 ! block layers=1-1 @1 ! norm"
"$SEQFLOW_BIN" run -q $model -i "$tmp/in.bin" -o "$tmp/ref.raw" "$plain" || fail "seqflow run"

# the packet bytes of a run (driver's network line: sent + received)
packet_bytes() {
    sed -n 's/.*network: sent [0-9]* packets (\([0-9]*\) bytes), received [0-9]* packets (\([0-9]*\) bytes).*/\1 \2/p' "$1" |
        awk '{ printf "%.0f", $1 + $2 }'
}

# float32 links: lossless, byte for byte
wan_topology "$tmp" '{"default": {"window_packets": 8}}' || fail "writing the topology"
t0=$(date +%s.%N)
wan_run "$tmp" "$tmp/f32" $model -i "$tmp/in.bin" -o "$tmp/f32.raw" "$layer" ||
    { s=$?; cat "$tmp/f32.rank0" "$tmp/f32.rank1" >&2; fail "f32 run: exit status $s"; }
t1=$(date +%s.%N)
cmp -s "$tmp/f32.raw" "$tmp/ref.raw" || fail "f32 links over the WAN: output differs from seqflow run"
f32_packets=$(packet_bytes "$tmp/f32.rank0")
f32_wire=$wan_wire_bytes
[ -n "$f32_packets" ] && [ "$f32_packets" -gt 0 ] || { cat "$tmp/f32.rank0" >&2; fail "no network line from the driver"; }
# one packet a segment each way, none sent twice (no connection was lost)
counts=$(sed -n 's/.*network: sent \([0-9]*\) packets ([0-9]* bytes), received \([0-9]*\) packets.*/\1 \2/p' "$tmp/f32.rank0")
[ "${counts% *}" = "${counts#* }" ] || fail "the driver sent and received other numbers of packets: $counts"
# the proxies saw the traffic: at least the packets' bytes went through them
[ "$f32_wire" -ge "$f32_packets" ] || fail "the proxies forwarded $f32_wire bytes, less than the $f32_packets of packets"
echo "ok: f32 links over a 50 ms round trip: identical to seqflow run ($(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s; packets $f32_packets bytes, wire $f32_wire bytes)"

# the connections to rank 1 reset mid-run: reconnected, resent, still the same bytes
WAN_CUT_AFTER_BYTES=$((f32_packets / 4)) wan_run "$tmp" "$tmp/cut" $model -i "$tmp/in.bin" -o "$tmp/cut.raw" "$layer" ||
    { s=$?; cat "$tmp/cut.rank0" "$tmp/cut.rank1" >&2; fail "cut run: exit status $s"; }
cmp -s "$tmp/cut.raw" "$tmp/ref.raw" || fail "connections reset over the WAN: output differs from seqflow run"
accepted=$(sed -n 's/.*: \([0-9]*\) connections,.*/\1/p' "$tmp/proxy-a.out")
[ "${accepted:-0}" -gt 2 ] || fail "the proxy to rank 1 saw $accepted connections: the cut did not happen"
echo "ok: connections to rank 1 reset after $((f32_packets / 4)) bytes: $accepted connections, packets $(packet_bytes "$tmp/cut.rank0") bytes, identical output"

# int8 + lz4 between the datacenters: close, not identical, smaller
wan_topology "$tmp" '{"across_datacenters": {"codec": "lz4", "quant": "int8", "error_feedback": true}}' ||
    fail "writing the topology"
wan_run "$tmp" "$tmp/q8" $model -i "$tmp/in.bin" -o "$tmp/q8.raw" "$layer" ||
    { s=$?; cat "$tmp/q8.rank0" "$tmp/q8.rank1" >&2; fail "int8 run: exit status $s"; }
q8_packets=$(packet_bytes "$tmp/q8.rank0")
q8_wire=$wan_wire_bytes
cmp -s "$tmp/q8.raw" "$tmp/ref.raw" && fail "int8 links: output identical to float32's (not quantized?)"
python3 - "$tmp/ref.raw" "$tmp/q8.raw" << 'PY' || fail "int8 links: output outside the tolerance"
import array, math, sys
a, b = array.array("f"), array.array("f")
a.frombytes(open(sys.argv[1], "rb").read())
b.frombytes(open(sys.argv[2], "rb").read())
if len(a) != len(b) or not a:
    sys.exit("sizes differ: %d and %d values" % (len(a), len(b)))
if not all(math.isfinite(x) for x in b):
    sys.exit("non-finite values")
diff = [abs(x - y) for x, y in zip(a, b)]
rms_ref = math.sqrt(sum(x * x for x in a) / len(a))
rms_err = math.sqrt(sum(d * d for d in diff) / len(diff))
# int8 with one scale per row: ~0.4 % of a row's largest value per value before the last layer
print("int8 links: max |error| %.4g, rms error %.4g of rms %.4g (%.2f %%)" % (max(diff), rms_err, rms_ref, 100 * rms_err / rms_ref))
if rms_err > 0.03 * rms_ref or max(diff) > 0.25 * max(abs(x) for x in a):
    sys.exit("too far from float32")
PY
[ "$q8_packets" -lt "$f32_packets" ] || fail "int8 + lz4 packets ($q8_packets bytes) not smaller than f32's ($f32_packets)"
[ "$q8_wire" -lt "$f32_wire" ] || fail "int8 + lz4 on the wire ($q8_wire bytes) not less than f32's ($f32_wire)"
echo "ok: int8 + lz4 links: within tolerance, packets $q8_packets bytes (f32 $f32_packets), wire $q8_wire bytes (f32 $f32_wire)"
exit 0
