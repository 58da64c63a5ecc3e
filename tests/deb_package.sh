#!/bin/sh
# `cpack -G DEB` in the build folder makes seqflow_VERSION_ARCH.deb: its Depends name the
# run-time libraries (from dpkg-shlibdeps) and the -dev packages pkg-config needs, it holds the
# binary, headers, both libraries, seqflow.pc, the CMake package and the man page, and its
# contents work where they are unpacked: the binary runs and examples/custom_stage.c builds
# against usr/lib/pkgconfig/seqflow.pc and runs. (scripts/deb-install.sh installs and removes
# the package for real, as root.)
# usage: deb_package.sh BUILD_DIR EXAMPLES_DIR WORK_DIR
set -eu
build=$1 examples=$2 work=$3
for tool in cpack dpkg-deb dpkg-shlibdeps pkg-config; do
    command -v "$tool" >/dev/null || { echo "skipped: $tool is not installed"; exit 77; }
done
fail() { echo "deb_package: $*"; exit 1; }
rm -rf "$work"
mkdir -p "$work"
(cd "$build" && cpack -G DEB -B "$work/out" >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; fail "cpack failed"; }
deb=$(ls "$work"/out/seqflow_*_*.deb)
[ -f "$deb" ] || fail "no seqflow_VERSION_ARCH.deb"
depends=$(dpkg-deb -f "$deb" Depends)
for dep in libc6 libopenblas0 libzstd1 liblz4-1 libcjson1 libxxhash0 libgomp1 libopenblas-dev; do
    echo "$depends" | grep -q "$dep" || fail "Depends lacks $dep: $depends"
done
echo "$depends" | grep -qi cuda && [ -z "$(readelf -d "$build/seqflow" | grep -i cuda)" ] && fail "Depends names CUDA in a CPU-only build"
dpkg-deb -c "$deb" >"$work/contents"
for f in ./usr/bin/seqflow ./usr/include/seqflow/seqflow.h ./usr/lib/libseqflow.a ./usr/lib/libseqflow.so.0 \
         ./usr/lib/pkgconfig/seqflow.pc ./usr/lib/cmake/seqflow/seqflowConfig.cmake ./usr/share/man/man1/seqflow.1; do
    grep -q " $f" "$work/contents" || fail "the package lacks $f"
done
dpkg-deb -x "$deb" "$work/root"
LD_LIBRARY_PATH="$work/root/usr/lib" "$work/root/usr/bin/seqflow" run -q >/dev/null || fail "the packaged binary does not run"
PKG_CONFIG_PATH="$work/root/usr/lib/pkgconfig"
export PKG_CONFIG_PATH
# shellcheck disable=SC2046
${CC:-cc} -o "$work/example" "$examples/custom_stage.c" $(pkg-config --cflags --libs seqflow) -lm || fail "building against the package failed"
LD_LIBRARY_PATH="$work/root/usr/lib" "$work/example" >/dev/null || fail "the example built against the package failed"
echo "deb_package: $(basename "$deb") ($(wc -c <"$deb") bytes); Depends: $depends"
