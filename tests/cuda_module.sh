#!/bin/sh
# In a CUDA build the CUDA backend is the module libseqflow-cuda.so.0: the seqflow binary and
# libseqflow.so need no CUDA library, a CPU run works where no CUDA library can be loaded (they
# are hidden in a mount namespace: each one's file is covered with /dev/null), and -d cuda
# there says that the backend cannot be loaded and why. The hiding part is skipped where
# `unshare -m` is not allowed (not root).
# usage: cuda_module.sh SEQFLOW_BIN LIBSEQFLOW_SO MODULE_SO
set -eu
bin=$1 lib=$2 module=$3
fail() { echo "cuda_module: $*"; exit 1; }
needed=$(readelf -d "$bin" "$lib" | grep NEEDED | grep -Ei 'cuda|cublas|nvrtc|nvjitlink' || true)
[ -z "$needed" ] || fail "the binary or libseqflow.so needs CUDA libraries: $needed"
readelf -d "$module" | grep -q 'NEEDED.*libcudart' || fail "$module does not link the CUDA runtime"
"$bin" run -q >/dev/null || fail "a CPU run failed"
if ! unshare -m true 2>/dev/null; then
    echo "cuda_module: no CUDA library needed; hiding them skipped (unshare -m is not allowed here)"
    exit 0
fi
# every CUDA runtime, cuBLAS and driver library the loader could find, symlinks resolved
libs=$( (ldconfig -p | awk '/lib(cudart|cublas|cublasLt|cuda)\.so/ {print $NF}';
         ls /usr/local/cuda*/lib*/lib*.so* 2>/dev/null | grep -E 'lib(cudart|cublas|cublasLt)\.so') |
       while read -r f; do readlink -f "$f"; done | sort -u)
[ -n "$libs" ] || { echo "cuda_module: no CUDA library installed to hide; the module check above is all"; exit 0; }
# shellcheck disable=SC2016
unshare -m sh -c '
    bin=$1; shift
    for f in "$@"; do mount --bind /dev/null "$f" || exit 3; done
    "$bin" run -q >/dev/null || { echo "a CPU run failed with the CUDA libraries hidden"; exit 1; }
    said=$("$bin" run -q -d cuda 2>&1) && { echo "-d cuda ran with the CUDA libraries hidden"; exit 1; }
    case "$said" in
    *"CUDA backend"*"cannot be loaded"*"use -d cpu"*) echo "hidden: $said" ;;
    *) echo "-d cuda with the CUDA libraries hidden said: $said"; exit 1 ;;
    esac' sh "$bin" $libs || fail "with the CUDA libraries hidden (exit $?)"
echo "cuda_module: CPU run without any CUDA library works; $(echo "$libs" | wc -l) libraries hidden"
