# Source on the GPU machine, in the project root, after scripts/gpu-fetch-debs.sh ran here:
#   source scripts/gpu-env.sh
# Runs the shared .gpu/gpu-env.sh (ZeroMQ and plain libraries), then exposes what that script
# does not: Debian's OpenBLAS lives in an alternatives folder (openblas-pthread/), and
# pkg-config itself may be missing. Nothing is written under /.
source .gpu/gpu-env.sh
_root=/tmp/offline-root
_ob=$_root/usr/lib/x86_64-linux-gnu/openblas-pthread
if ! pkg-config --exists openblas 2>/dev/null && [ -d "$_ob" ]; then
  sed -i -e "s|^prefix=.*|prefix=$_root/usr|" "$_ob"/pkgconfig/*.pc
  ln -sf libopenblasp-r0.3.21.so "$_ob/libopenblas.so"
  export PKG_CONFIG_PATH="$_ob/pkgconfig:$PKG_CONFIG_PATH"
  export LD_LIBRARY_PATH="$_ob:$LD_LIBRARY_PATH" LIBRARY_PATH="$_ob:$LIBRARY_PATH"
  export CPATH="$_root/usr/include/x86_64-linux-gnu/openblas-pthread:$CPATH"
fi
if ! command -v pkg-config >/dev/null 2>&1; then
  export PATH="$_root/usr/bin:$PATH"
  export PKG_CONFIG_PATH="$PKG_CONFIG_PATH:/usr/lib/x86_64-linux-gnu/pkgconfig:/usr/share/pkgconfig:/usr/lib/pkgconfig"
fi
[ -f "$_root/usr/lib/x86_64-linux-gnu/pkgconfig/libcjson.pc" ] && sed -i "s|/usr/include|$_root/usr/include|g" "$_root/usr/lib/x86_64-linux-gnu/pkgconfig/libcjson.pc"
unset _root _ob
