#!/bin/sh
# examples/serve_client against `seqflow serve --plaintext` on an ipc socket: two clients at once
# get the rows `seqflow run` writes for their files, byte for byte; the server stops on SIGTERM
# with exit 0. EXTRA: options for both (e.g. `-d cuda`, which the GPU machine's runs pass);
# CLIENT_EXTRA: options for the clients (`-m`: rows through shared memory, which the server's
# summary must then count).
# usage: serve_client.sh SEQFLOW_BIN SERVE_CLIENT_BIN [EXTRA [CLIENT_EXTRA]]
set -eu
bin=$1 client=$2 extra=${3:-} client_extra=${4:-}
dir=$(mktemp -d "${TMPDIR:-/tmp}/seqflow-serve.XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
model="--dim 64 --layers 1 --segment 64 --branches 16:1,32:2,64:4 --mlp 64 -t 1 $extra"
head -c 5000 /dev/urandom >"$dir/a.bin"
head -c 777 /dev/urandom >"$dir/b.bin"
# shellcheck disable=SC2086
"$bin" serve --bind "ipc://$dir/s.sock" --plaintext $model 2>"$dir/serve.err" &
pid=$!
# shellcheck disable=SC2086
"$client" $client_extra -i 1 -o "$dir/a.f32" "ipc://$dir/s.sock" "$dir/a.bin" &
apid=$!
# shellcheck disable=SC2086
"$client" $client_extra -i 2 -o "$dir/b.f32" "ipc://$dir/s.sock" "$dir/b.bin"
wait "$apid"
for f in a b; do
  # shellcheck disable=SC2086
  "$bin" run -q -i "$dir/$f.bin" -o "$dir/$f.ref.f32" $model
  cmp "$dir/$f.f32" "$dir/$f.ref.f32"
done
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=""
[ "$status" -eq 0 ] || { echo "seqflow serve exited $status"; cat "$dir/serve.err"; exit 1; }
grep -q "served 5777 tokens in" "$dir/serve.err" || { cat "$dir/serve.err"; exit 1; }
case " $client_extra " in
*" -m "*)
  grep -q "ROWS through clients' shared-memory regions" "$dir/serve.err" || { cat "$dir/serve.err"; exit 1; }
  echo "serve_client: 2 clients through shared memory, rows identical to seqflow run" ;;
*) echo "serve_client: 2 clients, rows identical to seqflow run" ;;
esac
