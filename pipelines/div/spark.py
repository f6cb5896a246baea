"""`tidegauge div validate --engine spark`: the same findings and summary as the local engine, partitions in parallel.

Why a second engine: one process validates partitions one after another; Spark spreads them over cores or a
cluster. Both run `div.batch.PartitionRun` per partition, so they share every rule; only the plumbing differs:

1. the driver plans exactly as the local engine does (`validate.plan`: same tasks, same `now`, same
   compaction lag per topic) and numbers the tasks;
2. every source is read as a DataFrame in Spark's Kafka schema (`read_archive` / `read_kafka`), joined with the
   task table, shuffled so that each task's records meet in one Spark partition (tasks are spread over the
   shuffle partitions largest first, see `_assign_buckets`), and sorted by (task, offset);
3. `mapInArrow` streams each Spark partition's Arrow batches through one `PartitionRun` per task and yields error
   rows as it goes plus one summary row (JSON) per task;
4. the driver collects the summary rows, writes `errors/` from the same (cached) output and `summary.json` with
   the local engine's `summarize` and `exit_code_for`.

That is the "shuffle" plan: it reads any archive at one pass over the data whatever its layout. Its price is the
JVM's share of the work (read, shuffle, sort, hand-over to Python), which bench/bench_div_spark.py measures at
about 80% of the CPU of the Python validation itself, so on 2 cores it is no faster than the local engine. The
"direct" plan skips it: Spark only distributes the task list, and each task reads its partition with the local
engine's reader (`pipelines.core.sources`) — about 1.7x the local engine on 2 cores. Every executor must then reach the
sources (a shared filesystem for archives, the brokers for Kafka, as with the shuffle plan). It is cheap for
live clusters and for archives whose row groups each hold one partition (what tidegauge writes); in a foreign
archive that mixes partitions in its row groups every task would read the whole archive. The Spark setting
`tidegauge.div.read` chooses: `auto` (default: direct unless an archive mixes partitions in a row group),
`shuffle` or `direct`.

Differences that do not change results: records an archive holds twice reach Spark twice and are dropped here
(the local reader drops them too); a task whose partition is empty never reaches an executor and is finished on
the driver. `--fail-fast` is best effort in Spark: every partition stops at its own first fatal finding while
others run concurrently, and the driver then keeps exactly what the local engine would have kept (the tasks up to
the first that stopped, in plan order), so the output is the same but less work is saved.

A partition whose run raises is reported in `failed_partitions` (exit 3) and its rows are dropped. A failure Spark
cannot attribute (an unreadable file fails the whole job) makes the driver retry task by task, so only the
partitions that really fail are reported.

On a cluster, executors import `div` and `pipelines` (and any record validator's module): install the tidegauge
wheel on the executors, or ship the packages with `spark-submit --py-files tidegauge.zip`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from div.archive import KAFKA_ARROW_SCHEMA
from div.batch import ERROR_COLUMNS, PartitionRun, PartitionSummary, StopRun, rows_to_table
from div.validators.registry import build_chain
from pipelines.core import interrupts
from pipelines.core.errors import UsageError
from pipelines.core.output import OutputDir, guard, source_inputs
from pipelines.core.progress import Progress, duration
from pipelines.core.sources import Source, SourceError, SourceSpec, open_source
from pipelines.core.spark_files import write_parquet
from pipelines.core.storage import locate
from pipelines.div.validate import (
    PartitionTask,
    ValidateOptions,
    evidence_for,
    exit_code_for,
    plan,
    start_run,
    summarize,
    write_errors,
)

log = logging.getLogger("tidegauge.div")

OUT_COLUMNS = [*ERROR_COLUMNS, ("task", pa.int32()), ("summary", pa.string())]
OUT_ARROW_SCHEMA = pa.schema(OUT_COLUMNS)
_SPARK_TYPES = {pa.int32(): "int", pa.int64(): "long", pa.string(): "string", pa.bool_(): "boolean"}
OUT_DDL = ", ".join(f"`{name}` {_SPARK_TYPES[t]}" for name, t in OUT_COLUMNS)
_BUCKETS_PER_CORE = 4
READ_SETTING, READ_AUTO, READ_SHUFFLE, READ_DIRECT = "tidegauge.div.read", "auto", "shuffle", "direct"
_HEADERS_TYPE = KAFKA_ARROW_SCHEMA.field("headers").type
_FED_COLUMNS = ["key", "value", "offset", "timestamp"]


# ------------------------------------------------------------------------------------------ executor side


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, (SourceError, OSError)):
        return str(exc)  # as the local engine reports them
    return f"{type(exc).__name__}: {exc}"


@dataclass
class TaskOutcome:
    """What the driver learns about one task: its summary, or why it failed; and where --fail-fast stopped it."""

    summary: PartitionSummary | None
    stopped: str | None = None
    error: str | None = None

    def to_json(self) -> str:
        s = None
        if self.summary is not None:  # not dataclasses.asdict: it would rebuild the Counter from item pairs
            s = {f.name: getattr(self.summary, f.name) for f in dataclasses.fields(self.summary)}
            s["findings"] = dict(s["findings"])
        return json.dumps({"summary": s, "stopped": self.stopped, "error": self.error})

    @classmethod
    def from_json(cls, text: str) -> TaskOutcome:
        d = json.loads(text)
        s = d["summary"]
        summary = None if s is None else PartitionSummary(**{**s, "findings": Counter(s["findings"])})
        return cls(summary, d["stopped"], d["error"])


class _TaskRun:
    """One task inside an executor: feeds its batches to a PartitionRun, hands back error rows as they appear."""

    def __init__(
        self, tid: int, task: PartitionTask, opts: ValidateOptions, source: Source | None = None
    ) -> None:
        self.tid, self.task = tid, task
        self.run: PartitionRun | None = None
        self.start: int | None = None
        self.last_offset: int | None = None
        self.stopped: str | None = None
        self.error: str | None = None
        try:
            self.run, self.start = start_run(task, opts, source)
        except Exception as exc:
            self.error = _error_text(exc)

    @property
    def done(self) -> bool:
        return self.run is None or self.error is not None or self.stopped is not None

    def _select(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Drop records before the restore point and repeated offsets (the batch is sorted by offset)."""
        offsets = batch.column("offset").to_numpy(zero_copy_only=False)
        prev = np.empty_like(offsets)
        prev[1:] = offsets[:-1]
        prev[0] = -1 if self.last_offset is None else self.last_offset
        keep = offsets != prev
        if self.last_offset is None:
            keep[0] = True
        if self.start is not None:
            keep &= offsets >= self.start
        if self.task.end is not None:  # the shuffle plan's scan fixed its own (later) end offsets
            keep &= offsets < self.task.end
        self.last_offset = int(offsets[-1])
        return batch if keep.all() else batch.filter(pa.array(keep))

    def feed(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """Validate a batch (archive columns key, value, offset, timestamp, headers) and yield new error rows."""
        if self.done:
            return
        batch = self._select(batch)
        if batch.num_rows == 0:
            return
        try:
            self.run.feed(batch)
        except StopRun as stop:
            self.stopped = str(stop)
        except Exception as exc:  # the partition fails; the others go on
            self.error = _error_text(exc)
            return
        yield from self._drain()

    def _drain(self) -> Iterator[pa.RecordBatch]:
        assert self.run is not None
        rows, self.run.rows = self.run.rows, []
        if not rows:
            return
        table = rows_to_table(rows)
        n = table.num_rows
        table = table.append_column("task", pa.array(np.full(n, self.tid, dtype=np.int32)))
        table = table.append_column("summary", pa.nulls(n, pa.string()))
        yield from table.to_batches()

    def finish(self) -> Iterator[pa.RecordBatch]:
        if self.run is not None and not self.error:
            try:
                self.run.finish()
            except Exception as exc:
                self.error = _error_text(exc)
        if self.error:
            outcome = TaskOutcome(None, error=self.error)
        else:
            assert self.run is not None
            yield from self._drain()
            outcome = TaskOutcome(self.run.summary, stopped=self.stopped)
        yield _summary_batch(self.tid, self.task, outcome.to_json())


def _with_headers(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with its `headers_json` column turned back into the archive's `headers` column."""
    js = batch.column("headers_json")
    n = batch.num_rows
    if js.null_count == n:
        headers = pa.nulls(n, _HEADERS_TYPE)
    else:
        headers = pa.array(
            [
                None
                if j is None
                else [
                    {"key": h.get("key"), "value": base64.b64decode(h["value"]) if "value" in h else None}
                    for h in json.loads(j)
                ]
                for j in js.to_pylist()
            ],
            _HEADERS_TYPE,
        )
    return pa.RecordBatch.from_arrays(
        [batch.column(c) for c in _FED_COLUMNS] + [headers], names=[*_FED_COLUMNS, "headers"]
    )


def _summary_batch(tid: int, task: PartitionTask, payload: str) -> pa.RecordBatch:
    values: dict[str, Any] = {name: None for name, _ in OUT_COLUMNS}
    values.update(region=task.region, topic=task.topic, partition=task.partition, task=tid, summary=payload)
    return pa.RecordBatch.from_pylist([values], schema=OUT_ARROW_SCHEMA)


class ValidateTasks:
    """The `mapInArrow` function: Arrow batches sorted by (task, offset) in, error and summary rows out.

    A Spark partition may hold several tasks, one after another; each gets its own PartitionRun, so nothing of a
    partition is kept beyond what PartitionRun keeps (DIV state and the findings not yet handed back).
    """

    def __init__(self, tasks: list[PartitionTask], opts: ValidateOptions, records=None) -> None:
        self.tasks = tasks
        self.opts = opts
        self.records = records  # a Spark accumulator of the records read, for the driver's progress line

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        current: _TaskRun | None = None
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            if self.records is not None:
                self.records.add(n)
            tids = batch.column("tid").to_numpy(zero_copy_only=False)
            cuts = (np.flatnonzero(np.diff(tids)) + 1).tolist()
            for s, e in zip([0, *cuts], [*cuts, n], strict=True):
                tid = int(tids[s])
                if current is None or current.tid != tid:
                    if current is not None:
                        yield from current.finish()
                    current = _TaskRun(tid, self.tasks[tid], self.opts)
                if not current.done:
                    yield from current.feed(_with_headers(batch.slice(s, e - s)))
        if current is not None:
            yield from current.finish()


class ReadAndValidate:
    """The `mapInArrow` function of the direct plan: task ids in; each task reads its partition itself with the
    local engine's reader (`Source.iter_partition`) and streams it through a PartitionRun."""

    def __init__(self, tasks: list[PartitionTask], opts: ValidateOptions, records=None) -> None:
        self.tasks = tasks
        self.opts = opts
        self.records = records  # a Spark accumulator of the records read, for the driver's progress line

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        sources: dict[int, Source] = {}
        try:
            yield from self._run(batches, sources)
        finally:
            for source in sources.values():
                close = getattr(source, "close", None)
                if close is not None:
                    close()

    def _run(self, batches: Iterator[pa.RecordBatch], sources: dict[int, Source]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for tid in batch.column("tid").to_pylist():
                task = self.tasks[tid]
                source = sources.get(task.region)
                if source is None:
                    try:
                        spec = next(s for s in self.opts.sources if s.region == task.region)
                        source = sources[task.region] = open_source(
                            spec, self.opts.kafka_conf.get(task.region)
                        )
                    except Exception as exc:
                        yield _summary_batch(tid, task, TaskOutcome(None, error=_error_text(exc)).to_json())
                        continue
                current = _TaskRun(tid, task, self.opts, source)
                try:
                    if not current.done:
                        for records in source.iter_partition(
                            task.topic, task.partition, start=current.start, end=task.end
                        ):
                            if self.records is not None:
                                self.records.add(records.num_rows)
                            yield from current.feed(records)
                            if current.done:
                                break
                except Exception as exc:  # the source failed mid-way: this partition fails, the others go on
                    current.error = _error_text(exc)
                yield from current.finish()


# ------------------------------------------------------------------------------------------ driver side

_C1, _C2, _M32 = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's `hash()` of an int column (Murmur3 x86_32, seed 42), as a signed 32-bit int."""
    k1 = _rotl((value & _M32) * _C1 & _M32, 15) * _C2 & _M32
    h1 = _rotl((seed & _M32) ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _M32
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def _bucket_keys(n: int) -> list[int]:
    """For each shuffle partition b < n, an int whose Spark hash lands in b (`repartition(n, col)` uses
    pmod(hash(col), n)), so the driver decides where each task goes instead of leaving it to hash collisions."""
    keys: list[int | None] = [None] * n
    missing, k = n, 0
    while missing and k < 1000 * n + 1000:
        b = spark_hash_int(k) % n
        if keys[b] is None:
            keys[b] = k
            missing -= 1
        k += 1
    # (practically unreachable) a key that lands elsewhere only unbalances the plan, it never breaks it
    return [b if key is None else key for b, key in enumerate(keys)]


def _assign_buckets(sizes: list[int], n: int) -> list[int]:
    """Largest task first onto the least loaded of n buckets; bucket 0 gets the heaviest load, so Spark (which
    starts shuffle partitions in order) starts the long tasks first."""
    load = [0] * n
    out = [0] * len(sizes)
    for tid in sorted(range(len(sizes)), key=lambda t: -sizes[t]):
        b = min(range(n), key=lambda i: (load[i], i))
        load[b] += max(sizes[tid], 1)
        out[tid] = b
    return out


def _read_source(
    spark,
    spec: SourceSpec,
    kafka_conf: dict[str, Any] | None,
    topics: list[str],
    only: tuple[str, int] | None,
    partitions_of: dict[str, list[int]],
):
    from pyspark.sql import functions as F

    if spec.is_kafka:
        from pipelines.core.kafka_source import LATEST, read_kafka

        starting = None
        if only is not None:  # a single partition: start every other one at its end, so it reads nothing
            starting = {only[0]: {p: LATEST for p in partitions_of[only[0]] if p != only[1]}}
        df = read_kafka(spark, spec.uri, topics, kafka_conf, starting=starting)
    else:
        from pipelines.core.archive_source import read_archive

        df = read_archive(spark, spec.uri, topics, partition=only[1] if only is not None else None)
    return df.where(F.col("offset").isNotNull()).select(
        F.lit(spec.region).cast("int").alias("region"),
        "topic",
        "partition",
        "key",
        "value",
        "offset",
        "timestamp",
        "headers",
    )


def _task_frame(spark, tasks: list[PartitionTask], tids: list[int], sizes: list[int]):
    """(n, DataFrame of the tasks with `tkey`, the key that sends each to its shuffle partition among n)."""
    n = max(1, min(len(tids), _BUCKETS_PER_CORE * spark.sparkContext.defaultParallelism))
    bucket_keys = _bucket_keys(n)
    buckets = _assign_buckets([sizes[t] for t in tids], n)
    task_rows = [
        (tasks[t].region, tasks[t].topic, tasks[t].partition, t, bucket_keys[b])
        for t, b in zip(tids, buckets, strict=True)
    ]
    return n, spark.createDataFrame(task_rows, "region int, topic string, partition int, tid int, tkey int")


def sorted_records(
    spark,
    opts: ValidateOptions,
    tasks: list[PartitionTask],
    tids: list[int],
    sizes: list[int],
    partitions_of: dict[tuple[int, str], list[int]],
):
    """The records of the tasks `tids`, each task's in one Spark partition, sorted by (tid, offset).

    Columns: key, value, offset, timestamp, headers_json (the headers as JSON, binary values in base64), tid. `sizes[t]` estimates task t's records (for balancing);
    `partitions_of[(region, topic)]` lists the planned partitions (to read one Kafka partition alone).
    """
    from pyspark.sql import functions as F

    n, task_df = _task_frame(spark, tasks, tids, sizes)
    only = None
    if len(tids) == 1:
        only = (tasks[tids[0]].topic, tasks[tids[0]].partition)
    frames = []
    for spec in opts.sources:
        topics = sorted({tasks[t].topic for t in tids if tasks[t].region == spec.region})
        if topics:
            parts = {t: partitions_of.get((spec.region, t), []) for t in topics}
            frames.append(_read_source(spark, spec, opts.kafka_conf.get(spec.region), topics, only, parts))
    data = reduce(lambda a, b: a.unionByName(b), frames)
    # Headers travel as JSON: Spark's Arrow writer is slow on array<struct> columns (measured: 3x the cost of
    # reading the archive, even when nearly every row's headers are null); to_json costs next to nothing.
    data = (
        data.join(F.broadcast(task_df), ["region", "topic", "partition"])
        .select(
            "key", "value", "offset", "timestamp", F.to_json("headers").alias("headers_json"), "tid", "tkey"
        )
        .repartition(n, "tkey")
        .drop("tkey")
        .sortWithinPartitions("tid", "offset")
    )
    return data


def _job(
    spark,
    opts: ValidateOptions,
    tasks: list[PartitionTask],
    tids: list[int],
    sizes: list[int],
    partitions_of: dict[tuple[int, str], list[int]],
    read: str,
    records=None,
):
    """The output DataFrame (OUT_DDL rows) of validating the tasks `tids`; tasks add what they read to the
    accumulator `records`."""
    if read == READ_DIRECT:
        n, task_df = _task_frame(spark, tasks, tids, sizes)
        placed = task_df.select("tid", "tkey").repartition(n, "tkey").sortWithinPartitions("tid")
        return placed.mapInArrow(ReadAndValidate(tasks, opts, records), OUT_DDL)
    data = sorted_records(spark, opts, tasks, tids, sizes, partitions_of)
    return data.mapInArrow(ValidateTasks(tasks, opts, records), OUT_DDL)


def _spark_error(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:500]


def _collect(df) -> dict[int, TaskOutcome]:
    from pyspark.sql import functions as F

    rows = df.where(F.col("summary").isNotNull()).select("task", "summary").collect()
    return {int(r["task"]): TaskOutcome.from_json(r["summary"]) for r in rows}


def _run_jobs(
    spark,
    opts,
    tasks,
    sizes,
    partitions_of,
    read,
    progress: Progress | None = None,
) -> tuple[dict[int, TaskOutcome], list]:
    """Run every task; returns outcomes by task id and the cached output DataFrames holding their error rows."""
    from pyspark import StorageLevel

    all_tids = list(range(len(tasks)))
    records = progress.accumulator() if progress is not None else None
    if progress is not None:
        progress.stage(f"validating {len(tasks)} partition(s)")
    df = _job(spark, opts, tasks, all_tids, sizes, partitions_of, read, records).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    try:
        return _collect(df), [df]
    except Exception as exc:  # Py4JJavaError, SparkException, ...: the job as a whole failed
        df.unpersist()
        interrupts.stop_if_interrupted()  # Ctrl-C cancelled it: no retry (one with a slow validator runs on)
        log.warning(
            "the Spark job failed (%s); retrying partition by partition to find the ones that fail",
            _spark_error(exc),
        )
    outcomes: dict[int, TaskOutcome] = {}
    frames = []
    for tid in all_tids:
        if progress is not None:
            progress.stage(f"retrying partition by partition ({tid + 1}/{len(all_tids)})")
        one = _job(spark, opts, tasks, [tid], sizes, partitions_of, read, records).persist(
            StorageLevel.MEMORY_AND_DISK
        )
        try:
            outcomes.update(_collect(one))
            frames.append(one)
        except Exception as exc:
            one.unpersist()
            interrupts.stop_if_interrupted()
            outcomes[tid] = TaskOutcome(None, error=_spark_error(exc))
    return outcomes, frames


def _finish_on_driver(task: PartitionTask, opts: ValidateOptions, source: Source) -> TaskOutcome:
    """A task no record reached (an empty partition): what the local engine reports for it."""
    try:
        run, _ = start_run(task, opts, source)
        run.finish()
    except (SourceError, OSError) as exc:
        return TaskOutcome(None, error=_error_text(exc))
    return TaskOutcome(run.summary)


def _write_errors(out: OutputDir, frames: list, keep: list[int]) -> None:
    from pyspark.sql import functions as F

    path = out.file("errors")
    if frames and keep:
        errors = reduce(lambda a, b: a.unionByName(b), frames)
        errors = errors.where(F.col("summary").isNull() & F.col("task").isin(keep)).select(
            *[name for name, _ in ERROR_COLUMNS]
        )
        if write_parquet(errors, path):
            return
    write_errors(out, rows_to_table([]))  # no rows: still a readable dataset with the schema


def archive_is_tidy(uri: str) -> bool:
    """True when every row group of the archive holds a single (topic, partition), by its Parquet statistics:
    then a task reading one partition reads only that partition's row groups (the direct plan is cheap)."""
    for f in locate(uri).files(".parquet"):
        md = pq.ParquetFile(f.path, filesystem=f.fs).metadata
        cols = {md.schema.column(i).path: i for i in range(md.num_columns)}
        if "topic" not in cols or "partition" not in cols:
            return False
        for r in range(md.num_row_groups):
            rg = md.row_group(r)
            for c in ("topic", "partition"):
                st = rg.column(cols[c]).statistics
                if st is None or not st.has_min_max or st.min != st.max or st.null_count:
                    return False
    return True


def plan_tasks(
    opts: ValidateOptions, opened: list[Source]
) -> tuple[list[PartitionTask], list[int], dict[tuple[int, str], list[int]]]:
    """The local engine's plan, plus each task's estimated size and the partitions of every (region, topic)."""
    by_region = {s.region: s for s in opened}
    tasks = plan(opts, opened)
    sizes: list[int] = []
    partitions_of: dict[tuple[int, str], list[int]] = {}
    for i, t in enumerate(tasks):
        first, end = by_region[t.region].bounds(t.topic, t.partition)
        # a Spark task opens its own source, whose bounds are its own: it must read up to the plan's end
        tasks[i] = dataclasses.replace(t, end=end)
        sizes.append(max(end - first, 0))
        partitions_of.setdefault((t.region, t.topic), []).append(t.partition)
    return tasks, sizes, partitions_of


def run_spark(
    opts: ValidateOptions,
    master: str | None = None,
    spark_conf: dict[str, str] | None = None,
    read: str | None = None,
) -> int:
    """Validate every partition with Spark. Returns the exit code; writes errors/ and summary.json.

    `read` chooses the plan: "auto", "shuffle" or "direct" (see the module docstring); None reads the Spark
    setting `tidegauge.div.read` (e.g. `spark: {conf: {tidegauge.div.read: shuffle}}` in the YAML file).
    """
    guard("div validate", {"--out": opts.out}, source_inputs(opts.sources))
    build_chain(opts.record_validators)  # a bad validator entry fails before Spark starts
    from pipelines.core.spark_session import get_session, warn_local_paths

    opened = [open_source(s, opts.kafka_conf.get(s.region)) for s in opts.sources]
    by_region = {s.region: s for s in opened}
    tasks, sizes, partitions_of = plan_tasks(opts, opened)
    spark = get_session(master, conf=spark_conf)
    warn_local_paths(spark, {**source_inputs(opts.sources), "--out": opts.out})
    read = read or spark.conf.get(READ_SETTING, READ_AUTO)
    if read not in (READ_AUTO, READ_SHUFFLE, READ_DIRECT):
        raise UsageError(
            f"{READ_SETTING}={read!r}: expected {READ_AUTO!r}, {READ_SHUFFLE!r} or {READ_DIRECT!r}"
        )
    if read == READ_AUTO:
        mixed = [s.uri for s in opts.sources if not s.is_kafka and not archive_is_tidy(s.uri)]
        read = READ_SHUFFLE if mixed else READ_DIRECT
        log.info("reading with the %s plan%s", read, f" ({', '.join(mixed)} mix partitions)" if mixed else "")
    t0 = time.time()
    with OutputDir(opts.out, "div validate") as out, Progress("div validate", spark=spark) as progress:
        outcomes, frames = (
            _run_jobs(spark, opts, tasks, sizes, partitions_of, read, progress) if tasks else ({}, [])
        )
        progress.stage("writing the results")
        try:
            summaries: list[PartitionSummary] = []
            failed: list[dict] = []
            keep: list[int] = []
            for tid, task in enumerate(tasks):
                outcome = outcomes.get(tid) or _finish_on_driver(task, opts, by_region[task.region])
                if outcome.error is not None or outcome.summary is None:
                    failed.append(
                        {
                            "region": task.region,
                            "topic": task.topic,
                            "partition": task.partition,
                            "error": outcome.error or "no result",
                        }
                    )
                    log.error(
                        "region %d %s[%d] could not be validated: %s",
                        task.region,
                        task.topic,
                        task.partition,
                        outcome.error,
                    )
                    continue
                summaries.append(outcome.summary)
                keep.append(tid)
                if outcome.stopped and opts.fail_fast:
                    log.warning("--fail-fast: stopped at %s", outcome.stopped)
                    break  # what the local engine, running tasks in order, would have kept
            evidence = evidence_for(tasks, summaries, failed, by_region)
            code = exit_code_for(summaries, failed, evidence)
            _write_errors(out, frames, keep)
        finally:
            for f in frames:
                f.unpersist()
        records = sum(s.records for s in summaries)
        elapsed = max(time.time() - t0, 1e-9)
        log.info(
            "%d partitions, %d records, %d findings in %s (%.0f records/s)",
            len(summaries),
            records,
            sum(sum(s.findings.values()) for s in summaries),
            duration(elapsed * 1000),
            records / elapsed,
        )
        out.write_json(
            "summary.json",
            summarize(
                out, summaries, failed, code, {s.region: s.uri for s in opts.sources}, "spark", evidence
            ),
        )
    return code
