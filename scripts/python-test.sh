#!/usr/bin/env bash
# usage: scripts/python-test.sh [BUILD_DIR]
# Tests the Python package (python/) against BUILD_DIR's libseqflow.so and seqflow binary
# (default: build/, which must be built): a venv in BUILD_DIR/python-venv, made once and kept
# between runs, with CPU-only PyTorch (from download.pytorch.org; from PyPI, CUDA libraries and
# all, about 4 GB, when that index is unreachable), numpy, safetensors and pytest; then the
# package installed into it with pip and its pytest tests (python/tests) run.
# Exits 77 with "skipped: ..." when python3, its venv module or the packages are unavailable.
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0; fi
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
if [ -n "${SEQFLOW_PYTHON_SKIP:-}" ]; then echo "skipped: $SEQFLOW_PYTHON_SKIP"; exit 77; fi
for f in libseqflow.so seqflow; do
  [ -e "$build/$f" ] || { echo "python-test: $build/$f is missing: build seqflow first" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "skipped: python3 is not installed"; exit 77; }
if ! python3 -c 'import venv, ensurepip' 2>/dev/null && command -v apt-get >/dev/null &&
   { [ "$(id -u)" -eq 0 ] || sudo -n true 2>/dev/null; }; then
  # Debian keeps the venv module apart (python3-venv; also in scripts/install-deps.sh --fuzz)
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  echo "python-test: installing python3-venv"
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv; } >/dev/null 2>&1 || true
fi
python3 -c 'import venv, ensurepip' 2>/dev/null ||
  { echo "skipped: python3's venv module is missing (Debian: python3-venv)"; exit 77; }
venv=$build/python-venv
deps="torch numpy safetensors pytest setuptools>=61"
# the venv is remade only when missing or made for another list of packages
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.seqflow-deps" 2>/dev/null)" != "$deps" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  log=$venv/.pip.log
  echo "python-test: making $venv (PyTorch for the CPU, numpy, safetensors, pytest)"
  if ! "$venv/bin/pip" install -q --retries 1 --timeout 30 torch \
       --index-url https://download.pytorch.org/whl/cpu >"$log" 2>&1; then
    echo "python-test: download.pytorch.org unreachable; torch from PyPI (with its CUDA libraries, ~4 GB)"
    if ! "$venv/bin/pip" install -q torch >>"$log" 2>&1; then
      echo "skipped: torch could not be installed ($(tail -n 1 "$log"))"; rm -rf "$venv"; exit 77
    fi
  fi
  if ! "$venv/bin/pip" install -q numpy safetensors pytest "setuptools>=61" >>"$log" 2>&1; then
    echo "skipped: the test packages could not be installed ($(tail -n 1 "$log"))"; rm -rf "$venv"; exit 77
  fi
  echo "$deps" >"$venv/.seqflow-deps"
fi
# the package itself, as a user installs it (setuptools from the venv: no download per run),
# from a copy in the build folder so that the build leaves nothing in the source tree
src=$build/python-src
rm -rf "$src" && mkdir -p "$src"
cp -r "$root/python/pyproject.toml" "$root/python/setup.py" "$root/python/README.md" "$root/python/seqflow" "$src/"
SEQFLOW_BUILD_DIR=$build "$venv/bin/pip" install -q --no-deps --no-build-isolation --force-reinstall "$src"
export SEQFLOW_LIB=$build/libseqflow.so SEQFLOW_BIN=$build/seqflow OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# run from the build folder, so that `import seqflow` finds the installed package, not python/
cd "$build"
"$venv/bin/python" -c 'import seqflow; print("python-test: seqflow from", seqflow.__file__, "with", seqflow.library_path())'
exec "$venv/bin/pytest" -q -p no:cacheprovider "$root/python/tests"
