#!/bin/sh
# cmake/cuda_quiet.sh drops ptxas's note C7519 and nothing else: other ptxas notes, compiler
# warnings, standard output and the exit status pass unchanged.
# usage: cuda_quiet.sh LAUNCHER WORK_DIR
set -eu
launcher=$1 work=$2
mkdir -p "$work"
cat >"$work/fake_nvcc.sh" <<'FAKE'
echo "ptxas info    : (C7519) warpgroup.arrive is injected in around line 12 by compiler to allow use of registers in GMMA in function '_Z3fooPf'" >&2
echo "ptxas info    : (C7517) warpgroup.wait is injected in around line 13 by compiler to allow use of registers defined by GMMA in function '_Z3fooPf'" >&2
echo "kernel.cu(3): warning #177-D: variable x was declared but never referenced" >&2
echo "object written"
exit 3
FAKE
set +e
sh "$launcher" sh "$work/fake_nvcc.sh" >"$work/out" 2>"$work/err"
status=$?
set -e
fail() { echo "cuda_quiet: $*"; cat "$work/err"; exit 1; }
[ "$status" = 3 ] || fail "exit status $status, not 3"
[ "$(cat "$work/out")" = "object written" ] || fail "standard output changed"
grep -q C7519 "$work/err" && fail "C7519 passed"
grep -q C7517 "$work/err" || fail "C7517 was dropped"
grep -q "warning #177-D" "$work/err" || fail "a compiler warning was dropped"
[ "$(wc -l <"$work/err")" -eq 2 ] || fail "stderr has $(wc -l <"$work/err") lines, not 2"
echo "cuda_quiet: only C7519 dropped"
