#!/usr/bin/env bash
# Builds the CUDA backend, bench/bench_cuda_compressive_memory.cu and tests/test_backend_ops.c straight with
# nvcc/gcc (independent of the rest of the tree's build state), then runs the test and the
# memory benchmark (checks against the CPU twin, then times).
# On the GPU machine, repo root: source scripts/gpu-env.sh && bash bench/run_compressive_memory_bench.sh [reps]
# Also builds tests/test_gpu_pipeline through CMake (build-gpu/) and runs it (MEM_PIPELINE_TEST=0:
# not); MEM_NCU=1 adds an Nsight Compute pass over the new kernels; variants of compressive_memory.cu placed in
# build-memvar/*.cu (ignored, carried) are checked and timed the same way (and run test_backend_ops
# while the script has run less than MEM_VARIANT_TEST_UNTIL seconds, default 170).
# Logs go to $OUT when set (the device tool), else /tmp.
set -euo pipefail
reps=${1:-50}
out=${OUT:-/tmp}
b=/tmp/membuild
mkdir -p "$b"
flags="-O3 -arch=sm_90 -I. -Iinclude -DSEQFLOW_HAVE_CUDA=1"
cflags="-O2 -march=x86-64-v3 -fno-math-errno -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -DSEQFLOW_HAVE_CUDA=1 \
  -I. -Iinclude -Itests -I/usr/local/cuda/include -fopenmp"
objs=()
pids=()
wgmma=()
# tests/test_gpu_pipeline needs the whole library: the CMake build, in the background meanwhile
# (also the fallback for the links below when the tree needs more than the files named here)
if [ "${MEM_PIPELINE_TEST:-1}" = 1 ]; then
  (cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSEQFLOW_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
     -DSEQFLOW_BUILD_EXAMPLES=OFF >/tmp/mem_cmake.log 2>&1 &&
   cmake --build build-gpu -j12 --target test_gpu_pipeline -- -k >>/tmp/mem_cmake.log 2>&1) &
  cmake_pid=$!
fi
# every kernel file but the sm_90a ones (below) with this tree's flags
for f in kernels/cuda/*.cu; do
  o=$b/$(basename "$f" .cu).cu.o
  case "$(basename "$f")" in attention_wgmma*.cu) wgmma+=("$f"); continue ;; esac
  extra=""
  [ "$(basename "$f")" = memory.cu ] && extra="-Xptxas -v"
  (nvcc $flags $extra -c -o "$o" "$f" 2> "$b/$(basename "$f").err" || { cat "$b/$(basename "$f").err"; exit 1; }) &
  pids+=($!)
  objs+=("$o")
done
for f in kernels/*.c kernels/cpu/*.c core/error.c core/process_stats.c core/packet.c model/config.c \
         tests/support/check.c tests/support/gpu.c; do
  o=$b/$(echo "$f" | tr / _).o
  gcc $cflags -c -o "$o" "$f" &
  pids+=($!)
  objs+=("$o")
done
nvcc $flags -c -o $b/bench.o bench/bench_cuda_compressive_memory.cu &
pids+=($!)
# the variants (below) compile meanwhile too
for f in build-memvar/*.cu; do
  [ -f "$f" ] || continue
  nm=$(basename "$f" .cu); rm -f $b/$nm.o
  (nvcc $flags -c -o $b/$nm.o "$f" 2> $b/$nm.err || true) &
  pids+=($!)
done
gcc $cflags -c -o $b/test.o tests/test_backend_ops.c &
pids+=($!)
# another engineer's sm_90a kernels (attention_wgmma*.cu, calling each other): all of them, or,
# when one does not build (being edited), a stub that says they cannot run, so the links work
wgmma_build() {
  local f o p ok=1 list=() ps=()
  for f in "${wgmma[@]}"; do
    o=$b/$(basename "$f" .cu).cu.o; list+=("$o")
    nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -I. -Iinclude -DSEQFLOW_HAVE_CUDA=1 -c -o "$o" "$f" \
      2> "$o.err" &
    ps+=($!)
  done
  for p in "${ps[@]}"; do wait "$p" || ok=0; done
  if [ $ok = 0 ]; then
    printf '%s\n' '#include "kernels/cuda/attention_staging.h"' \
      'bool att_wgmma_usable(const sf_attention_desc *) { return false; }' \
      'int att_wgmma_launch(int, const sf_attention_desc *, const att_branches &, const float *, const float *,' \
      '                     const float *, float *, unsigned char *, cudaStream_t) { return -1; }' > $b/wgmma_stub.cu
    nvcc $flags -c -o $b/wgmma_stub.o $b/wgmma_stub.cu && list=($b/wgmma_stub.o) || list=()
    echo "note: ${wgmma[*]} left out (do not build), stub: ${list[*]:-none}"
  fi
  printf '%s\n' "${list[@]}" > $b/wgmma.objs
}
rm -f $b/wgmma.err $b/wgmma.objs
wgmma_build &
pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
while read -r o; do [ -n "$o" ] && objs+=("$o"); done < $b/wgmma.objs
cp $b/memory.cu.err "$out/ptxas_memory.txt"
libs="-lcublas -lcublasLt -lopenblas -Xcompiler -fopenmp"
cmake_done=0
wait_cmake() {
  if [ -n "${cmake_pid:-}" ] && [ $cmake_done = 0 ]; then
    wait $cmake_pid; echo "cmake build: exit $?"; tail -3 /tmp/mem_cmake.log; cmake_done=1
  fi
}
# link_bench NAME [memory object]: the benchmark with this tree's backend, or the CMake library
link_bench() {
  local name=$1 mem=${2:-$b/compressive_memory.cu.o}
  local rest=$(printf '%s\n' "${objs[@]}" | grep -v '/compressive_memory.cu.o$')
  nvcc -arch=sm_90 -o $b/$name $b/bench.o $mem $rest $libs 2>/tmp/link_$name.err && return 0
  echo "note: $name: plain link failed ($(grep -m1 -o 'undefined reference to .*' /tmp/link_$name.err)); using the CMake library"
  wait_cmake
  nvcc -arch=sm_90 -o $b/$name $b/bench.o $mem build-gpu/libseqflow.a -lcublas -lcublasLt \
    $(pkg-config --libs openblas libcjson liblz4 libzstd) -Xcompiler -fopenmp
}
link_bench bench_mem
test_bin=$b/test_backend_ops
if ! nvcc -arch=sm_90 -o $test_bin $b/test.o "${objs[@]}" $libs 2>/tmp/link_test.err; then
  echo "note: test_backend_ops from the CMake build"; wait_cmake; test_bin=$PWD/build-gpu/tests/test_backend_ops
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
date -u | tee -a "$out/gpu.txt"
# what the tiled kernels compile to: FMAs, 16-byte shared loads, local memory (spills)
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass $b/compressive_memory.cu.o | awk '/Function :/ {f=$3} /FFMA/ {ffma[f]++} /LDS.128/ {lds[f]++}
    /LDG.E.128/ {ldg[f]++} /LDL|STL/ {loc[f]++} /HMMA/ {hmma[f]++}
    END {for (f in ffma) printf "%s FFMA %d HMMA %d LDS.128 %d LDG.128 %d local %d\n", f, ffma[f], hmma[f], lds[f],
      ldg[f], loc[f]}' \
    > "$out/sass_memory.txt" || true
fi
set +e
# once with the default products, then with each of the tiled kernels' products forced
(cd /tmp && OPENBLAS_NUM_THREADS=4 $test_bin) > "$out/test_backend_ops.txt" 2>&1
echo "test_backend_ops: exit $?"
grep -E "FAIL|passed|failed" "$out/test_backend_ops.txt" | tail -30
for products in ${MEM_TEST_PRODUCTS:-mma fma}; do
  (cd /tmp && SEQFLOW_CUDA_MEMORY=$products OPENBLAS_NUM_THREADS=4 $test_bin) > /tmp/test_backend_ops_$products.txt 2>&1
  echo "test_backend_ops SEQFLOW_CUDA_MEMORY=$products: exit $? $(grep -E 'passed|failed' /tmp/test_backend_ops_$products.txt | tail -1)" |
    tee -a "$out/test_backend_ops.txt"
  grep -E "FAIL" /tmp/test_backend_ops_$products.txt | head -20 | tee -a "$out/test_backend_ops.txt"
done
wait_cmake
OPENBLAS_NUM_THREADS=4 $b/bench_mem "$reps" 2>&1 | tee "$out/bench_memory.txt"
# the CMake build fails when another engineer's sm_90a file does not build: test_gpu_pipeline is
# then linked from the objects it did build, the sm_90a ones replaced as for the links above
pipeline_fallback() {
  local t=build-gpu/tests
  [ -f $t/CMakeFiles/test_gpu_pipeline.dir/test_gpu_pipeline.c.o ] && [ -f $t/libseqflow_test_support.a ] || return 1
  rm -f $b/libseqflow_nowgmma.a
  ar rcs $b/libseqflow_nowgmma.a $(find build-gpu/CMakeFiles/seqflow_objects.dir -name '*.o') $(cat $b/wgmma.objs) &&
  sed "s#\.\./libseqflow\.a#$b/libseqflow_nowgmma.a#" $t/CMakeFiles/test_gpu_pipeline.dir/linkLibs.rsp > $b/pipe_libs.rsp &&
  (cd $t && g++ CMakeFiles/test_gpu_pipeline.dir/test_gpu_pipeline.c.o -o test_gpu_pipeline @$b/pipe_libs.rsp \
     -L/usr/local/cuda/targets/x86_64-linux/lib/stubs -L/usr/local/cuda/targets/x86_64-linux/lib) &&
  echo "note: test_gpu_pipeline linked with $(cat $b/wgmma.objs | xargs -n1 basename | tr '\n' ' ')"
}
if [ "${MEM_PIPELINE_TEST:-1}" = 1 ]; then
  wait_cmake
  [ -x build-gpu/tests/test_gpu_pipeline ] || pipeline_fallback || echo "test_gpu_pipeline: not built"
fi
if [ -x build-gpu/tests/test_gpu_pipeline ]; then
  # (MEM_PIPELINE_PRODUCTS=mma or fma: the memory kernels' products there; default: memory.cu's)
  (cd build-gpu/tests && mkdir -p tmp && SEQFLOW_TEST_TMP=$PWD/tmp OPENBLAS_NUM_THREADS=1 \
     env ${MEM_PIPELINE_PRODUCTS:+SEQFLOW_CUDA_MEMORY=$MEM_PIPELINE_PRODUCTS} timeout 60 ./test_gpu_pipeline) \
     > "$out/test_gpu_pipeline.txt" 2>&1
  echo "test_gpu_pipeline (${MEM_PIPELINE_PRODUCTS:-default} products): exit $?"
  grep -E "FAIL|passed|failed|skipped" "$out/test_gpu_pipeline.txt" | tail -15
fi
# variants of memory.cu carried in build-memvar/ (outside the tree): the benchmark (its checks and
# times) and test_backend_ops, each linked with the variant
if [ -d build-memvar ]; then
  : > "$out/bench_variants.txt"
  for f in build-memvar/*.cu; do
    nm=$(basename "$f" .cu)
    { { [ -f $b/$nm.o ] || { cat $b/$nm.err; false; }; } && link_bench bench_$nm $b/$nm.o &&
        OPENBLAS_NUM_THREADS=4 $b/bench_$nm "$reps"; echo "variant $nm bench: exit $?"; } >> "$out/bench_variants.txt" 2>&1
    rest=$(printf '%s\n' "${objs[@]}" | grep -v '/compressive_memory.cu.o$')
    # (not when time runs short: the tree's own test run covers them)
    if [ $SECONDS -lt ${MEM_VARIANT_TEST_UNTIL:-170} ] && nvcc -arch=sm_90 -o $b/test_$nm $b/test.o $b/$nm.o $rest $libs 2>/dev/null; then
      (cd /tmp && OPENBLAS_NUM_THREADS=4 $b/test_$nm) > /tmp/test_$nm.txt 2>&1
      echo "variant $nm test_backend_ops: exit $? $(grep -E 'passed|failed' /tmp/test_$nm.txt | tail -1)" \
        >> "$out/bench_variants.txt"
    fi
  done
fi
# the tiled kernels under Nsight Compute (clocks left as they are)
if [ "${MEM_NCU:-0}" = 1 ] && [ $SECONDS -lt 220 ] && command -v ncu >/dev/null; then
  timeout 50 ncu --clock-control none -k regex:'tiled|64_kernel|chunk_reduce' --launch-count 6 --section SpeedOfLight \
    --section Occupancy --section WarpStateStats --section LaunchStats $b/bench_mem 0 > "$out/ncu_memory.txt" 2>&1
  grep -E "64_kernel|tiled|chunk_reduce|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Warp Cycles Per Issued" \
    "$out/ncu_memory.txt" | head -60
fi
# summary last (the device tool returns the end of the output)
echo "== summary"
grep -E "FAIL|checks passed|FAILED" "$out/bench_memory.txt" | tail -3
grep -E "^\| " "$out/bench_memory.txt"
[ -f "$out/bench_variants.txt" ] && grep -E "^\| (memory|update)|variant|FAIL" "$out/bench_variants.txt"
grep -E "passed|failed" "$out/test_backend_ops.txt" | tail -3
[ -f "$out/test_gpu_pipeline.txt" ] && grep -E "passed|failed" "$out/test_gpu_pipeline.txt" | tail -1
exit 0
