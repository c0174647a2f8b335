#!/bin/sh
# Prints the Debian packages that hold the shared libraries the given
# binaries load (ldd), one per line. With merged /usr a library is found as
# /lib/... but owned as /usr/lib/... (or the other way): both are asked.
# Exits non-zero naming a library no package owns.
set -eu
for lib in $(ldd "$@" | awk '/=> \// { print $3 }' | sort -u); do
  real=$(readlink -f "$lib")
  owner=
  for path in "$lib" "/usr$lib" "${lib#/usr}" "$real" "/usr$real" "${real#/usr}"; do
    owner=$(dpkg -S "$path" 2>/dev/null | head -n 1 | cut -d: -f1) && [ -n "$owner" ] && break
  done
  if [ -z "$owner" ]; then
    echo "runtime-packages: no package owns $lib" >&2
    exit 1
  fi
  echo "$owner"
done | sort -u
