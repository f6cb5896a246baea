"""The `tidegauge` command: one console script, one subcommand per job.

Each command package's `cli` module exposes `register(subparsers)`, which adds its parser and sets `func`: the
command's entry point, taking the parsed arguments and returning the exit code, wrapped in
`pipelines.core.errors.exit_codes`. Exit codes are the contract of `pipelines.core.errors`: 0 clean, 1 findings,
2 bad usage or unreadable input, 3 partial, 130 interrupted. An unexpected error (a bug) also exits 2, never 1.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
from typing import NoReturn

from pipelines.core.config import closest
from pipelines.core.errors import EXIT_USAGE
from pipelines.core.helptext import HelpFormatter
from pipelines.core.publish import tidegauge_version

# module path, in the order `--help` lists them
_JOBS = [
    "pipelines.simulate.cli",
    "pipelines.lag.cli",
    "pipelines.leapfrog.cli",
    "pipelines.div.cli",
    "pipelines.changes.cli",
    "pipelines.cut.cli",
    "pipelines.repair.cli",
    "pipelines.report.cli",
    "pipelines.demo.cli",
    "pipelines.watch.cli",
]


class _Parser(argparse.ArgumentParser):
    """argparse, with a command's unknown flags refused by that command, with its own usage.

    argparse leaves the flags a subcommand does not know to the top-level parser, which then prints its own
    usage (`tidegauge [-h] [-v] COMMAND ...`) under a message that does not say which command was meant; and
    a misspelled flag beside a missing required one is reported as the missing one. Here each (sub)command
    names its unknown flags first, with the closest flag it has. Every parser lays out its --help with
    `pipelines.core.helptext.HelpFormatter`: prose wraps at the terminal's width, examples stay as written."""

    def __init__(self, *args, formatter_class=HelpFormatter, **kwargs) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(self._unrecognized(extras))
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required"):
            unknown = [a for a in getattr(self, "_given", []) if self._unknown_flag(a)]
            if unknown:
                message = self._unrecognized(unknown)
        super().error(message)

    def _unknown_flag(self, token: str) -> bool:
        if not token.startswith("-") or token in ("-", "--") or _NUMBER.fullmatch(token):
            return False
        flag = token.split("=", 1)[0]
        known = self._option_string_actions
        return not (flag in known or (flag.startswith("--") and any(o.startswith(flag) for o in known)))

    def _unrecognized(self, extras: list[str]) -> str:
        flags = [a.split("=", 1)[0] for a in extras if a.startswith("--")]
        # (a stricter likeness than for configuration keys: flag names are short, `--bogus` is not `--out`)
        hint = closest(flags[0], self._option_string_actions, prefix="--", cutoff=0.6) if flags else ""
        return f"unrecognized arguments: {' '.join(extras)}{hint}"


_NUMBER = re.compile(r"-\d+(\.\d*)?|-\.\d+")  # a negative number is a value, not a flag


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(the words of a command, its parser) for every command and subcommand under `parser`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tidegauge",
        description=(
            "Measure how far the replicas of an active/active Venice-style store have come (high-water marks), "
            "whether they agree (Leap Frog) and whether their logs are whole (DIV)."
        ),
        epilog="Exit codes: 0 clean, 1 findings, 2 bad usage or unreadable input, 3 partial, 130 interrupted "
        "(Ctrl-C). Run `tidegauge demo` for a first look.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details to stderr")
    parser.add_argument(
        "--version", action="version", version=f"tidegauge {tidegauge_version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _JOBS:
        importlib.import_module(mod).register(sub)
    for words, p in _commands(parser):
        # what error lines name (`tidegauge div validate: ...`): the command as typed, subcommand included
        p.set_defaults(command_name=" ".join(words))
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
    return args.func(args)  # each command's entry maps its errors to exit codes (core.errors.exit_codes)


if __name__ == "__main__":
    sys.exit(main())
