"""`tidegauge watch --changes R`: region R's change stream, each change once, written as the VT grows.

A second query beside the watch's own (Leap Frog and DIV). It reads region R's version topic, groups it by VT
partition and hands each partition's new records to `ChangesProcessor`, which keeps the partition's change-capture
state in Spark's state store and feeds `heartbeat.change_events.PartitionChanges` — the consumer API's and
`tidegauge changes`' own code, so the three deliver the same changes. `ChangesSink` appends a micro-batch's changes to
`OUT/changes/batch-<id>.parquet` (`CHANGES_SCHEMA`, in VT order per partition) and the records that could not
become changes to `OUT/changes_problems/batch-<id>.parquet`.

Exactly once across restarts, as the findings are: a micro-batch's offsets, its state-store version and its files
carry its batch id; Spark runs an unfinished micro-batch again with the same offsets and the state before it, so
the file of that id is written again with the same rows. A stream never reads a record twice, so the state kept
is the one after the micro-batch's last record, with the chunks still waiting for their manifest beside it
(`PartitionChanges.state(hold=False)`, `waiting_chunks`), not the batch readers' held-back state.

The watch reads one version from its start: the change stream begins with the version's bulk load as the
snapshot. A swap to the next version is `tidegauge changes --state` or the consumer API's `follow`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, StructField, StructType

from heartbeat.change_events import CHANGES_SCHEMA, PartitionChanges, events_table
from heartbeat.changes import ChangeState, PartitionState
from pipelines.core.storage import locate
from pipelines.watch.rows import ddl, parquet_bytes, records, unpacked

log = logging.getLogger("tidegauge.watch")

PROBLEMS_SCHEMA = pa.schema([("partition", pa.int32()), ("vt_offset", pa.int64()), ("reason", pa.string())])
# what the processor emits: a change ("E") or a record that could not become one ("P", `reason` says why)
OUTPUT_SCHEMA = pa.schema([("row", pa.string())] + list(CHANGES_SCHEMA) + [("reason", pa.string())])
_CHUNKS_SCHEMA = pa.schema([("key", pa.binary()), ("payload", pa.binary())])


def state_bytes(store: str, version: int, n_regions: int, stream: PartitionChanges) -> tuple[bytes, bytes]:
    """What the state store keeps for a partition: its `ChangeState` bytes (the format every reader stores) and
    the chunks waiting for their manifest (Arrow IPC; empty when none)."""
    state = ChangeState(store, version, n_regions, {stream.partition: stream.state(hold=False)})
    waiting = stream.waiting_chunks
    if not waiting:
        return state.to_bytes(), b""
    table = pa.table([list(waiting), list(waiting.values())], schema=_CHUNKS_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, _CHUNKS_SCHEMA) as w:
        w.write_table(table)
    return state.to_bytes(), sink.getvalue().to_pybytes()


def restore_stream(partition: int, n_regions: int, kept: tuple[bytes, bytes] | None) -> PartitionChanges:
    """The partition's stream from what `state_bytes` kept (None: a fresh one, from the version's start)."""
    if kept is None:
        return PartitionChanges(partition, PartitionState.fresh(n_regions))
    state = ChangeState.from_bytes(kept[0]).partition(partition)
    chunks = {}
    if kept[1]:
        t = pa.ipc.open_stream(pa.py_buffer(kept[1])).read_all()
        chunks = dict(zip(t.column("key").to_pylist(), t.column("payload").to_pylist(), strict=True))
    return PartitionChanges(partition, state, chunks=chunks)


class ChangesProcessor(StatefulProcessor):
    """Keeps one VT partition's change-capture state in the state store and feeds `PartitionChanges` its new
    records."""

    def __init__(self, store: str, version: int, n_regions: int) -> None:
        self.store, self.version, self.n = store, version, n_regions

    def init(self, handle: StatefulProcessorHandle) -> None:
        schema = StructType([StructField("state", BinaryType()), StructField("chunks", BinaryType())])
        self.state = handle.getValueState("change_state", schema)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        partition = int(key[0])
        table = unpacked(rows).get(0)
        if table is None:
            return
        table = table.sort_by("offset")  # a micro-batch may hand a partition's ranges in any order
        kept = tuple(self.state.get()) if self.state.exists() else None
        stream = restore_stream(partition, self.n, kept)
        events = events_table(stream.feed(table))
        self.state.update(state_bytes(self.store, self.version, self.n, stream))
        n_problems = len(stream.problems)
        out = events.append_column("reason", pa.nulls(events.num_rows, pa.string()))
        out = out.add_column(0, "row", pa.array(["E"] * events.num_rows, pa.string()))
        if n_problems:
            problems = pa.Table.from_pylist(
                [
                    {"row": "P", "partition": p.partition, "vt_offset": p.offset, "reason": p.reason}
                    for p in stream.problems
                ],
                OUTPUT_SCHEMA,
            )
            out = pa.concat_tables([out.cast(OUTPUT_SCHEMA), problems])
        if out.num_rows:
            yield out.cast(OUTPUT_SCHEMA).to_pandas()

    def close(self) -> None:
        pass


def changes_query(spark: SparkSession, opts) -> DataFrame:
    """The streaming DataFrame of region `opts.changes_region`'s changes (and problems), grouped by partition."""
    region = opts.changes_region
    sources = [s for s in opts.sources if s.region == region]
    rows = records(spark, opts, topics=[opts.topic], sources=sources)
    n = opts.store_regions or max(s.region for s in opts.sources) + 1
    return (
        rows.select("partition", "records")
        .groupBy("partition")
        .transformWithStateInPandas(
            ChangesProcessor(opts.store, opts.version, n), ddl(OUTPUT_SCHEMA), "Append", "None"
        )
    )


class ChangesSink:
    """`foreachBatch`: a micro-batch's changes to OUT/changes/batch-<id>.parquet, its problems beside them."""

    def __init__(self, opts, metrics=None) -> None:
        self.metrics = metrics
        self.dir = locate(opts.out) / "changes"
        self.problems_dir = locate(opts.out) / "changes_problems"
        self.dir.makedirs()
        self.warned = 0

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        table = df.toArrow()
        if not table.num_rows:
            return
        kind = table.column("row").to_numpy(zero_copy_only=False)
        events = table.filter(pa.array(kind == "E")).select(CHANGES_SCHEMA.names).cast(CHANGES_SCHEMA)
        events = events.sort_by([("partition", "ascending"), ("vt_offset", "ascending")])
        if events.num_rows:
            (self.dir / f"batch-{batch_id:08d}.parquet").write_bytes(parquet_bytes(events))
        problems = table.filter(pa.array(kind == "P")).select(PROBLEMS_SCHEMA.names).cast(PROBLEMS_SCHEMA)
        if problems.num_rows:
            self.problems_dir.makedirs()
            (self.problems_dir / f"batch-{batch_id:08d}.parquet").write_bytes(parquet_bytes(problems))
            if self.warned < 20:  # the files hold every one; the log names the first few
                for r in problems.to_pylist()[: 20 - self.warned]:
                    log.warning(
                        "tidegauge watch: changes: partition %d offset %d not delivered: %s",
                        r["partition"],
                        r["vt_offset"],
                        r["reason"],
                    )
                    self.warned += 1
        if self.metrics is not None:
            self.metrics.add_changes(int(events.num_rows), int(np.sum(kind == "P")))


def read_changes(out: str) -> pa.Table:
    """Every change the watch has appended under OUT/changes, in micro-batch order."""
    where = locate(out) / "changes"
    files = sorted(where.files(".parquet"), key=lambda f: f.path) if where.exists() else []
    tables = [pq.read_table(f.path, filesystem=f.fs) for f in files]
    return pa.concat_tables(tables).cast(CHANGES_SCHEMA) if tables else CHANGES_SCHEMA.empty_table()
