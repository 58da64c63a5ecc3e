#!/bin/sh
# A build without CUDA (-DSEQFLOW_CUDA=OFF, or no nvcc) neither needs nor loads a CUDA library:
# the binary and libseqflow.so name none, a run with an empty library path works, and
# `-d cuda` says that this build has no CUDA backend.
# usage: cpu_only.sh SEQFLOW_BIN LIBSEQFLOW_SO
set -eu
bin=$1 lib=$2
needed=$(readelf -d "$bin" "$lib" | grep NEEDED | grep -Ei 'cuda|cublas|nvrtc|nvjitlink' || true)
if [ -n "$needed" ]; then
    echo "a CPU-only build needs CUDA libraries:"
    echo "$needed"
    exit 1
fi
LD_LIBRARY_PATH= "$bin" run -q >/dev/null
set +e
said=$("$bin" run -q -d cuda 2>&1)
status=$?
set -e
case "$status:$said" in
1:*"has no CUDA backend"*"use -d cpu"*) ;;
*) echo "-d cuda in a CPU-only build: exit $status, '$said'"; exit 1 ;;
esac
echo "CPU-only build: no CUDA library needed; -d cuda: $said"
