#!/bin/sh
# The image's entrypoint: runs one of zshard's binaries with its arguments.
# Anything else is refused with one line naming what is allowed.
set -eu
if [ $# -eq 0 ]; then
  echo "zshard image: name a binary: zshard-server, zshard-train or zshardctl" >&2
  exit 2
fi
case "$1" in
  zshard-server|zshard-train|zshardctl) exec "/usr/local/bin/$@" ;;
  *) echo "zshard image: '$1' is not one of zshard-server, zshard-train, zshardctl" >&2
     exit 2 ;;
esac
