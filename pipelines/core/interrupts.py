"""Ctrl-C: whether this run was interrupted, recorded where the signal arrives, because the error that ends the run
often does not say so.

A KeyboardInterrupt that cuts a Spark call short rarely arrives as itself: the call the driver was waiting in
fails with whatever the cancelled job left (a `Py4JJavaError` "job cancelled" or "broken pipe", a `Py4JError`),
raised while handling the KeyboardInterrupt or instead of it. So the handler `install()` puts in place records the
interrupt first, and the command's entry point (`pipelines.core.errors.exit_codes`) reads that record, not the
error's type, to say `interrupted` (exit 130). Once interrupted, nothing but that line is printed: Python logging is
switched off and `pipelines.core.spark_session` stops copying what Spark's JVM and its workers say while their
jobs are cancelled under them (`arrived()`: Spark's Python workers share the terminal's process group and get the
same SIGINT, and the JVM may log their KeyboardInterrupt before the driver's main thread has run its handler).

pyspark installs a SIGINT handler of its own with every SparkContext (it cancels Spark's jobs, then raises
KeyboardInterrupt); ours replaces it (`install()` again once the session is up) and cancels the jobs from another
thread (`on_interrupt`): pyspark's calls Spark from inside the handler, which breaks (py4j: "reentrant call") when
the interrupted code was itself waiting in a Spark call.

`held()` marks a block that Ctrl-C must not cut in two (publishing an output: two renames): an interrupt during it
is recorded and raised when the block ends. `import_uncut()` imports, in such a block, the extension modules whose
initialisation Ctrl-C must not cut (`UNCUT_IMPORTS`).

Imports nothing of tidegauge's: publishing, the Spark session and the exit codes all use it.
"""

from __future__ import annotations

import _thread
import contextlib
import importlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

_interrupted = threading.Event()
_held = 0  # depth of `held()` blocks in the main thread
_pending = False  # an interrupt arrived inside a `held()` block
_hooks: list[Callable[[], None]] = []
# the read end of the pipe Python's C-level signal handler writes each signal's number to (`_watch_arrivals`)
_wakeup: int | None = None
_arrived = False  # a SIGINT for our handler was seen in that pipe

# Extension modules whose import runs Python source through the C API's PyRun_String (Cython's shims: cavro's
# dataclass and abc patches). A KeyboardInterrupt that escapes such a run marks the interpreter as ended by Ctrl-C
# (CPython's Py_RunMain), even when the command catches it: `python -m pipelines.cli` then dies by SIGINT after
# printing its line, whatever exit code it returns. Imported whole, before the command's work, they never meet one.
UNCUT_IMPORTS: tuple[str, ...] = ("cavro",)


def interrupted() -> bool:
    """Whether SIGINT reached this process since the command started."""
    return _interrupted.is_set()


def stop_if_interrupted() -> None:
    """Raise KeyboardInterrupt if the run was interrupted. For code that catches a failed Spark call and goes on
    with more work (a retry): the failure may be what Ctrl-C's cancellation left, and the KeyboardInterrupt itself
    may never reach that code (raised where Python drops it), so the record of the interrupt decides."""
    if _interrupted.is_set():
        raise KeyboardInterrupt


def on_interrupt(hook: Callable[[], None]) -> None:
    """Run `hook` (once, in a thread of its own) when the run is interrupted, e.g. to cancel Spark's jobs."""
    if hook not in _hooks:
        _hooks.append(hook)


def _run_hooks() -> None:
    for hook in list(_hooks):
        try:
            hook()
        except Exception:  # noqa: BLE001 - the run is ending anyway; a hook that fails changes nothing
            pass


def _on_sigint(signum: int, frame: Any) -> None:
    global _pending
    if not _interrupted.is_set():
        _interrupted.set()
        logging.disable(logging.CRITICAL)  # from now on the one line `interrupted` says it all
        threading.Thread(target=_run_hooks, name="tidegauge-interrupted", daemon=True).start()
    if _held:
        _pending = True
        return
    if _in_weakref_callback(frame):
        # Python runs a weakref callback (py4j's, when a Java object's proxy is collected) where the collection
        # happened, and drops what it raises ("Exception ignored in"): the KeyboardInterrupt would be lost and
        # the run go on (a job whose Spark tasks never end ran until killed). Deliver it again in a moment.
        threading.Timer(0.05, _thread.interrupt_main).start()
        return
    raise KeyboardInterrupt


# py4j's weakref callbacks (java_gateway.py): collecting a Java object's proxy or a connection
_WEAKREF_CALLBACKS = {
    "<lambda>",
    "_garbage_collect_object",
    "_garbage_collect_connection",
    "_garbage_collect_proxy",
}


def _in_weakref_callback(frame: Any) -> bool:
    while frame is not None:
        code = frame.f_code
        if code.co_name in _WEAKREF_CALLBACKS and code.co_filename.endswith(
            os.path.join("py4j", "java_gateway.py")
        ):
            return True
        frame = frame.f_back
    return False


def install() -> None:
    """Put the recording handler in place of whatever handles SIGINT now. Called when a command starts, and
    again after anything that installs a handler of its own (a new SparkContext does). Not outside the main
    thread (where Python lets no handler be set), nor where SIGINT is ignored on purpose."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        signal.signal(signal.SIGINT, _on_sigint)
        _watch_arrivals()


def _watch_arrivals() -> None:
    """Have Python's C-level handler write each signal's number into a pipe the moment the signal arrives, in
    whichever thread the kernel picks: the Python handler runs later, when the main thread gets to it."""
    global _wakeup
    if _wakeup is not None:
        return
    read, write = os.pipe()  # (not inherited by Spark's JVM or any child)
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    if signal.set_wakeup_fd(write, warn_on_full_buffer=False) != -1:  # someone's own (an event loop): theirs
        signal.set_wakeup_fd(-1)
        os.close(read)
        os.close(write)
        return
    _wakeup = read


def arrived() -> bool:
    """Whether a SIGINT our handler handles has reached this process, even if the handler has not run yet: for a
    thread that must stop talking at once (the one copying Spark's stderr to the console)."""
    global _arrived
    if _interrupted.is_set() or _arrived:
        return True
    if _wakeup is None:
        return False
    try:
        numbers = os.read(_wakeup, 512)
    except BlockingIOError:
        return False
    if signal.SIGINT in numbers and signal.getsignal(signal.SIGINT) is _on_sigint:
        _arrived = True
    return _arrived


def ignore() -> None:
    """Ignore further SIGINTs: the run is ending (a second Ctrl-C must not cut its clean-up short and print a
    traceback of its own)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A block Ctrl-C does not cut in two: an interrupt during it raises KeyboardInterrupt when it ends."""
    global _held, _pending
    main = threading.current_thread() is threading.main_thread()
    if main:
        _held += 1
    try:
        yield
    finally:
        if main:
            _held -= 1
    if main and not _held and _pending:
        _pending = False
        raise KeyboardInterrupt


def import_uncut() -> None:
    """Import the installed `UNCUT_IMPORTS` in a `held()` block: a Ctrl-C meanwhile is raised once they are in."""
    with held():
        for name in UNCUT_IMPORTS:
            try:
                importlib.import_module(name)
            except ImportError:  # an optional decoder that is not installed: nothing to protect
                pass


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether `exc` is a KeyboardInterrupt, or was raised while handling one (or because of one): what a
    KeyboardInterrupt turns into when it cuts a Spark call short, even where `install()` could not record it."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, KeyboardInterrupt):
            return True
        todo += [e.__cause__, e.__context__]
    return False


def reset() -> None:
    """A command starts: forget an interrupt recorded for an earlier one (tests run several in one process)."""
    global _pending, _arrived
    if _interrupted.is_set():
        logging.disable(logging.NOTSET)
    _interrupted.clear()
    _pending = _arrived = False
    with contextlib.suppress(BlockingIOError):
        while _wakeup is not None and os.read(_wakeup, 512):  # the numbers of signals that came before
            pass
