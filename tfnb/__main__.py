"""``python -m tfnb COMMAND``: demo (train on digits with 2 workers on a local Spark), stage (copy a shard)."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        # asked for: on stdout, exit 0; no command: a usage error, on stderr, exit 2 (as argparse does)
        print("usage: python -m tfnb demo [--workers N] [--epochs N] [--out DIR]\n"
              "       python -m tfnb stage SRC_URL DEST_DIR [--index I --count N]\n"
              "       python -m tfnb.dbc build|extract ...", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "demo":
        from .demo import main as demo

        return demo(argv[1:])
    if argv[0] == "stage":
        from .staging import main as stage

        return stage(argv[1:])
    print(f"tfnb: unknown command {argv[0]!r}; try: python -m tfnb demo", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
