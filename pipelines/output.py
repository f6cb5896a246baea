"""Job output directories, written atomically: build everything in a staging directory, then swap it in.

A job killed midway leaves the previous output untouched (and at most a staging directory, which the next run
removes); re-running gives the same result.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from div.checkpoint import atomic_write


def tidegauge_version() -> str:
    try:
        from importlib.metadata import version

        return version("tidegauge")
    except Exception:
        return "0+unknown"


class OutputDir:
    """`with OutputDir(path) as out:` write under `out.staging`; on success the staging dir replaces `path`."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.staging = self.path.with_name(f".{self.path.name}.staging-{os.getpid()}")
        self.started = time.time()
        self.started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")

    def __enter__(self) -> OutputDir:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for old in self.path.parent.glob(f".{self.path.name}.staging-*"):
            shutil.rmtree(old, ignore_errors=True)
        self.staging.mkdir()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            return
        self.commit()

    def commit(self) -> None:
        if not self.staging.exists():
            return
        old = None
        if self.path.exists():
            old = self.path.with_name(f".{self.path.name}.old-{os.getpid()}")
            os.replace(self.path, old)
        os.replace(self.staging, self.path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def file(self, name: str) -> Path:
        return self.staging / name

    def write_json(self, name: str, data: Any) -> Path:
        path = self.file(name)
        atomic_write(path, (json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n").encode())
        return path

    def common_fields(self, job: str, exit_code: int, sources: dict[int, str] | None = None) -> dict[str, Any]:
        return {
            "job": job,
            "tidegauge_version": tidegauge_version(),
            "started_at": self.started_at,
            "elapsed_s": round(time.time() - self.started, 3),
            "exit_code": exit_code,
            "sources": {str(k): v for k, v in (sources or {}).items()},
        }


def versions() -> dict[str, str]:
    out = {"tidegauge": tidegauge_version(), "python": platform.python_version()}
    for mod in ("pyspark", "pyarrow", "fastavro", "confluent_kafka"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = getattr(m, "__version__", "?")
    return out


def _json_default(o: Any) -> Any:
    if isinstance(o, bytes):
        return o.hex()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")
