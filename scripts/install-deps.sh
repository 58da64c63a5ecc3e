#!/usr/bin/env bash
# Installs the Debian packages seqflow builds against, when any is missing. Needs root (or sudo).
#   scripts/install-deps.sh          what building and running needs
#   scripts/install-deps.sh --fuzz   also clang, libFuzzer's runtime and OpenMP for clang
#                                    (the fuzz build of scripts/fuzz.sh; scripts/test.sh asks),
#                                    python3-jsonschema, python3-venv (the Python package's test),
#                                    the arm64 cross compiler, qemu-user (tests)
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
set -euo pipefail
packages=(build-essential cmake pkg-config libopenblas-dev libcjson-dev liblz4-dev libzstd-dev libxxhash-dev libzmq3-dev)
# for the distributed tests: mpirun starts ranks as a launcher does (rank discovery from Open
# MPI's environment); iproute2's tc and ip shape and cut links between local ranks
packages+=(openmpi-bin iproute2)
[ "${1:-}" = --fuzz ] && packages+=(clang libclang-rt-dev libomp-dev)
# and what scripts/test.sh's checks use: the JSON schemas, the arm64 cross compile, a pre-AVX CPU
[ "${1:-}" = --fuzz ] && packages+=(python3-jsonschema python3-venv gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "seqflow: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
