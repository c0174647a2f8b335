#!/usr/bin/env bash
# Builds and runs the gpu-labelled tests (CUDA kernels against the reference)
# on a machine with an NVIDIA GPU. Builds only what those tests need, into
# build-gpu/ (or $ZSHARD_GPU_BUILD_DIR). Non-zero on any failure.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${ZSHARD_GPU_BUILD_DIR:-$root/build-gpu}

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "tests/gpu/run.sh: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
  exit 1
fi
nvidia-smi -L
"$root/deploy/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DZSHARD_WITH_CUDA=ON -DZSHARD_WITH_TORCH=OFF
cmake --build "$build" --target cuda_kernels_test
cd "$build"
ctest --output-on-failure --label-regex '^gpu$' --timeout 480
