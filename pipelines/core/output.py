"""Job output directories: never destroy what tidegauge did not write, and publish results whole.

A user points `--out` at the wrong place sooner or later: at the archive the job just read, at a simulation, at a
home directory. So a job writes only into a place that is absent, an empty directory, or an earlier output of the
same command — marked by a small `.tidegauge` file naming the command and version (`check_output`) — and never
into or around its inputs (`check_disjoint`). Everything is checked before any work starts; a refusal is a usage
error (exit 2) naming the path, and nothing is touched.

Outputs may live on any filesystem `pipelines.core.storage` serves. Writing is published whole
(`pipelines.core.publish`): everything is built in a staging directory, then swapped in by renames (local disk,
HDFS) or published by one pointer object (object stores). A job killed midway leaves the previous output as it
was; re-running gives the same result.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines.core.errors import UsageError
from pipelines.core.publish import (
    MARKER,
    POINTER,
    RUNS,
    Publication,
    current,
    marker_text,
    recover,
    tidegauge_version,
)
from pipelines.core.sources import is_kafka
from pipelines.core.storage import Location, StorageError, is_local, locate, scheme

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
    """The absolute local path of a plain path or `file://` URI; None for other schemes."""
    return locate(uri).local if is_local(uri) else None


def _locate(path: str | os.PathLike, flag: str) -> Location:
    try:
        return locate(path)
    except StorageError as exc:
        raise OutputRefused(f"{flag} {exc}") from None


def marker_of(path: Location | str | os.PathLike) -> dict[str, Any] | None:
    """The `.tidegauge` marker of a directory, or None when it has none (or an unreadable one)."""
    loc = path if isinstance(path, Location) else locate(path)
    try:
        doc = json.loads((loc / MARKER).read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _is_legacy_output(loc: Location, command: str) -> bool:
    known = _LEGACY_OUTPUTS.get(command)
    if not known:
        return False
    names = {c.name for c in loc.children() if not c.name.startswith(".")}
    return known[0] in names and names <= set(known)


def _is_unpublished_run(loc: Location, command: str) -> bool:
    """An object-store target holding only runs of `command` that were never published (killed first runs)."""
    names = {c.name for c in loc.children()}
    if not loc.is_object_store or not names <= {MARKER, POINTER, RUNS}:
        return False
    runs = (loc / RUNS).children()
    return bool(runs) and all((marker_of(r) or {}).get("command") == command for r in runs)


def _check_writable(p: Path, flag: str) -> None:
    """Refuse before any work when a local output cannot be created: it is staged beside itself, in its parent
    (or the nearest parent that exists, where the missing ones will be made)."""
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
    loc = _locate(path, flag)
    p = loc.local
    if p is not None:
        if p.is_symlink() and not p.exists():
            raise OutputRefused(f"{flag} {path}: is a dangling symbolic link")
        _check_writable(p, flag)
        recover(loc)
    try:
        kind = loc.info().type
        if kind == pafs.FileType.NotFound:
            return
        if kind != pafs.FileType.Directory:
            raise OutputRefused(
                f"{flag} {path}: exists and is not a directory (tidegauge writes a directory there; "
                "choose a new path)"
            )
        empty = not loc.children()
    except OSError as exc:
        raise OutputRefused(
            f"{flag} {path}: cannot be listed: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    if empty:
        return
    mark = marker_of(loc)
    if mark is not None:
        if mark.get("command") != command:
            raise OutputRefused(
                f"{flag} {path}: holds the output of `tidegauge {mark.get('command')}`, not of "
                f"`tidegauge {command}`; choose another directory"
            )
        return
    if _is_legacy_output(loc, command) or _is_unpublished_run(loc, command):
        return
    raise OutputRefused(
        f"{flag} {path}: the directory is not empty and is not an earlier output of `tidegauge "
        f"{command}` (no {MARKER} marker); tidegauge never replaces what it did not write: choose a "
        "new or empty directory"
    )


def _comparable(path: str | os.PathLike) -> str:
    """A path as a string that nests like the place it names: the real path on local disk, else the URI with
    Hadoop's scheme aliases (s3a://) spelled as pyarrow's."""
    text = os.fspath(path)
    if is_local(text):
        return os.path.realpath(locate(text).path).rstrip("/") + "/"
    return f"{scheme(text)}://{text.split('://', 1)[1]}".rstrip("/") + "/"


def check_disjoint(
    outputs: dict[str, str | os.PathLike | None], inputs: dict[str, str | os.PathLike | None]
) -> None:
    """Refuse an output equal to or inside an input, an input inside an output, and two outputs that nest.

    Keys are the labels the message uses (`--out`, `--source 1`); None values and Kafka sources are ignored."""
    outs = {k: _comparable(v) for k, v in outputs.items() if v is not None}
    ins = {k: _comparable(v) for k, v in inputs.items() if v is not None and not is_kafka(os.fspath(v))}
    for ok, o in outs.items():
        for ik, i in ins.items():
            if o.startswith(i):
                raise OutputRefused(
                    f"{ok} {outputs[ok]}: is inside {ik} ({inputs[ik]}), which this job reads; "
                    "write the output somewhere else"
                )
            if i.startswith(o):
                raise OutputRefused(
                    f"{ok} {outputs[ok]}: contains {ik} ({inputs[ik]}), which this job reads; "
                    "write the output somewhere else"
                )
        for ok2, o2 in outs.items():
            if ok2 != ok and o2.startswith(o):
                raise OutputRefused(
                    f"{ok} {outputs[ok]} and {ok2} {outputs[ok2]} overlap; give them separate directories"
                )


def write_marker(directory: Location | Path | str, command: str) -> None:
    loc = directory if isinstance(directory, Location) else locate(directory)
    (loc / MARKER).write_text(marker_text(command))


class OutputDir:
    """`with OutputDir(path, command) as out:` write under `out.staging` (a Location: `out.file(name)`,
    `out.write_json`, `out.write_table`); on success the staging directory, marked as `command`'s output, is
    published as `path`. Entering refuses (OutputRefused) a path `check_output` refuses."""

    def __init__(self, path: str | os.PathLike, command: str) -> None:
        self.target = _locate(path, "--out")
        self.path = self.target.uri
        self.command = command
        self.publication = Publication(self.target, command)
        self.staging: Location | None = None
        self.started = time.time()
        self.started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")

    def __enter__(self) -> OutputDir:
        check_output(self.path, self.command)
        try:
            self.staging = self.publication.stage()  # marked as `command`'s from its first moment
        except OSError as exc:  # before any work: say where, not which staging file
            self.publication.abandon()
            raise OutputRefused(
                f"--out {self.path}: cannot write there: {getattr(exc, 'strerror', None) or exc}"
            ) from None
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.publication.abandon()
            return
        self.commit()

    def commit(self) -> None:
        if self.staging is None or not self.staging.exists():
            return
        self.publication.publish()
        self.staging = None

    @property
    def published(self) -> Location:
        """Where readers find the published output (`--out` itself, or the run its pointer names)."""
        return current(self.target)

    def file(self, name: str) -> Location:
        assert self.staging is not None
        return self.staging / name

    def write_json(self, name: str, data: Any) -> Location:
        path = self.file(name)
        path.write_text(json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n")
        return path

    def write_table(self, name: str, table: pa.Table) -> Location:
        """A one-file Parquet dataset `name/part-00000.parquet`."""
        d = self.file(name)
        d.makedirs()
        write_parquet_file(table, d / "part-00000.parquet")
        return d

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


class ParquetFileWriter:
    """A Parquet file written in pieces that appears whole or not at all: one upload, completed on `close`, on
    an object store; a temporary name renamed on `close` elsewhere. Opened at the first write, so a writer that
    gets no rows leaves nothing."""

    def __init__(self, target: Location, schema: pa.Schema, **options: Any) -> None:
        self.target, self.schema, self.options = target, schema, options
        self.tmp: Location | None = None
        self.writer: pq.ParquetWriter | None = None

    def write(self, data: pa.Table | pa.RecordBatch) -> None:
        if self.writer is None:
            t = self.target
            self.tmp = t if t.is_object_store else t.parent / f".{t.name}.{uuid.uuid4().hex[:8]}.tmp"
            self.writer = pq.ParquetWriter(self.tmp.path, self.schema, filesystem=t.fs, **self.options)
        if isinstance(data, pa.RecordBatch):
            self.writer.write_batch(data)
        else:
            self.writer.write_table(data)

    def close(self) -> None:
        if self.writer is None:
            return
        self.writer.close()
        self.writer = None
        if self.tmp != self.target:
            self.tmp.move_to(self.target)

    def abort(self) -> None:
        """Give up: nothing appears at the target (a temporary file written so far is removed)."""
        if self.writer is None:
            return
        try:
            self.writer.close()
        finally:
            self.writer = None
            if self.tmp is not None:
                self.tmp.remove()


def write_parquet_file(table: pa.Table, target: Location, **options: Any) -> None:
    """One Parquet file holding `table` (its schema even when empty), appearing whole."""
    w = ParquetFileWriter(target, table.schema, **options)
    w.write(table)
    w.close()


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
    if path is None:
        return
    loc = _locate(path, "--history")
    kind = loc.info().type
    if kind == pafs.FileType.NotFound:
        return
    if kind != pafs.FileType.Directory:
        raise OutputRefused(f"--history {path}: exists and is not a directory")
    mark = marker_of(loc)
    if mark is not None and mark.get("command") == "report history":
        return
    strangers = [
        c.name
        for c in loc.children()
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
    output, none inside or around an input. Raises OutputRefused naming the path. `--state` and `--history` are
    directories a run adds to, not outputs it replaces: their loaders check their content (`check_history`)."""
    check_disjoint(outputs, inputs)  # first: "it is your input" says more than "it is not empty"
    for flag, path in outputs.items():
        if path is None:
            continue
        if flag not in ("--state", "--history"):
            check_output(path, command, flag)
        elif (local := local_path(path)) is not None:
            _check_writable(local, flag)


def source_inputs(specs) -> dict[str, str]:
    """`--source N` → URI, for check_disjoint."""
    return {f"--source {s.region}": s.uri for s in specs}


def read_output(
    path: str, flag: str, command: str, jobs: tuple[str | None, ...]
) -> tuple[Location, dict[str, Any]]:
    """Another command's published output given as an input (`flag`, e.g. `--plan`): where it is published and its
    summary.json. A usage error names the flag and says which command's --out to give when `path` is not a
    directory, has no readable summary.json, or is not the output of one of `jobs` (its summary's `job`)."""
    hint = f"give the --out of a `tidegauge {command}` run"
    try:
        where = locate(path)
        if not where.is_dir():
            raise UsageError(f"{flag} {path}: not a directory ({hint})")
        where = current(where)
        raw = (where / "summary.json").read_text()
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read its summary.json ({exc}); {hint}") from None
    try:
        summary = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag} {path}: summary.json is not JSON ({exc})") from None
    if not isinstance(summary, dict) or summary.get("job") not in jobs or "store" not in summary:
        raise UsageError(f"{flag} {path}: not the output of `tidegauge {command}`")
    return where, summary
