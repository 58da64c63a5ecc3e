#!/usr/bin/env bash
# Head-parallel blocks on the GPU machine, in the project root, after `source scripts/gpu-env.sh`:
#   bash scripts/gpu-heads.sh
# 1. builds build-gpu (Release, CUDA sm_90, NCCL: the toolkit's or the nvidia-nccl wheel's);
# 2. runs test_heads (CPU ranks) and test_gpu_heads (NCCL: one rank on one GPU against the
#    unsharded run, a rank that never joins or fails, resume; two ranks when two GPUs exist) and
#    test_gpu_reduce_norm (the sums that norm the rows: one rank, and split over two GPUs);
# 3. the binary: `seqflow run -d cuda --gpus N` against `-d cuda` on the built-in model; with
#    two GPUs also head ranks as processes (`seqflow launch -n 2`, `block head_ranks=0,1`, one
#    GPU a process) against both, and a follower killed mid-stream (the job must fail within
#    about its comm_timeout=);
# 4. bench_heads on the reference model: plain block, heads_of=1 (the sharded path's overhead),
#    heads_of=2 with two GPUs (the ranks' parts in bf16, also with normed_sums=0, and
#    reduce=f32): tokens/s, all-reduce time a layer, memory per GPU; test_cuda_parts (the bf16 parts' ops), and the attention on
#    a rank's 8 heads against its whole-block lab twin (bench_attention_variants, variant 36);
# 5. the GPU tests the changed kernels touch (test_gpu_pipeline, test_cuda_attention,
#    test_gpu_checkpoint, test_backend_ops), as regressions.
# HEADS_REPS: bench_heads repetitions (3); HEADS_OVERLAP: its --overlap (2). Logs go to $OUT
# (the device tool's output folder) when set, else build-gpu/heads; a summary to
# $OUT/heads-summary.txt. Each step has a time
# limit, so the whole stays under 9 minutes on a machine of 16 cores (the build is about 90 s).
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${OUT:-build-gpu/heads}
mkdir -p "$logs"
summary=$logs/heads-summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 # NVLink multicast stays off
start=$(date +%s)
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$logs/gpu.txt"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
note "date: $(date -u +%FT%TZ); GPUs: $gpus; commit: $(git rev-parse --short HEAD 2>/dev/null)"

# NCCL: the toolkit's headers and library, else those of the nvidia-nccl wheel next to PyTorch
nccl_args=()
if ! ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h >/dev/null 2>&1; then
  root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
  if [ -n "$root" ] && [ -e "$root/include/nccl.h" ]; then
    nccl_args=(-DNCCL_ROOT="$root")
    export LD_LIBRARY_PATH="$root/lib:${LD_LIBRARY_PATH:-}"
    note "NCCL from $root"
  fi
fi
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSEQFLOW_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DSEQFLOW_BUILD_TESTS=ON -DSEQFLOW_BUILD_BENCH=ON ${nccl_args[@]+"${nccl_args[@]}"} >"$logs/configure.log" 2>&1 \
  || { tail -40 "$logs/configure.log"; exit 1; }
grep -E "CUDA backend|NCCL" "$logs/configure.log" | tee -a "$summary"
targets=(seqflow test_heads test_gpu_heads test_gpu_reduce_norm bench_heads test_gpu_pipeline test_cuda_attention test_gpu_checkpoint
         test_cuda_parts test_backend_ops bench_attention_variants)
cmake --build build-gpu -j16 --target "${targets[@]}" >"$logs/build.log" 2>&1 \
  || { grep -E "error|Error" "$logs/build.log" | head -40; exit 1; }
note "build: ok ($(( $(date +%s) - start )) s)"
status=0
tests=build-gpu/tests
export SEQFLOW_TEST_TMP=$PWD/$tests/tmp OPENBLAS_NUM_THREADS=1
mkdir -p "$SEQFLOW_TEST_TMP"

# step NAME LIMIT COMMAND...: runs COMMAND under a time limit (at most what is left of 500 s
# since the start) into $logs/NAME.log; 77 is a skip
step() {
  local name=$1 limit=$2 t0 rc left
  shift 2
  t0=$(date +%s)
  left=$(( 500 - (t0 - start) ))
  if [ $left -lt 10 ]; then note "$name: not run (time)"; return 0; fi
  [ $limit -gt $left ] && limit=$left
  timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  note "$name: exit $rc ($(( $(date +%s) - t0 )) s)"
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && status=1
  return 0
}

step test_heads 60 "$tests/test_heads"
grep -E "FAIL|passed" "$logs/test_heads.log" | tail -5 | tee -a "$summary"
step test_gpu_heads 240 "$tests/test_gpu_heads"
grep -E "FAIL|vs unsharded|NCCL|rank|restore|skipped|passed" "$logs/test_gpu_heads.log" | tail -60 | tee -a "$summary"
step test_gpu_reduce_norm 60 "$tests/test_gpu_reduce_norm"
grep -E "FAIL|rank|GPUs|skipped|passed" "$logs/test_gpu_reduce_norm.log" | tail -8 | tee -a "$summary"

# the binary: --gpus N against the plain GPU run (bf16), the built-in model and text
n=$(( gpus >= 2 ? 2 : 1 ))
bin=build-gpu/seqflow
step run_plain 30 "$bin" run -q -d cuda -o "$logs/plain.f32"
step run_gpus 30 "$bin" run -q -d cuda --gpus "$n" -o "$logs/gpus.f32"
python3 - "$logs/plain.f32" "$logs/gpus.f32" "$n" <<'EOF' 2>&1 | tee -a "$summary"
import sys
import numpy as np
a = np.fromfile(sys.argv[1], dtype=np.float32)
b = np.fromfile(sys.argv[2], dtype=np.float32)
ok = a.size == b.size and a.size > 0
err = float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30)) if ok else float("nan")
print(f"binary: seqflow run -d cuda --gpus {sys.argv[3]} against -d cuda: {a.size} and {b.size} values, relative error {err:.3g}")
EOF

# head ranks as processes (docs/HEADS.md): `seqflow launch -n 2` with `block head_ranks=0,1`,
# one GPU a process (launch sets LOCAL_RANK, and a worker's -d cuda without an index takes the
# local rank's GPU), against the thread form (--gpus 2) and one GPU; then a follower killed
# mid-stream must end the job with an error within comm_timeout= (10 s here)
if [ "$gpus" -ge 2 ]; then
  step run_procs 60 "$bin" launch -n 2 -- -q -d cuda -o "$logs/procs.f32" "segment ! embed ! block head_ranks=0,1 ! norm"
  python3 - "$logs/procs.f32" "$logs/gpus.f32" "$logs/plain.f32" <<'EOF' 2>&1 | tee -a "$summary"
import os
import sys
import numpy as np
def load(p):
    return np.fromfile(p, dtype=np.float32) if os.path.exists(p) else np.zeros(0, dtype=np.float32)
p, t, one = (load(x) for x in sys.argv[1:4])
bad = 0
for name, ref in (("--gpus 2 (threads)", t), ("-d cuda (one GPU)", one)):
    ok = p.size == ref.size and p.size > 0
    err = float(np.linalg.norm(p - ref) / max(np.linalg.norm(ref), 1e-30)) if ok else float("nan")
    ok = ok and err <= 1e-3
    bad += not ok
    print(f"binary: launch -n 2 head_ranks=0,1 -d cuda against {name}: {p.size} and {ref.size} values, "
          f"relative error {err:.3g}" + ("" if ok else " FAIL"))
sys.exit(1 if bad else 0)
EOF
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  # the kill: an input far too long to finish, the follower (job rank 1: RANK=1 in its
  # environment) killed 3 s in; the job is expected to end within about comm_timeout= after
  if [ $(( 500 - ($(date +%s) - start) )) -lt 40 ]; then
    note "procs_kill: not run (time)"
  else
    head -c 100000000 /dev/urandom >"$logs/long.bin"
    timeout -k 5 90 "$bin" launch -n 2 --timeout-ms 1500 -- -q -d cuda -i "$logs/long.bin" -o "$logs/kill.f32" \
      "segment ! embed ! block head_ranks=0,1 comm_timeout=10000 ! norm" >"$logs/procs_kill.log" 2>&1 &
    lp=$!
    sleep 3
    victim=
    for c in $(pgrep -P "$lp"); do # timeout's child is launch, whose children are the workers
      for w in $(pgrep -P "$c"); do
        { tr '\0' '\n' <"/proc/$w/environ"; } 2>/dev/null | grep -qx "RANK=1" && victim=$w
      done
    done
    if [ -n "$victim" ] && kill -0 "$victim" 2>/dev/null; then
      killed=$(date +%s.%N)
      kill -9 "$victim"
      wait "$lp"
      rc=$?
      took=$(awk -v a="$killed" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
      # ended: non-zero, well within the time limit, and the job's error names the killed rank
      # (launch's verdict: rank 0 may still be in an NCCL wait, which launch then stops)
      verdict=ok
      if [ "$rc" -eq 0 ] || ! awk -v t="$took" 'BEGIN { exit !(t < 20) }' ||
         ! grep -q "rank 1 (pid $victim) was killed by signal 9" "$logs/procs_kill.log"; then
        verdict=FAIL
        status=1
      fi
      note "procs_kill: follower (pid $victim) killed, the job ended with exit $rc $took s after (comm_timeout 10 s): $verdict"
      grep -E "^seqflow:" "$logs/procs_kill.log" | tail -3 | tee -a "$summary"
    else
      wait "$lp"
      note "procs_kill: FAIL: no follower running 3 s in (launch exit $?; see procs_kill.log)"
      status=1
    fi
  fi
  rm -f "$logs/long.bin" "$logs/kill.f32"* "$logs/procs.f32"
fi
rm -f "$logs/plain.f32" "$logs/gpus.f32"

step test_cuda_parts 60 "$tests/test_cuda_parts"
grep -E "FAIL|passed|skipped|fp8" "$logs/test_cuda_parts.log" | tail -6 | tee -a "$summary"
step attention_8_heads 90 build-gpu/bench/bench_attention_variants 20 36
grep -E "8 heads|ref causal G256 |checks:" "$logs/attention_8_heads.log" | tee -a "$summary"
step bench_heads 200 build-gpu/bench/bench_heads --preset reference --segments 14 --warmup 3 --reps "${HEADS_REPS:-3}" \
  --overlap "${HEADS_OVERLAP:-2}"
grep -vE "^  rep|^RESULT" "$logs/bench_heads.log" | tail -16 | tee -a "$summary"

for t in test_gpu_pipeline test_cuda_attention test_gpu_checkpoint test_backend_ops; do
  step "$t" 120 "$tests/$t"
  grep -E "FAIL|passed|skipped" "$logs/$t.log" 2>/dev/null | tail -4 | tee -a "$summary"
done
note "total: $(( $(date +%s) - start )) s, status $status"
exit $status
