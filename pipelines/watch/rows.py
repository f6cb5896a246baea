"""The watch's queries' shared plumbing: the stream they read, its packed rows unpacked, and Parquet bytes.

Leap Frog, DIV and the change stream (`pipelines.watch.changes`) each read the regions' topics through
`records`, get a group's records back from the packed rows with `unpacked`, declare their output with `ddl`
and write each micro-batch's file with `parquet_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
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


def unpacked(frames: Iterator[pd.DataFrame], by: str | None = None) -> dict[int, pa.Table]:
    """A group's packed rows (`stream_source.PACKED_SCHEMA`) as records: per value of the column `by` (e.g. the
    region), or all under 0."""
    from pipelines.core.stream_source import unpack

    blobs: dict[int, list[bytes]] = {}
    for f in frames:
        if not len(f):
            continue
        groups = f[by].to_numpy() if by else np.zeros(len(f), np.int64)
        for g, blob in zip(groups.tolist(), f["records"].tolist(), strict=True):
            blobs.setdefault(int(g), []).append(blob)
    out = {g: unpack(bs) for g, bs in sorted(blobs.items())}
    return {g: t for g, t in out.items() if t is not None and t.num_rows}


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
