"""Command line: ``python -m datapipes demo`` (or the installed ``datapipes demo``)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``datapipes COMMAND [args]``."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: python -m datapipes demo [--workdir DIR] [--workers N]\n\n"
            "  demo   run a real pipeline, checkpoint mid-epoch, resume in a new process,\n"
            "         and verify the resumed stream equals the uninterrupted one"
        )
        return 0 if args else 2
    if args[0] == "demo":
        from datapipes.demo import main as demo_main

        return demo_main(args[1:])
    print(
        f"datapipes: unknown command {args[0]!r}; try 'python -m datapipes --help'", file=sys.stderr
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
