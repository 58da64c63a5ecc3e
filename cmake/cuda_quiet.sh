#!/bin/sh
# Compiler launcher for the CUDA objects: runs the command it is given and passes its output
# on, less exactly one kind of line, ptxas's advisory note C7519
#   ptxas info    : (C7519) warpgroup.arrive is injected in around line N by compiler to allow
#                   use of registers in GMMA in function '...'
# which the wgmma kernels draw on every fresh build and which asks for no action (ptxas has no
# option that turns this one note off). Every other line, and the exit status, pass unchanged.
err=$(mktemp "${TMPDIR:-/tmp}/cuda_quiet.XXXXXX") || exec "$@"
"$@" 2>"$err"
status=$?
grep -v -E '^ptxas info *: \(C7519\) warpgroup\.arrive is injected ' "$err" >&2
rm -f "$err"
exit $status
