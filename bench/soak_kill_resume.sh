#!/bin/sh
# The kill/resume loop of tests/distributed_cli.sh, long: kill -9 of a worker or of rank 0 of a
# 3-process `seqflow launch` at seeded random points after its first checkpoint, each followed by --resume, whose output
# must be the uninterrupted run's byte for byte.
#   bench/soak_kill_resume.sh [BIN] [KILLS] [SEED]     (defaults: build/seqflow 100 1)
set -u
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "$(dirname "${1:-build/seqflow}")" && pwd)/$(basename "${1:-build/seqflow}")
log=$(mktemp /tmp/soak_kill_resume.XXXXXX)
start=$(date +%s)
SEQFLOW_BIN=$bin SEQFLOW_TEST_KILLS=${2:-100} SEQFLOW_TEST_SEED=${3:-1} sh "$here/../tests/distributed_cli.sh" kill > "$log" 2>&1
status=$?
grep -v '^ok: kill' "$log"
awk '/^ok: kill/ { n++; if ($0 ~ /\(exit 0\)/) early++; else if ($0 ~ /rank 0 /) driver++ }
     END { printf "%d runs passed: %d killed a worker, %d killed rank 0, %d finished before the kill\n",
                  n, n - early - driver, driver, early }' "$log"
echo "status $status, $(($(date +%s) - start)) s (log: $log)"
exit $status
