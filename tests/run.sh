#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test that needs no GPU.
# Non-zero on any failure. Build directory: $ZSHARD_TEST_BUILD_DIR or build/.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ZSHARD_TEST_BUILD_DIR:-$root/build}

"$root/deploy/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build"
cd "$build"
ctest --output-on-failure --label-exclude gpu --parallel "$(nproc)" --timeout 600
