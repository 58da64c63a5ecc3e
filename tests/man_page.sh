#!/bin/sh
# docs/seqflow.1 describes every long option that `seqflow --help` and `seqflow serve --help` list, and is valid roff
# (where man is installed, it renders without warnings).
# usage: man_page.sh SEQFLOW_BIN MAN_PAGE
set -eu
bin=$1 page=$2
missing=""
for opt in $({ "$bin" --help; "$bin" serve --help; } | grep -o -- '--[a-z][a-z0-9-]*' | sort -u); do
    # roff writes a dash as \-
    escaped=$(printf '%s' "$opt" | sed 's/-/\\\\-/g')
    grep -q -- "$escaped" "$page" || missing="$missing $opt"
done
if [ -n "$missing" ]; then
    echo "options of seqflow --help missing from $page:$missing"
    exit 1
fi
if command -v man >/dev/null 2>&1; then
    warnings=$(MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null || true)
    if [ -n "$warnings" ]; then
        echo "$page: $warnings"
        exit 1
    fi
fi
echo "$page describes all $("$bin" --help | grep -o -- '--[a-z][a-z0-9-]*' | sort -u | wc -l) long options"
