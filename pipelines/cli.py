"""The `tidegauge` command: one console script, one subcommand per job.

Each job module exposes `register(subparsers)`, which adds its parser and sets `func` (a callable taking the
parsed arguments and returning the exit code). Exit codes are the contract of `pipelines.core.errors`: 0 clean, 1 findings,
2 bad usage or unreadable input, 3 partial. An unexpected error (a bug) also exits 2, never 1.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from pipelines.core.errors import EXIT_USAGE, UsageError

# module path, in the order `--help` lists them
_JOBS = [
    "pipelines.simulate.job",
    "pipelines.lag.job",
    "pipelines.leapfrog.cli",
    "pipelines.div.cli",
    "pipelines.report.cli",
    "pipelines.demo.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidegauge",
        description=(
            "Measure how far the replicas of an active/active Venice-style store have come (high-water marks), "
            "whether they agree (Leap Frog) and whether their logs are whole (DIV)."
        ),
        epilog="Exit codes: 0 clean, 1 findings, 2 bad usage or unreadable input, 3 partial. "
        "Run `tidegauge demo` for a first look.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _JOBS:
        importlib.import_module(mod).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # py4j logs every Spark gateway connection it opens and closes (and at DEBUG, every call): not the user's
    # business, even with --verbose
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"tidegauge {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a path that cannot be read or written (permissions, full disk, read-only storage)
        print(f"tidegauge {args.command}: error: {_os_error(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception:  # never exit 1 ("findings") on a crash: a pager must not read a bug as a divergence
        import traceback

        traceback.print_exc()
        print(f"tidegauge {args.command}: internal error (the traceback above says where); no result was "
              "written for this run", file=sys.stderr)
        return EXIT_USAGE


def _os_error(exc: OSError) -> str:
    """One line naming the path and the reason, e.g. "cannot write /x/out: Read-only file system"."""
    what = exc.strerror or str(exc)
    if exc.filename is None:
        return what
    target = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else str(exc.filename)
    return f"{target}: {what} (nothing was replaced: an earlier output there is intact)"


if __name__ == "__main__":
    # `python -m pipelines.cli` runs this file as __main__; the jobs raise pipelines.cli's errors, so run that
    # module's main (a second copy of the classes here would not catch them)
    from pipelines.cli import main as _main

    sys.exit(_main())
