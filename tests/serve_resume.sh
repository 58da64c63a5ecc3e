#!/bin/sh
# `seqflow serve --checkpoint` killed with SIGKILL mid-stream and restarted on the same
# directory: three examples/serve_client processes (paced, so that the kill lands mid-stream)
# resume their streams and write exactly the rows `seqflow run` writes for their files, byte for
# byte; the server restarted says it loaded their streams. Then a checkpoint with a flipped byte
# is refused at start (exit 1, naming the checksum) and one written for another model is refused
# naming the difference.
# CLIENT_EXTRA: options for the clients (`-m`: rows through shared memory, a region mapped again
# from the restarted server).
# usage: serve_resume.sh SEQFLOW_BIN SERVE_CLIENT_BIN [CLIENT_EXTRA]
set -eu
bin=$1 client=$2 client_extra=${3:-}
dir=$(mktemp -d "${TMPDIR:-/tmp}/seqflow-resume.XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
model="--dim 64 --layers 1 --segment 64 --branches 16:1,32:2,64:4 --mlp 64 -t 1"
fail() { echo "serve_resume: $*"; for f in "$dir"/*.err; do echo "== $f"; cat "$f"; done; exit 1; }
start() { # start LOG: the server on the checkpoint directory, its pid in $pid
  # shellcheck disable=SC2086
  "$bin" serve --bind "ipc://$dir/s.sock" --plaintext $model --idle-timeout 20 \
    --checkpoint "$dir/ckpt" --checkpoint-every 0.05 2>"$dir/$1" &
  pid=$!
}
for f in a b c; do head -c 24000 /dev/urandom >"$dir/$f.bin"; done
start serve1.err
i=0
for f in a b c; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  "$client" $client_extra -i "$i" -r 8000 -R 20 -o "$dir/$f.f32" "ipc://$dir/s.sock" "$dir/$f.bin" 2>"$dir/$f.err" &
  eval "c_$f=\$!"
done
# kill once a few checkpoints hold the streams, well before the 3 s the clients take: 0.6 s
# after the first checkpoint, whose time depends on the machine (a sanitizer build on two busy
# cores starts the server slowly)
n=0
until ls "$dir"/ckpt/ckpt-*.sqf >/dev/null 2>&1; do
  n=$((n + 1))
  [ "$n" -le 100 ] || fail "no checkpoint after 10 s"
  sleep 0.1
done
sleep 0.6
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
pid=""
sleep 0.3
start serve2.err
for f in a b c; do
  eval "wait \$c_$f" || fail "client $f failed"
done
grep -q "loaded: 3 stream(s)" "$dir/serve2.err" || fail "the restarted server did not load the 3 streams"
resumed=0
for f in a b c; do
  # shellcheck disable=SC2086
  "$bin" run -q -i "$dir/$f.bin" -o "$dir/$f.ref.f32" $model
  cmp "$dir/$f.f32" "$dir/$f.ref.f32" || fail "client $f: rows differ from seqflow run's"
  grep -Eq "resumed at position [1-9]" "$dir/$f.err" && resumed=$((resumed + 1))
done
[ "$resumed" -eq 3 ] || fail "$resumed of 3 clients resumed past position 0"
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=""
[ "$status" -eq 0 ] || fail "seqflow serve exited $status"
case " $client_extra " in
*" -m "*) grep -q "ROWS through clients' shared-memory regions" "$dir/serve2.err" ||
  fail "the restarted server placed no rows in the clients' regions" ;;
esac
# a damaged checkpoint: refused at start, naming the checksum; nothing is served from it
newest=$(ls "$dir"/ckpt/ckpt-*.sqf | tail -n 1)
for old in "$dir"/ckpt/ckpt-*.sqf; do [ "$old" = "$newest" ] || rm -f "$old"; done
size=$(wc -c <"$newest")
printf 'X' | dd of="$newest" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
status=0
# shellcheck disable=SC2086
"$bin" serve --bind "ipc://$dir/s2.sock" --plaintext $model --checkpoint "$dir/ckpt" 2>"$dir/damaged.err" || status=$?
[ "$status" -eq 1 ] || fail "a damaged checkpoint: exit $status, not 1"
grep -q "checksum" "$dir/damaged.err" && grep -q "no valid checkpoint" "$dir/damaged.err" ||
  fail "a damaged checkpoint: no clear message"
# a checkpoint of another model: refused, naming what differs
rm -rf "$dir/ckpt2"
# shellcheck disable=SC2086
"$bin" serve --bind "ipc://$dir/s3.sock" --plaintext $model --checkpoint "$dir/ckpt2" 2>"$dir/other.err" &
pid=$!
sleep 0.5
kill -TERM "$pid"
wait "$pid" || fail "a server stopped by SIGTERM did not exit 0"
pid=""
ls "$dir"/ckpt2/ckpt-*.sqf >/dev/null 2>&1 && fail "a server with no stream wrote a checkpoint"
# one stream, then a stop: the checkpoint written at the stop holds it
# shellcheck disable=SC2086
"$bin" serve --bind "ipc://$dir/s3.sock" --plaintext $model --checkpoint "$dir/ckpt2" 2>"$dir/other.err" &
pid=$!
"$client" -i 9 -o "$dir/d.f32" "ipc://$dir/s3.sock" "$dir/a.bin" >/dev/null 2>"$dir/d.err" || fail "client d failed"
kill -TERM "$pid"
wait "$pid" || fail "exit status after SIGTERM"
pid=""
status=0
# shellcheck disable=SC2086
"$bin" serve --bind "ipc://$dir/s3.sock" --plaintext $model --layers 2 --checkpoint "$dir/ckpt2" 2>"$dir/other.err" || status=$?
[ "$status" -eq 1 ] && grep -q "different model configuration" "$dir/other.err" ||
  fail "a checkpoint of another model: exit $status"
echo "serve_resume: 3 clients resumed after SIGKILL, rows identical to seqflow run; damaged and foreign checkpoints refused"
