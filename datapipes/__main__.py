"""Command line: ``python -m datapipes demo|inspect`` (or the installed ``datapipes ...``)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``datapipes COMMAND [args]``."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: python -m datapipes demo [--workdir DIR] [--workers N]\n"
            "       python -m datapipes inspect CHECKPOINT [CHECKPOINT ...]\n"
            "                [--recipe MODULE:NAME] [--world-size N] [--num-workers K] [--json]\n\n"
            "  demo     run a real pipeline, checkpoint mid-epoch, resume in a new process,\n"
            "           and verify the resumed stream equals the uninterrupted one\n"
            "  inspect  show the Loader state(s) in a checkpoint (torch.save, JSON or DCP;\n"
            "           several files: the ranks of one job, merged); --recipe checks that a\n"
            "           recipe can resume from it and shows the epoch's remaining work, and\n"
            "           --world-size/--num-workers how it would be dealt on that topology"
        )
        return 0 if args else 2
    if args[0] == "demo":
        from datapipes.demo import main as demo_main

        return demo_main(args[1:])
    if args[0] == "inspect":
        from datapipes.inspect import main as inspect_main

        return inspect_main(args[1:])
    print(
        f"datapipes: unknown command {args[0]!r}; try 'python -m datapipes --help'", file=sys.stderr
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
