#!/usr/bin/env bash
# ctest's runner for one Python test: runs it with the test virtual
# environment's interpreter ($ZSHARD_TEST_PYTHON, made by tests/run.sh), or
# skips (exit 77) naming why that environment cannot run it.
set -uo pipefail
test=$1
py=${ZSHARD_TEST_PYTHON:-${ZSHARD_BUILD_DIR}/pyenv/bin/python}
if [ ! -x "$py" ]; then
  why="no test virtual environment at $py"
  [ -s "${ZSHARD_BUILD_DIR}/pyenv-install.log" ] &&
    why="$why ($(tail -n 1 "${ZSHARD_BUILD_DIR}/pyenv-install.log"))"
  echo "SKIP: $why" >&2
  exit 77
fi
if ! missing=$("$py" -c 'import torch, transformers' 2>&1); then
  why=$(printf '%s\n' "$missing" | tail -n 1)
  [ -s "${ZSHARD_BUILD_DIR}/pyenv-install.log" ] &&
    why="$why; pip said: $(tail -n 1 "${ZSHARD_BUILD_DIR}/pyenv-install.log")"
  echo "SKIP: torch / transformers not importable ($why)" >&2
  exit 77
fi
cd "$(dirname "$0")"
exec "$py" "$test" "${@:2}"
