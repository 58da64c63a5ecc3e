#!/usr/bin/env bash
# Run here, in the project root, before a GPU run: the shared fetch script (ZeroMQ) plus the
# build dependencies the GPU machine may lack (OpenBLAS, cJSON, pkg-config), all into the
# git-ignored .offline-debs/. scripts/gpu-env.sh unpacks and exposes them there.
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
set -euo pipefail
cd "$(dirname "$0")/.."
../shared/device/fetch-debs.sh >/dev/null
cd .offline-debs
apt-get download -qq libopenblas0-pthread libopenblas-pthread-dev libcjson1 libcjson-dev liblz4-1 liblz4-dev libzstd1 libzstd-dev libxxhash0 libxxhash-dev \
  pkgconf pkgconf-bin libpkgconf3 libgfortran5 2>&1 | grep -v '^W:' || true
ls -1
