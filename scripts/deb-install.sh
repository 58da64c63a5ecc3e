#!/usr/bin/env bash
# usage: scripts/deb-install.sh [BUILD_DIR]   (root or sudo; default BUILD_DIR: build)
# Packs BUILD_DIR with `cpack -G DEB`, installs the package with apt-get, runs `seqflow run`
# from PATH, builds examples/custom_stage.c against the installed package three ways
# (pkg-config, pkg-config --static, find_package(seqflow)) and runs them, then removes the
# package and checks that none of its files is left behind.
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$build" && cpack -G DEB -B "$work/deb" >/dev/null 2>&1)
deb=$(ls "$work"/deb/seqflow_*.deb)
echo "deb-install: installing $(basename "$deb")"
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$deb" >/dev/null
dpkg -L seqflow >"$work/files"
hash -r
[ "$(command -v seqflow)" = /usr/bin/seqflow ] || { echo "deb-install: seqflow is not on PATH from /usr/bin"; exit 1; }
seqflow run -q
cc -o "$work/shared" examples/custom_stage.c $(pkg-config --cflags --libs seqflow) -lm
"$work/shared" >/dev/null
mkdir "$work/static-lib" && ln -s /usr/lib/libseqflow.a "$work/static-lib/"
cc -o "$work/static" examples/custom_stage.c -L"$work/static-lib" $(pkg-config --cflags --libs --static seqflow) -lm
! readelf -d "$work/static" | grep -q 'NEEDED.*libseqflow' || { echo "deb-install: --static build needs libseqflow.so"; exit 1; }
"$work/static" >/dev/null
cmake -S examples -B "$work/cmake" >/dev/null && cmake --build "$work/cmake" >/dev/null
"$work/cmake/custom_stage" >/dev/null
echo "deb-install: seqflow from PATH, pkg-config, pkg-config --static and find_package builds ran"
DEBIAN_FRONTEND=noninteractive $sudo apt-get remove -y -qq seqflow >/dev/null
left=$(while read -r f; do [ -f "$f" ] || [ -L "$f" ] && echo "$f"; done <"$work/files" || true)
if [ -n "$left" ]; then
  echo "deb-install: files left after apt-get remove:"
  echo "$left"
  exit 1
fi
# removed packages keep a dpkg record (state rc) for their maintainer scripts: purge it too
DEBIAN_FRONTEND=noninteractive $sudo apt-get purge -y -qq seqflow >/dev/null
echo "deb-install: removed and purged; no file of the package left"
