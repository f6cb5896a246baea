"""One machine-wide lock for the suite's installs (apt-get, dpkg): the suite runs on two pytest-xdist workers, and
apt refuses a second client while one holds its lock instead of waiting for it. Installs that go through Maven
need none of this: `sim.maven` takes its own lock per jar set."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "tidegauge-tests-installs.lock"


@contextmanager
def installs_lock() -> Iterator[None]:
    """Held while one worker installs or unpacks a package; the other waits, then finds it installed."""
    with open(LOCK, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
