"""`tidegauge_stream`: every region's topics as one streaming DataFrame, for `tidegauge watch` (issue 19).

The nightly jobs read a finished range; the watch reads the same topics forever on Spark Structured Streaming.
This is the streaming twin of the batch sources and shares their code: the driver plans with
`pipelines.core.sources.open_source` (topics, partitions, bounds of an archive or a Kafka cluster) and each Spark
task reads planned ranges with `pipelines.core.record_reader`, the reader every data source uses.
Rows are the archive's columns plus `region`: `region int, topic string, partition int, offset long, key binary,
value binary, headers array<struct<key string, value binary>>, timestamp timestamp`; a task yields one range of
one partition in offset order, or several small ranges one after the other, each whole and in order.

**What a checkpoint holds.** The source's offset is a flat JSON object `{"REGION/TOPIC/PARTITION": next offset
to read}` (topic names cannot hold '/'), e.g. `{"0/store_v1/3": 1234}`. Spark writes the end offset of every
micro-batch to the checkpoint's offset log before the batch runs and marks it done in the commit log after;
a restarted query re-runs a planned batch with the offsets it was planned with (`partitions(start, end)` only
depends on them and on the options), then goes on from the last end offset. Nothing else is kept: no consumer
group, no committed Kafka offsets, no state in the source. The query therefore reads every record once, as long
as the batch's sink is idempotent per batch id (Spark's own sinks and a `foreachBatch` that overwrites what a
batch id wrote are).

**Planning** (`latestOffset`, on the driver, every trigger): each source's partitions of the `topics` it holds
(a region without the RT topic is normal) and their bounds. A known partition's end is its high watermark (an
archive's last offset + 1); offsets never move backwards. A partition not seen before appears at its low
watermark (its first offset) and is read from the next trigger on, so its start is in the checkpoint before any
of its records are read; this also applies to a region that could not be reached when the query started, and
to every partition with `starting=latest` except those seen at the start, as with Spark's own Kafka source.
`max_records_per_trigger` caps a micro-batch at that many offsets (a compacted range holds fewer records),
shared fairly over the partitions that have data: none gets more than its share while another wants it, and a
partition left out gets its turn as the others' backlogs shrink. `Trigger.AvailableNow` is supported: the query
reads up to the bounds seen when it started, in as many batches as the cap requires, then stops.

**Faults.** A source that cannot be reached or listed while planning does not stop the query: its partitions
keep their previous offsets (nothing new from it this trigger), one warning names the region and URI when an
outage starts and one line when it ends (never Kafka settings, which may hold credentials), and the sources'
state is exposed two ways: `TidegaugeStreamReader.unreachable()` for a caller holding the reader, and the JSON
file given as option `status_file` (written atomically after every planning; `read_status` reads it). Spark runs
the planner in a Python worker process of its own, so the file is how the watch's metrics on the driver see it;
it is a local path on the driver's machine, where that worker runs. Regions are planned in parallel and a
Kafka region waits at most `plan_timeout_s` (default 10 s) per request, so regions that are down delay a trigger
by about that long (never more than three times it), however many they are. Records that retention deleted
before the query read them are logged as lost when planning sees it; a read starts at the low watermark, as
every reader does (`div.kafka_log.iter_partition`), so a batch re-run after retention cut its start is read
from there.

A range that cannot be read in a task (a damaged archive file, a broker that goes away, Kafka settings the
client refuses) is never skipped: `read()` raises `StreamReadError` naming the region, topic, partition and offsets, the
micro-batch fails, and the query stops with that error. Its offsets are already in the checkpoint's offset log,
so when the query is started again from the checkpoint that same batch is re-run, whole, before anything else.

**Archives are streamed like topics.** An archive directory that grows, as `div.archive.ArchiveWriter` and
`sim.archiver.Archiver` write it (each file renamed into place whole, a partition's files in offset order), is
followed like a topic: every trigger lists it again (footers of known files are cached) and its last offset + 1
is the end. This lets the watch follow a copy of a cluster, and makes streaming tests deterministic.

**Checkpoint locations.** Spark writes the checkpoint itself, through Hadoop's file APIs and the Hadoop client
jars it ships, not through `pipelines.core.storage`. Checked on pyspark 4.2.0 (Hadoop 3.5.0) here: a plain local
path and `file://` work without extra jars (the tests use both); `hdfs://` loads (an unreachable namenode fails
the start with `ConnectException`, not with an unknown scheme), so it works where the Hadoop configuration names a
reachable cluster; `s3a://` needs Hadoop's S3 connector (`hadoop-aws` at Spark's Hadoop version and the AWS SDK
bundle), without which the query fails with `CANNOT_LOAD_CHECKPOINT_FILE_MANAGER` (`ClassNotFoundException:
org.apache.hadoop.fs.s3a.S3A`): `tidegauge watch` resolves it and puts it on Spark's class path by itself
(`pipelines.watch.checkpoint`; tested against an S3 server on loopback), under spark-submit it is `--packages
org.apache.hadoop:hadoop-aws:<Spark's Hadoop version>`. `gs://` would need the GCS connector
(`org.apache.hadoop.fs.gs.Gs`) and `s3://` has no FileSystem at all; the watch refuses both. Outputs and state go
through `storage` and work on every store; only the checkpoint needs connector jars.

Options: `sources` (JSON `{region: archive path/URI or kafka://...}`), `topics` (comma list, read in every
region), `kafka_secret_conf` (JSON `{region: {librdkafka settings}}`; Spark redacts options whose name holds
`secret`, so `explain()` shows them as `*********(redacted)`; the query's progress reports hold no options), `starting` (`earliest`, the default, `latest`, or a
JSON object of offsets in the checkpoint's form, -2 earliest and -1 latest allowed, partitions not named from
earliest), `max_records_per_trigger`, `max_records_per_split` (a cut within a partition's range),
`min_records_per_task` (default 50,000: smaller ranges are read together by one task, `group_ranges`), `status_file`, `plan_timeout_s`, `packed` (`true`: rows of `PACKED_SCHEMA`, a batch of records each).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

from div.checkpoint import atomic_write
from pipelines.core import record_reader
from pipelines.core.sources import SourceError, SourceSpec, open_source

log = logging.getLogger(__name__)

SHORT_NAME = "tidegauge_stream"
EARLIEST = -2
LATEST = -1
DEFAULT_PLAN_TIMEOUT_S = 10.0
# ranges smaller than this are read together by one task (`group_ranges`)
DEFAULT_MIN_RECORDS_PER_TASK = 50_000

SCHEMA = record_reader.STREAM.spark
# Packed rows (option `packed`): one row per batch of records read, the records an Arrow IPC stream of
# `record_reader.STREAM_RECORDS` in offset order. Spark then moves, shuffles and hands to Python a few rows per
# partition instead of one per record: `transformWithStateInPandas` turns its input into pandas one row at a
# time, which cost the watch more than its rules did. `unpack` gives the records back.
PACKED_SCHEMA = StructType(
    [
        StructField("region", IntegerType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("records", BinaryType()),
    ]
)
# records per packed row: enough that the rows are few, small enough that a task's rows stream through Spark
PACK_RECORDS = 16384
# and bytes of keys and values per packed row: a chunked version's records are up to 1 MB each, and one Spark
# binary value holds at most 2 GB (a row always holds at least one record)
PACK_BYTES = 32 << 20
# What reading or listing a source raises when the source, not our code, is at fault.
_SOURCE_ERRORS = (SourceError, *record_reader.READ_ERRORS)

Offsets = dict[str, int]


class StreamReadError(Exception):
    """A planned range could not be read: the micro-batch fails and is re-run from the checkpoint."""


class RecordsLostError(StreamReadError):
    """Offsets the checkpoint had not read yet are gone from the source (Kafka's retention deleted them, or an
    archive's first files were removed). Reading on from the source's first offset would feed the rules a log
    with a hole no rule can tell from compaction — DIV would report the hole as missing records and Leap Frog
    compare keys whose latest records were lost — so the query stops instead, naming the range. Re-running does
    not bring the records back: a watch sees this once and gives up."""

    MARKER = "records were deleted before the watch read them"


def offset_key(region: int, topic: str, partition: int) -> str:
    """The checkpoint's name for one partition of one region's topic: `REGION/TOPIC/PARTITION`."""
    return f"{int(region)}/{topic}/{int(partition)}"


def parse_offset_key(key: str) -> tuple[int, str, int]:
    """`REGION/TOPIC/PARTITION` -> (region, topic, partition); ValueError naming `key` otherwise."""
    parts = key.split("/")
    if len(parts) != 3 or not parts[1]:
        raise ValueError(f"offset key {key!r} is not REGION/TOPIC/PARTITION")
    try:
        return int(parts[0]), parts[1], int(parts[2])
    except ValueError:
        raise ValueError(f"offset key {key!r}: region and partition must be integers") from None


@dataclass(frozen=True)
class StreamRange:
    """Offsets [start, end) of one partition of one region's topic."""

    region: int
    uri: str
    topic: str
    partition: int
    start: int
    end: int


class StreamSplit(InputPartition):
    """What one Spark task reads: one range, or several small ones read one after the other, each whole and in
    offset order (see `group_ranges`)."""

    def __init__(self, ranges: Sequence[StreamRange]) -> None:
        self.ranges = tuple(ranges)
        first = self.ranges[0]
        InputPartition.__init__(self, (first.region, first.topic, first.partition, first.start))

    def __repr__(self) -> str:
        return f"StreamSplit({list(self.ranges)!r})"


def group_ranges(ranges: Sequence[StreamRange], min_records: int) -> list[StreamSplit]:
    """The ranges as tasks, in the order given: consecutive ranges are read by one task until it has at least
    `min_records` offsets. A task costs a few tenths of a second whatever it reads (its Python worker, its
    scheduling), about what reading 100 k records costs: a micro-batch of a store with hundreds of partitions,
    each with a few new records, was hundreds of tasks doing almost nothing. A range of `min_records` or more is
    a task of its own, so a large backlog keeps its parallelism."""
    splits: list[StreamSplit] = []
    group: list[StreamRange] = []
    size = 0
    for r in ranges:
        group.append(r)
        size += r.end - r.start
        if size >= min_records:
            splits.append(StreamSplit(group))
            group, size = [], 0
    if group:
        splits.append(StreamSplit(group))
    return splits


def fair_shares(available: Mapping[str, int], budget: int) -> dict[str, int]:
    """How many offsets of each partition's `available` backlog one micro-batch of at most `budget` offsets reads.

    Water-filling: partitions with small backlogs take all of them and leave the rest to the others; the
    remainder of an uneven split goes to the largest backlogs, so a partition left with nothing this time
    (more partitions than budget) has the larger backlog next time and is served first then."""
    shares = dict.fromkeys(available, 0)
    wanting = sorted((n, k) for k, n in available.items() if n > 0)
    left = max(int(budget), 0)
    for i, (n, k) in enumerate(wanting):
        take = min(n, left // (len(wanting) - i))
        shares[k] = take
        left -= take
    return shares


def _parse_starting(raw: str | None) -> str | Offsets:
    text = (raw or "earliest").strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{SHORT_NAME}: option 'starting' must be earliest, latest or a JSON object "
            f'{{"REGION/TOPIC/PARTITION": offset}} ({e.msg} at position {e.pos})'
        ) from None
    if not isinstance(spec, dict):
        raise ValueError(f"{SHORT_NAME}: option 'starting' must be a JSON object, got {text!r}")
    out: Offsets = {}
    for key, off in spec.items():
        region, topic, partition = parse_offset_key(key)
        if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
            raise ValueError(
                f"{SHORT_NAME}: option 'starting': {key} = {off!r} is neither an offset nor -2 (earliest) "
                "/ -1 (latest)"
            )
        out[offset_key(region, topic, partition)] = off
    return out


def _positive_int(opts: Mapping[str, str], name: str) -> int | None:
    raw = opts.get(name)
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{SHORT_NAME}: option {name!r} must be an integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{SHORT_NAME}: option {name!r} must be positive, got {raw!r}")
    return value


def _flag(opts: Mapping[str, str], name: str) -> bool:
    raw = str(opts.get(name) or "false").strip().lower()
    if raw not in ("true", "false"):
        raise ValueError(f"{SHORT_NAME}: option {name!r} must be true or false, got {raw!r}")
    return raw == "true"


class _Options:
    """Parsed, validated options. Messages name the option; never a value of `kafka_secret_conf`."""

    def __init__(self, options: Mapping[str, str]) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        try:
            raw_sources = json.loads(opts.get("sources") or "")
        except json.JSONDecodeError:
            raise ValueError(
                f"{SHORT_NAME}: option 'sources' must be a JSON object {{region id: archive path or "
                f"kafka:// URI}}, got {opts.get('sources')!r}"
            ) from None
        if not isinstance(raw_sources, dict) or not raw_sources:
            raise ValueError(f"{SHORT_NAME}: option 'sources' names no source: {opts.get('sources')!r}")
        self.sources: dict[int, str] = {}
        for region, uri in raw_sources.items():
            try:
                rid = int(region)
            except ValueError:
                raise ValueError(f"{SHORT_NAME}: option 'sources': region {region!r} is not an id") from None
            if not isinstance(uri, str) or not uri:
                raise ValueError(f"{SHORT_NAME}: option 'sources': region {rid} has no URI")
            self.sources[rid] = SourceSpec(rid, uri).uri
        self.topics = [t.strip() for t in (opts.get("topics") or "").split(",") if t.strip()]
        if not self.topics:
            raise ValueError(f"{SHORT_NAME}: option 'topics' (comma-separated topic names) is required")
        bad = [t for t in self.topics if "/" in t]
        if bad:
            raise ValueError(f"{SHORT_NAME}: option 'topics': {bad[0]!r} is not a topic name")
        try:
            conf = json.loads(opts.get("kafka_secret_conf") or "{}")
        except json.JSONDecodeError as e:  # the text may hold credentials: say where, not what
            raise ValueError(
                f"{SHORT_NAME}: option 'kafka_secret_conf' is not valid JSON (position {e.pos})"
            ) from None
        if not isinstance(conf, dict) or not all(isinstance(v, dict) for v in conf.values()):
            raise ValueError(
                f"{SHORT_NAME}: option 'kafka_secret_conf' must be a JSON object {{region: {{setting: value}}}}"
            )
        try:
            self.kafka_conf: dict[int, dict[str, Any]] = {int(k): v for k, v in conf.items()}
        except ValueError:
            raise ValueError(f"{SHORT_NAME}: option 'kafka_secret_conf': a key is not a region id") from None
        self.starting = _parse_starting(opts.get("starting"))
        self.max_records_per_trigger = _positive_int(opts, "max_records_per_trigger")
        self.max_records_per_split = _positive_int(opts, "max_records_per_split")
        self.min_records_per_task = (
            _positive_int(opts, "min_records_per_task") or DEFAULT_MIN_RECORDS_PER_TASK
        )
        self.batch_size = _positive_int(opts, "batch_size") or 65536
        self.packed = _flag(opts, "packed")
        if self.packed:
            self.batch_size = min(self.batch_size, PACK_RECORDS)
        self.status_file = opts.get("status_file") or None
        raw = opts.get("plan_timeout_s")
        try:
            self.plan_timeout_s = float(raw) if raw not in (None, "") else DEFAULT_PLAN_TIMEOUT_S
        except ValueError:
            raise ValueError(f"{SHORT_NAME}: option 'plan_timeout_s' must be seconds, got {raw!r}") from None
        if not self.plan_timeout_s > 0:
            raise ValueError(f"{SHORT_NAME}: option 'plan_timeout_s' must be positive, got {raw!r}")


def plan_region(
    region: int,
    uri: str,
    topics: Sequence[str],
    kafka_conf: Mapping[str, Any] | None = None,
    timeout_s: float = DEFAULT_PLAN_TIMEOUT_S,
) -> dict[str, tuple[int, int]]:
    """(low, high) watermarks of every partition of `topics` the source holds, by offset key. Raises what opening
    or listing the source raises (see `_SOURCE_ERRORS`)."""
    src = open_source(SourceSpec(region, uri), kafka_conf, timeout_s=timeout_s)
    try:
        held = set(src.topics())
        return {
            offset_key(region, topic, p): src.bounds(topic, p)
            for topic in topics
            if topic in held
            for p in src.partitions(topic)
        }
    finally:
        close = getattr(src, "close", None)  # a Kafka source holds a client; an archive holds nothing
        if close is not None:
            close()


class TidegaugeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver and reads their ranges in tasks; see the module docstring.

    Spark keeps one instance per query run in its planner worker (so `_down` and `_target` live across
    triggers of one run) and pickles it into every task for `read()`; its constructor opens nothing."""

    def __init__(self, options: _Options) -> None:
        self.options = options
        self._down: dict[int, dict[str, Any]] = {}
        self._checked_ms: int | None = None
        self._target: Offsets | None = None
        self._latest: Offsets | None = None

    # ------------------------------------------------------------------------------------------ planning

    def _plan(self) -> dict[int, dict[str, tuple[int, int]]]:
        """Watermarks of every region reached now; regions that could not be are in `_down`."""
        o = self.options
        regions = sorted(o.sources)
        pool = ThreadPoolExecutor(max_workers=min(len(regions), 16), thread_name_prefix="tidegauge-plan")
        futures = {
            r: pool.submit(plan_region, r, o.sources[r], o.topics, o.kafka_conf.get(r), o.plan_timeout_s)
            for r in regions
        }
        # A Kafka request gives up after plan_timeout_s; an archive on a hung store has no such limit, so the
        # trigger waits no longer than a few requests' worth and treats what did not answer as down.
        wait_all(futures.values(), timeout=o.plan_timeout_s * 3)
        pool.shutdown(wait=False, cancel_futures=True)
        now = _now_ms()
        reached: dict[int, dict[str, tuple[int, int]]] = {}
        for r, fut in futures.items():
            error = None
            if not fut.done():
                error = f"no answer within {o.plan_timeout_s * 3:g} s"
            elif fut.exception() is not None:
                exc = fut.exception()
                if not isinstance(exc, _SOURCE_ERRORS):
                    raise exc
                error = str(exc).removeprefix(f"source {r}={o.sources[r]}: ")  # the warning names it
            if error is None:
                reached[r] = fut.result()
                gone = self._down.pop(r, None)
                if gone is not None:
                    log.warning(
                        "source %d=%s can be read again, after %.0f s",
                        r,
                        o.sources[r],
                        (now - gone["since"]) / 1e3,
                    )
            elif r not in self._down:
                self._down[r] = {"since": now, "error": error}
                log.warning(
                    "source %d=%s cannot be read; its offsets stay where they are until it can: %s",
                    r,
                    o.sources[r],
                    error,
                )
            else:
                self._down[r]["error"] = error
        self._checked_ms = now
        self._write_status()
        return reached

    def unreachable(self) -> dict[int, str]:
        """Regions whose source could not be read at the last planning, with the reason."""
        return {r: d["error"] for r, d in sorted(self._down.items())}

    def status(self) -> dict[str, Any]:
        """What `status_file` holds: per region its URI, whether it was reachable at the last planning, since
        when (epoch ms, for a source down) and why; `checked_ms`, when that planning ran."""
        regions = {}
        for r, uri in sorted(self.options.sources.items()):
            down = self._down.get(r)
            regions[str(r)] = {
                "uri": uri,
                "up": down is None,
                "down_since_ms": None if down is None else down["since"],
                "error": None if down is None else down["error"],
            }
        return {"checked_ms": self._checked_ms, "sources": regions}

    def _write_status(self) -> None:
        path = self.options.status_file
        if not path:
            return
        try:
            # whole or not at all: the metrics may read it at any moment
            atomic_write(Path(path), json.dumps(self.status(), indent=1).encode())
        except OSError as exc:
            log.warning("cannot write the stream source status to %s: %s", path, exc)

    def initialOffset(self) -> dict:
        marks = self._plan()
        starting = self.options.starting
        out: Offsets = {}
        for region_marks in marks.values():
            for key, (low, high) in region_marks.items():
                if starting == "latest":
                    out[key] = high
                elif starting == "earliest":
                    out[key] = low
                else:
                    wanted = starting.get(key, EARLIEST)
                    out[key] = low if wanted == EARLIEST else high if wanted == LATEST else wanted
        if isinstance(starting, dict):
            # a partition named explicitly keeps its offset even before it can be seen; -2/-1 need its bounds
            out.update({k: v for k, v in starting.items() if k not in out and v >= 0})
        return _in_order(out)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        target: Offsets = {}
        for region_marks in self._plan().values():
            target.update({key: high for key, (_, high) in region_marks.items()})
        self._target = target

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        start = {k: int(v) for k, v in start.items()}
        end = dict(start)  # partitions of regions not reached keep their offsets
        lost: list[str] = []
        for region_marks in self._plan().values():
            for key, (low, high) in region_marks.items():
                if key not in start:
                    end[key] = low  # a new partition: its start goes into the checkpoint first
                    continue
                if low > start[key]:
                    lost.append(f"{key} offsets {start[key]} to {low - 1}")
                end[key] = max(start[key], high)
        if lost:
            raise RecordsLostError(
                f"{RecordsLostError.MARKER} (the cluster's retention, or an archive's files removed): "
                + "; ".join(lost)
                + ". This checkpoint cannot judge those partitions any more. Start the watch with a new "
                "--checkpoint (and a new --out): each partition then starts where its log starts now, at its "
                "next heartbeat, as `leapfrog` does on a trimmed topic. Keep the watch within the topics' "
                "retention (see tidegauge_offset_lag_records and its alert)"
            )
        self._latest = _in_order(end)
        if self._target is not None:
            for key in list(end):
                bound = self._target.get(key)
                if key not in start:
                    if bound is None:  # appeared after AvailableNow fixed its target: not this run's data
                        del end[key]
                    continue
                end[key] = start[key] if bound is None else max(start[key], min(end[key], bound))
        if isinstance(limit, ReadMaxRows):
            shares = fair_shares({k: end[k] - start[k] for k in end if k in start}, limit.max_rows)
            for key, n in shares.items():
                end[key] = start[key] + n
        return _in_order(end)

    def reportLatestOffset(self) -> dict | None:
        """The latest offsets seen at the last planning, before any cap: Spark shows them in the query's
        progress (`sources[].latestOffset`), where the end offsets minus these are the lag."""
        return self._latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        o = self.options
        ranges: list[StreamRange] = []
        for key in sorted(end, key=parse_offset_key):
            first, stop = int(start.get(key, end[key])), int(end[key])
            if stop <= first:
                continue
            region, topic, partition = parse_offset_key(key)
            uri = o.sources.get(region)
            if uri is None:  # the region was dropped from `sources` after these offsets were planned
                raise StreamReadError(
                    f"region {region} has offsets {first} to {stop - 1} of {topic}[{partition}] planned in the "
                    "checkpoint but is not among the sources any more"
                )
            step = o.max_records_per_split or stop - first
            ranges.extend(
                StreamRange(region, uri, topic, partition, s, min(s + step, stop))
                for s in range(first, stop, step)
            )
        return group_ranges(ranges, o.min_records_per_task)

    # ------------------------------------------------------------------------------------------- reading

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The split's records in offset order, with the region column. Raises StreamReadError when the range
        cannot be read: the micro-batch fails rather than lose the range (see the module docstring)."""
        split: StreamSplit = partition  # type: ignore[assignment]
        for s in split.ranges:
            yield from self._read_range(s)

    def _read_range(self, s: StreamRange) -> Iterator[pa.RecordBatch]:
        conf = self.options.kafka_conf.get(s.region)
        layout = record_reader.STREAM_RECORDS if self.options.packed else record_reader.STREAM
        try:
            for b in layout.read(
                s.uri,
                conf,
                s.topic,
                s.partition,
                s.start,
                s.end,
                region=s.region,
                batch_size=self.options.batch_size,
            ):
                if not self.options.packed:
                    yield b
                    continue
                packs = list(_packs(b))
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.repeat(pa.scalar(s.region, pa.int32()), len(packs)),
                        pa.repeat(pa.scalar(s.topic, pa.string()), len(packs)),
                        pa.repeat(pa.scalar(s.partition, pa.int32()), len(packs)),
                        pa.array(packs, pa.binary()),
                    ],
                    names=PACKED_SCHEMA.fieldNames(),
                )
        except _SOURCE_ERRORS as exc:
            raise StreamReadError(
                f"region {s.region} {s.topic}[{s.partition}] offsets {s.start} to {s.end - 1} from {s.uri} "
                f"cannot be read; the micro-batch fails and is re-run from the checkpoint: {exc}"
            ) from exc

    def commit(self, end: dict) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint only. Kafka is read with assign and seek (no
        consumer group, nothing to commit there), and archives belong to whoever writes them."""

    def stop(self) -> None:
        """Nothing to release: sources are opened for each planning and each task, and closed after."""


class TidegaugeStreamDataSource(DataSource):
    """`spark.readStream.format("tidegauge_stream")`; see the module docstring for options."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        return PACKED_SCHEMA if _flag({k.lower(): v for k, v in self.options.items()}, "packed") else SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TidegaugeStreamReader(_Options(self.options))


def register(spark: SparkSession) -> None:
    """Make `tidegauge_stream` available to `spark.readStream.format(...)` (idempotent)."""
    spark.dataSource.register(TidegaugeStreamDataSource)


def _packs(batch: pa.RecordBatch) -> Iterator[bytes]:
    """A batch of records as packed rows of at most `PACK_BYTES` of keys and values each (at least one record)."""
    size = np.zeros(batch.num_rows, np.int64)
    for name in ("key", "value"):
        size += pc.fill_null(pc.binary_length(batch.column(name)), 0).to_numpy().astype(np.int64)
    total = np.cumsum(size)
    start = 0
    while start < batch.num_rows:
        before = int(total[start - 1]) if start else 0
        end = max(start + 1, int(np.searchsorted(total, before + PACK_BYTES, side="right")))
        yield pack(batch.slice(start, end - start))
        start = end


def pack(batch: pa.RecordBatch) -> bytes:
    """Records as one packed row's `records` (an Arrow IPC stream)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def unpack(blobs: Iterable[bytes]) -> pa.Table | None:
    """The records of packed rows, in the order given (None for none): `offset, key, value, headers,
    timestamp`, the archive's types."""
    tables = [pa.ipc.open_stream(pa.py_buffer(b)).read_all() for b in blobs if b is not None]
    return pa.concat_tables(tables) if tables else None


def read_status(path: str | os.PathLike) -> dict[str, Any]:
    """The status a query's source last wrote to its `status_file` (see `TidegaugeStreamReader.status`)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_stream(
    spark: SparkSession,
    sources: Mapping[int, str],
    topics: str | Sequence[str],
    kafka_conf: Mapping[int, Mapping[str, Any]] | None = None,
    starting: str | Mapping[str, int] = "earliest",
    max_records_per_trigger: int | None = None,
    *,
    max_records_per_split: int | None = None,
    min_records_per_task: int | None = None,
    status_file: str | os.PathLike | None = None,
    plan_timeout_s: float | None = None,
    packed: bool = False,
) -> DataFrame:
    """A streaming DataFrame of every region's `topics` (see the module docstring). `sources`: region id ->
    archive path/URI or `kafka://...`; `kafka_conf`: region id -> librdkafka settings (never shown); `packed`:
    rows of `PACKED_SCHEMA`, each a batch of records (`unpack`)."""
    register(spark)
    topic_list = [t.strip() for t in topics.split(",")] if isinstance(topics, str) else list(topics)
    # made absolute here, on the driver: the planner worker and the executors resolve paths elsewhere
    absolute = {str(r): SourceSpec(int(r), uri).uri for r, uri in sources.items()}
    reader = (
        spark.readStream.format(SHORT_NAME)
        .option("sources", json.dumps(absolute))
        .option("topics", ",".join(topic_list))
        .option("kafka_secret_conf", json.dumps({str(r): dict(c) for r, c in (kafka_conf or {}).items()}))
        .option("starting", starting if isinstance(starting, str) else json.dumps(dict(starting)))
    )
    if max_records_per_trigger:
        reader = reader.option("max_records_per_trigger", str(int(max_records_per_trigger)))
    if max_records_per_split:
        reader = reader.option("max_records_per_split", str(int(max_records_per_split)))
    if min_records_per_task:
        reader = reader.option("min_records_per_task", str(int(min_records_per_task)))
    if status_file is not None:
        reader = reader.option("status_file", os.path.abspath(os.fspath(status_file)))
    if plan_timeout_s is not None:
        reader = reader.option("plan_timeout_s", str(float(plan_timeout_s)))
    if packed:
        reader = reader.option("packed", "true")
    return reader.load()


def _in_order(offsets: Offsets) -> Offsets:
    """Offsets in one order whatever the order they were found in: Spark compares the JSON texts."""
    return {k: offsets[k] for k in sorted(offsets, key=parse_offset_key)}


def _now_ms() -> int:
    return int(time.time() * 1000)
