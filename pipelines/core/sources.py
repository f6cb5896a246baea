"""Where records come from: `--source ID=URI`, an archive directory or a live Kafka cluster.

Every job reads either kind through the same small interface (topics, partitions, planned bounds, ordered Arrow
batches in the archive schema), so a job gives the same answer for the same records wherever they live. The kind
is decided here only (`is_kafka`); a Spark task reads its planned range with `read_range`.
Kafka client settings (security.protocol, sasl.*, ssl.*) come from configuration and go to librdkafka untouched;
they are never printed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from div import archive, kafka_log
from pipelines.core.storage import absolute, locate


class SourceError(Exception):
    """A source that cannot be parsed or read; the message names it (exit code 2)."""


def is_kafka(uri: str) -> bool:
    """The one test of a source's kind: a Kafka cluster (`kafka://host:port[,...]`) or an archive (a directory,
    or any URI `pipelines.core.storage` serves). Every reader, on the driver and in Spark tasks, asks this."""
    return isinstance(uri, str) and uri.startswith("kafka://")


def read_range(
    uri: str,
    kafka_conf: Mapping[str, Any] | None,
    topic: str,
    partition: int,
    start: int,
    end: int,
    columns: list[str] | None = None,
    batch_size: int = 65536,
    from_start: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Records [start, end) of one partition of a source the driver has planned, read without opening the source
    first (no listing, no metadata request): what a Spark task runs for its split. Raises what the readers raise
    (ArchiveError, KafkaLogError, OSError, ArrowException); the caller says which split failed. With `from_start`
    a Kafka range whose start retention removed after planning raises `kafka_log.RangeTrimmedError` instead of
    being read from the first offset still held."""
    if is_kafka(uri):
        bootstrap = kafka_log.parse_kafka_uri(uri)
        for batch in kafka_log.iter_partition(
            bootstrap, kafka_conf or {}, topic, partition, start, end, batch_size, from_start=from_start
        ):
            yield batch.select(columns) if columns else batch
    else:
        where = locate(uri)
        yield from archive.iter_partition(
            where.path, topic, partition, start, end, columns, batch_size, filesystem=where.fs
        )


@dataclass(frozen=True)
class SourceSpec:
    region: int
    uri: str

    def __post_init__(self) -> None:
        # made absolute on the driver: executors resolve a relative path in their own working directory
        if isinstance(self.uri, str) and not is_kafka(self.uri):
            object.__setattr__(self, "uri", absolute(self.uri))

    @property
    def is_kafka(self) -> bool:
        return is_kafka(self.uri)


def parse_source(text: str) -> SourceSpec:
    """`ID=URI` → SourceSpec. ID is a region id (0..N-1); URI an archive directory or kafka://host:port,..."""
    m = re.fullmatch(r"\s*(\d+)\s*=\s*(\S.*?)\s*", text or "")
    if not m:
        raise SourceError(
            f"--source {text!r}: expected ID=URI, e.g. 0=out/archive/dc-0 or 1=kafka://host:9092"
        )
    return SourceSpec(int(m.group(1)), m.group(2))


def check_unique(specs: list[SourceSpec]) -> None:
    seen: dict[int, str] = {}
    for s in specs:
        if s.region in seen:
            raise SourceError(f"region {s.region} is given twice ({seen[s.region]!r} and {s.uri!r})")
        seen[s.region] = s.uri


@dataclass
class Source:
    """An opened source. `bounds` are fixed when first asked (the job's planned snapshot)."""

    spec: SourceSpec
    # Kafka client settings hold credentials (sasl.password, ssl.key.password): never in a repr or a log line
    kafka_conf: Mapping[str, Any] = field(default_factory=dict, repr=False)
    _bounds: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Subclasses open the source here (the dataclass __init__ calls it)."""

    @property
    def region(self) -> int:
        return self.spec.region

    @property
    def uri(self) -> str:
        return self.spec.uri

    @property
    def label(self) -> str:
        """How messages name the source: `source ID=URI`, or `source URI` for one given without a region id (a
        negative id: `tidegauge changes --source LOC` reads a VT that is no region's until the user says so)."""
        return f"source {self.region}={self.uri}" if self.region >= 0 else f"source {self.uri}"

    def topics(self) -> list[str]:
        raise NotImplementedError

    def partitions(self, topic: str) -> list[int]:
        raise NotImplementedError

    def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        """(first offset, end offset exclusive) of the planned snapshot of this partition."""
        raise NotImplementedError

    def iter_partition(
        self,
        topic: str,
        partition: int,
        start: int | None = None,
        end: int | None = None,
        columns: list[str] | None = None,
        batch_size: int = 65536,
    ) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError

    def planned_records(self, topic: str, partition: int) -> int | None:
        """How many records the planned snapshot of this partition holds, when the source knows exactly (an
        archive's metadata); None when it does not (Kafka: compaction may leave holes between the bounds)."""
        return None

    def min_compaction_lag_ms(self, topic: str) -> int | None:
        """The topic's min.compaction.lag.ms when it is compacted and the source can tell; else None."""
        return None

    def timestamp_type(self, topic: str) -> str | None:
        """The topic's message.timestamp.type (CreateTime or LogAppendTime) when the source can tell; else None."""
        return None

    def offset_for_time(self, topic: str, partition: int, ms: int) -> int:
        """The first offset whose timestamp is >= `ms` by the source's time index (Kafka only)."""
        raise NotImplementedError(f"source {self.region}={self.uri} has no time index")


class ArchiveSource(Source):
    def __post_init__(self) -> None:
        try:
            where = locate(self.uri)
            if not where.is_dir():
                raise SourceError(f"{self.label}: no such archive directory")
            self._info = {(i.topic, i.partition): i for i in archive.describe(where.path, where.fs)}
        except archive.ArchiveError as exc:
            raise SourceError(f"{self.label}: {exc}") from exc
        except OSError as exc:  # the store itself: unreachable, no credentials, no such bucket
            raise SourceError(f"{self.label}: cannot read: {exc}") from exc

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self._info})

    def partitions(self, topic: str) -> list[int]:
        return sorted(p for t, p in self._info if t == topic)

    def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        info = self._info.get((topic, partition))
        if info is None:
            return (0, 0)
        return (info.first_offset, info.last_offset + 1)

    def planned_records(self, topic: str, partition: int) -> int | None:
        info = self._info.get((topic, partition))
        return info.records if info is not None else 0

    def iter_partition(self, topic, partition, start=None, end=None, columns=None, batch_size=65536):
        try:
            yield from read_range(self.uri, None, topic, partition, start, end, columns, batch_size)
        except archive.ArchiveError as exc:
            raise SourceError(f"{self.label}: {exc}") from exc


@dataclass
class KafkaSource(Source):
    # How long each metadata or watermark request may wait for the cluster: a streaming query plans every
    # trigger and must not wait ten seconds on a region that is down (pipelines.core.stream_source).
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        try:
            self.bootstrap = kafka_log.parse_kafka_uri(self.uri)
            self._log = kafka_log.KafkaLog(self.bootstrap, self.kafka_conf, timeout_s=self.timeout_s)
            self._topics = self._log.topics()
        except kafka_log.KafkaLogError as exc:
            raise SourceError(f"{self.label}: {exc}") from exc

    def topics(self) -> list[str]:
        return list(self._topics)

    def partitions(self, topic: str) -> list[int]:
        try:
            return self._log.partitions(topic)
        except kafka_log.KafkaLogError as exc:
            raise SourceError(f"{self.label}: {exc}") from exc

    def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        key = (topic, partition)
        if key not in self._bounds:
            self._bounds[key] = self._log.watermarks(topic, partition)
        return self._bounds[key]

    def iter_partition(self, topic, partition, start=None, end=None, columns=None, batch_size=65536):
        low, high = self.bounds(topic, partition)
        start = low if start is None else max(start, low)
        end = high if end is None else min(end, high)
        if start >= end:
            return
        yield from read_range(self.uri, self.kafka_conf, topic, partition, start, end, columns, batch_size)

    def min_compaction_lag_ms(self, topic: str) -> int | None:
        compacted, lag = kafka_log.compaction(self.bootstrap, self.kafka_conf, topic)
        return lag if compacted else None  # unknown (the cluster cannot say) or not compacted: strict

    def timestamp_type(self, topic: str) -> str | None:
        return kafka_log.topic_config(self.bootstrap, self.kafka_conf, topic, "message.timestamp.type")

    def offset_for_time(self, topic: str, partition: int, ms: int) -> int:
        try:
            return self._log.offset_for_time(topic, partition, ms)
        except kafka_log.KafkaLogError as exc:
            raise SourceError(f"source {self.region}={self.uri}: {exc}") from exc

    def close(self) -> None:
        self._log.close()


def open_source(
    spec: SourceSpec, kafka_conf: Mapping[str, Any] | None = None, timeout_s: float = 10.0
) -> Source:
    """The source `spec` names, opened. `timeout_s`: how long a Kafka source waits for each metadata request
    (archives ignore it)."""
    if spec.is_kafka:
        return KafkaSource(spec, dict(kafka_conf or {}), timeout_s=timeout_s)
    return ArchiveSource(spec)
