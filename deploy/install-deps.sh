#!/usr/bin/env bash
# Installs every Debian 12 package that zshard's build, tests and demo need.
# Idempotent; prints nothing when everything is already installed. Needs root
# only when something is missing.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
  libtorch-dev libopenblas0-pthread nlohmann-json3-dev libzstd-dev
  libucx-dev ucx-utils libssl-dev openssl libmicrohttpd-dev
  chromium slurm-wlm munge
  podman runc debootstrap fuse-overlayfs slirp4netns uidmap
  python3-venv python3-dev pybind11-dev
  iproute2 procps util-linux
)

# --build-only: what building the binaries needs, no more (the image's build
# stage: no test tools, browser, Slurm or Python).
if [ "${1:-}" = --build-only ]; then
  packages=(
    cmake ninja-build g++ pkg-config ccache
    libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
    libabsl-dev libgtest-dev libgmock-dev
    libtorch-dev libopenblas0-pthread nlohmann-json3-dev libzstd-dev
    libucx-dev libssl-dev libmicrohttpd-dev
  )
elif [ $# -gt 0 ]; then
  echo "install-deps: unknown argument '$1' (only --build-only)" >&2
  exit 2
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages (${missing[*]}); run this script as root" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
