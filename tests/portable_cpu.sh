#!/bin/sh
# The portable build runs on an x86-64 CPU without AVX (qemu-x86_64 -cpu Nehalem, Debian's
# qemu-user) and computes the same bits there as on an AVX2 CPU (-cpu Haswell) and on this
# machine: the load-time selected copies of the hot loops (SF_CPU_DISPATCH) agree. OpenBLAS
# chooses its kernels by CPU too, so all runs pin them (OPENBLAS_CORETYPE=Prescott, which any
# x86-64 runs). Skips (77) without qemu-x86_64 or on another architecture.
# usage: portable_cpu.sh SEQFLOW_BIN
set -eu
bin=$1
[ "$(uname -m)" = x86_64 ] || { echo "skipped: not an x86-64 machine"; exit 77; }
command -v qemu-x86_64 >/dev/null || { echo "skipped: qemu-x86_64 is not installed (Debian: qemu-user)"; exit 77; }
export OPENBLAS_CORETYPE=Prescott OPENBLAS_NUM_THREADS=1
here=$("$bin" run -q -t 1)
for cpu in Nehalem Haswell; do
    there=$(qemu-x86_64 -cpu "$cpu" "$bin" run -q -t 1 2>/dev/null) || { echo "the run died on -cpu $cpu (exit $?)"; exit 1; }
    if [ "$there" != "$here" ]; then
        echo "-cpu $cpu: $there"
        echo "here:      $here"
        exit 1
    fi
done
echo "same digest natively, on Nehalem (no AVX) and on Haswell (AVX2): $here"
