"""Progress lines for long jobs, and the one human format for durations.

A nightly job that prints nothing for a minute looks hung. While a job runs, `Progress` logs one line at least
every 10 s (stage, records read so far, elapsed time, and on Spark the tasks of the running stages), from a
background thread so that a long Spark action or a slow partition cannot starve it. Records are counted where
they are read: driver loops call `add` (or wrap their batches in `counted`); Spark tasks add to an accumulator
(`accumulator()`), which the driver sees as each task finishes.

`duration` is how every command, the lag table and the report show a duration: 850 ms, 12.3 s, 4.2 min, 3.1 h,
2.0 days.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

log = logging.getLogger("tidegauge.progress")

INTERVAL_ENV = "TIDEGAUGE_PROGRESS_S"
DEFAULT_INTERVAL_S = 10.0


def duration(ms: float | int | None) -> str:
    """A duration in the unit a person reads fastest: 850 ms, 12.3 s, 4.2 min, 3.1 h, 2.0 days."""
    if ms is None or (isinstance(ms, float) and math.isnan(ms)):
        return "unknown"
    ms = float(ms)
    if abs(ms) < 1000:
        return f"{ms:.0f} ms"
    for unit, size in (("days", 86_400_000), ("h", 3_600_000), ("min", 60_000)):
        if abs(ms) >= size:
            return f"{ms / size:.1f} {unit}"
    return f"{ms / 1000:.1f} s"


def _interval() -> float:
    try:
        return max(0.05, float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S)))
    except ValueError:
        return DEFAULT_INTERVAL_S


class Progress:
    """Logs `job: stage, N records read, tasks d/t done, elapsed` at least every interval while in use.

    Use as a context manager; `stage(name)` names what runs now. Nothing is printed for a job shorter than one
    interval, nor before the first stage (opening the sources: a source that cannot be opened is one error line).
    """

    def __init__(self, job: str, *, spark: Any = None, every_s: float | None = None) -> None:
        self.job = job
        self.current: str | None = None  # no line until the job names its first stage
        self.records = 0
        self._spark = spark
        self._acc = None
        self._every = every_s if every_s is not None else _interval()
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the job tells us -------------------------------------------------------------------------
    def stage(self, name: str) -> None:
        self.current = name

    def add(self, records: int) -> None:
        self.records += records  # one writer thread per job; the ticker only reads

    def counted(self, batches: Iterable) -> Iterator:
        """`batches` unchanged, each one's rows added to the records read."""
        for b in batches:
            self.add(b.num_rows)
            yield b

    def accumulator(self):
        """A Spark accumulator for tasks to add their records to (created on first use)."""
        if self._acc is None and self._spark is not None:
            self._acc = self._spark.sparkContext.accumulator(0)
        return self._acc

    # -- the line ----------------------------------------------------------------------------------------
    def line(self) -> str:
        records = self.records + (self._acc.value if self._acc is not None else 0)
        parts = [f"{self.job}: {self.current}", f"{records:,} records read"]
        tasks = self._tasks()
        if tasks is not None:
            parts.append(tasks)
        parts.append(f"{duration((time.monotonic() - self._t0) * 1000)} elapsed")
        return ", ".join(parts)

    def _tasks(self) -> str | None:
        if self._spark is None:
            return None
        try:
            tracker = self._spark.sparkContext.statusTracker()
            infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
        except Exception:  # noqa: BLE001 - a progress line must never fail a job
            return None
        infos = [i for i in infos if i is not None]
        if not infos:
            return None
        total = sum(i.numTasks for i in infos)
        done = sum(i.numCompletedTasks for i in infos)
        running = sum(i.numActiveTasks for i in infos)
        return f"tasks {done}/{total} done, {running} running"

    # -- the ticker --------------------------------------------------------------------------------------
    def _tick(self) -> None:
        while not self._stop.wait(self._every):
            if self.current is not None:
                log.info("%s", self.line())

    def __enter__(self) -> Progress:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._tick, name=f"tidegauge-progress-{self.job}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
