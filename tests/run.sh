#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test that needs no GPU.
# Non-zero on any failure. Build directory: $ZSHARD_TEST_BUILD_DIR or build/.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ZSHARD_TEST_BUILD_DIR:-$root/build}

"$root/deploy/install-deps.sh"
# ccache: paths relative to the checkout, so a clone elsewhere hits the cache.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build"

# Test-side tool from PyPI: the reference safetensors reader, in a virtual
# environment under the build directory (the export test reads our files
# with it; it is skipped, saying so, when PyPI cannot be reached).
pyenv="$build/pyenv"
if ! "$pyenv/bin/python" -c 'import safetensors.numpy' >/dev/null 2>&1; then
  { python3 -m venv "$pyenv" &&
    "$pyenv/bin/pip" install -q --disable-pip-version-check safetensors numpy; } ||
    echo "tests/run.sh: could not install safetensors from PyPI; its test will skip" >&2
fi
export ZSHARD_TEST_PYTHON="$pyenv/bin/python"

cd "$build"
ctest --output-on-failure --label-exclude gpu --parallel "$(nproc)" --timeout 600
