"""Ctrl-C in one process (issue 28): whatever error a KeyboardInterrupt turns into, the command says
`interrupted` once and exits 130, and the staging directories it started are gone (or named when they cannot be
removed); a publication is never cut between its two renames. tests/test_interrupt.py sends real SIGINTs to real
jobs, Spark's included."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time

import pytest

from pipelines.core import errors, interrupts, publish
from pipelines.core.storage import locate


@pytest.fixture(autouse=True)
def _sigint_restored():
    """These tests install the recording handler (and, once interrupted, ignore SIGINT) in pytest's own process:
    put Python's handler back, and logging on, after each."""
    yield
    interrupts.reset()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    assert not logging.root.manager.disable


def _entry(run):
    return errors.exit_codes()(run)


def _ctrl_c() -> None:
    """What a terminal's Ctrl-C does to this process: SIGINT, handled by whatever handler is in place."""
    signal.raise_signal(signal.SIGINT)


def test_an_error_raised_while_handling_a_keyboard_interrupt_is_an_interrupt(capsys):
    """pyspark's collect: the KeyboardInterrupt cuts a socket read, its `finally` then fails with a Py4JJavaError."""

    def run(args) -> int:
        try:
            raise KeyboardInterrupt
        finally:
            raise RuntimeError("An error occurred while calling o205.getResult: broken pipe")

    code = _entry(run)(argparse.Namespace(command="leapfrog"))
    err = capsys.readouterr().err
    assert (code, err) == (130, "tidegauge leapfrog: interrupted\n")


def test_a_recorded_interrupt_wins_over_whatever_error_ends_the_run(capsys):
    """The error need not even know of the KeyboardInterrupt (py4j's "reentrant call", a lost connection)."""

    def run(args) -> int:
        try:
            _ctrl_c()
        except KeyboardInterrupt:
            pass  # swallowed on the way, as some libraries do
        raise ConnectionRefusedError(111, "Connection refused")

    code = _entry(run)(argparse.Namespace(command_name="div validate"))
    assert (code, capsys.readouterr().err) == (130, "tidegauge div validate: interrupted\n")
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # a second Ctrl-C cannot cut the clean-up short


def test_a_swallowed_interrupt_is_no_result(capsys):
    def run(args) -> int:
        try:
            _ctrl_c()
        except KeyboardInterrupt:
            pass
        return 0

    assert _entry(run)(argparse.Namespace(command="lag")) == 130
    assert capsys.readouterr().err == "tidegauge lag: interrupted\n"


def test_nothing_is_logged_once_interrupted(caplog, capsys):
    def run(args) -> int:
        try:
            _ctrl_c()
        finally:
            logging.getLogger("py4j.clientserver").error("Exception while sending command.")
        return 0

    assert _entry(run)(argparse.Namespace(command="leapfrog")) == 130
    assert not caplog.records


def test_the_staging_directories_of_an_interrupted_run_are_removed(tmp_path, capsys):
    """The output's and the incremental state's (which no `with` block removes)."""
    stagings = []

    def run(args) -> int:
        for name in ("out", "state"):
            staging = publish.Publication(locate(tmp_path / name), "leapfrog").stage()
            (staging / "part-0.parquet").write_bytes(b"x")
            stagings.append(staging)
        _ctrl_c()
        return 0

    assert _entry(run)(argparse.Namespace(command="leapfrog")) == 130
    assert capsys.readouterr().err == "tidegauge leapfrog: interrupted\n"
    assert stagings and not any(s.exists() for s in stagings)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_staging_directory_that_cannot_be_removed_is_named(tmp_path, capsys, monkeypatch):
    Location = type(locate(tmp_path))
    remove = Location.remove

    def refuse(self):
        raise PermissionError(13, "Permission denied", self.path)

    def run(args) -> int:
        publish.Publication(locate(tmp_path / "out"), "lag").stage()
        monkeypatch.setattr(Location, "remove", refuse)
        raise KeyboardInterrupt

    monkeypatch.setattr(publish.time, "sleep", lambda s: None)
    assert _entry(run)(argparse.Namespace(command="lag")) == 130
    staging = tmp_path / f".out.staging-{os.getpid()}"
    assert capsys.readouterr().err == (
        f"tidegauge lag: interrupted; could not remove {staging} (remove it by hand)\n"
    )
    monkeypatch.setattr(Location, "remove", remove)
    assert publish.abandon_unfinished() == [] and not staging.exists()


def test_an_interrupt_while_publishing_lets_the_publication_finish_first(tmp_path, monkeypatch):
    """Between the two renames the previous content is set aside and nothing is at the target: Ctrl-C there waits."""
    target = locate(tmp_path / "out")
    first = publish.Publication(target, "leapfrog")
    (first.stage() / "summary.json").write_text("old")
    first.publish()
    second = publish.Publication(target, "leapfrog")
    (second.stage() / "summary.json").write_text("new")
    move = type(target).move_to

    def move_then_ctrl_c(self, other):
        move(self, other)
        if other.name.startswith(".out.old-"):  # the first of the two renames
            _ctrl_c()

    monkeypatch.setattr(type(target), "move_to", move_then_ctrl_c)
    interrupts.install()
    with pytest.raises(KeyboardInterrupt):
        second.publish()
    assert (tmp_path / "out" / "summary.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert second not in publish._unfinished  # (on an object store its staging run is what readers now read)


def test_a_sigint_is_seen_to_arrive_before_its_handler_runs():
    """The thread copying Spark's stderr stops at the signal itself: Spark's Python workers get the same Ctrl-C, and
    the JVM may log what it did to them before the driver's main thread gets round to the Python handler."""
    interrupts.install()
    seen = {}
    read, write = os.pipe()

    def elsewhere():  # a SIGINT delivered to this thread: the main thread, blocked in a read, cannot run the handler
        time.sleep(0.5)  # (the main thread is in its read by then)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        seen["arrived"], seen["handled"] = interrupts.arrived(), interrupts.interrupted()
        os.write(write, b"x")

    threading.Thread(target=elsewhere).start()
    with pytest.raises(KeyboardInterrupt):
        os.read(read, 1)  # returns once the thread has looked; the handler runs right after
    os.close(read)
    os.close(write)
    assert seen == {"arrived": True, "handled": False}
    assert interrupts.interrupted()


def test_once_interrupted_nothing_the_jvm_says_reaches_the_console():
    from pipelines.core.spark_session import _forward

    jvm_r, jvm_w = os.pipe()
    console_r, console_w = os.pipe()
    forward = threading.Thread(target=_forward, args=(jvm_r, console_w))
    forward.start()
    os.write(jvm_w, b"26/11/27 18:30:00 WARN before the Ctrl-C\n")
    time.sleep(0.5)  # (forwarded before the signal)
    interrupts.install()
    with pytest.raises(KeyboardInterrupt):
        _ctrl_c()
    os.write(jvm_w, b"26/11/27 18:30:01 ERROR Executor: Exception in task 0.0 (TID 3)\nTraceback ...\n")
    os.close(jvm_w)
    forward.join(10)
    with open(console_r, "rb") as console:
        assert console.read() == b"26/11/27 18:30:00 WARN before the Ctrl-C\n"


def test_a_failed_run_removes_its_own_staging_only(tmp_path, capsys):
    # Runs in one process (a test session, the demo) each clean up after themselves: a failing run must not touch
    # what another run staged (in CI one such directory was on an S3 server stopped since, and the clean-up hung).
    other = publish.Publication(locate(tmp_path / "other"), "lag")
    other_staging = other.stage()

    def run(args) -> int:
        publish.Publication(locate(tmp_path / "mine"), "lag").stage()
        raise KeyboardInterrupt

    try:
        assert _entry(run)(argparse.Namespace(command="lag")) == 130
        assert capsys.readouterr().err == "tidegauge lag: interrupted\n"
        assert other_staging.exists() and other in publish._unfinished
        assert [p.name for p in tmp_path.iterdir()] == [other_staging.name]
    finally:
        other.abandon()


def test_a_ctrl_c_that_lands_in_a_py4j_weakref_callback_is_delivered_again_not_lost():
    """Python drops what a weakref callback raises ("Exception ignored in"): a KeyboardInterrupt raised while
    py4j's callback collects a Java object's proxy was lost, and a Spark job whose tasks never end ran on (seen in
    CI: `div validate --engine spark` ignored Ctrl-C). The handler sees such a frame and delivers the interrupt
    again a moment later, where it is not dropped."""
    import sys

    scope: dict = {"sys": sys}
    exec(
        compile("grab = lambda: sys._getframe()", os.path.join("x", "py4j", "java_gateway.py"), "exec"), scope
    )
    in_callback = scope["grab"]()
    assert interrupts._in_weakref_callback(in_callback)
    assert not interrupts._in_weakref_callback(sys._getframe())

    previous = signal.signal(signal.SIGINT, interrupts._on_sigint)
    interrupts.reset()
    try:
        assert interrupts._on_sigint(signal.SIGINT, in_callback) is None  # not raised there: it would be lost
        assert interrupts.interrupted()
        with pytest.raises(KeyboardInterrupt):  # delivered again, to the main thread
            time.sleep(2)
    finally:
        signal.signal(signal.SIGINT, previous)
        interrupts.reset()
        logging.disable(logging.NOTSET)


# A module whose import runs Python source through the C API's PyRun_String, as Cython's module shims do (cavro's),
# and meets a Ctrl-C there.
PYRUN_SHIM = """
import ctypes
ctypes.pythonapi.PyRun_String.restype = ctypes.py_object
ctypes.pythonapi.PyRun_String.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]
ctypes.pythonapi.PyRun_String(
    b"import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nfor _ in range(100000): pass\\n", 257, {}, {}
)
"""

# `python -m` a command whose work imports that module: either as the command's entry imports it
# (`UNCUT_IMPORTS`), or within the command's own work (the control)
COMMAND = """
import argparse, sys
from pipelines.core import errors, interrupts

uncut = sys.argv[1] == "uncut"
interrupts.UNCUT_IMPORTS = ("pyrun_shim",) if uncut else ()


@errors.exit_codes()
def run(args):
    if not uncut:
        import pyrun_shim  # noqa: F401
    return 0


sys.exit(run(argparse.Namespace(command="simulate")))
"""


@pytest.mark.parametrize("where", ["uncut", "in-the-work"])
def test_a_ctrl_c_during_an_extension_import_still_exits_130(tmp_path, where):
    """CI once saw `python -m pipelines.cli simulate` print `interrupted` and then die by SIGINT (-2): the Ctrl-C
    had landed in cavro's import, inside a PyRun_String, and CPython remembers a KeyboardInterrupt that escapes one
    as unhandled, however the program goes on. The command's entry imports such modules whole, first."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "pyrun_shim.py").write_text(PYRUN_SHIM)
    (tmp_path / "command.py").write_text(COMMAND)
    repo = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [sys.executable, "-m", "command", where],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)])},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stderr == "tidegauge simulate: interrupted\n"
    # the control shows the premise: the same exit code and line, but the interpreter ends by SIGINT
    assert proc.returncode == (130 if where == "uncut" else -signal.SIGINT)


def test_a_spark_job_ctrl_c_cancelled_is_not_retried(monkeypatch):
    """`div validate --engine spark` retries a failed job partition by partition. A job Ctrl-C cancelled fails
    too, and the KeyboardInterrupt itself may be lost on the way (raised where Python drops it): no retry may
    start then, since a retry with a slow record validator would run on long after the Ctrl-C."""
    from pipelines.div import spark as div_spark

    class Frame:
        def persist(self, *_):
            return self

        def unpersist(self):
            pass

    jobs = []

    def job(*args):
        jobs.append(args)
        return Frame()

    def cancelled(df):
        try:
            _ctrl_c()
        except KeyboardInterrupt:
            pass  # lost on the way
        raise RuntimeError("Job 0 cancelled as part of cancellation of all jobs")

    interrupts.install()
    monkeypatch.setattr(div_spark, "_job", job)
    monkeypatch.setattr(div_spark, "_collect", cancelled)
    with pytest.raises(KeyboardInterrupt):
        div_spark._run_jobs(None, None, ["task-0", "task-1"], [1, 1], {}, "direct")
    assert len(jobs) == 1
