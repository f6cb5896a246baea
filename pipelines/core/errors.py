"""The exit-code contract, written once, and the one place an error becomes an exit code.

0 clean: every planned record read and decoded, nothing found. 1 findings (findings outrank missing evidence).
2 bad usage or unreadable input: the message names the flag, path or value; nothing is written. 3 partial: no
finding, but some planned record was not read or decoded (the outputs say where). A bug also exits 2, never 1:
a pager must not read a crash as a divergence. 130 interrupted (Ctrl-C): one line, and nothing left behind.

Jobs raise the errors of their own layer (`SourceError` for a source that cannot be read, `ValidatorSpecError` for
a bad validator entry, ...); each command's entry point names, with `exit_codes`, which of them mean "the user's
input is wrong", so no job has to translate them.
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from typing import Any

from pipelines.core import interrupts

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # the shell's convention for Ctrl-C

Command = Callable[[Any], int]


class UsageError(Exception):
    """Bad command-line input; the message names the offending flag or value. Exit code 2."""


def exit_codes(*usage: type[Exception]) -> Callable[[Command], Command]:
    """Decorator for a command's entry point `run(args) -> int`: what it raises becomes an exit code.

    `UsageError`, `OSError` (a path that cannot be read or written), the `usage` types and the loss of Spark's
    JVM print one line `tidegauge CMD: error: ...` and exit 2; Ctrl-C prints `tidegauge CMD: interrupted` and
    exits 130, whatever error it turned into (`pipelines.core.interrupts`); anything else is a bug: its
    traceback, a line saying no result was written, and exit 2. However the run ends early, the staging
    directories it started are removed first.
    """

    def decorate(run: Command) -> Command:
        @functools.wraps(run)
        def entry(args: Any) -> int:
            from pipelines.core.publish import unfinished_now

            name = command_name(args)
            interrupts.reset()
            interrupts.install()
            earlier = (
                unfinished_now()
            )  # other runs' in this process (tests, the demo): not this run's to remove
            try:
                interrupts.import_uncut()
                code = int(run(args))
            except BaseException as exc:
                return _failed(name, exc, usage, earlier)
            if interrupts.interrupted():  # a KeyboardInterrupt was swallowed on the way: no result to trust
                return _failed(name, KeyboardInterrupt(), usage, earlier)
            return code

        return entry

    return decorate


def command_name(args: Any) -> str:
    """The command as typed, e.g. `div validate` (`pipelines.cli` sets `command_name` for every subcommand)."""
    return getattr(args, "command_name", None) or getattr(args, "command", None) or "?"


def _failed(
    name: str, exc: BaseException, usage: tuple[type[Exception], ...], earlier: frozenset = frozenset()
) -> int:
    """The exit code of a run `exc` ended, after its line on stderr and the removal of its staging directories."""
    interrupted = interrupts.interrupted() or interrupts.caused_by_interrupt(exc)
    if interrupted:
        interrupts.ignore()  # a second Ctrl-C must not cut the clean-up short with a traceback of its own
    from pipelines.core.publish import abandon_unfinished

    left = abandon_unfinished(earlier=earlier)
    if interrupted:
        print(
            f"tidegauge {name}: interrupted"
            + (f"; could not remove {', '.join(left)} (remove it by hand)" if left else ""),
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if not isinstance(exc, Exception):
        raise exc
    if isinstance(exc, (UsageError, *usage)):
        print(f"tidegauge {name}: error: {exc}", file=sys.stderr)
    elif spark_gone(exc):
        print(
            f"tidegauge {name}: error: Spark's JVM stopped answering ({exc}). It most likely ran out "
            "of memory: its own messages above say why. No result was written for this run.",
            file=sys.stderr,
        )
    elif isinstance(exc, OSError):
        print(f"tidegauge {name}: error: {os_error(exc)}", file=sys.stderr)
    else:
        traceback.print_exception(exc)
        print(
            f"tidegauge {name}: internal error (the traceback above says where); no result was "
            "written for this run",
            file=sys.stderr,
        )
    return EXIT_USAGE


def spark_gone(exc: BaseException) -> bool:
    """Whether `exc` is py4j losing the Spark JVM (it died, e.g. out of memory). py4j raises that as a
    ConnectionRefusedError, an OSError, which would otherwise read as a path that cannot be opened."""
    if type(exc).__module__.startswith("py4j") and type(exc).__name__ == "Py4JNetworkError":
        return True
    if not isinstance(exc, ConnectionError):
        return False
    tb = exc.__traceback__
    while tb is not None:
        if "py4j" in tb.tb_frame.f_code.co_filename.replace("\\", "/").split("/"):
            return True
        tb = tb.tb_next
    return False


def os_error(exc: OSError) -> str:
    """One line naming the path and the reason, e.g. "cannot write /x/out: Read-only file system"."""
    what = exc.strerror or str(exc)
    if exc.filename is None:
        return what
    target = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else str(exc.filename)
    return f"{target}: {what} (nothing was replaced: an earlier output there is intact)"
