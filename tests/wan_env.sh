# A two-machine WAN on one host, for tests/wan_netns.sh and bench/bench_wan.sh (sourced, sh).
# Two network namespaces joined by a veth pair (10.201.0.1 | 10.201.0.2), each end capped by a
# tbf qdisc, and one sf_tcp_proxy per direction holding every byte WAN_DELAY_MS (the one-way
# delay; a connection's round trip is twice that):
#
#   namespace A (rank 0)                          namespace B (rank 1)
#   rank 0 binds 10.201.0.1:7001  <- proxy in B listening on 10.201.0.2:7101 (rank 0's endpoint)
#   proxy in A on 10.201.0.1:7102 -> rank 1 binds 10.201.0.2:7002 (rank 1's endpoint: the proxy)
#   rendezvous 10.201.0.1:7000 (over the veth, not delayed)
#
# Ports are the namespaces' own, so parallel runs (names carry the PID) do not collide.
# Needs root, ip and tc. Functions:
#   wan_setup DIR        makes the namespaces, the veth pair and the qdiscs (DIR: scratch
#                        files); returns 77 with "skipped: <reason>" on stdout when it cannot
#   wan_topology DIR LINKS_JSON  writes DIR/topology.json and DIR/rank{0,1}.key for the two
#                        ranks (CURVE keys from `seqflow launch --write-topology`); LINKS_JSON
#                        is the topology's "links" object
#   wan_run DIR OUTPUT_PREFIX ARGS...  starts the proxies, runs rank 1 in B and rank 0 in A
#                        with the same worker options (rank R's stderr in OUTPUT_PREFIX.rankR),
#                        stops the proxies; returns rank 0's status (else rank 1's) and sets
#                        wan_wire_bytes (what the proxies forwarded, both ways)
#   wan_cleanup          stops the proxies, deletes the namespaces (trap it on EXIT)
# Variables: SEQFLOW_BIN, SF_TCP_PROXY (the programs), WAN_DELAY_MS (default 25),
# WAN_RATE (tbf rate, default 1gbit), WAN_CUT_AFTER_BYTES (the proxy to rank 1 resets its
# connections once, after that many bytes; default never).

wan_a=sfwan-$$-a
wan_b=sfwan-$$-b
wan_pids=""
wan_made=""

wan_cleanup() {
    [ -n "${wan_worker:-}" ] && kill "$wan_worker" 2> /dev/null
    for p in $wan_pids; do kill "$p" 2> /dev/null; done
    for p in $wan_pids; do wait "$p" 2> /dev/null; done
    wan_pids=""
    for ns in $wan_made; do ip netns del "$ns" 2> /dev/null; done
    wan_made=""
}

wan_skip() { echo "skipped: $*"; return 77; }

wan_setup() {
    wan_dir=$1
    [ "$(id -u)" = 0 ] || { wan_skip "not root (network namespaces need it)"; return 77; }
    command -v ip > /dev/null || { wan_skip "no ip command"; return 77; }
    command -v tc > /dev/null || { wan_skip "no tc command"; return 77; }
    ip netns add "$wan_a" 2> "$wan_dir/ns.err" || { wan_skip "cannot make a network namespace: $(cat "$wan_dir/ns.err")"; return 77; }
    wan_made="$wan_a"
    ip netns add "$wan_b" 2> "$wan_dir/ns.err" || { wan_skip "cannot make a network namespace: $(cat "$wan_dir/ns.err")"; return 77; }
    wan_made="$wan_a $wan_b"
    ip -n "$wan_a" link add va type veth peer name vb netns "$wan_b" 2> "$wan_dir/ns.err" ||
        { wan_skip "cannot make a veth pair: $(cat "$wan_dir/ns.err")"; return 77; }
    ip -n "$wan_a" addr add 10.201.0.1/24 dev va && ip -n "$wan_b" addr add 10.201.0.2/24 dev vb &&
        ip -n "$wan_a" link set va up && ip -n "$wan_b" link set vb up &&
        ip -n "$wan_a" link set lo up && ip -n "$wan_b" link set lo up || return 1
    for side in "$wan_a va" "$wan_b vb"; do
        set -- $side
        tc -n "$1" qdisc add dev "$2" root tbf rate "${WAN_RATE:-1gbit}" burst 256kb latency 50ms 2> "$wan_dir/ns.err" ||
            { wan_skip "no tbf qdisc: $(cat "$wan_dir/ns.err")"; return 77; }
    done
    return 0
}

# starts the two proxies (files in $1)
wan_proxies_start() {
    wan_delay=${WAN_DELAY_MS:-25}
    rm -f "$1/proxy-a.port" "$1/proxy-b.port"
    ip netns exec "$wan_a" "$SF_TCP_PROXY" --listen 10.201.0.1:7102 --target 10.201.0.2:7002 --delay-ms "$wan_delay" \
        --cut-after-bytes "${WAN_CUT_AFTER_BYTES:-0}" --ready-file "$1/proxy-a.port" > "$1/proxy-a.out" &
    wan_pids="$wan_pids $!"
    ip netns exec "$wan_b" "$SF_TCP_PROXY" --listen 10.201.0.2:7101 --target 10.201.0.1:7001 --delay-ms "$wan_delay" \
        --ready-file "$1/proxy-b.port" > "$1/proxy-b.out" &
    wan_pids="$wan_pids $!"
    n=0
    while [ ! -s "$1/proxy-a.port" ] || [ ! -s "$1/proxy-b.port" ]; do
        n=$((n + 1))
        [ $n -lt 250 ] || { echo "the proxies did not start" >&2; return 1; }
        sleep 0.02
    done
}

# stops them; wan_wire_bytes = the bytes they forwarded, both ways (TCP payload: ZeroMQ's
# framing and CURVE included)
wan_proxies_stop() {
    for p in $wan_pids; do kill "$p" 2> /dev/null; done
    for p in $wan_pids; do wait "$p" 2> /dev/null; done
    wan_pids=""
    wan_wire_bytes=$(cat "$1/proxy-a.out" "$1/proxy-b.out" |
        awk '{ for (i = 1; i <= NF; i++) if ($i == "bytes") s += $(i - 1) } END { printf "%.0f", s }')
}

wan_topology() {
    rm -rf "$1/keys"
    "$SEQFLOW_BIN" launch -n 2 --write-topology "$1/keys" > /dev/null || return 1
    cp "$1/keys/rank0.key" "$1/keys/rank1.key" "$1/" && chmod 600 "$1/rank0.key" "$1/rank1.key" || return 1
    python3 - "$1/keys/topology.json" "$1/topology.json" "$2" << 'PY' || return 1
import json, sys
src, dst, links = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
keys = {r["id"]: r["public_key"] for dc in json.load(open(src))["datacenters"] for n in dc["nodes"] for r in n["ranks"]}
topology = {
    "version": 1, "security": "curve", "rendezvous": "tcp://10.201.0.1:7000",
    "heartbeat_ms": 500, "timeout_ms": 5000, "connect_timeout_ms": 10000, "rendezvous_timeout_ms": 20000,
    "datacenters": [
        {"name": "a", "nodes": [{"name": "a-1", "host": "10.201.0.1", "ranks": [
            {"id": 0, "endpoint": "tcp://10.201.0.2:7101", "bind": "tcp://10.201.0.1:7001", "public_key": keys[0]}]}]},
        {"name": "b", "nodes": [{"name": "b-1", "host": "10.201.0.2", "ranks": [
            {"id": 1, "endpoint": "tcp://10.201.0.1:7102", "bind": "tcp://10.201.0.2:7002", "public_key": keys[1]}]}]}],
    "links": links,
}
json.dump(topology, open(dst, "w"), indent=1)
PY
}

wan_run() {
    dir=$1 prefix=$2
    shift 2
    wan_proxies_start "$dir" || return 1
    ip netns exec "$wan_b" "$SEQFLOW_BIN" worker --topology "$dir/topology.json" --key "$dir/rank{rank}.key" \
        --rank 1 --world 2 "$@" 2> "$prefix.rank1" &
    r1=$!
    wan_worker=$r1
    ip netns exec "$wan_a" "$SEQFLOW_BIN" worker --topology "$dir/topology.json" --key "$dir/rank{rank}.key" \
        --rank 0 --world 2 "$@" 2> "$prefix.rank0"
    s0=$?
    wait $r1
    s1=$?
    wan_worker=""
    wan_proxies_stop "$dir"
    [ $s0 -ne 0 ] && return $s0
    return $s1
}
