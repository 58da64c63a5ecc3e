#!/bin/sh
# The C code of the library and the binary compiles for arm64 (aarch64-linux-gnu-gcc, Debian's
# gcc-aarch64-linux-gnu): no x86 instruction or header outside a guard. Objects only (the arm64
# builds of OpenBLAS, zstd, ... would be needed to link); the dependencies' headers are the
# host's, taken after the cross compiler's own. Skips (77) without the cross compiler.
# usage: cross_aarch64.sh SOURCE_DIR WORK_DIR
set -eu
src=$1 work=$2
cc=aarch64-linux-gnu-gcc
command -v "$cc" >/dev/null || { echo "skipped: $cc is not installed (Debian: gcc-aarch64-linux-gnu)"; exit 77; }
blas=$(pkg-config --cflags-only-I openblas 2>/dev/null || true)
mkdir -p "$work"
failed=0 count=0
for f in "$src"/core/*.c "$src"/compress/*.c "$src"/state/*.c "$src"/model/*.c "$src"/kernels/*.c \
         "$src"/kernels/cpu/*.c "$src"/pipeline/*.c "$src"/stages/*.c "$src"/tools/*.c; do
    [ -f "$f" ] || continue
    count=$((count + 1))
    # shellcheck disable=SC2086
    if ! $cc -std=c11 -O2 -fopenmp -fPIC -Wall -Werror=implicit-function-declaration -D_POSIX_C_SOURCE=200809L \
         -D_DEFAULT_SOURCE -I"$src" -I"$src/include" $blas -idirafter /usr/include \
         -c "$f" -o "$work/$(basename "$f" .c).o" 2>"$work/err"; then
        echo "$f:"
        cat "$work/err"
        failed=$((failed + 1))
    fi
done
[ "$failed" -eq 0 ] || { echo "$failed of $count files do not compile for aarch64"; exit 1; }
file "$work"/*.o 2>/dev/null | grep -qv aarch64 && { echo "an object is not aarch64"; exit 1; }
echo "all $count C files compile for aarch64"
