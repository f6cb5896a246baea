"""Job output directories: never destroy what tidegauge did not write, and swap results in atomically.

A user points `--out` at the wrong place sooner or later: at the archive the job just read, at a simulation, at a
home directory. So a job writes only into a place that is absent, an empty directory, or an earlier output of the
same command — marked by a small `.tidegauge` file naming the command and version (`check_output`) — and never
into or around its inputs (`check_disjoint`). Everything is checked before any work starts; a refusal is a usage
error (exit 2) naming the path, and nothing is touched.

Writing itself is atomic: everything is built in a staging directory beside the output, then swapped in. A job
killed midway leaves the previous output untouched (and at most a marked staging directory, which the next run
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
from pipelines.core.errors import UsageError

MARKER = ".tidegauge"

# What each command's outputs held before outputs were marked: an unmarked directory holding only these names
# (and at least the first) is taken for an earlier output of that command, so upgrading does not lock users out.
_LEGACY_OUTPUTS: dict[str, tuple[str, ...]] = {
    "leapfrog": ("summary.json", "inconsistencies"),
    "div validate": ("summary.json", "errors"),
    "div restore": ("summary.json", "partition_state.bin", "state.json"),
    "lag": ("lag.json", "lag", "heartbeats"),
    "report": ("report.json", "report.html"),
    "simulate": ("summary.json", "archive", "followers", "truth.json"),
}


class OutputRefused(UsageError):
    """An output path tidegauge must not write to; the message names it and says why (exit code 2)."""


def local_path(uri: str | os.PathLike) -> Path | None:
    """The absolute local path of a plain path or `file://` URI; None for other schemes (not checked here)."""
    text = os.fspath(uri)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        return None
    return Path(os.path.abspath(os.path.expanduser(text)))


def marker_of(path: Path) -> dict[str, Any] | None:
    """The `.tidegauge` marker of a directory, or None when it has none (or an unreadable one)."""
    try:
        doc = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _is_legacy_output(path: Path, command: str) -> bool:
    known = _LEGACY_OUTPUTS.get(command)
    if not known:
        return False
    names = {p.name for p in path.iterdir() if not p.name.startswith(".")}
    return known[0] in names and names <= set(known)


def _check_writable(p: Path, flag: str) -> None:
    """Refuse before any work when the output cannot be created: it is staged beside itself, in its parent (or
    the nearest parent that exists, where the missing ones will be made)."""
    where = p.absolute().parent
    while not where.exists() and where != where.parent:
        where = where.parent
    if os.access(where, os.W_OK | os.X_OK):
        return
    try:
        read_only = bool(os.statvfs(where).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    why = "Read-only file system" if read_only else "Permission denied"
    raise OutputRefused(f"{flag} {p.absolute()}: cannot write there: {why} ({where} is not writable)")


def check_output(path: str | os.PathLike, command: str, flag: str = "--out") -> None:
    """Refuse (OutputRefused) unless `path` is absent, an empty directory, or an earlier output of `command`."""
    p = local_path(path)
    if p is None:
        return
    if p.is_symlink() and not p.exists():
        raise OutputRefused(f"{flag} {path}: is a dangling symbolic link")
    _check_writable(p, flag)
    if not p.exists():
        return
    if not p.is_dir():
        raise OutputRefused(
            f"{flag} {path}: exists and is not a directory (tidegauge writes a directory there; "
            "choose a new path)"
        )
    try:
        empty = not any(p.iterdir())
    except OSError as exc:
        raise OutputRefused(f"{flag} {path}: cannot be listed: {exc.strerror}") from None
    if empty:
        return
    mark = marker_of(p)
    if mark is not None:
        if mark.get("command") != command:
            raise OutputRefused(
                f"{flag} {path}: holds the output of `tidegauge {mark.get('command')}`, not of "
                f"`tidegauge {command}`; choose another directory"
            )
        return
    if _is_legacy_output(p, command):
        return
    raise OutputRefused(
        f"{flag} {path}: the directory is not empty and is not an earlier output of `tidegauge "
        f"{command}` (no {MARKER} marker); tidegauge never replaces what it did not write: choose a "
        "new or empty directory"
    )


def check_disjoint(
    outputs: dict[str, str | os.PathLike | None], inputs: dict[str, str | os.PathLike | None]
) -> None:
    """Refuse an output equal to or inside an input, an input inside an output, and two outputs that nest.

    Keys are the labels the message uses (`--out`, `--source 1`); None values are ignored."""
    outs = {k: local_path(v) for k, v in outputs.items() if v is not None}
    ins = {k: local_path(v) for k, v in inputs.items() if v is not None}
    outs = {k: v for k, v in outs.items() if v is not None}
    ins = {k: v for k, v in ins.items() if v is not None}
    for ok, o in outs.items():
        o_real = Path(os.path.realpath(o))
        for ik, i in ins.items():
            i_real = Path(os.path.realpath(i))
            if o_real == i_real or o_real.is_relative_to(i_real):
                raise OutputRefused(
                    f"{ok} {outputs[ok]}: is inside {ik} ({inputs[ik]}), which this job reads; "
                    "write the output somewhere else"
                )
            if i_real.is_relative_to(o_real):
                raise OutputRefused(
                    f"{ok} {outputs[ok]}: contains {ik} ({inputs[ik]}), which this job reads; "
                    "write the output somewhere else"
                )
        for ok2, o2 in outs.items():
            if ok2 != ok and Path(os.path.realpath(o2)).is_relative_to(o_real):
                raise OutputRefused(
                    f"{ok} {outputs[ok]} and {ok2} {outputs[ok2]} overlap; give them separate directories"
                )


def write_marker(directory: Path, command: str) -> None:
    atomic_write(
        directory / MARKER,
        (
            json.dumps(
                {
                    "command": command,
                    "tidegauge_version": tidegauge_version(),
                    "written_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                }
            )
            + "\n"
        ).encode(),
    )


def tidegauge_version() -> str:
    try:
        from importlib.metadata import version

        return version("tidegauge")
    except Exception:
        return "0+unknown"


class OutputDir:
    """`with OutputDir(path, command) as out:` write under `out.staging`; on success the staging dir, marked as
    `command`'s output, replaces `path`. Entering refuses (OutputRefused) a path `check_output` refuses."""

    def __init__(self, path: str | os.PathLike, command: str) -> None:
        local = local_path(path)
        if local is None:
            raise OutputRefused(f"--out {path}: only local paths and file:// URIs can be written so far")
        self.path = local
        self.command = command
        self.staging = self.path.with_name(f".{self.path.name}.staging-{os.getpid()}")
        self.started = time.time()
        self.started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")

    def __enter__(self) -> OutputDir:
        check_output(self.path, self.command)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for old in self.path.parent.glob(f".{self.path.name}.staging-*"):
                if (old / MARKER).exists():  # only staging directories an earlier run of ours left
                    shutil.rmtree(old, ignore_errors=True)
            self.staging.mkdir()
            write_marker(self.staging, self.command)
        except OSError as exc:  # before any work: say where, not which staging file
            shutil.rmtree(self.staging, ignore_errors=True)
            raise OutputRefused(f"--out {self.path}: cannot write there: {exc.strerror or exc}") from None
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
        if self.path.exists():  # checked on entry: empty, or an earlier output of this command
            old = self.path.with_name(f".{self.path.name}.old-{os.getpid()}")
            os.replace(self.path, old)
        os.replace(self.staging, self.path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def file(self, name: str) -> Path:
        return self.staging / name

    def write_json(self, name: str, data: Any) -> Path:
        path = self.file(name)
        atomic_write(
            path, (json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n").encode()
        )
        return path

    def common_fields(
        self, job: str, exit_code: int, sources: dict[int, str] | None = None
    ) -> dict[str, Any]:
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


def check_history(path: str | os.PathLike | None) -> None:
    """`report --history`: absent, empty, or holding only the run files the report appends (`run-*.parquet`)."""
    p = local_path(path) if path is not None else None
    if p is None or not p.exists():
        return
    if not p.is_dir():
        raise OutputRefused(f"--history {path}: exists and is not a directory")
    mark = marker_of(p)
    if mark is not None and mark.get("command") == "report history":
        return
    strangers = [
        c.name
        for c in p.iterdir()
        if not c.name.startswith(".") and not (c.name.startswith("run-") and c.name.endswith(".parquet"))
    ]
    if strangers:
        raise OutputRefused(
            f"--history {path}: holds files the report did not write ({', '.join(sorted(strangers)[:3])}"
            f"{', ...' if len(strangers) > 3 else ''}); choose a new or empty directory"
        )


def guard(
    command: str, outputs: dict[str, str | os.PathLike | None], inputs: dict[str, str | os.PathLike | None]
) -> None:
    """Every check a job makes of its outputs before any work: each output absent, empty or its own earlier
    output, none inside or around an input. Raises OutputRefused naming the path."""
    check_disjoint(outputs, inputs)  # first: "it is your input" says more than "it is not empty"
    for flag, path in outputs.items():
        if path is None:
            continue
        if flag != "--state":
            check_output(path, command, flag)
        elif (local := local_path(path)) is not None:  # a state directory's content is checked by its loader
            _check_writable(local, flag)


def source_inputs(specs) -> dict[str, str]:
    """`--source N` → URI, for check_disjoint."""
    return {f"--source {s.region}": s.uri for s in specs}
