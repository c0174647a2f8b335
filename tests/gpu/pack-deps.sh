#!/usr/bin/env bash
# Run on a Debian development machine: copies what tests/gpu/run.sh needs
# beyond CUDA, CMake, Ninja and a C++ compiler -- abseil and GoogleTest
# (headers, libraries, CMake configs) -- into .gpu-deps/ (git-ignored), laid
# out as under /usr so their CMake configs resolve there. For a GPU machine
# that cannot install packages: carry .gpu-deps along with the working tree.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
"$root/deploy/install-deps.sh"
dest=$root/.gpu-deps/usr
lib=$dest/lib/x86_64-linux-gnu
rm -rf "$root/.gpu-deps"
mkdir -p "$dest/include" "$lib/cmake"
cp -a /usr/include/absl /usr/include/gtest /usr/include/gmock "$dest/include/"
cp -a /usr/lib/x86_64-linux-gnu/libabsl_*.so* "$lib/"
cp -a /usr/lib/x86_64-linux-gnu/libgtest*.a /usr/lib/x86_64-linux-gnu/libgmock*.a "$lib/"
cp -a /usr/lib/x86_64-linux-gnu/cmake/absl /usr/lib/x86_64-linux-gnu/cmake/GTest "$lib/cmake/"
echo "tests/gpu/pack-deps.sh: $(du -sh "$root/.gpu-deps" | cut -f1) in .gpu-deps/"
