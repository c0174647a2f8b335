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

# The Python side's test environment from PyPI (tests/requirements.txt:
# the user's PyTorch, transformers, peft, and the reference safetensors
# reader), a virtual environment under the build directory made with
# Debian's Python. When pip cannot install it, the tests that need it skip
# and name the cause (kept in pyenv-install.log).
pyenv="$build/pyenv"
requirements="$root/tests/requirements.txt"
if ! "$pyenv/bin/python" -c 'import safetensors.numpy, torch, transformers, peft, prometheus_client, kubernetes_validate, yaml' >/dev/null 2>&1; then
  { /usr/bin/python3 -m venv "$pyenv" &&
    "$pyenv/bin/pip" install -q --disable-pip-version-check -r "$requirements"; } \
    >"$build/pyenv-install.log" 2>&1 && rm -f "$build/pyenv-install.log" ||
    echo "tests/run.sh: could not install the Python test environment ($(tail -n 1 "$build/pyenv-install.log")); its tests will skip" >&2
fi
export ZSHARD_TEST_PYTHON="$pyenv/bin/python"

cd "$build"
ctest --output-on-failure --label-exclude gpu --parallel "$(nproc)" --timeout 600
