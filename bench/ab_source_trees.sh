#!/usr/bin/env bash
# Compares this source tree with another one (e.g. an older release unpacked with `git archive`)
# on the GPU machine: the wall time of each tree's CUDA build from clean, then the steady rate of
# each tree's `seqflow` binary on one model (bench/ab_builds.sh: alternating pairs, median ratio).
#
#   source scripts/gpu-env.sh && bash bench/ab_source_trees.sh OTHER_TREE [MODEL]
#
# Builds OTHER_TREE into OTHER_TREE/build-gpu and this tree into build-gpu (Release, sm_90, tests
# and benches on, -j$(nproc)), each timed from an empty build folder. MODEL as ab_builds.sh takes
# it (default reference). Logs and build_times.txt go to $OUT (or /tmp/ab_out).
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h | --help | "") echo "usage: $0 OTHER_TREE [MODEL]  (AB_PAIRS, OUT)"; exit 2 ;; esac
other=$(cd "$1" && pwd) || exit 2
model=${2:-reference}
out=${OUT:-/tmp/ab_out}
mkdir -p "$out"
build() { # source_dir log_name
  rm -rf "$1/build-gpu"
  cmake -S "$1" -B "$1/build-gpu" -DCMAKE_BUILD_TYPE=Release -DSEQFLOW_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DSEQFLOW_BUILD_TESTS=ON -DSEQFLOW_BUILD_BENCH=ON -DSEQFLOW_BUILD_EXAMPLES=ON >"$out/$2.configure.log" 2>&1 || return 1
  local t0 t1
  t0=$(date +%s.%N)
  cmake --build "$1/build-gpu" -j"$(nproc)" >"$out/$2.build.log" 2>&1 || return 1
  t1=$(date +%s.%N)
  python3 -c "print('$2 build: %.1f s wall, -j$(nproc)' % ($t1 - $t0))" | tee -a "$out/build_times.txt"
}
build "$other" other || { echo "build of $other failed: $out/other.build.log"; exit 1; }
build "$PWD" this || { echo "build of this tree failed: $out/this.build.log"; exit 1; }
OUT=$out bash bench/ab_builds.sh "$other/build-gpu" build-gpu "$model"
