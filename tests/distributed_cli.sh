#!/bin/sh
# Distributed runs through the binary, all processes on this machine over ipc:// endpoints.
#   layouts  `seqflow launch -n 3`: a layer pipeline, a stream-parallel group and the two
#            combined give `seqflow run`'s bytes (the same pipeline without placements)
#   mpirun   the same layouts started by Open MPI's mpirun (skipped without mpirun)
#   torchrun the same started as torchrun --no-python would (RANK, WORLD_SIZE, MASTER_ADDR,
#            MASTER_PORT set per process)
#   kill     kill -9 of a worker or of rank 0 at seeded random points, each followed by a
#            --resume that must give the uninterrupted bytes; a dead worker is named by the
#            driver within its heartbeat timeout, and no output file is left
#   stop     a SIGSTOPped worker is detected within the timeout; no output (or partial) left
#   connect  ranks 1 and 2 started with only rank 0's rendezvous (--connect, or MASTER_ADDR and
#            MASTER_PORT), rank 0's public key and their own keys get the topology from rank 0:
#            seqflow run's bytes; a rank whose key is not in the topology is refused
#   rejoin   kill -9 of a worker mid-stream under `seqflow launch --restart 1 --checkpoint`: the
#            worker is started again, rejoins, every rank rolls back and the job finishes with
#            the uninterrupted bytes; without a restart the job ends after --rejoin-timeout with
#            the usual error, and --resume finishes it
#   heads    a block's heads over processes (block head_ranks=): over 1, 2 and 4 processes, and
#            2 processes beside a third rank, for delta, linear and no memory, causal or not,
#            global tokens on and off, three streams batched: the bytes of the same heads_of= on
#            threads of one process (the sums are taken in the same order) and within 1e-5
#            (relative, L2) of one rank; a failing or killed following rank ends the job within
#            the heartbeat timeout, named; --resume after the kill gives the uninterrupted bytes, and
#            so does a kill under launch --restart (the rank rejoins, every rank rolls back)
# Usage: distributed_cli.sh MODE (SEQFLOW_BIN: the binary; SEQFLOW_TEST_SEED: the kill points)
set -u
mode=$1
bin=${SEQFLOW_BIN:?SEQFLOW_BIN must name the seqflow binary}
tmp=$(mktemp -d /tmp/sf-dist-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
fail() { echo "FAIL: $*" >&2; exit 1; }
# a sanitizer build runs several times slower: more slack for the timings, fewer kills
slack=2.5 kills=11
if grep -q __asan_init "$bin"; then slack=8 kills=4; fi
slack=${SEQFLOW_TEST_SLACK:-$slack}
model="--layers 2 -t 1 -q"
export OMP_WAIT_POLICY=passive
head -c "${SEQFLOW_TEST_INPUT_BYTES:-12000}" /dev/urandom > in.bin
# three streams: the input cut in three, one input each
split -n 3 -d in.bin part
multi="-i part00 -i part01 -i part02"

layer="segment ! embed ! block layers=0-0 @1 ! block layers=1-1 @2 ! norm"
stream="segment ! embed @1,2 ! block layers=0-0 @1,2 ! block layers=1-1 @1,2 ! norm @1,2"
combined="segment ! embed @1 ! block layers=0-0 @0,2 ! block layers=1-1 @1 ! norm"
plain="segment ! embed ! block layers=0-0 ! block layers=1-1 ! norm"
"$bin" run $model -i in.bin -o ref1.raw "$plain" || fail "seqflow run"
"$bin" run $model $multi -o ref3.raw "$plain" || fail "seqflow run of three streams"

# check NAME EXPECTED_REF COMMAND...: runs the command, compares out.raw with the reference
check() {
    name=$1 ref=$2
    shift 2
    rm -f out.raw
    "$@" || fail "$name: exit status $?"
    cmp -s out.raw "$ref" || fail "$name: output differs from seqflow run"
    echo "ok: $name"
}

# relerr A B: the relative L2 error of the float32 values of file A against those of file B
# (python3 where it is; od and awk otherwise, five times slower and less precise)
relerr() {
    [ "$(wc -c < "$1")" -eq "$(wc -c < "$2")" ] || { echo "sizes differ"; return; }
    python3 - "$1" "$2" 2> /dev/null << 'PY' && return
import array, math, sys
a, b = array.array("f"), array.array("f")
a.frombytes(open(sys.argv[1], "rb").read())
b.frombytes(open(sys.argv[2], "rb").read())
e = sum((x - y) * (x - y) for x, y in zip(a, b))
n = sum(y * y for y in b)
print("%.3g" % math.sqrt(e / n) if n else "nan")
PY
    local ta tb
    ta=$(mktemp) tb=$(mktemp)
    od -An -v -tf4 -w4 "$1" > "$ta"
    od -An -v -tf4 -w4 "$2" > "$tb"
    paste "$ta" "$tb" |
        awk '{ d = $1 - $2; e += d * d; n += $2 * $2 } END { if (n == 0) print "nan"; else printf "%.3g\n", sqrt(e / n) }'
    rm -f "$ta" "$tb"
}

# the pid of rank R among the children of pid P
rank_pid() {
    for d in /proc/[0-9]*; do
        [ "$(awk '{print $4}' "$d/stat" 2>/dev/null)" = "$1" ] || continue
        { tr '\0' '\n' < "$d/environ"; } 2> /dev/null | grep -qx "RANK=$2" && { echo "${d#/proc/}"; return; }
    done
}

now() { date +%s.%N; }
# sized_input FILE BYTES: BYTES random bytes in FILE, doubled (at most 5 times) until one
# process takes them in at least 0.8 s here: a job killed after its first checkpoint must still
# be running then, and on a machine of many fast cores a fixed size ended first
sized_input() {
    local file=$1 bytes=$2 n=0 t0 t
    while :; do
        head -c "$bytes" /dev/urandom > "$file"
        t0=$(now)
        "$bin" run $model -i "$file" --sink-format null "$plain" > /dev/null || fail "seqflow run of $file"
        t=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
        awk -v t="$t" 'BEGIN { exit !(t < 0.8) }' && [ $n -lt 5 ] || break
        bytes=$((bytes * 2)) n=$((n + 1))
    done
}
# start_job N LAUNCH_OPTIONS -- WORKER_OPTIONS: a checkpointed job of N ranks in the background
# ($lp, its stderr in err.txt), returning once its first checkpoint is written (the data has
# crossed every rank)
start_job() {
    local world=$1
    shift
    rm -rf ck out.raw out.raw.partial*
    "$bin" launch -n "$world" --timeout-ms 1500 "$@" 2> err.txt &
    lp=$!
    n=0
    while [ -z "$(ls ck/ckpt-* 2> /dev/null)" ] && [ $n -lt 1000 ] && kill -0 $lp 2> /dev/null; do
        sleep 0.02
        n=$((n + 1))
    done
    [ -n "$(ls ck/ckpt-* 2> /dev/null)" ] || { cat err.txt >&2; fail "no checkpoint was written"; }
}
# kill_rank R NAME: kill -9 of rank R of the job start_job began, then waits for the job: its
# exit in $status, the seconds from the kill to its end in $took
kill_rank() {
    local pid killed_at
    pid=$(rank_pid $lp "$1")
    [ -n "$pid" ] || { wait $lp; fail "$2: the job ended before the kill (make the input longer)"; }
    killed_at=$(now)
    kill -9 "$pid"
    wait $lp
    status=$?
    took=$(awk -v a="$killed_at" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
}
# a TCP port free now on loopback (the kernel's choice): tests running at once must not share
# one, as ports made from the shell's pid could
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2> /dev/null ||
        echo $((20000 + $$ % 20000))
}

case $mode in
layouts)
    check "launch: layer pipeline" ref1.raw "$bin" launch -n 3 -- $model -i in.bin -o out.raw "$layer"
    check "launch: stream parallel" ref3.raw "$bin" launch -n 3 -- $model $multi -o out.raw "$stream"
    check "launch: both" ref3.raw "$bin" launch -n 3 -- $model $multi -o out.raw "$combined"
    # a topology's link options reach the links: zstd with and without the byte shuffle give
    # seqflow run's bytes, and the shuffled links send fewer (rank 0's embeddings, as floats)
    "$bin" launch -n 3 --write-topology "$tmp/topo" > /dev/null || fail "--write-topology"
    for sh in false true; do
        sed "/\"timeout_ms\"/a\\
  \"links\": {\"default\": {\"codec\": \"zstd\", \"level\": 1, \"shuffle\": $sh}}," \
            "$tmp/topo/topology.json" > "$tmp/topo/links-$sh.json"
        rm -f out.raw
        "$bin" launch -n 3 --topology "$tmp/topo/links-$sh.json" -- --key "$tmp/topo/rank{rank}.key" \
            --layers 2 -t 1 -i in.bin -o out.raw "$layer" 2> "net-$sh.txt" ||
            { cat "net-$sh.txt" >&2; fail "zstd links, shuffle $sh: exit status"; }
        cmp -s out.raw ref1.raw || fail "zstd links, shuffle $sh: output differs from seqflow run"
        echo "ok: launch: zstd links, shuffle $sh"
    done
    sent() { sed -n 's/^seqflow: network: sent [0-9]* packets (\([0-9]*\) bytes).*/\1/p' "$1"; }
    plain_bytes=$(sent net-false.txt) shuffled_bytes=$(sent net-true.txt)
    [ -n "$plain_bytes" ] && [ -n "$shuffled_bytes" ] && [ "$shuffled_bytes" -lt "$plain_bytes" ] ||
        fail "shuffled links sent ${shuffled_bytes:-?} bytes, plain ones ${plain_bytes:-?}"
    echo "ok: rank 0 sent $shuffled_bytes bytes shuffled, $plain_bytes without"
    # head parallelism placed by the topology: every rank listing two CPU ranks splits its
    # blocks' heads over two threads, as --cpu-ranks 2 does in one process
    sed 's/"public_key": \("[^"]*"\)}/"public_key": \1, "devices": ["cpu:0", "cpu:1"]}/' \
        "$tmp/topo/topology.json" > "$tmp/topo/heads.json"
    grep -q '"cpu:1"' "$tmp/topo/heads.json" || fail "could not write the devices into the topology"
    "$bin" run $model --cpu-ranks 2 -i in.bin -o ref-heads.raw "$plain" || fail "seqflow run --cpu-ranks 2"
    cmp -s ref-heads.raw ref1.raw && fail "--cpu-ranks 2 gave the unsharded bytes: the check below could not fail"
    check "launch: heads over a rank's topology devices" ref-heads.raw "$bin" launch -n 3 \
        --topology "$tmp/topo/heads.json" -- --key "$tmp/topo/rank{rank}.key" $model -i in.bin -o out.raw "$layer"
    # refusals: a bad placement is a usage error before anything runs
    rm -f out.raw
    "$bin" launch -n 2 -- $model -i in.bin -o out.raw "segment ! embed @1,2 ! block @1 ! norm" 2> err.txt
    [ $? -eq 2 ] || fail "a bad placement: exit status not 2"
    [ ! -e out.raw ] || fail "a refused job left out.raw"
    ;;
mpirun)
    command -v mpirun > /dev/null || { echo "skipped: no mpirun"; exit 77; }
    "$bin" launch -n 3 --write-topology "$tmp/topo" > /dev/null || fail "--write-topology"
    mpi="mpirun --allow-run-as-root --oversubscribe -x OMP_WAIT_POLICY -n 3"
    w="$bin worker --topology $tmp/topo/topology.json --key $tmp/topo/rank{rank}.key"
    check "mpirun: layer pipeline" ref1.raw $mpi $w $model -i in.bin -o out.raw "$layer"
    check "mpirun: stream parallel" ref3.raw $mpi $w $model $multi -o out.raw "$stream"
    check "mpirun: both" ref3.raw $mpi $w $model $multi -o out.raw "$combined"
    ;;
torchrun)
    "$bin" launch -n 3 --write-topology "$tmp/topo" > /dev/null || fail "--write-topology"
    rm -f out.raw
    port=$(free_port)
    for r in 0 1 2; do
        RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            "$bin" worker --topology "$tmp/topo/topology.json" --key "$tmp/topo/rank{rank}.key" \
            $model -i in.bin -o out.raw "$layer" > /dev/null 2> "err$r.txt" &
    done
    wait || true
    for r in 0 1 2; do [ -s "err$r.txt" ] && cat "err$r.txt" >&2; done
    cmp -s out.raw ref1.raw || fail "torchrun variables: output differs"
    echo "ok: torchrun variables"
    ;;
kill)
    # seeded kill points; a worker's death is seen within the timeout (1500 ms here)
    seed=${SEQFLOW_TEST_SEED:-1}
    runs=${SEQFLOW_TEST_KILLS:-$kills}
    # long enough that the seeded delays end before the job does
    sized_input in.bin 40000
    split -n 2 -d in.bin half
    two="-i half00 -i half01"
    "$bin" run $model $two -o ref.raw "$plain" || fail "reference"
    i=0
    while [ $i -lt "$runs" ]; do
        victim=$(awk -v s="$seed" -v i="$i" 'BEGIN { srand(s * 1000 + i); print int(rand() * 3) }')
        delay=$(awk -v s="$seed" -v i="$i" 'BEGIN { srand(s * 1000 + i); rand(); printf "%.2f", rand() * 0.7 }')
        layout=$layer
        [ $((i % 2)) -eq 1 ] && layout=$combined
        # mid-stream: once the first checkpoint is written (the data crosses every rank), then
        # the seeded delay
        start_job 3 -- $model $two -o out.raw --checkpoint ck --checkpoint-every 2 "$layout"
        sleep "$delay"
        pid=$(rank_pid $lp "$victim")
        killed_at=$(now)
        [ -n "$pid" ] && kill -9 "$pid"
        wait $lp
        status=$?
        ended_at=$(now)
        if [ $status -eq 0 ]; then
            cmp -s out.raw ref.raw || fail "run $i: finished before the kill, with other bytes"
        elif [ -e out.raw ]; then
            # the kill came after the driver had all it needed: whole output, the launcher says so
            cmp -s out.raw ref.raw || fail "run $i: a failed job left an out.raw that differs"
            grep -q "^seqflow launch: rank $victim failed (exit status 137); the driver finished: the output is complete" err.txt ||
                { cat err.txt >&2; fail "run $i: a failed job left out.raw"; }
        else
            if [ "$victim" != 0 ]; then
                [ -n "${SEQFLOW_TEST_VERBOSE:-}" ] && cat err.txt >&2
                grep -q "rank $victim (host .*) stopped answering" err.txt || { cat err.txt >&2; fail "run $i: rank $victim not named"; }
                awk -v a="$killed_at" -v b="$ended_at" -v s="$slack" 'BEGIN { exit !(b - a < 1.5 + s) }' ||
                    { cat err.txt >&2; fail "run $i: the driver took $(awk -v a="$killed_at" -v b="$ended_at" 'BEGIN { print b - a }') s"; }
            fi
            "$bin" launch -n 3 -- $model $two -o out.raw \
                --checkpoint ck --checkpoint-every 2 --resume "$layout" 2> err2.txt || { cat err2.txt >&2; fail "run $i: resume"; }
            cmp -s out.raw ref.raw || fail "run $i: resumed output differs (rank $victim killed after $delay s)"
        fi
        echo "ok: kill -9 of rank $victim $delay s after the first checkpoint (exit $status), resumed"
        i=$((i + 1))
    done
    # rank 2 killed the moment rank 1 has finished its part and exited: the driver hears both
    # fall silent together, and must name the one that died, not the one that said goodbye
    named=0
    for i in 1 2 3 4 5 6; do
        "$bin" launch -n 3 --timeout-ms 1500 -- $model $two -o out.raw "$layer" 2> err.txt &
        lp=$!
        p1= p2=
        while { [ -z "$p1" ] || [ -z "$p2" ]; } && kill -0 $lp 2> /dev/null; do p1=$(rank_pid $lp 1) p2=$(rank_pid $lp 2); done
        while [ -n "$p1" ] && kill -0 "$p1" 2> /dev/null; do :; done
        [ -n "$p2" ] && kill -9 "$p2" 2> /dev/null
        wait $lp
        status=$?
        if [ $status -eq 1 ]; then
            grep -q "^seqflow: rank 2 (host .*) stopped answering" err.txt || { cat err.txt >&2; fail "rank 1 finished, rank 2 killed: rank 2 not named"; }
            named=$((named + 1))
        elif [ $status -ne 0 ]; then
            grep -q "the driver finished: the output is complete" err.txt || { cat err.txt >&2; fail "rank 1 finished, rank 2 killed: exit $status"; }
        fi
    done
    echo "ok: rank 2 killed as rank 1 finished: named rank 2 in $named of 6 (the others ended first)"
    ;;
stop)
    # long enough to be running still when rank 2 is stopped, on any machine (stopped, the job
    # ends by the timeout, not by its size)
    head -c 240000 /dev/urandom > in.bin
    rm -f out.raw
    "$bin" launch -n 3 -- $model -i in.bin -o out.raw "$layer" 2> err.txt &
    lp=$!
    sleep 0.5
    pid=$(rank_pid $lp 2)
    [ -n "$pid" ] || fail "no rank 2"
    stopped_at=$(now)
    kill -STOP "$pid"
    wait $lp
    status=$?
    ended_at=$(now)
    [ $status -eq 1 ] || { cat err.txt >&2; fail "a stopped worker: exit status $status, not 1"; }
    # named by rank 0's own watch, or inside the abort of the rank that noticed first
    grep -q "rank 2 (host .*) stopped answering" err.txt || { cat err.txt >&2; fail "rank 2 not named"; }
    awk -v a="$stopped_at" -v b="$ended_at" -v s="$slack" 'BEGIN { exit !(b - a < 3 + s) }' || fail "detected after more than 3 + $slack s"
    [ -z "$(ls out.raw* 2> /dev/null)" ] || fail "output left behind: $(ls out.raw*)"
    echo "ok: SIGSTOP of rank 2 detected in $(awk -v a="$stopped_at" -v b="$ended_at" 'BEGIN { printf "%.2f", b - a }') s"
    ;;
connect)
    "$bin" launch -n 3 --write-topology "$tmp/topo" > /dev/null || fail "--write-topology"
    "$bin" launch -n 3 --write-topology "$tmp/other" > /dev/null || fail "--write-topology"
    key0=$(sed -n 's/.*"id": 0, .*"public_key": "\([^"]*\)".*/\1/p' "$tmp/topo/topology.json")
    [ ${#key0} -eq 40 ] || fail "no public key of rank 0 in the topology"
    # worker RANK ARGS...: one rank in the background, RANK and WORLD_SIZE set as a launcher would
    worker() {
        r=$1
        shift
        RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r "$bin" worker "$@" $model -i in.bin -o out.raw "$layer" > /dev/null 2> "err$r.txt" &
    }
    for how in connect master; do
        rm -f out.raw
        if [ $how = connect ]; then
            worker 0 --topology "$tmp/topo/topology.json" --key "$tmp/topo/rank{rank}.key"
            p0=$!
            worker 1 --connect "ipc://$tmp/topo/rendezvous" --server-key "$key0" --key "$tmp/topo/rank{rank}.key"
            p1=$!
            # a rank with a key the topology does not list is refused, and the job goes on
            worker 2 --connect "ipc://$tmp/topo/rendezvous" --server-key "$key0" --key "$tmp/other/rank{rank}.key"
            wait $! && fail "a worker with a foreign key was let in"
            grep -q "refused this rank's CURVE key" err2.txt || { cat err2.txt >&2; fail "the foreign key: not the expected error"; }
            echo "ok: a worker with a key not in the topology is refused"
            worker 2 --connect "ipc://$tmp/topo/rendezvous" --server-key "$key0" --key "$tmp/topo/rank{rank}.key"
            p2=$!
        else
            # torchrun's variables: rank 0 binds MASTER_ADDR:MASTER_PORT, the others ask there
            port=$(free_port)
            export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
            worker 0 --topology "$tmp/topo/topology.json" --key "$tmp/topo/rank{rank}.key"
            p0=$!
            worker 1 --server-key "$key0" --key "$tmp/topo/rank{rank}.key"
            p1=$!
            worker 2 --server-key "$key0" --key "$tmp/topo/rank{rank}.key"
            p2=$!
            unset MASTER_ADDR MASTER_PORT
        fi
        for p in $p0 $p1 $p2; do wait $p || { cat err0.txt err1.txt err2.txt >&2; fail "$how: a rank failed"; }; done
        cmp -s out.raw ref1.raw || fail "$how: output differs from seqflow run"
        echo "ok: ranks 1 and 2 without the topology file ($how): output identical"
    done
    ;;
rejoin)
    sized_input in.bin 40000
    split -n 2 -d in.bin half
    two="-i half00 -i half01"
    "$bin" run $model $two -o ref.raw "$plain" || fail "reference"
    # a worker killed and started again: rank 1 of the layer pipeline, rank 2 of the combined
    # layout (a replica of the stream-parallel group)
    for case in "1 layer" "2 combined"; do
        set -- $case
        victim=$1 name=$2
        layout=$layer
        [ "$name" = combined ] && layout=$combined
        start_job 3 --restart 1 -- $model $two -o out.raw --checkpoint ck --checkpoint-every 2 "$layout"
        sleep 0.2
        kill_rank "$victim" "$name"
        [ $status -eq 0 ] || { cat err.txt >&2; fail "$name: rank $victim killed, exit status $status"; }
        grep -q "rank $victim started again" err.txt || { cat err.txt >&2; fail "$name: rank $victim was not started again"; }
        grep -q "every rank is back" err.txt || { cat err.txt >&2; fail "$name: no roll-back reported"; }
        cmp -s out.raw ref.raw || { cat err.txt >&2; fail "$name: output after the rejoin differs from seqflow run"; }
        [ -z "$(ls out.raw.* 2> /dev/null)" ] || fail "$name: left $(ls out.raw.*)"
        echo "ok: $name: kill -9 of rank $victim, started again, rejoined; output identical"
    done
    # nobody starts it again: the driver waits --rejoin-timeout 2 s, then the usual error
    start_job 3 -- $model $two -o out.raw --checkpoint ck --checkpoint-every 2 --rejoin-timeout 2 "$layer"
    sleep 0.2
    kill_rank 1 "no rejoin"
    [ $status -eq 1 ] || { cat err.txt >&2; fail "no rejoin: exit status $status, not 1"; }
    grep -q "^seqflow: a lost rank did not come back within --rejoin-timeout 2 s (.*rank 1 (.*) never arrived.*); last committed segment .*; checkpoint [0-9]* holds it: rerun with --resume" err.txt ||
        { cat err.txt >&2; fail "no rejoin: not the expected error"; }
    awk -v t="$took" -v s="$slack" 'BEGIN { exit !(t >= 2 && t < 1.5 + 2 + s) }' || { cat err.txt >&2; fail "no rejoin: ended $took s after the kill"; }
    [ ! -e out.raw ] || fail "no rejoin: a failed job left out.raw"
    "$bin" launch -n 3 -- $model $two -o out.raw --checkpoint ck --checkpoint-every 2 --resume "$layer" 2> err2.txt ||
        { cat err2.txt >&2; fail "no rejoin: resume"; }
    cmp -s out.raw ref.raw || fail "no rejoin: resumed output differs"
    echo "ok: no rejoin within 2 s: the job ended $took s after the kill, named rank 1; resumed"
    ;;
heads)
    # a shorter input: every layout below runs three to six processes' worth of work
    head -c 4000 /dev/urandom > in.bin
    split -n 3 -d in.bin part
    "$bin" run $model -i in.bin -o ref1.raw "$plain" || fail "seqflow run"
    both="segment ! embed ! block layers=0-0 head_ranks=0,1 ! block layers=1-1 head_ranks=1,0 ! norm"
    # heads_of=R on threads of one process, the same pipeline over R processes: the same sums in
    # the same order (rank 0 adds the others' parts in rank order), so the same bytes; and within
    # 1e-5 of one rank
    for cfg in "" "--memory linear --causal 0 --global-tokens 0" "--memory none --global-tokens 8 --summary-tokens 2"; do
        m="$model $cfg"
        "$bin" run $m -i in.bin -o one.raw "$plain" || fail "seqflow run $cfg"
        "$bin" run $m --cpu-ranks 2 -i in.bin -o threads.raw "$plain" || fail "seqflow run --cpu-ranks 2 $cfg"
        cmp -s threads.raw one.raw && fail "$cfg: --cpu-ranks 2 gave one rank's bytes: the checks below could not fail"
        check "heads over processes 0 and 1 (${cfg:-delta memory, global tokens, causal})" threads.raw \
            "$bin" launch -n 2 -- $m -i in.bin -o out.raw "$both"
        err=$(relerr out.raw one.raw)
        awk -v e="$err" 'BEGIN { exit !(e <= 1e-5) }' || fail "$cfg: relative error $err against one rank"
        echo "ok: relative error $err against one rank"
    done
    # 4 processes, one head each; one rank holding all of them (bit for bit one rank's); two head
    # ranks of the first layer beside a third rank running the second
    "$bin" run $model --cpu-ranks 4 -i in.bin -o threads4.raw "$plain" || fail "seqflow run --cpu-ranks 4"
    check "heads over 4 processes" threads4.raw "$bin" launch -n 4 -- $model -i in.bin -o out.raw \
        "segment ! embed ! block layers=0-0 head_ranks=0,1,2,3 ! block layers=1-1 head_ranks=3,2,1,0 ! norm"
    err=$(relerr out.raw ref1.raw)
    awk -v e="$err" 'BEGIN { exit !(e <= 1e-5) }' || fail "4 processes: relative error $err against one rank"
    check "one head rank, on rank 1" ref1.raw "$bin" launch -n 2 -- $model -i in.bin -o out.raw \
        "segment ! embed ! block layers=0-0 head_ranks=1 ! block layers=1-1 ! norm"
    "$bin" run $model -i in.bin -o threads3.raw "segment ! embed ! block layers=0-0 heads_of=2 ! block layers=1-1 ! norm" ||
        fail "seqflow run heads_of=2 on layer 0"
    beside="segment ! embed ! block layers=0-0 head_ranks=1,2 ! block layers=1-1 ! norm"
    check "heads over processes 1 and 2, rank 0 beside" threads3.raw "$bin" launch -n 3 -- $model -i in.bin -o out.raw "$beside"
    # three streams batched: units of work of three streams each
    "$bin" run $model --cpu-ranks 2 $multi -o threads-b.raw "segment ! embed ! block batch=3 ! norm" ||
        fail "seqflow run --cpu-ranks 2 batch=3"
    check "three streams, batch=3, over processes 0 and 1" threads-b.raw "$bin" launch -n 2 -- $model $multi -o out.raw \
        "segment ! embed ! block batch=3 head_ranks=0,1 ! norm"
    # a following rank that fails: the job ends at once with its reason, no output left
    rm -f out.raw
    "$bin" launch -n 3 -- $model -i in.bin -o out.raw \
        "segment ! embed ! block layers=0-0 head_ranks=1,2 inject_failure=3 ! block layers=1-1 ! norm" 2> err.txt
    [ $? -eq 1 ] || { cat err.txt >&2; fail "a failing head rank: exit status not 1"; }
    grep -q "^seqflow: .*head rank 1 of 2 (job rank 2) failed: .*failure injected after 3 segments" err.txt ||
        { cat err.txt >&2; fail "a failing head rank: the driver does not say what failed"; }
    [ -z "$(ls out.raw* 2> /dev/null)" ] || fail "a failing head rank: output left behind"
    echo "ok: a failing following head rank ends the job, named"
    # kill -9 of a following rank mid-stream: named within the heartbeat timeout (1500 ms); the
    # checkpoints hold every head rank's state, and --resume gives the uninterrupted bytes
    sized_input long.bin 12000
    split -n 2 -d long.bin half
    two="-i half00 -i half01"
    for case in "2 1 $both" "3 2 $beside"; do
        set -- $case
        world=$1 victim=$2
        shift 2
        layout="$*"
        threads="$plain"
        [ "$world" = 3 ] && threads="segment ! embed ! block layers=0-0 heads_of=2 ! block layers=1-1 ! norm"
        ranks=--cpu-ranks\ 2
        [ "$world" = 3 ] && ranks=
        "$bin" run $model $ranks $two -o ref-long.raw "$threads" || fail "reference of the kill"
        start_job "$world" -- $model $two -o out.raw --checkpoint ck --checkpoint-every 2 "$layout"
        sleep 0.1
        kill_rank "$victim" "$world ranks"
        [ $status -eq 1 ] || { cat err.txt >&2; fail "$world ranks: head rank on rank $victim killed: exit status $status"; }
        # the driver names the killed rank: itself, or, with three ranks, through the error of
        # the head rank that waited on it in a collective (its links' aborts carry it, and reach
        # the driver ahead of its goodbye), never that rank for the killed one
        grep -q "^seqflow: .*rank $victim (host .*) stopped answering" err.txt ||
            { cat err.txt >&2; fail "$world ranks: the driver does not name rank $victim"; }
        awk -v t="$took" -v s="$slack" 'BEGIN { exit !(t < 1.5 + s) }' || { cat err.txt >&2; fail "$world ranks: ended $took s after the kill"; }
        [ ! -e out.raw ] || fail "$world ranks: a failed job left out.raw"
        "$bin" launch -n "$world" -- $model $two -o out.raw --checkpoint ck --checkpoint-every 2 --resume "$layout" \
            2> err2.txt || { cat err2.txt >&2; fail "$world ranks: resume"; }
        cmp -s out.raw ref-long.raw || fail "$world ranks: resumed output differs from the uninterrupted run"
        echo "ok: kill -9 of head rank on rank $victim of $world: the job ended $took s after, named it; resumed, identical"
    done
    # under launch --restart the killed head rank is started again, its owner (rank 1) rejoins
    # with it (a head rank lost to the network rolls the job back), and the job ends with the
    # uninterrupted bytes (ref-long.raw: the last layout's)
    start_job 3 --restart 1 -- $model $two -o out.raw --checkpoint ck --checkpoint-every 2 "$beside"
    sleep 0.1
    kill_rank 2 restart
    [ $status -eq 0 ] || { cat err.txt >&2; fail "restart: head rank on rank 2 killed, exit status $status"; }
    grep -q "rank 2 started again" err.txt && grep -q "^seqflow\[rank 1\]: rejoining the job" err.txt &&
        grep -q "every rank is back" err.txt || { cat err.txt >&2; fail "restart: no roll-back of every rank"; }
    cmp -s out.raw ref-long.raw || fail "restart: output after the rejoin differs from the uninterrupted run"
    echo "ok: kill -9 of head rank on rank 2 under --restart 1: started again, every rank rolled back; identical"
    # refusals: a head rank outside the job is a usage error; head_ranks= in one process is refused
    "$bin" launch -n 2 -- $model -i in.bin -o out.raw "segment ! embed ! block head_ranks=0,2 ! norm" 2> err.txt
    [ $? -eq 2 ] && grep -q "head_ranks=0,2 names rank 2, but the job has 2 ranks" err.txt ||
        { cat err.txt >&2; fail "a head rank outside the job: not refused"; }
    "$bin" run $model -i in.bin -o out.raw "segment ! embed ! block head_ranks=0,1 ! norm" 2> err.txt &&
        fail "head_ranks= in one process ran"
    grep -q "run it with .seqflow launch" err.txt || { cat err.txt >&2; fail "head_ranks= in one process: not the expected error"; }
    echo "ok: refusals"
    ;;
*)
    fail "unknown mode $mode"
    ;;
esac
exit 0
