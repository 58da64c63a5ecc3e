#!/bin/sh
# The portable build on two CPU levels under qemu-user (Debian's qemu-user) and on this machine:
#   - an x86-64 without AVX (-cpu Nehalem) runs it to the end on the baseline kernels: an AVX
#     instruction there would be SIGILL;
#   - an AVX2 CPU (-cpu Haswell) runs the AVX2 + FMA kernels;
#   - each output is within 1e-5 of this machine's (relative L2 error of every row), the
#     tolerance the kernel sets promise each other (kernels/cpu/vector_rows.h);
#   - this machine gives the same bits on a second run.
# The kernel set a run took is the one its debug line names ("CPU kernels baseline|avx2").
# OpenBLAS chooses its kernels by CPU too, so all runs pin them (OPENBLAS_CORETYPE=Prescott,
# which any x86-64 runs). Skips (77) without qemu-x86_64 or on another architecture.
# usage: portable_cpu.sh SEQFLOW_BIN
set -eu
bin=$1
[ "$(uname -m)" = x86_64 ] || { echo "skipped: not an x86-64 machine"; exit 77; }
command -v qemu-x86_64 >/dev/null || { echo "skipped: qemu-x86_64 is not installed (Debian: qemu-user)"; exit 77; }
tmp=$(mktemp -d /tmp/sf-portable.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_CORETYPE=Prescott OPENBLAS_NUM_THREADS=1
width=128 # the built-in model's D: a row of the raw float32 output

# worst A B: the largest relative L2 error of a row of B against the same row of A
worst() {
    od -An -v -f -w$((4 * width)) "$1" > "$tmp/a.txt"
    od -An -v -f -w$((4 * width)) "$2" > "$tmp/b.txt"
    [ "$(wc -l < "$tmp/a.txt")" -eq "$(wc -l < "$tmp/b.txt")" ] || { echo "rows differ"; return; }
    paste -d'|' "$tmp/a.txt" "$tmp/b.txt" | awk -F'|' '{
        n = split($1, a, " "); split($2, b, " "); e = 0; w = 0
        for (i = 1; i <= n; i++) { e += (a[i] - b[i]) ^ 2; w += a[i] ^ 2 }
        r = sqrt(e) / (sqrt(w) + 1e-30); if (r > worst) worst = r
    } END { printf "%.3g\n", worst + 0 }'
}

"$bin" run -t 1 --log-level debug -o "$tmp/here.f32" 2> "$tmp/here.err"
"$bin" run -t 1 -q -o "$tmp/again.f32"
cmp -s "$tmp/here.f32" "$tmp/again.f32" || { echo "two runs on this machine differ"; exit 1; }
here=$(sed -n 's/.*CPU kernels \([a-z0-9]*\);.*/\1/p' "$tmp/here.err")
[ -n "$here" ] || { echo "no 'CPU kernels' in the debug line:"; cat "$tmp/here.err"; exit 1; }
for run in Nehalem:baseline Haswell:avx2; do
    cpu=${run%%:*} want=${run#*:}
    qemu-x86_64 -cpu "$cpu" "$bin" run -t 1 --log-level debug -o "$tmp/$cpu.f32" 2> "$tmp/$cpu.err" ||
        { echo "the run died on -cpu $cpu (exit $?):"; tail -3 "$tmp/$cpu.err"; exit 1; }
    grep -q "CPU kernels $want;" "$tmp/$cpu.err" || { echo "-cpu $cpu did not take the $want kernels:"; head -1 "$tmp/$cpu.err"; exit 1; }
    err=$(worst "$tmp/here.f32" "$tmp/$cpu.f32")
    awk -v e="$err" 'BEGIN { exit !(e <= 1e-5) }' ||
        { echo "-cpu $cpu ($want kernels): a row's relative error is $err against this machine's ($here), over 1e-5"; exit 1; }
    cmp -s "$tmp/here.f32" "$tmp/$cpu.f32" && same="the same bits" || same="other bits"
    echo "-cpu $cpu: $want kernels, ran to the end, worst row within $err of this machine's ($here kernels; $same)"
done
echo "same bits twice on this machine ($here kernels)"
