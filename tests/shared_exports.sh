#!/bin/sh
# libseqflow.so has the soname libseqflow.so.0 and exports only the functions the public
# headers declare (every exported symbol is an sf_ name of include/seqflow/*.h).
# usage: shared_exports.sh LIBSEQFLOW_SO INCLUDE_DIR
set -eu
lib=$1 inc=$2
soname=$(readelf -d "$lib" | sed -n 's/.*SONAME.*\[\(.*\)\].*/\1/p')
if [ "$soname" != libseqflow.so.0 ]; then
    echo "soname is '$soname', not libseqflow.so.0"
    exit 1
fi
tmp=${TMPDIR:-/tmp}/shared_exports.$$
trap 'rm -f "$tmp".*' EXIT
nm -D --defined-only "$lib" | awk '{print $NF}' | sort -u >"$tmp.exported"
grep -ho '\bsf_[a-z0-9_]*[[:space:]]*(' "$inc"/*.h | sed 's/[[:space:]]*($//' | sort -u >"$tmp.declared"
extra=$(comm -23 "$tmp.exported" "$tmp.declared")
if [ -n "$extra" ]; then
    echo "exported but not declared in include/seqflow ($(echo "$extra" | wc -l)):"
    echo "$extra"
    exit 1
fi
for f in sf_graph_create sf_graph_run sf_model_load sf_register_stage sf_last_error; do
    grep -qx "$f" "$tmp.exported" || { echo "$f is not exported"; exit 1; }
done
echo "libseqflow.so.0 exports $(wc -l <"$tmp.exported") symbols, all of the public API"
