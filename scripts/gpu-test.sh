#!/usr/bin/env bash
# On the GPU machine, after `source scripts/gpu-env.sh`: a Release build with CUDA for sm_90 in
# build-gpu, then every ctest test there (the GPU ones run instead of skipping). Logs go to
# $OUT (the device tool's output folder) when it is set, else to build-gpu/. Extra arguments go
# to ctest (e.g. -R 'backend_ops|gpu_pipeline').
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${OUT:-build-gpu}
mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$logs/gpu.txt"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSEQFLOW_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DSEQFLOW_BUILD_TESTS=ON -DSEQFLOW_BUILD_BENCH=ON -DSEQFLOW_BUILD_EXAMPLES=ON >"$logs/configure.log" 2>&1 \
  || { tail -40 "$logs/configure.log"; exit 1; }
grep "CUDA backend" "$logs/configure.log"
cmake --build build-gpu -j16 >"$logs/build.log" 2>&1 || { grep -E "error|Error" "$logs/build.log" | head -40; exit 1; }
echo "build: ok"
(cd build-gpu && ctest --output-on-failure -j8 --timeout 240 "$@") >"$logs/ctest.log" 2>&1
status=$?
# the GPU tests again on their own, for their per-case errors (ctest shows output only on failure)
for t in test_backend_ops test_gpu_pipeline test_gpu_checkpoint; do
  (cd build-gpu/tests && SEQFLOW_TEST_TMP=$PWD/tmp OPENBLAS_NUM_THREADS=1 ./$t) >"$logs/$t.log" 2>&1
  echo "$t: exit $?"; grep -E "FAIL|rel err|passed|skipped" "$logs/$t.log" | tail -60
done
tail -25 "$logs/ctest.log"
exit $status
