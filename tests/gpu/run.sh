#!/usr/bin/env bash
# Builds the kernels and their tests alone (ZSHARD_KERNELS_ONLY: no gRPC or
# libtorch needed) and runs the gpu-labelled suite (the CUDA kernels against
# the reference) on a machine with an NVIDIA GPU. Dependencies: CUDA, CMake,
# Ninja, a C++ compiler, abseil and GoogleTest -- from .gpu-deps/ when present
# (see tests/gpu/pack-deps.sh), else installed with deploy/install-deps.sh.
# Build directory: build-gpu/ (or $ZSHARD_GPU_BUILD_DIR). Non-zero on failure.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${ZSHARD_GPU_BUILD_DIR:-$root/build-gpu}

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "tests/gpu/run.sh: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
  exit 1
fi
nvidia-smi -L
extra=()
if [ -d "$root/.gpu-deps/usr" ]; then
  extra+=("-DCMAKE_PREFIX_PATH=$root/.gpu-deps/usr")
  export LD_LIBRARY_PATH="$root/.gpu-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  "$root/deploy/install-deps.sh"
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DZSHARD_KERNELS_ONLY=ON -DZSHARD_WITH_CUDA=ON "${extra[@]}"
cmake --build "$build"
cd "$build"
ctest --output-on-failure --label-regex '^gpu$' --timeout 480
