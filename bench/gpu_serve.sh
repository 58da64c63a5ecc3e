#!/usr/bin/env bash
# `seqflow serve` on the GPU against the same streams in one `seqflow run -d cuda`, on the GPU
# machine (project root, after `source scripts/gpu-env.sh`; BUILD_DIR a configured CUDA build,
# as scripts/gpu-test.sh makes, or one with seqflow and the benches below built):
#
#   bash bench/gpu_serve.sh BUILD_DIR
#
# Builds BUILD_DIR's seqflow, bench_serve, bench_gpu_pipeline and bench_zmq_frames, then measures.
# The reference model (bench_gpu_pipeline --make-model --preset reference: D=1024, 16 heads,
# N=8192, 4 layers), bf16, float32 rows out. Points:
#   0. the transport alone (bench_zmq_frames): 32 MiB messages over ipc in one frame and in
#      frames of 256 KiB to 16 MiB, on 1 and 4 connections;
#   1. the reference model: 1 stream x 64 segments, 64 x 8 at the defaults (protocol
#      3: rows without a copy, in 1 MiB frames); 64 x 8 as an older client (`--protocol 2`: each
#      ROWS encoded whole, one frame), with 32 MiB frames (`--frame-bytes`) and with bf16 rows
#      (`--out-dtype bf16`, half the bytes); 1024 x 2 in float32 and bf16; latency at 50% load
#      with 4 segments a stream (1 for 1024 streams, whose 4 would take minutes);
#   2. the rows' way out alone: `segment ! embed ! norm` (computes almost nothing) at the
#      reference model's rows (32 MiB a segment), 1 x 48 and 64 x 6, as an older client and at
#      the defaults, and with 1, 2 and 4 ZeroMQ I/O threads on each side (`--io-threads`,
#      `--client-io-threads`);
#   3. a hang check: the reference model, 64 x 6, REPS times (default 10) at the defaults; each
#      run must end (exit 0) within its timeout;
#   4. rows through shared memory (`bench_serve --shm 0`: each client socket MAPs a region of the
#      server's default size) against the socket, alternating, REPS times (default 10; 2 is
#      plenty): the reference model 1 x 64, 64 x 8 and 1024 x 2 in float32 rows, 64 x 8 in bf16;
#   5. more through shared memory: 1024 x 2 in bf16 rows, and in float32 rows with regions of
#      four segments (each of 64 clients MAPs 4 x 32 MiB and 1 MiB: 8.1 GiB, hence the server's
#      `--shm-budget 9000000000`); then a hang check, REPS runs of 64 x 6 through regions.
# Each point's output and the summary go to $OUT (or /tmp/gpu_serve). PARTS="0 1 2 3 4" (default
# "0 1 2 3") picks the parts to run.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:?usage: $0 BUILD_DIR}
out=${OUT:-/tmp/gpu_serve}
parts=${PARTS:-0 1 2 3}
reps=${REPS:-10}
mkdir -p "$out"
if [ -f "$B/CMakeCache.txt" ]; then
  cmake --build "$B" -j"$(nproc)" --target seqflow bench_serve bench_gpu_pipeline bench_zmq_frames >"$out/serve-build.log" 2>&1 \
    || { tail -30 "$out/serve-build.log"; exit 1; }
fi
D=/tmp/gpu_serve_data
mkdir -p "$D"
[ -f "$D/ref.st" ] || "$B/bench/bench_gpu_pipeline" --make-model "$D/ref.st" --preset reference --seed 1 >/dev/null
summary=$out/serve-summary.txt
: >"$summary"

# point NAME STREAMS SEGMENTS LATENCY_SEGMENTS [bench options] -- [server and run options]
point() {
  local name=$1 streams=$2 segments=$3 lat=$4
  shift 4
  local log=$out/serve_$name.txt
  timeout 300 "$B/bench/bench_serve" --seqflow "$B/seqflow" --streams "$streams" --segments "$segments" --segment 8192 \
    --latency-segments "$lat" "$@" >"$log" 2>&1
  echo "$name: $streams streams x $segments segments: exit $?" | tee -a "$summary"
  grep -E "^serve:|^latency|^server:|^run:|^RESULT|^bench_serve" "$log" | tee -a "$summary"
}

trivial="segment ! embed ! norm"
for part in $parts; do
  case $part in
  0)
    for streams in 1 4; do
      "$B/bench/bench_zmq_frames" --streams "$streams" 0 262144 1048576 4194304 16777216 2>&1 | tee -a "$summary"
    done
    ;;
  1)
    point ref_1x64 1 64 4 -- -d cuda -m "$D/ref.st"
    point ref_64x8 64 8 4 -- -d cuda -m "$D/ref.st"
    point ref_64x8_protocol2 64 8 4 --protocol 2 -- -d cuda -m "$D/ref.st"
    point ref_64x8_frame32m 64 8 4 --frame-bytes 33554432 -- -d cuda -m "$D/ref.st"
    point ref_64x8_bf16 64 8 4 -- -d cuda -m "$D/ref.st" --out-dtype bf16
    point ref_1024x2 1024 2 1 -- -d cuda -m "$D/ref.st"
    point ref_1024x2_bf16 1024 2 1 -- -d cuda -m "$D/ref.st" --out-dtype bf16
    ;;
  2)
    for protocol in 2 3; do
      point "trivial_1x48_protocol$protocol" 1 48 2 --protocol "$protocol" -- -d cuda -m "$D/ref.st" "$trivial"
      point "trivial_64x6_protocol$protocol" 64 6 2 --protocol "$protocol" -- -d cuda -m "$D/ref.st" "$trivial"
    done
    for io in 1 2 4; do
      point "trivial_64x6_io$io" 64 6 2 --io-threads "$io" --client-io-threads "$io" -- -d cuda -m "$D/ref.st" "$trivial"
    done
    ;;
  3)
    for r in $(seq 1 "$reps"); do
      point "ref_64x6_rep$r" 64 6 2 -- -d cuda -m "$D/ref.st"
    done
    echo "hang check: $(grep -c 'ref_64x6_rep.*exit 0$' "$summary") of $reps runs of 64 x 6 ended (exit 0)" | tee -a "$summary"
    ;;
  4)
    for r in $(seq 1 "$reps"); do
      point "ref_1x64_socket_rep$r" 1 64 4 -- -d cuda -m "$D/ref.st"
      point "ref_1x64_shm_rep$r" 1 64 4 --shm 0 -- -d cuda -m "$D/ref.st"
      point "ref_64x8_socket_rep$r" 64 8 4 -- -d cuda -m "$D/ref.st"
      point "ref_64x8_shm_rep$r" 64 8 4 --shm 0 -- -d cuda -m "$D/ref.st"
      point "ref_1024x2_socket_rep$r" 1024 2 1 -- -d cuda -m "$D/ref.st"
      point "ref_1024x2_shm_rep$r" 1024 2 1 --shm 0 -- -d cuda -m "$D/ref.st"
      point "ref_64x8_bf16_shm_rep$r" 64 8 4 --shm 0 -- -d cuda -m "$D/ref.st" --out-dtype bf16
    done
    ;;
  5)
    point ref_1024x2_bf16_shm 1024 2 1 --shm 0 -- -d cuda -m "$D/ref.st" --out-dtype bf16
    point ref_1024x2_shm4 1024 2 1 --shm 135266304 --shm-budget 9000000000 -- -d cuda -m "$D/ref.st"
    for r in $(seq 1 "$reps"); do
      point "ref_64x6_shm_rep$r" 64 6 2 --shm 0 -- -d cuda -m "$D/ref.st"
    done
    echo "hang check: $(grep -c 'ref_64x6_shm_rep.*exit 0$' "$summary") of $reps runs of 64 x 6 through regions ended" | tee -a "$summary"
    ;;
  esac
done
