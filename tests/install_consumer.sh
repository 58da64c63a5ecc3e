#!/bin/sh
# Installs the build into a temporary prefix, moves the prefix elsewhere (the install must be
# relocatable), then builds examples/custom_stage.c against it three ways and runs each:
#   1. pkg-config, shared: the program needs libseqflow.so.0
#   2. pkg-config --static against a prefix holding only libseqflow.a: Libs.private and
#      Requires.private must name everything, and the program needs no libseqflow.so
#   3. find_package(seqflow) from a CMake project (examples/CMakeLists.txt on its own)
# usage: install_consumer.sh BUILD_DIR EXAMPLES_DIR WORK_DIR
set -eu
build=$1 examples=$2 work=$3
cc=${CC:-cc}
for tool in pkg-config readelf cmake "$cc"; do
    command -v "$tool" >/dev/null || { echo "skipped: $tool is not installed"; exit 77; }
done
fail() { echo "install_consumer: $*"; exit 1; }
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/installed" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install failed"; }
mv "$work/installed" "$work/prefix"
prefix=$work/prefix
pc=$(find "$prefix" -name seqflow.pc)
[ -n "$pc" ] || fail "no seqflow.pc installed"
grep -q "$work/installed" "$pc" && fail "seqflow.pc names the install prefix: $(grep installed "$pc")"
libdir=$(cd "$(dirname "$pc")/.." && pwd)
[ -x "$prefix/bin/seqflow" ] || fail "no bin/seqflow"
ls "$prefix"/share/man/man1/seqflow.1* >/dev/null 2>&1 || fail "no man page"
[ -L "$libdir/libseqflow.so" ] && [ -f "$libdir/libseqflow.so.0" ] || fail "no libseqflow.so -> libseqflow.so.0"

# 1. pkg-config, shared
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --variable=libdir seqflow)" -ef "$libdir" ] || fail "pkg-config libdir $(pkg-config --variable=libdir seqflow) is not $libdir"
# shellcheck disable=SC2046
$cc -o "$work/ex_shared" "$examples/custom_stage.c" $(pkg-config --cflags --libs seqflow) -lm
readelf -d "$work/ex_shared" | grep -q 'NEEDED.*\[libseqflow\.so\.0\]' || fail "ex_shared does not need libseqflow.so.0"
LD_LIBRARY_PATH="$libdir" "$work/ex_shared" >"$work/ex_shared.out" || fail "ex_shared failed: $(cat "$work/ex_shared.out")"

# 2. pkg-config --static, only the static library present
cp -R "$prefix" "$work/static-prefix"
rm -f "$work/static-prefix/${libdir#"$prefix"/}"/libseqflow.so*
export PKG_CONFIG_PATH="$work/static-prefix/${libdir#"$prefix"/}/pkgconfig"
# shellcheck disable=SC2046
$cc -o "$work/ex_static" "$examples/custom_stage.c" $(pkg-config --cflags --libs --static seqflow) -lm
readelf -d "$work/ex_static" | grep -q 'NEEDED.*libseqflow' && fail "ex_static needs libseqflow.so"
"$work/ex_static" >"$work/ex_static.out" || fail "ex_static failed: $(cat "$work/ex_static.out")"

# 3. find_package(seqflow)
cmake -S "$examples" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$work/cmake.log" 2>&1 ||
    { cat "$work/cmake.log"; fail "configuring examples/ against the install failed"; }
cmake --build "$work/cmake-build" >"$work/cmake-build.log" 2>&1 || { cat "$work/cmake-build.log"; fail "building examples/ failed"; }
readelf -d "$work/cmake-build/custom_stage" | grep -q 'NEEDED.*\[libseqflow\.so\.0\]' || fail "find_package build does not use libseqflow.so.0"
"$work/cmake-build/custom_stage" >"$work/ex_cmake.out" || fail "find_package build failed: $(cat "$work/ex_cmake.out")"
echo "install_consumer: pkg-config shared, pkg-config --static and find_package builds all ran"
