"""Remember each report run in a history directory, to show trends and what changed since the last run.

One Parquet file per run (one row: the counts, and the identity of every finding), written under a hidden
temporary name and renamed into place, so a reader never sees half a run and concurrent runs never append
to the same file. A finding is "the same" from one run to the next when its identity matches:
(store, version, partition, region pair, type, key) for a divergence, (region, topic, partition, offset, type)
for a DIV finding.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.core.storage import Location, locate

DIVERGENCE_ID = ("store", "version", "partition", "region_a", "region_b", "type", "key_hex")
DIV_FINDING_ID = ("region", "topic", "partition", "offset", "type")

_DIVERGENCE_STRUCT = pa.struct(
    [
        ("store", pa.string()),
        ("version", pa.int32()),
        ("partition", pa.int32()),
        ("region_a", pa.int32()),
        ("region_b", pa.int32()),
        ("type", pa.string()),
        ("key_hex", pa.string()),
    ]
)
_DIV_STRUCT = pa.struct(
    [
        ("region", pa.int32()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("type", pa.string()),
    ]
)
SCHEMA = pa.schema(
    [
        ("run_at", pa.timestamp("ms", tz="UTC")),
        ("store", pa.string()),
        ("version", pa.int32()),
        ("success", pa.bool_()),
        ("consistent", pa.bool_()),
        ("logs_whole", pa.bool_()),
        ("expectations_evaluated", pa.int32()),
        ("expectations_failed", pa.int32()),
        ("divergences", pa.int64()),
        ("fatal_div_findings", pa.int64()),
        ("div_warnings", pa.int64()),
        ("pending_keys", pa.int64()),
        ("undecodable", pa.int64()),
        ("max_lag_ms", pa.int64()),
        ("divergence_ids", pa.list_(_DIVERGENCE_STRUCT)),
        ("div_finding_ids", pa.list_(_DIV_STRUCT)),
    ]
)


@dataclass
class RunRecord:
    run_at: dt.datetime
    store: str
    version: int
    success: bool
    consistent: bool
    logs_whole: bool
    expectations_evaluated: int
    expectations_failed: int
    divergences: int
    fatal_div_findings: int
    div_warnings: int
    pending_keys: int
    undecodable: int
    max_lag_ms: int | None
    divergence_ids: list[tuple] = field(default_factory=list)
    div_finding_ids: list[tuple] = field(default_factory=list)
    path: str | None = None

    def counts(self) -> dict[str, Any]:
        return {
            "run_at": self.run_at.isoformat(),
            "success": self.success,
            "consistent": self.consistent,
            "logs_whole": self.logs_whole,
            "expectations_failed": self.expectations_failed,
            "divergences": self.divergences,
            "fatal_div_findings": self.fatal_div_findings,
            "div_warnings": self.div_warnings,
            "pending_keys": self.pending_keys,
            "undecodable": self.undecodable,
            "max_lag_ms": self.max_lag_ms,
        }


@dataclass
class Changes:
    """Findings of this run against the previous one; each list holds finding identities (tuples)."""

    new: list[tuple] = field(default_factory=list)
    still: list[tuple] = field(default_factory=list)
    healed: list[tuple] = field(default_factory=list)


@dataclass
class Trend:
    previous: RunRecord | None
    runs: list[RunRecord]  # earlier runs of the same store, oldest first, this run last
    divergences: Changes
    div_findings: Changes
    warnings: list[str] = field(default_factory=list)


def divergence_ids(rows: pd.DataFrame) -> list[tuple]:
    """Identities of leapfrog inconsistency rows, in row order."""
    return [
        (
            str(r.store),
            int(r.version),
            int(r.partition),
            int(r.region_a),
            int(r.region_b),
            str(r.type),
            bytes(r.key).hex(),
        )
        for r in rows.itertuples(index=False)
    ]


def div_finding_ids(rows: pd.DataFrame) -> list[tuple]:
    """Identities of DIV error rows, in row order."""
    return [
        (int(r.region), str(r.topic), int(r.partition), int(r.offset), str(r.type))
        for r in rows.itertuples(index=False)
    ]


def _to_record(row: dict[str, Any], path: Location) -> RunRecord:
    run_at = row["run_at"]
    if run_at.tzinfo is None:
        run_at = run_at.replace(tzinfo=dt.UTC)
    return RunRecord(
        run_at=run_at,
        store=row["store"],
        version=int(row["version"]),
        success=bool(row["success"]),
        consistent=bool(row["consistent"]),
        logs_whole=bool(row["logs_whole"]),
        expectations_evaluated=int(row["expectations_evaluated"]),
        expectations_failed=int(row["expectations_failed"]),
        divergences=int(row["divergences"]),
        fatal_div_findings=int(row["fatal_div_findings"]),
        div_warnings=int(row["div_warnings"]),
        pending_keys=int(row["pending_keys"]),
        undecodable=int(row["undecodable"]),
        max_lag_ms=None if row["max_lag_ms"] is None else int(row["max_lag_ms"]),
        divergence_ids=[tuple(d[k] for k in DIVERGENCE_ID) for d in row["divergence_ids"] or []],
        div_finding_ids=[tuple(d[k] for k in DIV_FINDING_ID) for d in row["div_finding_ids"] or []],
        path=str(path),
    )


def read_history(directory: str | os.PathLike) -> tuple[list[RunRecord], list[str]]:
    """Every run recorded in `directory`, oldest first, and a warning for each file that could not be read.

    An unreadable history file must not stop this morning's report (today's findings do not depend on it),
    so it is skipped and named on the page instead.
    """
    directory = locate(directory)
    runs, problems = [], []
    if not directory.is_dir():
        return runs, problems
    for path in directory.children():
        if not (path.name.startswith("run-") and path.name.endswith(".parquet")):
            continue
        try:
            rows = pq.read_table(path.path, filesystem=path.fs).to_pylist()
            runs.extend(_to_record(row, path) for row in rows)
        except Exception as exc:  # any damage to one file: report it, keep the others
            problems.append(f"history file {path} skipped: {type(exc).__name__}: {exc}")
    runs.sort(key=lambda r: r.run_at)
    return runs, problems


def append_run(directory: str | os.PathLike, record: RunRecord) -> Location:
    """Write `record` as a new Parquet file in `directory` (created if needed); returns where."""
    directory = locate(directory)
    directory.makedirs()
    from pipelines.core.output import MARKER, write_marker, write_parquet_file

    if not (directory / MARKER).exists():
        write_marker(directory, "report history")
    row = {
        **{
            name: getattr(record, name)
            for name in SCHEMA.names
            if name not in ("divergence_ids", "div_finding_ids")
        },
        "divergence_ids": [dict(zip(DIVERGENCE_ID, i, strict=True)) for i in record.divergence_ids],
        "div_finding_ids": [dict(zip(DIV_FINDING_ID, i, strict=True)) for i in record.div_finding_ids],
    }
    table = pa.Table.from_pylist([row], schema=SCHEMA)
    stamp = record.run_at.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    final = directory / f"run-{stamp}-{uuid.uuid4().hex[:8]}.parquet"
    write_parquet_file(table, final)
    return final


def _changes(previous: list[tuple] | None, current: list[tuple]) -> Changes:
    if previous is None:  # nothing to compare with: the page says so instead of calling everything new
        return Changes()
    before, now = set(previous), set(current)
    unique_now = list(dict.fromkeys(current))
    return Changes(
        new=[i for i in unique_now if i not in before],
        still=[i for i in unique_now if i in before],
        healed=sorted(before - now, key=repr),
    )


def compare(history: list[RunRecord], current: RunRecord, warnings: list[str] | None = None) -> Trend:
    """What changed since the latest earlier run of the same store (no earlier run: no changes to tell)."""
    earlier = [r for r in history if r.store == current.store and r.run_at < current.run_at]
    previous = earlier[-1] if earlier else None
    return Trend(
        previous=previous,
        runs=[*earlier, current],
        divergences=_changes(previous.divergence_ids if previous else None, current.divergence_ids),
        div_findings=_changes(previous.div_finding_ids if previous else None, current.div_finding_ids),
        warnings=list(warnings or []),
    )
