#!/bin/sh
# Sequence parallelism through the binary (seqflow launch -n N -- --sequence MODE ...), against
# `seqflow run` on the same input:
#   - hand-off on 2 and 3 processes (unequal chunks): the same .npy bytes;
#   - scan on 2, 3 and 4 processes (equal and unequal chunks), for delta and linear memory, with
#     and without global tokens, causal and not: every segment within 1e-5 (relative, L2);
#     two scan runs give the same bytes;
#   - the example topology of two datacenters (examples/sequence-2dc.json): within 1e-5; with
#     "shuffle": true on its zstd link between them, the same bytes and fewer packet bytes sent;
#   - '{rank}' in -o: each rank writes its own file, holding its rows;
#   - a rank killed mid-stream: the job fails naming it; with --checkpoint, --resume finishes
#     with the bytes of an uninterrupted run;
#   - refusals: standard input, a text input, a pipeline.
# Usage: sequence_cli.sh (SEQFLOW_BIN: the binary)
set -u
bin=${SEQFLOW_BIN:?SEQFLOW_BIN must name the seqflow binary}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/sf-seq-test.XXXXXX)
trap 'rm -rf "$tmp" /tmp/seqflow-2dc-*' EXIT
trap 'exit 1' INT TERM HUP PIPE
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v python3 > /dev/null || { echo "skipped: no python3"; exit 77; }
cd "$tmp" || exit 1
export OMP_WAIT_POLICY=passive

# close A B: every segment of .npy B within 1e-5 of A's (relative, L2); N rows a segment
close() {
    python3 - "$1" "$2" "$3" << 'PY'
import array, math, sys
def rows(path):
    data = open(path, "rb").read()
    a = array.array("f")
    a.frombytes(data[128:])
    return a
a, b, n = rows(sys.argv[1]), rows(sys.argv[2]), int(sys.argv[3])
if len(a) != len(b) or not a:
    sys.exit("sizes differ: %d and %d values" % (len(a), len(b)))
worst = 0.0
for s in range(0, len(a), n):
    e = sum((x - y) ** 2 for x, y in zip(a[s:s + n], b[s:s + n]))
    w = sum(x * x for x in a[s:s + n])
    rel = math.sqrt(e) / (math.sqrt(w) + 1e-30)
    if not rel <= 1e-5:
        sys.exit("segment at value %d: relative error %g" % (s, rel))
    worst = max(worst, rel)
print("%.2e" % worst)
PY
}

small="-t 1 --segment 64 --branches 32:1,64:2 --dim 64 --heads 4 --head-dim 16 --mlp 128 --global-tokens 8 --summary-tokens 2"
head -c 6000 /dev/urandom > in.bin # 93 segments of 64 and a partial one of 48
seg_values=$((64 * 64))

"$bin" run -q $small -i in.bin -o ref.npy || fail "seqflow run"
for spec in "2 4" "3 2,5,3"; do
    set -- $spec
    "$bin" launch -n "$1" -- -q $small --sequence handoff --chunks "$2" -i in.bin -o out.npy 2> err.txt ||
        { cat err.txt >&2; fail "hand-off on $1 processes"; }
    cmp -s out.npy ref.npy || fail "hand-off on $1 processes (chunks $2): output differs from seqflow run"
    echo "ok: hand-off on $1 processes (chunks $2): the bytes of seqflow run"
done
for spec in "2 4" "3 2,5,3" "4 3"; do
    set -- $spec
    "$bin" launch -n "$1" -- -q $small --sequence scan --chunks "$2" -i in.bin -o out.npy 2> err.txt ||
        { cat err.txt >&2; fail "scan on $1 processes"; }
    err=$(close ref.npy out.npy $seg_values) || fail "scan on $1 processes (chunks $2): $err"
    echo "ok: scan on $1 processes (chunks $2): worst segment $err"
    cp out.npy "scan$1.npy"
done
"$bin" launch -n 3 -- -q $small --sequence scan --chunks 2,5,3 -i in.bin -o again.npy 2> err.txt ||
    { cat err.txt >&2; fail "scan again"; }
cmp -s again.npy scan3.npy || fail "two scan runs of one layout differ"
echo "ok: two scan runs: the same bytes"

for variant in "--memory linear" "--memory linear --causal 0 --global-tokens 0" "--memory delta --causal 0"; do
    "$bin" run -q $small $variant -i in.bin -o ref2.npy || fail "seqflow run $variant"
    "$bin" launch -n 3 -- -q $small $variant --sequence scan --chunks 3 -i in.bin -o out2.npy 2> err.txt ||
        { cat err.txt >&2; fail "scan $variant"; }
    err=$(close ref2.npy out2.npy $seg_values) || fail "scan $variant: $err"
    echo "ok: scan on 3 processes, $variant: worst segment $err"
done

# the split following the ranks' speed: hand-off stays byte for byte
"$bin" launch -n 3 -- -q $small --sequence handoff --chunks 1,6,2 --balance -i in.bin -o bal.npy 2> err.txt ||
    { cat err.txt >&2; fail "balanced hand-off"; }
cmp -s bal.npy ref.npy || fail "balanced hand-off: output differs from seqflow run"
echo "ok: --balance (hand-off, 3 processes from chunks 1,6,2): the bytes of seqflow run"

# two datacenters of two nodes: the exchange crosses between their gateways only
"$bin" launch -n 4 --topology "$here/../examples/sequence-2dc.json" -- $small --sequence scan --chunks 4 \
    -i in.bin -o dc.npy 2> err.txt || { cat err.txt >&2; fail "the example topology"; }
err=$(close ref.npy dc.npy $seg_values) || fail "two datacenters: $err"
across=$(sed -n 's/.*across datacenters \([0-9]*\) out.*/\1/p' err.txt | awk '{ s += $1 } END { print s + 0 }')
[ "$across" -gt 0 ] || { cat err.txt >&2; fail "two datacenters: nothing crossed between them"; }
echo "ok: two datacenters x two nodes (examples/sequence-2dc.json): worst segment $err, $across bytes across"
# the same with the byte shuffle on the link between them (zstd): the same bytes out, and fewer
# packet bytes sent (the "network:" lines of every rank; only that link's encoding changed)
cp err.txt err-2dc.txt
sent_bytes() { sed -n 's/.*network: sent [0-9]* packets (\([0-9]*\) bytes).*/\1/p' "$1" | awk '{ s += $1 } END { print s + 0 }'; }
sed 's/"across_datacenters": {"codec": "zstd"}/"across_datacenters": {"codec": "zstd", "shuffle": true}/' \
    "$here/../examples/sequence-2dc.json" > 2dc-shuffle.json
grep -q '"shuffle": true' 2dc-shuffle.json || fail "two datacenters, shuffled: the example's links changed"
"$bin" launch -n 4 --topology 2dc-shuffle.json -- $small --sequence scan --chunks 4 \
    -i in.bin -o dc-shuffle.npy 2> err.txt || { cat err.txt >&2; fail "the example topology, shuffled"; }
cmp -s dc.npy dc-shuffle.npy || fail "two datacenters, shuffled: output differs from the unshuffled run"
wire=$(sent_bytes err-2dc.txt) wire_shuffled=$(sent_bytes err.txt)
[ "$wire_shuffled" -gt 0 ] && [ "$wire_shuffled" -lt "$wire" ] ||
    { cat err.txt >&2; fail "two datacenters, shuffled: the ranks sent $wire_shuffled packet bytes, $wire without"; }
echo "ok: two datacenters, shuffled: the same bytes; the ranks sent $wire_shuffled packet bytes instead of $wire"

# the split from the topology's "chunk" of each rank (8, 8, 12, 12)
"$bin" launch -n 4 --topology "$here/../examples/sequence-2dc.json" -- -q $small --sequence scan \
    -i in.bin -o dc-topo.npy 2> err.txt || { cat err.txt >&2; fail "chunks from the topology"; }
err=$(close ref.npy dc-topo.npy $seg_values) || fail "chunks from the topology: $err"
cmp -s dc-topo.npy dc.npy && fail "chunks from the topology: the same bytes as chunks of 4 (not read?)"
echo "ok: chunks from the topology (8, 8, 12, 12): worst segment $err"

# the same example topology started by Open MPI's mpirun (its ranks from OMPI_COMM_WORLD_RANK)
if command -v mpirun > /dev/null; then
    mpirun --allow-run-as-root --oversubscribe -x OMP_WAIT_POLICY -n 4 \
        "$bin" worker --topology "$here/../examples/sequence-2dc.json" -q $small --sequence scan --chunks 4 \
        -i in.bin -o mpi.npy > err.txt 2>&1 || { cat err.txt >&2; fail "the example topology under mpirun"; }
    cmp -s mpi.npy dc.npy || fail "under mpirun: output differs from seqflow launch's"
    echo "ok: the example topology under mpirun: the bytes of seqflow launch's run"
else
    echo "skipped: mpirun (not installed)"
fi

# a file per rank
"$bin" launch -n 2 -- -q $small --sequence handoff --chunks 4 -i in.bin -o 'part{rank}.npy' 2> err.txt ||
    { cat err.txt >&2; fail "a file per rank"; }
python3 - ref.npy part0.npy part1.npy 256 << 'PY' || fail "a file per rank: rows in the wrong places"
import sys
ref, p0, p1 = (open(p, "rb").read() for p in sys.argv[1:4])
seg = 64 * 64 * 4  # bytes a segment; 4 segments a chunk, rank 0 first in each round of 8
assert len(ref) == len(p0) == len(p1)
for i in range(128, len(ref), seg):
    s = (i - 128) // seg
    mine, other = (p0, p1) if (s // 4) % 2 == 0 else (p1, p0)
    assert mine[i:i + seg] == ref[i:i + seg], "segment %d" % s
    assert other[i:i + seg].count(0) == len(other[i:i + seg]), "segment %d in both" % s
PY
echo "ok: '{rank}' in -o: each rank's file holds its own rows"

# a rank killed mid-stream, then resumed from the checkpoint
head -c 60000 /dev/urandom > big.bin
"$bin" launch -n 3 -- -q $small --sequence scan --chunks 2 -i big.bin -o whole.npy 2> err.txt ||
    { cat err.txt >&2; fail "the uninterrupted run"; }
rm -rf ck
"$bin" launch -n 3 --timeout-ms 1500 -- -q $small --sequence scan --chunks 2 -i big.bin -o cut.npy \
    --checkpoint ck 2> err.txt &
lp=$!
n=0
while [ ! -e ck/sequence.state ] && [ $n -lt 1000 ] && kill -0 $lp 2> /dev/null; do sleep 0.02; n=$((n + 1)); done
for d in /proc/[0-9]*; do
    [ "$(awk '{print $4}' "$d/stat" 2> /dev/null)" = "$lp" ] || continue
    { tr '\0' '\n' < "$d/environ"; } 2> /dev/null | grep -qx "RANK=1" && kill -9 "${d#/proc/}"
done
wait $lp
status=$?
if [ $status -ne 0 ]; then
    grep -q "rank 1" err.txt || { cat err.txt >&2; fail "the killed rank is not named"; }
    "$bin" launch -n 3 -- -q $small --sequence scan --chunks 2 -i big.bin -o cut.npy --checkpoint ck --resume 2> err.txt ||
        { cat err.txt >&2; fail "resume"; }
fi
cmp -s cut.npy whole.npy || fail "resumed after rank 1 was killed (exit $status): output differs"
echo "ok: rank 1 killed (exit $status), resumed: the bytes of the uninterrupted run"

# refusals
"$bin" launch -n 2 -- -q $small --sequence scan -i - -o x.npy < in.bin 2> err.txt && fail "standard input accepted"
grep -q "reads its chunks from a file" err.txt || { cat err.txt >&2; fail "standard input: no clear message"; }
"$bin" launch -n 2 -- -q $small --sequence scan -f text -i in.bin -o x.npy 2> err.txt && fail "text input accepted"
"$bin" launch -n 2 -- -q $small --sequence sideways -i in.bin -o x.npy 2> err.txt && fail "a bad mode accepted"
grep -q "scan or handoff" err.txt || { cat err.txt >&2; fail "bad mode: no clear message"; }
echo "ok: refusals"
