"""The watch's queries' shared plumbing: the stream they read, its packed rows unpacked, and Parquet bytes.

The watch's query (Leap Frog and DIV, `pipelines.watch.job`) and the change stream (`pipelines.watch.changes`)
each read the regions' topics through `records`, get a group's records back from the packed rows with `unpacked`,
declare their output with `ddl` and write each micro-batch's file with `parquet_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from pipelines.core.sources import SourceSpec

DDL = {
    "string": "string",
    "int32": "int",
    "int64": "long",
    "bool": "boolean",
    "binary": "binary",
    "list<item: int64>": "array<long>",
}


def ddl(schema: pa.Schema) -> str:
    """Spark's DDL for an Arrow schema of the types the queries emit."""
    return ", ".join(f"{f.name} {DDL[str(f.type)]}" for f in schema)


def unpacked(frames: Iterator[pd.DataFrame], by: tuple[str, ...] | None = None) -> dict:
    """A group's packed rows (`stream_source.PACKED_SCHEMA`) as records: per tuple of values of the columns `by`
    (e.g. ("region", "topic"): keys such as (0, "store_v1"), in order), or all under 0. Groups without records are
    left out."""
    from pipelines.core.stream_source import unpack

    blobs: dict = {}
    for f in frames:
        if not len(f):
            continue
        if by is None:
            groups = [0] * len(f)
        else:
            groups = list(zip(*(_plain(f[c].to_numpy().tolist()) for c in by), strict=True))
        for g, blob in zip(groups, f["records"].tolist(), strict=True):
            blobs.setdefault(g, []).append(blob)
    out = {g: unpack(bs) for g, bs in sorted(blobs.items())}
    return {g: t for g, t in out.items() if t is not None and t.num_rows}


def _plain(values: list) -> list:
    """A column's values as Python ints (pandas may give a column of ints as floats) or as they are."""
    return [int(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for v in values]


def records(
    spark: SparkSession,
    opts,
    status: str | None = None,
    topics: list[str] | None = None,
    sources: list[SourceSpec] | None = None,
) -> DataFrame:
    """Every region's (or only `sources`') `topics` (default: its VT) as a stream (each query reads them with its
    own offsets in its own checkpoint)."""
    from pipelines.core.stream_source import read_stream

    return read_stream(
        spark,
        {s.region: s.uri for s in (opts.sources if sources is None else sources)},
        topics or [opts.topic],
        opts.kafka_conf,
        opts.starting,
        opts.max_records_per_trigger,
        status_file=status,
        packed=True,
    )


def parquet_bytes(table: pa.Table) -> bytes:
    import pyarrow.parquet as pq

    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    return buf.getvalue().to_pybytes()
