"""``python -m tfnb stage SRC DEST [--index I --count N]``: copy a shard of files to local disk (the demo and the
DBC tools are the repository's: ``./dev demo``, ``./dev dbc``)."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        # asked for: on stdout, exit 0; no command: a usage error, on stderr, exit 2 (as argparse does)
        print("usage: python -m tfnb stage SRC DEST [--index I --count N]\n"
              "In a tfnb checkout: ./dev demo (train on digits on a local Spark), ./dev dbc (rebuild the DBC)",
              file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "stage":
        from .data.staging import main as stage

        return stage(argv[1:])
    where = (f"; {argv[0]} is a developer tool of the tfnb repository: run ./dev {argv[0]} in a checkout"
             if argv[0] in ("demo", "dbc") else "")
    print(f"tfnb: unknown command {argv[0]!r}{where}; try: python -m tfnb stage --help", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
