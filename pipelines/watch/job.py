"""`tidegauge watch`: Leap Frog and DIV as one Spark Structured Streaming query, micro-batch by micro-batch.

Three rooms, as in the batch job:

- input: `pipelines.core.stream_source` (`tidegauge_stream`) reads every region's VT and, with `--rt`, its RT
  (`<store>_rt`); its offsets live in the query's checkpoint. Its rows are packed (a batch of up to 16,384 records
  per row, `stream_source.unpack`): Spark hands a `transformWithStateInPandas` function its input one row at a
  time through pandas, which cost more than the rules when a row was a record;
- the rules: the rows are grouped by partition (each record is read, shuffled and handed to pandas once) and
  handed to `WatchProcessor`, a `StatefulProcessor` for `transformWithStateInPandas` whose only job is to keep the
  partition's state in Spark's state store (RocksDB) and run the steps: Leap Frog
  (`pipelines.watch.leapfrog_step.LeapfrogStep`, the nightly incremental job's own code) over the VT records of
  every region, its `PartitionState` in the value state `partition_state` and its settled keys' records apart, in
  `settled_base` and the list state `settled_log` (`pipelines.watch.settled`: a micro-batch reads and writes the
  records of the keys it touches, not of every key); and DIV
  (`pipelines.watch.div_step.DivStep`, `div validate`'s own run, resumed) over each (region, topic) of the
  partition on its own, its `DivPartitionState` in the map state `div_state` keyed by (region, topic). Leap Frog
  reads only the VTs; an RT partition is judged by DIV with RT rules, as `div validate` judges it;
- output: `foreachBatch` (`WatchSink`) appends the micro-batch's Leap Frog findings to
  `OUT/leapfrog/batch-<id>.parquet` and its DIV findings to `OUT/div/batch-<id>.parquet`, and feeds the metrics.

The query's checkpoint is --checkpoint/watch. A checkpoint of an older watch that ran Leap Frog and DIV as two
queries (`leapfrog/`, `div/`) holds state in another layout and is refused (`check_layout`).

**Exactly once across restarts.** A micro-batch's offsets, its state store version and its findings files all
carry its batch id. Spark re-runs an unfinished batch after a restart with the same offsets and the state of the
batch before it, so it computes the same findings and the files of that id are rewritten with the same rows (our
own files, each written whole by rename). Each finding also has a deterministic `finding_id`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

from div.archive import offset_order
from div.envelope_columns import Heads, read_envelopes
from pipelines.core.errors import UsageError
from pipelines.core.output import check_disjoint, check_output, source_inputs
from pipelines.core.publish import MARKER, marker_text
from pipelines.core.sources import SourceError, SourceSpec
from pipelines.core.storage import absolute, locate
from pipelines.leapfrog.keys import OUT_SCHEMA
from pipelines.leapfrog.source import check_sources
from pipelines.watch.checkpoint import check_checkpoint, check_session
from pipelines.watch.div_step import FINDING_SCHEMA as DIV_SCHEMA
from pipelines.watch.heartbeats import newest_heartbeats
from pipelines.watch.leapfrog_step import RECORD_COLUMNS, LeapfrogStep
from pipelines.watch.metrics import QUERY_NAMES
from pipelines.watch.rows import DDL, parquet_bytes, records, unpacked
from pipelines.watch.settled import PartitionStore

log = logging.getLogger("tidegauge.watch")

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# the findings' columns: those of `leapfrog`'s inconsistencies (the per-key stage's finding rows, keys.OUT_SCHEMA),
# with an id, the store, and when the watch found them
_STEP_COLUMNS = OUT_SCHEMA.names[1 : OUT_SCHEMA.names.index("b_high_watermark") + 1] + ["status"]
# a finding's status when it changed after it was reported (a repair healed it, a newer write opened it again):
# appended to OUT/leapfrog-status/, one file per micro-batch; `read_findings` gives each finding its latest
STATUS_SCHEMA = pa.schema(
    [
        ("finding_id", pa.string()),
        ("partition", pa.int32()),
        ("region_a", pa.int32()),
        ("region_b", pa.int32()),
        ("key", pa.binary()),
        ("status", pa.string()),
        ("changed_at", pa.timestamp("ms", tz="UTC")),
    ]
)
FINDINGS_SCHEMA = pa.schema(
    [("finding_id", pa.string()), ("store", pa.string()), ("version", pa.int32())]
    + [OUT_SCHEMA.field(c) for c in _STEP_COLUMNS]
    + [("detected_at", pa.timestamp("ms", tz="UTC"))]
)
# what the processor emits: findings ("F"), their status changes ("U": partition, pair, key, status), each region's
# running mark and unverified keys in a partition ("M"),
# pending keys ("C"), the newest heartbeat from each source region in a region partition ("H"), the records read
# of each region partition ("N") and what it could not judge ("W", the reason in `type`) — Leap Frog's — and
# DIV's findings ("D", the columns of div_step.FINDING_SCHEMA: region, partition and type are shared, of the same
# types; the others are added)
OUTPUT_SCHEMA = pa.schema(
    [("row", pa.string())]
    + [OUT_SCHEMA.field(c) for c in _STEP_COLUMNS]
    + [
        ("region", pa.int32()),
        ("mark", pa.list_(pa.int64())),
        ("pending", pa.int64()),
        ("detected_ms", pa.int64()),
        ("source_region", pa.int32()),
        ("origin_ms", pa.int64()),
        ("arrival_ms", pa.int64()),
        ("records", pa.int64()),
        ("unverified", pa.int64()),
    ]
    + [f for f in DIV_SCHEMA if f.name not in ("region", "partition", "type")]
)
OUTPUT_DDL = ", ".join(f"{f.name} {DDL[str(f.type)]}" for f in OUTPUT_SCHEMA)
_STATE_SCHEMA = StructType([StructField("state", BinaryType())])
# the key of DIV's map state: a (region, topic) of the partition
_DIV_KEY_SCHEMA = StructType([StructField("region", IntegerType()), StructField("topic", StringType())])


def finding_id(store: str, version: int, partition: int, a: int, b: int, key: bytes) -> str:
    """Deterministic: the watch reports a (partition, pair, key) once, so this names the finding."""
    h = hashlib.sha256(f"{store}\0{version}\0{partition}\0{a}\0{b}\0".encode() + key)
    return h.hexdigest()[:32]


class WatchProcessor(StatefulProcessor):
    """Keeps one partition's state in the state store, Leap Frog's `PartitionState` (over the VT records of every
    region) and DIV's `DivPartitionState` of each (region, topic), and runs `LeapfrogStep` and `DivStep` on its
    new rows."""

    def __init__(self, pairs: tuple[tuple[int, int], ...], n_regions: int, vt_topic: str) -> None:
        self.pairs, self.n, self.vt_topic = tuple(pairs), n_regions, vt_topic

    def init(self, handle: StatefulProcessorHandle) -> None:
        from pipelines.watch.div_step import DivStep

        self.state = handle.getValueState("partition_state", _STATE_SCHEMA)
        # the settled keys' records, apart from the small value (`pipelines.watch.settled`)
        self.settled_base = handle.getValueState("settled_base", _STATE_SCHEMA)
        self.settled_log = handle.getListState("settled_log", _STATE_SCHEMA)
        self.div_state = handle.getMapState("div_state", _DIV_KEY_SCHEMA, _STATE_SCHEMA)
        self.step = LeapfrogStep(self.pairs, self.n)
        self.div_step = DivStep()

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        partition = int(key[0])
        groups = unpacked(rows, ("region", "topic"))
        # each VT record's envelope is read once, in offset order, for both Leap Frog and DIV
        envelopes = {}
        for (region, topic), table in groups.items():
            if topic == self.vt_topic:
                order = offset_order(table)
                if order is not None:
                    groups[(region, topic)] = table = table.take(order)
                envelopes[region] = read_envelopes(table)
        vt = {region: table for (region, topic), table in groups.items() if topic == self.vt_topic}
        if vt:  # a partition whose micro-batch brought RT records only leaves Leap Frog's state as it is
            out = self._leapfrog(partition, vt, envelopes)
            if out:
                # through Arrow, so every column of the output is there (each row kind fills only some)
                yield pa.Table.from_pylist(out, OUTPUT_SCHEMA).to_pandas()
        del vt
        for region, topic in sorted(groups):  # each (region, topic)'s records let go once DIV has judged them
            table = groups.pop((region, topic))
            found = self._div(
                region, topic, partition, table, envelopes.pop(region) if topic == self.vt_topic else None
            )
            del table
            if found.num_rows:
                yield _div_rows(found).to_pandas()

    def _leapfrog(self, partition: int, vt: dict[int, pa.Table], envelopes: dict[int, Heads]) -> list[dict]:
        """Leap Frog over the micro-batch's VT records of every region: the processor's F, M, C, H, N, W rows."""
        records: dict[int, pa.Table] = {}
        out: list[dict] = []
        for region, mine in vt.items():
            records[region] = mine.select(RECORD_COLUMNS)
            out.extend({"row": "H", **h} for h in newest_heartbeats(region, partition, mine))
            out.append({"row": "N", "partition": partition, "region": region, "records": mine.num_rows})
        store = PartitionStore(
            _SparkBackend(self.state, self.settled_base, self.settled_log), (self.vt_topic, partition)
        )
        result = store.run(self.step, partition, records, envelopes)
        now_ms = int(time.time() * 1000)
        for f in result.findings.select(_STEP_COLUMNS).to_pylist():
            out.append({"row": "F", **f, "detected_ms": now_ms})
        for a, b, key, status in result.status_changes:
            out.append(
                {
                    "row": "U",
                    "partition": partition,
                    "region_a": a,
                    "region_b": b,
                    "key": key,
                    "status": status,
                    "detected_ms": now_ms,
                }
            )
        for fact in result.state.facts.values():
            out.append(
                {
                    "row": "M",
                    "partition": partition,
                    "region": fact["region"],
                    "mark": fact["final_hw"],
                    "unverified": len({k for k, _ in fact.get("unverified") or ()}),
                }
            )
        # what this partition's micro-batch could not judge: said on the driver, never silently dropped
        if result.chunked_late:
            out.append(
                {"row": "W", "partition": partition, "type": "chunks appeared after unchunked comparisons"}
            )
        for region, error in sorted(result.failed.items()):
            out.append({"row": "W", "partition": partition, "region": region, "type": f"unreadable: {error}"})
        if result.widest_hbw > self.n:
            out.append(
                {
                    "row": "W",
                    "partition": partition,
                    "type": f"heartbeats name {result.widest_hbw} regions and the watch counts {self.n}: the "
                    "other regions' records raise no mark, so findings may be false or missed; start it again "
                    f"with --regions {result.widest_hbw} and a new --checkpoint",
                }
            )
        for c in result.counters.to_pylist():
            out.append(
                {
                    "row": "C",
                    "partition": partition,
                    "region_a": c["region_a"],
                    "region_b": c["region_b"],
                    "pending": c["pending_keys"],
                }
            )
        return out

    def _div(
        self, region: int, topic: str, partition: int, table: pa.Table, envelopes: Heads | None
    ) -> pa.Table:
        """DIV over the micro-batch's records of one (region, topic) of the partition: its findings
        (div_step.FINDING_SCHEMA)."""
        from pipelines.watch.div_step import RECORD_COLUMNS as DIV_COLUMNS
        from pipelines.watch.div_step import DivPartitionState

        kept = self.div_state.getValue((region, topic))
        before = DivPartitionState.from_bytes(kept[0]) if kept is not None else None
        result = self.div_step(
            region, topic, partition, table.select(DIV_COLUMNS), before, envelopes=envelopes
        )
        self.div_state.updateValue((region, topic), (result.state.to_bytes(),))
        return result.findings

    def close(self) -> None:
        pass


class _SparkBackend:
    """A partition's Leap Frog state in the processor's state variables (`settled.Backend`)."""

    def __init__(self, value, base, log) -> None:
        self._value, self._base, self._log = value, base, log

    def value(self) -> bytes | None:
        return self._value.get()[0] if self._value.exists() else None

    def update(self, value: bytes) -> None:
        self._value.update((value,))

    def base(self) -> bytes | None:
        return self._base.get()[0] if self._base.exists() else None

    def log(self) -> Iterator[bytes]:
        if self._log.exists():
            for row in self._log.get():
                yield row[0]

    def append(self, entry: bytes) -> None:
        self._log.appendValue((entry,))

    def rewrite(self, base: bytes) -> None:
        self._base.update((base,))
        self._log.clear()


def _div_rows(findings: pa.Table) -> pa.Table:
    """DIV's findings as the processor's "D" rows: their columns, the other columns of OUTPUT_SCHEMA null."""
    n = findings.num_rows
    columns = [
        pa.repeat(pa.scalar("D"), n)
        if f.name == "row"
        else findings.column(f.name).cast(f.type)
        if f.name in DIV_SCHEMA.names
        else pa.nulls(n, f.type)
        for f in OUTPUT_SCHEMA
    ]
    return pa.Table.from_arrays(columns, schema=OUTPUT_SCHEMA)


@dataclass
class WatchOptions:
    store: str
    version: int
    sources: list[SourceSpec]
    checkpoint: str
    out: str
    kafka_conf: dict[int, dict] = field(default_factory=dict)
    pairs: tuple[tuple[int, int], ...] | None = None
    trigger_interval: str = "10 seconds"
    max_records_per_trigger: int | None = None
    starting: str = "earliest"
    # DIV also validates this real-time topic of every region (`--rt`, `--rt-topic`); None: the VTs only (Leap Frog
    # reads the VTs only either way)
    rt_topic: str | None = None
    # micro-batches whose state versions and offset logs the checkpoint keeps, not Spark's default 100: a restart
    # needs only the last one
    batches_to_retain: int = 10
    regions: int | None = (
        None  # the store's region count (--regions); None: learned (pipelines.leapfrog.regions)
    )
    # the region count the watch runs with: set by `prepare` (and kept in the checkpoint for every restart)
    store_regions: int | None = None
    # --changes R: also write region R's change stream (pipelines.watch.changes); None: no change stream
    changes_region: int | None = None

    @property
    def topic(self) -> str:
        return f"{self.store}_v{self.version}"

    @property
    def div_topics(self) -> list[str]:
        """What the watch query reads in every region: the VT, and the RT when asked for (DIV judges both; Leap
        Frog only the VT)."""
        return [self.topic] + ([self.rt_topic] if self.rt_topic else [])


def status_file(opts: WatchOptions) -> str:
    """Where the watch query's source says which regions it could reach (what `tidegauge_source_up` and its
    alert read). The source's planner writes it with local file calls, on the driver's machine: in a local
    checkpoint, else in a directory of the temporary directory named after the checkpoint (an s3a:// or hdfs://
    checkpoint would otherwise leave the metric unset and its alert silent)."""
    import tempfile
    from pathlib import Path

    from pipelines.core.storage import is_local

    if is_local(opts.checkpoint):
        return str(locate(opts.checkpoint).local / "watch-sources.json")
    digest = hashlib.sha256(absolute(opts.checkpoint).rstrip("/").encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / f"tidegauge-watch-{digest}" / "watch-sources.json")


def observe_sources(
    metrics,
    progress: dict | None,
    status: dict | None,
    opts: WatchOptions | None = None,
    *,
    query: str,
) -> None:
    """Offset lag per region partition from the progress of the query `query` (`watch`, or `changes` with
    --changes; the source reports the latest offsets it saw beside the end of the micro-batch), and which sources
    were reachable from the source's status.

    With `opts`, every partition of the version topic the source knows of expects a heartbeat from every region
    from now on: a partition whose heartbeats never come is seen too, not only one whose heartbeats stop (only
    the watch query's Leap Frog reads heartbeats, and only in the VTs: an RT partition expects none)."""
    from pipelines.core.stream_source import parse_offset_key

    regions = sorted(s.region for s in opts.sources) if opts is not None else []
    for src in (progress or {}).get("sources") or []:
        latest, end = (_offsets(src.get(k)) for k in ("latestOffset", "endOffset"))
        for key, last in latest.items():
            region, topic, partition = parse_offset_key(key)
            metrics.set_lag(region, topic, partition, int(last), int(end.get(key, last)), query=query)
            if opts is not None and query == "watch" and topic == opts.topic:
                metrics.expect_heartbeats(region, [partition], regions)
    for region, s in ((status or {}).get("sources") or {}).items():
        metrics.set_source_up(region, bool(s.get("up")))


def _offsets(value) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def watch_query(spark: SparkSession, opts: WatchOptions) -> DataFrame:
    """The streaming DataFrame of the processor's rows: Leap Frog's (findings, marks, pending counts, heartbeats,
    records read, warnings) and DIV's findings, over every region's VT and, when `opts.rt_topic` names one, its
    RT, grouped by partition."""

    regions = sorted(s.region for s in opts.sources)
    n = opts.store_regions or max(regions) + 1
    pairs = opts.pairs or tuple((a, b) for i, a in enumerate(regions) for b in regions[i + 1 :])
    rows = records(spark, opts, status_file(opts), topics=opts.div_topics)
    return (
        rows.select("region", "topic", "partition", "records")
        .groupBy("partition")
        .transformWithStateInPandas(WatchProcessor(pairs, n, opts.topic), OUTPUT_DDL, "Append", "None")
    )


class WatchSink:
    """`foreachBatch`: a micro-batch's Leap Frog findings to OUT/leapfrog/batch-<id>.parquet, its DIV findings to
    OUT/div/batch-<id>.parquet, and the metrics."""

    def __init__(self, opts: WatchOptions, metrics=None) -> None:
        self.opts, self.metrics = opts, metrics
        self.dir = locate(opts.out) / "leapfrog"
        self.dir.makedirs()
        self.div_dir = locate(opts.out) / "div"
        self.div_dir.makedirs()
        self.status_dir = locate(opts.out) / "leapfrog-status"
        self.status_dir.makedirs()
        # every finding so far with its status now (restarted: read back from the output), for the open count
        self.findings: dict[str, dict] = {
            r["finding_id"]: r
            for r in read_findings(opts.out)
            .select(["finding_id", "type", "region_a", "region_b", "status"])
            .to_pylist()
        }
        self.warned: set[tuple] = set()
        self.pending: dict[tuple[int, int, int], int] = {}  # (partition, region_a, region_b) → its last count
        self.unverified: dict[tuple[int, int], int] = {}  # (partition, region) → its last count

    def _finding_id(self, r: dict) -> str:
        o = self.opts
        return finding_id(o.store, o.version, r["partition"], r["region_a"], r["region_b"], r["key"])

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        table = df.toArrow()
        kind = table.column("row").to_numpy(zero_copy_only=False) if table.num_rows else np.array([])
        found = table.filter(pa.array(kind == "F", pa.bool_())) if table.num_rows else None
        if found is not None and found.num_rows:
            rows = found.to_pylist()
            out = pa.Table.from_pylist(
                [
                    {
                        "finding_id": self._finding_id(r),
                        "store": self.opts.store,
                        "version": self.opts.version,
                        **{c: r[c] for c in _STEP_COLUMNS},
                        "detected_at": r["detected_ms"],
                    }
                    for r in rows
                ],
                FINDINGS_SCHEMA,
            )
            (self.dir / f"batch-{batch_id:08d}.parquet").write_bytes(parquet_bytes(out))
            if self.metrics is not None:
                self.metrics.observe_divergences(rows)
            for r in out.select(["finding_id", "type", "region_a", "region_b", "status"]).to_pylist():
                self.findings[r["finding_id"]] = r
        changed = table.filter(pa.array(kind == "U", pa.bool_())) if table.num_rows else None
        if changed is not None and changed.num_rows:
            rows = [
                {
                    "finding_id": self._finding_id(r),
                    **{c: r[c] for c in ("partition", "region_a", "region_b", "key", "status")},
                    "changed_at": r["detected_ms"],
                }
                for r in changed.to_pylist()
            ]
            (self.status_dir / f"batch-{batch_id:08d}.parquet").write_bytes(
                parquet_bytes(pa.Table.from_pylist(rows, STATUS_SCHEMA))
            )
            for r in rows:
                if r["finding_id"] in self.findings:
                    self.findings[r["finding_id"]]["status"] = r["status"]
        if self.metrics is not None and self.findings:
            self.metrics.set_open_divergences(self.findings.values())
        div = table.filter(pa.array(kind == "D", pa.bool_())) if table.num_rows else None
        if div is not None and div.num_rows:
            div = div.select(DIV_SCHEMA.names)
            (self.div_dir / f"batch-{batch_id:08d}.parquet").write_bytes(parquet_bytes(div))
            if self.metrics is not None:
                self.metrics.observe_div_findings(div.to_pylist())
        if table.num_rows:
            for r in table.filter(pa.array(kind == "W", pa.bool_())).to_pylist():
                said = (r["partition"], r["region"], r["type"])
                if said not in self.warned:
                    self.warned.add(said)
                    where = f"partition {r['partition']}" + (
                        f" region {r['region']}" if r["region"] is not None else ""
                    )
                    log.warning("tidegauge watch: %s: %s", where, r["type"])
        if self.metrics is not None and table.num_rows:
            observe_rows(self.metrics, table, self.pending, self.opts.topic, self.unverified)
        log.debug("micro-batch %d: %d rows", batch_id, table.num_rows)


def observe_rows(
    metrics,
    table: pa.Table,
    pending: dict[tuple[int, int, int], int] | None = None,
    topic: str | None = None,
    unverified: dict[tuple[int, int], int] | None = None,
) -> None:
    """The processor's other rows to the metrics: pending keys per pair ("C"), each region partition's running
    high-water mark and unverified keys ("M"), the newest heartbeats ("H") and, with the VT's name as `topic`,
    the records read ("N").

    A partition reports its counts only in the micro-batches that bring it records, so `pending` ((partition,
    region_a, region_b)) and `unverified` ((partition, region)) keep each partition's last count across
    micro-batches and the metrics are their sums over every partition seen."""
    pending = {} if pending is None else pending
    unverified = {} if unverified is None else unverified
    kind = table.column("row").to_numpy(zero_copy_only=False)
    pairs: set[tuple[int, int]] = set()
    for r in table.filter(pa.array(kind == "C", pa.bool_())).to_pylist():
        pending[(r["partition"], r["region_a"], r["region_b"])] = r["pending"] or 0
        pairs.add((r["region_a"], r["region_b"]))
    for a, b in sorted(pairs):
        metrics.set_pending_keys(a, b, sum(n for (_, x, y), n in pending.items() if (x, y) == (a, b)))
    if topic is not None:
        for r in table.filter(pa.array(kind == "N", pa.bool_())).to_pylist():
            metrics.add_records(r["region"], topic, r["records"])
    regions: set[int] = set()
    for r in table.filter(pa.array(kind == "M", pa.bool_())).to_pylist():
        if r["mark"] is not None:
            metrics.set_high_water_marks(r["region"], r["partition"], r["mark"])
        if r["unverified"] is not None:
            unverified[(r["partition"], r["region"])] = r["unverified"]
            regions.add(r["region"])
    for x in sorted(regions):
        metrics.set_unverified_keys(x, sum(n for (_, y), n in unverified.items() if y == x))
    heartbeats = table.filter(pa.array(kind == "H", pa.bool_()))
    if heartbeats.num_rows:
        metrics.observe_heartbeats(
            heartbeats.select(["region", "partition", "source_region", "origin_ms", "arrival_ms"]).to_pylist()
        )


def read_findings(out: str, kind: str = "leapfrog") -> pa.Table:
    """Every finding the watch has appended under OUT/<kind> (`leapfrog` or `div`; one file per micro-batch).
    Leap Frog's findings come with their latest status (the last change under OUT/leapfrog-status/, else the
    status they were found with)."""
    import pyarrow.parquet as pq

    def read(where) -> list[pa.Table]:
        files = sorted(where.files(".parquet"), key=lambda f: f.name) if where.exists() else []
        return [pq.read_table(f.path, filesystem=f.fs) for f in files]

    tables = read(locate(out) / kind)
    empty = FINDINGS_SCHEMA if kind == "leapfrog" else DIV_SCHEMA
    found = pa.concat_tables(tables, promote_options="default") if tables else empty.empty_table()
    if kind != "leapfrog" or not found.num_rows:
        return found
    if "status" not in found.schema.names:  # written before findings had a status: open when found
        found = found.append_column("status", pa.array(["open"] * found.num_rows, pa.string()))
    latest = {}
    for t in read(locate(out) / "leapfrog-status"):  # in micro-batch order: the last change wins
        latest.update(zip(t.column("finding_id").to_pylist(), t.column("status").to_pylist(), strict=True))
    if latest:
        ids, old = found.column("finding_id").to_pylist(), found.column("status").to_pylist()
        i = found.schema.get_field_index("status")
        merged = pa.array([latest.get(f, s) for f, s in zip(ids, old, strict=True)], pa.string())
        found = found.set_column(i, found.schema.field(i), merged)
    return found


def check_rt_topic(opts: WatchOptions) -> None:
    """With --rt, every source that answers holds the RT as well: one without it would be watched without its RT
    for ever, whereas `div validate --topic` refuses a source that lacks a topic it is asked for."""
    try:
        check_sources(
            {s.region: s.uri for s in opts.sources}, opts.rt_topic, opts.kafka_conf, unreachable_ok=True
        )
    except SourceError as exc:
        raise SourceError(
            f"{exc}; --rt asks DIV to validate each region's real-time topic {opts.rt_topic!r} too: name it "
            "with --rt-topic, or leave --rt out to validate the version topics only"
        ) from None


def prepare(opts: WatchOptions) -> None:
    """Before any work: the checkpoint is a place Spark can write (local, file://, hdfs:// or s3a://, see
    `pipelines.watch.checkpoint`), --out is absent, empty or an earlier watch's (marked as such, since the watch
    adds to it run after run), neither is an input, and every source that answers holds the store's version
    topic, and its real-time topic when DIV is to read it."""
    check_checkpoint(opts.checkpoint)
    check_layout(opts.checkpoint)
    if opts.changes_region is not None:
        if opts.changes_region not in {s.region for s in opts.sources}:
            raise UsageError(
                f"--changes {opts.changes_region}: no --source names region {opts.changes_region} "
                f"(sources: {', '.join(str(s.region) for s in opts.sources)})"
            )
        if opts.starting != "earliest":
            raise UsageError(
                "--changes reads the version from its start (its bulk load is the change stream's snapshot): "
                "leave --starting at earliest"
            )
    check_disjoint({"--checkpoint": opts.checkpoint, "--out": opts.out}, source_inputs(opts.sources))
    check_output(opts.out, "watch")
    # a typo in --store or a source without the store would otherwise be watched, empty, for ever
    down = check_sources(
        {s.region: s.uri for s in opts.sources}, opts.topic, opts.kafka_conf, unreachable_ok=True
    )
    for why in down.values():
        log.warning("tidegauge watch: %s; watching it anyway: it is read once it answers", why)
    if opts.rt_topic:
        check_rt_topic(opts)
    opts.store_regions = store_regions_of(opts, set(down))
    out = locate(opts.out)
    out.makedirs()
    if not (out / MARKER).exists():
        (out / MARKER).write_text(marker_text("watch"))


def check_layout(checkpoint: str) -> None:
    """Refuse the checkpoint of a watch that ran Leap Frog and DIV as two queries (`leapfrog/`, `div/` under
    --checkpoint): its offsets and state are laid out for those queries, not for the one query that now runs
    both (`watch/`), and Spark would not read them as that query's."""
    where = locate(checkpoint)
    old = [name for name in OLD_QUERIES if (where / name).exists()]
    if old:
        paths = " and ".join(absolute(str(where / name)) for name in old)
        raise UsageError(
            f"--checkpoint {checkpoint}: it holds {paths}, the checkpoint of an older watch that ran Leap Frog and "
            "DIV as two queries; the watch now runs them as one query whose state is laid out otherwise, so it "
            "cannot go on from there: start it with a new --checkpoint (it reads the topics again from "
            "--starting)"
        )


def store_regions_of(opts: WatchOptions, down: set[int] = frozenset()) -> int:
    """The store's region count the watch runs with (pipelines.leapfrog.regions), refusing one log given for two
    regions. The first start learns it and keeps it in the checkpoint: the state's marks have that width, so
    every restart must use it too."""
    from pipelines.leapfrog.regions import FROM_SOURCES, check_distinct, store_regions, tails
    from pipelines.leapfrog.source import plan

    if opts.store_regions is not None:  # `prepare` ran already (the CLI calls it before `start` does)
        return opts.store_regions

    kept = locate(opts.checkpoint) / "store-regions.json"
    sources = {s.region: s.uri for s in opts.sources if s.region not in down}
    splits = plan(sources, opts.topic, opts.kafka_conf) if len(sources) else []
    probed = tails(splits, opts.topic, opts.kafka_conf)
    check_distinct(sources, probed)
    if kept.exists():
        count = int(json.loads(kept.read_bytes())["store_regions"])
        if opts.regions is not None and opts.regions != count:
            raise UsageError(
                f"--regions {opts.regions}: the checkpoint {opts.checkpoint} was started with {count} regions; "
                "give a new --checkpoint to watch with another count"
            )
        return count
    width = store_regions(sorted(s.region for s in opts.sources), probed, opts.regions)
    if width.learned_from == FROM_SOURCES:
        log.warning(
            "tidegauge watch: no heartbeat says how many regions the store has yet: counting %d (the sources'); "
            "if it has more, stop and start again with --regions and a new --checkpoint",
            width.count,
        )
    kept.parent.makedirs()
    kept.write_bytes(json.dumps({"store_regions": width.count, "from": width.learned_from}).encode())
    return width.count


# the queries: the metrics' `query` label takes exactly these names, so they are stated once, there (a query the
# label did not know had its progress rejected)
QUERIES = QUERY_NAMES
# the queries of a watch before Leap Frog and DIV ran as one (`check_layout` refuses their checkpoints)
OLD_QUERIES = ("leapfrog", "div")


def query_names(opts: WatchOptions) -> tuple[str, ...]:
    """The queries this watch runs: Leap Frog and DIV as one, and the change stream with --changes."""
    return QUERIES if opts.changes_region is not None else QUERIES[:1]


def start_query(
    spark: SparkSession, opts: WatchOptions, name: str, metrics=None, available_now: bool = False
):
    """Start one of the queries (`watch` or `changes`) with its checkpoint under --checkpoint/<name>: again
    after a failure, it goes on from its last committed micro-batch."""
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    # a commit appends the micro-batch's changes to a changelog instead of flushing and uploading a snapshot of
    # every state file (snapshots are made in the background); Spark reads either kind of checkpoint
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    spark.conf.set("spark.sql.streaming.minBatchesToRetain", str(opts.batches_to_retain))
    checkpoint = absolute(opts.checkpoint).rstrip("/")
    if name == "watch":
        df, sink = watch_query(spark, opts), WatchSink(opts, metrics)
    else:
        from pipelines.watch.changes import ChangesSink, changes_query

        df, sink = changes_query(spark, opts), ChangesSink(opts, metrics)
    writer = (
        df.writeStream.queryName(f"tidegauge_watch_{name}")
        .foreachBatch(sink)
        .option("checkpointLocation", f"{checkpoint}/{name}")
        .outputMode("append")
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=opts.trigger_interval)
    )
    return writer.start()


def start(
    spark: SparkSession,
    opts: WatchOptions,
    metrics=None,
    available_now: bool = False,
    queries: tuple[str, ...] = QUERIES,
) -> list:
    """Start the queries, Leap Frog and DIV as one (and the change stream with --changes), each with its
    checkpoint under --checkpoint (`watch/`, `changes/`); `available_now`: read what is there now, then stop
    (tests, catch-up runs); `queries`: only some of them."""
    unknown = set(queries) - set(QUERIES)
    if unknown:
        raise ValueError(f"unknown watch queries {sorted(unknown)}; known: {QUERIES}")
    prepare(opts)
    check_session(spark, opts.checkpoint)
    return [
        start_query(spark, opts, name, metrics, available_now)
        for name in query_names(opts)
        if name in queries
    ]
