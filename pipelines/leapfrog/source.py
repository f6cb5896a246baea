"""`tidegauge_vt`: every region's version topic as one DataFrame, split by offset range, each split in offset order.

Leap Frog's running high-water marks follow VT order. Spark's Parquet reader packs files into tasks in no
particular order, so archives and live clusters are both read here: a split is one (region, partition, offset
range), read in offset order (`pipelines.core.record_reader`, as every data source reads), and every row
carries its split id so the decoding stage can keep per-split running state. End offsets are fixed when the job
is planned. The job reads each split inside the task that scans it (`scan_splits`), so only the scan's narrow
rows reach the JVM. The data source (`read_vt`) gives the records themselves as a DataFrame; no command uses it
now, the benchmarks do, to time this reader against Spark's own (bench_leapfrog.py, bench_vt_kafka_source.py).

Kafka client settings travel in the option `kafka_secret_conf`: Spark redacts options whose name matches its
redaction pattern (`secret`), so they never show in plans or the UI.

A split that cannot be read to its end (a damaged archive file, a Kafka error) does not fail the Spark job —
that would lose every other partition and exit like a finding. Its rows stop where reading failed and one
*read-error row* follows (offset `READ_ERROR_OFFSET`, the error text as its value); the scan reports the split
as failed, and the job leaves that region's partition out and lists it as failed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from div import kafka_log
from pipelines.core import record_reader
from pipelines.core.sources import SourceError, SourceSpec, is_kafka, open_source, read_range
from pipelines.leapfrog.scan import READ_ERROR_OFFSET

SHORT_NAME = "tidegauge_vt"
_READ_ERRORS = record_reader.READ_ERRORS
SCHEMA = record_reader.VT.spark


@dataclass
class VtSplit(InputPartition):
    """Offsets [start, end) of one region's partition."""

    split: int
    region: int
    uri: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        InputPartition.__init__(self, self.split)


def plan(
    sources: Mapping[int, str],
    topic: str,
    kafka_conf: Mapping[int, Mapping] | None = None,
    starting: Mapping[tuple[int, int], int] | None = None,
    max_records_per_split: int | None = None,
) -> list[VtSplit]:
    """Splits of every region's partitions of `topic`, from `starting[(region, partition)]` (inclusive; default
    the first offset held) to the current end. A Kafka partition whose first offset held is past its `starting`
    keeps `starting`: retention deleted records the previous run never read, and the scan's read of that split
    fails (`kafka_log.RangeTrimmedError`), so the region partition's verdict is partial instead of silently
    missing them. An archive starts at its first record (its head may have been compacted away)."""
    splits: list[VtSplit] = []
    starting = starting or {}
    for region in sorted(sources):
        uri = sources[region]
        src = open_source(SourceSpec(region, uri), (kafka_conf or {}).get(region))
        try:
            ranges = [(p, *src.bounds(topic, p)) for p in src.partitions(topic)]
        finally:
            _close(src)
        for p, low, high in ranges:
            first = starting.get((region, p), low)
            low = first if is_kafka(uri) else max(low, first)
            step = max_records_per_split or max(high - low, 1)
            for s in range(low, max(high, low + 1), step):
                splits.append(VtSplit(len(splits), region, uri, p, s, min(s + step, high)))
    return splits


class _Reader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.topic = options["topic"]
        self.splits = [VtSplit(**s) for s in json.loads(options["splits"])]
        self.kafka_conf = {int(k): v for k, v in json.loads(options.get("kafka_secret_conf") or "{}").items()}

    def partitions(self) -> list[InputPartition]:
        return list(self.splits) or [VtSplit(0, 0, "", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from split_batches(partition, self.topic, self.kafka_conf)  # type: ignore[arg-type]


def split_batches(s: VtSplit, topic: str, kafka_conf: Mapping[int, Mapping]) -> Iterator[pa.RecordBatch]:
    """The records of split `s` as `tidegauge_vt` batches, in offset order; a read-error row last when it could not
    be read to its end."""
    if s.end <= s.start:
        return
    try:
        # from_start: a range that retention cut after planning is a read error (a partial verdict), not a
        # shorter range read as if whole
        yield from record_reader.VT.read(
            s.uri,
            kafka_conf.get(s.region),
            topic,
            s.partition,
            s.start,
            s.end,
            region=s.region,
            split=s.split,
            from_start=True,
        )
    except _READ_ERRORS as exc:
        yield read_error_batch(s, f"region {s.region} partition {s.partition}: {exc}")


class ReadSplits:
    """`mapInArrow` over split ids (`scan_splits`): each task reads its split and hands the batches, in offset
    order, to `then` (a function of an iterator of batches: a `scan.SplitScan`, a decoder), in the same Python
    worker. Leap Frog's job reads this way: its records never cross into the JVM and back (the data source's rows
    are Spark rows, which `mapInArrow` would turn into Arrow again), only what `then` yields does."""

    def __init__(
        self, splits: list[VtSplit], topic: str, kafka_conf: Mapping[int, Mapping] | None, then
    ) -> None:
        self.splits, self.topic, self.kafka_conf, self.then = splits, topic, dict(kafka_conf or {}), then

    def __call__(self, ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in ids:
            for i in b.column(0).to_pylist():
                yield from self.then(split_batches(self.splits[i], self.topic, self.kafka_conf))


def scan_splits(
    spark: SparkSession,
    splits: list[VtSplit],
    topic: str,
    kafka_conf: Mapping[int, Mapping] | None,
    then,
    ddl: str,
) -> DataFrame:
    """What `then` makes of each planned split's records (`ReadSplits`), one Spark task per split; `ddl` is its
    rows' schema. Kafka settings travel inside the task's function, never in a plan's text."""
    return spark.range(0, len(splits), 1, max(len(splits), 1)).mapInArrow(
        ReadSplits(splits, topic, kafka_conf, then), ddl
    )


def read_error_batch(s: VtSplit, message: str) -> pa.RecordBatch:
    """The one row that tells the scan split `s` could not be read to its end."""
    row = {
        "split": s.split,
        "region": s.region,
        "partition": s.partition,
        "offset": READ_ERROR_OFFSET,
        "value": message.encode(),
    }
    schema = record_reader.VT.arrow
    return pa.RecordBatch.from_arrays(
        [pa.array([row.get(f.name)], f.type) for f in schema], names=schema.names
    )


class VtDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _Reader(self.options)


def read_vt(
    spark: SparkSession, splits: list[VtSplit], topic: str, kafka_conf: Mapping[int, Mapping] | None = None
) -> DataFrame:
    """The records of the planned splits (one Spark partition each) with split and region columns."""
    spark.dataSource.register(VtDataSource)
    payload = [
        {
            "split": s.split,
            "region": s.region,
            "uri": s.uri,
            "partition": s.partition,
            "start": s.start,
            "end": s.end,
        }
        for s in splits
    ]
    return (
        spark.read.format(SHORT_NAME)
        .option("topic", topic)
        .option("splits", json.dumps(payload))
        .option("kafka_secret_conf", json.dumps({str(k): dict(v) for k, v in (kafka_conf or {}).items()}))
        .load()
    )


def chunked_version(
    splits: list[VtSplit], topic: str, kafka_conf: Mapping[int, Mapping] | None = None, probe: int = 64
) -> bool:
    """Whether the version holds chunked values: any region's StartOfPush says so, or a chunk or a manifest is
    among the first records of a partition's range (a range that starts after the StartOfPush)."""
    from div import envelope as E
    from div.records import Kind, iter_records

    codec = E.EnvelopeCodec()
    firsts: dict[tuple[int, int], VtSplit] = {}
    for s in splits:
        k = (s.region, s.partition)
        if k not in firsts or s.start < firsts[k].start:
            firsts[k] = s
    for s in firsts.values():
        end = min(s.end, s.start + probe)
        try:
            conf = (kafka_conf or {}).get(s.region)
            for b in read_range(
                s.uri, conf, topic, s.partition, s.start, end, columns=["key", "value", "headers"]
            ):
                for rec in iter_records(b, codec):
                    if rec.kind in (Kind.CHUNK, Kind.MANIFEST):
                        return True
                    if rec.kind == Kind.START_OF_PUSH and E.control_body(rec.env).get("chunked"):
                        return True
        except _READ_ERRORS:
            continue  # the split fails again when the job reads it, and is reported then
    return False


def compaction_deadlines(
    sources: Mapping[int, str], topic: str, kafka_conf: Mapping[int, Mapping] | None, planned_ms: int
) -> dict[int, int]:
    """Per live region whose topic may be compacted: until when (epoch ms) a read whose end offsets were fixed at
    `planned_ms` still holds every key's latest record up to those ends
    (`leapfrog.reference.entries.RegionLog.latest_kept`).

    The cleaner removes a record only for a later one of the same key that is older than the topic's
    `min.compaction.lag.ms`; a record beyond the fixed end was written after `planned_ms`, so it can cost the
    read a record of its key only from `planned_ms + min.compaction.lag.ms` on. A topic known not to be compacted
    has no deadline; when the cluster cannot say (no DescribeConfigs permission), the deadline is `planned_ms`
    (no promise). Archives hold the log as compaction left it and have none.
    """
    out: dict[int, int] = {}
    for region, uri in sorted(sources.items()):
        if not is_kafka(uri):
            continue
        compacted, lag = kafka_log.compaction(uri, (kafka_conf or {}).get(region) or {}, topic)
        if compacted is not False:
            out[region] = planned_ms + lag
    return out


def check_sources(
    sources: Mapping[int, str],
    topic: str,
    kafka_conf: Mapping[int, Mapping] | None = None,
    may_lack_topic: set[int] | frozenset = frozenset(),
    unreachable_ok: bool = False,
) -> dict[int, str]:
    """Raise SourceError naming the first source that cannot be read or lacks the topic (regions in
    `may_lack_topic` may: an incremental run over a region with nothing new). With `unreachable_ok` (a
    continuous job, which waits for a source that is down), a source that cannot be opened is returned, with
    the reason, instead."""
    unreachable: dict[int, str] = {}
    for region, uri in sorted(sources.items()):
        try:
            src = open_source(SourceSpec(region, uri), (kafka_conf or {}).get(region))
        except SourceError as exc:
            if not unreachable_ok:
                raise
            unreachable[region] = str(exc)
            continue
        topics = src.topics()
        _close(src)
        if topic not in topics and region not in may_lack_topic:
            raise SourceError(
                f"source {region}={uri}: no topic {topic!r} (it has {', '.join(topics) or 'none'})"
            )
    return unreachable


def _close(src) -> None:
    close = getattr(src, "close", None)  # a Kafka source holds a client; an archive holds nothing
    if close is not None:
        close()
