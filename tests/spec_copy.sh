#!/bin/sh
# docs/SPEC.md is the repository's copy of the contract, ../shared/SPEC.md the one the project
# is given: the two must stay identical. Skips (77) where ../shared is absent, saying why.
docs=$1
shared=$2
if [ ! -f "$shared" ]; then
    echo "skipped: $shared is absent (no shared contract beside the repository)"
    exit 77
fi
if cmp "$docs" "$shared"; then
    exit 0
fi
echo "docs/SPEC.md differs from $shared: copy the contract into docs/SPEC.md"
exit 1
