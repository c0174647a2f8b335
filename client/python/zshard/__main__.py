"""``python -m zshard`` / the ``zshard`` command."""

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: zshard launch [flags] -- COMMAND ...\n"
              "  launch  start local shard servers (or join --coordinator) "
              "and run COMMAND per trainer rank; 'zshard launch --help'")
        return 0 if argv else 2
    if argv[0] != "launch":
        print(f"zshard: unknown command '{argv[0]}' (expected launch)",
              file=sys.stderr)
        return 2
    from . import launch
    return launch.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
