"""Load the output directories of `leapfrog`, `div validate` and `lag` for the report.

The report reads only what docs/outputs.md promises. Every problem with an input (a missing file, a file that
is not JSON or Parquet, a column or field that is absent, a directory given to the wrong flag) is raised as
`InputError` naming the file, so the nightly job fails with a message a person can act on instead of a stack
trace from deep inside pandas.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from leapfrog.compare import OPEN
from pipelines.core.publish import current
from pipelines.core.storage import Location, locate
from pipelines.report.errors import InputError

# Columns the report needs from each Parquet dataset (docs/outputs.md pins more; extra ones are kept).
INCONSISTENCY_COLUMNS = {
    "store": pa.string(),
    "version": pa.int32(),
    "partition": pa.int32(),
    "region_a": pa.int32(),
    "region_b": pa.int32(),
    "type": pa.string(),
    "key": pa.binary(),
    "key_hash": pa.int64(),
    "a_value_hash": pa.int64(),
    "b_value_hash": pa.int64(),
    "a_deleted": pa.bool_(),
    "b_deleted": pa.bool_(),
    "a_vt_offset": pa.int64(),
    "b_vt_offset": pa.int64(),
    "a_vector": pa.list_(pa.int64()),
    "b_vector": pa.list_(pa.int64()),
    "a_high_watermark": pa.list_(pa.int64()),
    "b_high_watermark": pa.list_(pa.int64()),
}
DIV_ERROR_COLUMNS = {
    "region": pa.int32(),
    "topic": pa.string(),
    "partition": pa.int32(),
    "offset": pa.int64(),
    "producer_guid": pa.string(),
    "segment": pa.int32(),
    "sequence": pa.int32(),
    "type": pa.string(),
    "fatal": pa.bool_(),
    "detail": pa.string(),
}
LAG_COLUMNS = {
    "vt_region": pa.int32(),
    "partition": pa.int32(),
    "source_region": pa.int32(),
    "heartbeats": pa.int64(),
    "last_heartbeat_vt_offset": pa.int64(),
    "last_heartbeat_origin_ms": pa.int64(),
    "time_lag_ms": pa.int64(),
    "watermark": pa.int64(),
    "rt_end_offset": pa.int64(),
    "offset_lag": pa.int64(),
}
HEARTBEAT_COLUMNS = {
    "vt_region": pa.int32(),
    "partition": pa.int32(),
    "vt_offset": pa.int64(),
    "origin_region": pa.int32(),
    "origin_ms": pa.int64(),
    "vt_timestamp_ms": pa.int64(),
    "delay_ms": pa.int64(),
    "watermarks": pa.list_(pa.int64()),
}


@dataclass
class LeapfrogOutput:
    path: Location
    summary: dict[str, Any]
    inconsistencies: pd.DataFrame

    @property
    def store(self) -> str:
        return str(self.summary["store"])

    @property
    def version(self) -> int:
        return int(self.summary["version"])

    @property
    def regions(self) -> list[int]:
        return [int(r) for r in self.summary["regions"]]


@dataclass
class DivOutput:
    path: Location | None  # None: no `div validate` output was given (`no_div`)
    summary: dict[str, Any]
    errors: pd.DataFrame

    @property
    def given(self) -> bool:
        return self.path is not None


def no_div() -> DivOutput:
    """What the report reads when it is given a leapfrog output alone: no log partitions, no DIV findings. The
    integrity suite is then not run, and the page says the logs were not checked."""
    errors = pa.schema(list(DIV_ERROR_COLUMNS.items())).empty_table().to_pandas(integer_object_nulls=True)
    return DivOutput(path=None, summary={}, errors=errors)


@dataclass
class LagOutput:
    path: Location
    summary: dict[str, Any]
    lag: pd.DataFrame
    heartbeats: pd.DataFrame
    now_ms: int | None = None


@dataclass
class Inputs:
    leapfrog: LeapfrogOutput
    div: DivOutput
    lag: LagOutput | None = None


def _read_json(path: Location, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise InputError(f"{what}: {path} not found (every job output holds it; see docs/outputs.md)")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{what}: {path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{what}: {path} holds a JSON {type(data).__name__}, expected an object")
    return data


def _require_fields(data: dict[str, Any], fields: list[str], path: Location, what: str) -> None:
    missing = [f for f in fields if f not in data]
    if missing:
        raise InputError(f"{what}: {path} lacks the field(s) {', '.join(missing)} (see docs/outputs.md)")


def _check_job(data: dict[str, Any], expected: str, path: Location, flag: str) -> None:
    job = data.get("job")
    if job is not None and job != expected:
        raise InputError(
            f"{flag}: {path} was written by `tidegauge {job}`, expected the output of `tidegauge {expected}`"
        )


def _read_dataset(path: Location, columns: dict[str, pa.DataType], what: str) -> pd.DataFrame:
    """Read a Parquet dataset directory (as Spark or pyarrow write it) into pandas.

    Integer columns that may hold nulls stay Python ints and None (not floats), so offsets print exactly.
    An empty directory is an empty dataset: a job with no findings may write no part files.
    """
    if not path.is_dir():
        raise InputError(
            f"{what}: {path} not found (expected a directory of Parquet files; see docs/outputs.md)"
        )
    files = path.files(".parquet")
    if not files:
        return pa.schema(list(columns.items())).empty_table().to_pandas(integer_object_nulls=True)
    tables = []
    for file in files:
        try:
            tables.append(pq.read_table(file.path, filesystem=file.fs))
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{what}: {file} is not a readable Parquet file: {exc}") from exc
    try:
        table = pa.concat_tables(tables, promote_options="default")
    except pa.ArrowException as exc:
        raise InputError(f"{what}: the Parquet files in {path} have different schemas: {exc}") from exc
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise InputError(
            f"{what}: {path} lacks the column(s) {', '.join(missing)} (has {', '.join(table.column_names)})"
        )
    for name, expected in columns.items():
        actual = table.schema.field(name).type
        if pa.types.is_binary(expected) and not (
            pa.types.is_binary(actual) or pa.types.is_large_binary(actual)
        ):
            raise InputError(f"{what}: {path} column {name!r} is {actual}, expected binary (the key bytes)")
    return table.to_pandas(integer_object_nulls=True)


def _output(path: str | os.PathLike, what: str) -> Location:
    """Where a job output's published files are (any path or URI; on object stores the run its pointer names)."""
    try:
        where = locate(path)
        if not where.is_dir():
            raise InputError(f"{what}: {where} is not a directory")
        return current(where)
    except OSError as exc:
        raise InputError(f"{what}: {path}: cannot read: {exc}") from None


def load_leapfrog(path: str | os.PathLike) -> LeapfrogOutput:
    """Read `tidegauge leapfrog --out DIR`: summary.json and inconsistencies/."""
    what = "--leapfrog"
    path = _output(path, what)
    summary = _read_json(path / "summary.json", what)
    _check_job(summary, "leapfrog", path / "summary.json", what)
    _require_fields(
        summary, ["store", "version", "regions", "by_pair", "by_region"], path / "summary.json", what
    )
    rows = _read_dataset(path / "inconsistencies", INCONSISTENCY_COLUMNS, what)
    if "status" not in rows.columns:  # an output written before findings had a status: they were all open
        rows["status"] = OPEN
    rows["status"] = rows["status"].fillna(OPEN).astype(str)
    return LeapfrogOutput(path=path, summary=summary, inconsistencies=rows)


def load_div(path: str | os.PathLike) -> DivOutput:
    """Read `tidegauge div validate --out DIR`: summary.json and errors/."""
    what = "--div"
    path = _output(path, what)
    summary = _read_json(path / "summary.json", what)
    _check_job(summary, "div validate", path / "summary.json", what)
    _require_fields(summary, ["partitions"], path / "summary.json", what)
    rows = _read_dataset(path / "errors", DIV_ERROR_COLUMNS, what)
    return DivOutput(path=path, summary=summary, errors=rows)


def load_lag(path: str | os.PathLike) -> LagOutput:
    """Read `tidegauge lag --out DIR`: lag.json (for when lag was measured), lag/ and heartbeats/."""
    what = "--lag"
    path = _output(path, what)
    summary = _read_json(path / "lag.json", what)
    _check_job(summary, "lag", path / "lag.json", what)
    lag = _read_dataset(path / "lag", LAG_COLUMNS, what)
    heartbeats = _read_dataset(path / "heartbeats", HEARTBEAT_COLUMNS, what)
    now_ms = summary.get("now_ms")
    return LagOutput(
        path=path,
        summary=summary,
        lag=lag,
        heartbeats=heartbeats,
        now_ms=int(now_ms) if isinstance(now_ms, int | float) else None,
    )


def load_inputs(
    leapfrog_dir: str | os.PathLike,
    div_dir: str | os.PathLike | None,
    lag_dir: str | os.PathLike | None = None,
) -> Inputs:
    """Read every job output the report was given; raises `InputError` naming the first bad one."""
    return Inputs(
        leapfrog=load_leapfrog(leapfrog_dir),
        div=load_div(div_dir) if div_dir is not None else no_div(),
        lag=load_lag(lag_dir) if lag_dir is not None else None,
    )
