"""Ctrl-C during a batch job (issue 28): one line `tidegauge CMD: interrupted` on stderr, exit 130, no Python or
Java traceback, and nothing left behind (no staging directory, no half-written output).

Each job runs as the `tidegauge` command in a process group of its own, and SIGINT goes to the whole group, as a
terminal's Ctrl-C does: the CLI, Spark's JVM and the JVM's Python workers all get it. The signal is sent once the
job is surely at work: its staging directory exists (leapfrog), or a record validator that stalls on every record
says it has started (div validate: on the driver, or in a Spark executor's Python worker).
pipelines/core/test_interrupts.py pins the same contract piece by piece, in one process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from small_sim import small_sim

REPO = Path(__file__).resolve().parents[1]

# Printed by the JVM as it starts (Spark uses Java's incubating vector API), before any job work and whatever
# happens later; not a message of the run.
JVM_START_UP = ("WARNING: Using incubator modules: jdk.incubator.vector",)

STALL = '''
import os
import pathlib
import time

from div.validators.base import RecordValidator


class Stall(RecordValidator):
    """Says it has started (the file $TIDEGAUGE_TEST_STARTED), then takes a second per record."""

    def validate(self, record):
        pathlib.Path(os.environ["TIDEGAUGE_TEST_STARTED"]).touch()
        time.sleep(1)
        return None
'''


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    return small_sim(tmp_path_factory.mktemp("interrupt") / "sim", regions=2, partitions=2, records=1500)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(
    argv: list[str], tmp_path: Path, started, modules: Path | None = None, env: dict | None = None
) -> tuple[int, str, str]:
    """Run `tidegauge ARGV` (with `modules` importable), Ctrl-C it once `started()` holds; (exit code, what it
    wrote to stderr after the Ctrl-C, what it wrote before)."""
    err = tmp_path / "stderr"
    path = [str(REPO)] + ([str(modules)] if modules else [])
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", *argv],
            cwd=tmp_path,
            env={**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(path)},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            # a terminal's shell starts its foreground job with Ctrl-C's default disposition, whatever its own
            # (a background `pytest &` inherits SIGINT ignored, and so would the job, which rightly keeps it so)
            preexec_fn=_default_sigint,
        )
        try:
            deadline = time.monotonic() + 300
            while not started() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert proc.poll() is None, f"the job ended before it could be interrupted:\n{err.read_text()}"
            assert started(), "the job did not start its work within 300 s"
            before = (
                err.stat().st_size
            )  # the job's own lines until then (its progress) are not Ctrl-C's doing
            os.killpg(proc.pid, signal.SIGINT)
            code = proc.wait(120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = err.read_bytes()
    return code, text[before:].decode(), text[:before].decode()


def _assert_one_line(command: str, code: int, after: str, before: str) -> None:
    """Ctrl-C adds one line to what the job said until then, and the job said nothing alarming before either."""
    for text in (before, after):
        assert "Traceback" not in text and "Exception" not in text and "ERROR" not in text, before + after
    lines = [ln for ln in after.splitlines() if ln.strip() and ln not in JVM_START_UP]
    assert (code, lines) == (130, [f"tidegauge {command}: interrupted"]), before + after


def _staging(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.staging-*"))


@pytest.mark.slow
@pytest.mark.spark
def test_ctrl_c_during_leapfrog(sim, tmp_path):
    out = tmp_path / "lf"
    argv = ["leapfrog", "--store", sim.store, "--version", str(sim.version), "--out", str(out)]
    for region, archive in sorted(sim.archives.items()):
        argv += ["--source", f"{region}={archive}"]
    _assert_one_line("leapfrog", *_interrupt(argv, tmp_path, lambda: bool(_staging(out))))
    assert not _staging(out) and not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine", ["local", pytest.param("spark", marks=pytest.mark.spark)], ids=["driver", "spark-executor"]
)
def test_ctrl_c_during_div_validate(sim, tmp_path, engine):
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "stall_checks.py").write_text(STALL)
    started = tmp_path / "started"
    out = tmp_path / "div"
    argv = ["div", "validate", "--engine", engine, "--validator", "stall_checks:Stall", "--out", str(out)]
    argv += ["--source", f"0={sim.archives[0]}"]
    env = {"TIDEGAUGE_TEST_STARTED": str(started)}
    _assert_one_line("div validate", *_interrupt(argv, tmp_path, started.exists, modules, env))
    assert not _staging(out) and not out.exists()


@pytest.mark.slow
def test_ctrl_c_during_simulate_leaves_no_half_simulation(tmp_path):
    """simulate writes in place (a watch may read its growing archives): a new --out is removed whole. Its region
    workers are processes of their own, which get the Ctrl-C too, even while they are still starting."""
    out = tmp_path / "sim"
    argv = ["simulate", "--out", str(out), "--regions", "2", "--records", "200000", "--no-progress"]
    _assert_one_line("simulate", *_interrupt(argv, tmp_path, lambda: (out / "archive").exists()))
    assert not out.exists()
