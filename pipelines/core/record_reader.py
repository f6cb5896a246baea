"""The one reader of records for Spark: the record columns every data source gives, and the reading of a range.

Three Python data sources hand records to Spark: `pipelines.core.kafka_source` (a live cluster in Spark's Kafka
schema), `pipelines.leapfrog.source` (`tidegauge_vt`: every region's version topic by offset range; the one-pass
Leap Frog job reads its partitions through it in its own tasks) and `pipelines.core.stream_source`
(`tidegauge_stream`, the watch). They plan differently (splits, stream offsets and triggers, Kafka options: each
in its own module) but read the same way: a Spark task holds one (region, topic, partition, [start, end)) and
wants its records in offset order, as Arrow batches in its own choice of columns. This module owns both halves of
that: what each column is (its Arrow type, from the archive's schema `div.archive.KAFKA_ARROW_SCHEMA`, and its
Spark twin, plus `region` and `split`, which name where a record was read), and the reading of a range into any
`Layout` of those columns (through `pipelines.core.sources.read_range`, which tells archives from clusters).

What a source does when a range cannot be read (fail the micro-batch, or end the split with a read-error row) is
its own business; `READ_ERRORS` are what reading raises when the source, not the code, is at fault.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from div import archive, kafka_log
from pipelines.core.sources import read_range

# What reading a range raises when the source is at fault (a damaged archive file, a broker gone, records
# deleted under the reader), as opposed to a bug here.
READ_ERRORS: tuple[type[BaseException], ...] = (
    archive.ArchiveError,
    kafka_log.KafkaLogError,
    OSError,
    pa.ArrowException,
)

# Every column a layout may hold, as (Arrow type, Spark type). The archive's columns keep the archive's Arrow
# types, so a batch read from a cluster and one read from its archive are alike to the byte.
_HEADERS_SPARK = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
_SPARK_TYPES: dict[str, DataType] = {
    "split": IntegerType(),  # the planned split a record was read in (`tidegauge_vt`)
    "region": IntegerType(),  # the region whose source the record was read from
    "key": BinaryType(),
    "value": BinaryType(),
    "topic": StringType(),
    "partition": IntegerType(),
    "offset": LongType(),
    "timestamp": TimestampType(),
    "timestampType": IntegerType(),
    "headers": _HEADERS_SPARK,
}
_ARROW_TYPES: dict[str, pa.DataType] = {
    "split": pa.int32(),
    "region": pa.int32(),
    **{f.name: f.type for f in archive.KAFKA_ARROW_SCHEMA},
}
# Columns that are the same for every record of a range: given by the caller, never read (reading `topic` from an
# archive costs a string column per record for one value).
_CONSTANT = ("split", "region", "topic", "partition")


@dataclass(frozen=True)
class Layout:
    """The columns, in order, of the batches a data source gives Spark (each a name in `_SPARK_TYPES`)."""

    names: tuple[str, ...]

    def __post_init__(self) -> None:
        unknown = [n for n in self.names if n not in _SPARK_TYPES]
        if unknown:
            raise ValueError(f"no record column {unknown[0]!r} (known: {', '.join(_SPARK_TYPES)})")

    @property
    def spark(self) -> StructType:
        """The layout as a Spark schema (what a data source's `schema()` returns)."""
        return StructType([StructField(n, _SPARK_TYPES[n]) for n in self.names])

    @property
    def arrow(self) -> pa.Schema:
        """The layout as an Arrow schema (what the batches `read` yields hold)."""
        return pa.schema([pa.field(n, _ARROW_TYPES[n]) for n in self.names])

    def read(
        self,
        uri: str,
        kafka_conf: Mapping[str, Any] | None,
        topic: str,
        partition: int,
        start: int,
        end: int,
        *,
        region: int | None = None,
        split: int | None = None,
        batch_size: int = 65536,
        from_start: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        """Records [start, end) of `topic[partition]` in source `uri` (an archive or `kafka://...`), in offset
        order, as batches of this layout; `region` and `split` fill those columns. Raises what reading raises
        (`READ_ERRORS`, and `kafka_log.RangeTrimmedError` with `from_start`: see `sources.read_range`)."""
        if end <= start:
            return
        given = {"split": split, "region": region, "topic": topic, "partition": partition}
        for name in _CONSTANT:
            if name in self.names and given[name] is None:
                raise ValueError(f"reading a range into columns {self.names}: no {name} given")
        read = [n for n in self.names if n not in _CONSTANT]
        for b in read_range(uri, kafka_conf, topic, partition, start, end, read, batch_size, from_start):
            n = b.num_rows
            yield pa.RecordBatch.from_arrays(
                [
                    pa.repeat(pa.scalar(given[name], _ARROW_TYPES[name]), n)
                    if name in _CONSTANT
                    else b.column(name)
                    for name in self.names
                ],
                names=list(self.names),
            )


# Spark's Kafka source schema (with includeHeaders=true): `kafka_source` and `archive_source` give it.
KAFKA = Layout(("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"))
# `tidegauge_vt` (`pipelines.leapfrog.source`): what Leap Frog reads of a record, and the split it was read in.
VT = Layout(("split", "region", "partition", "offset", "key", "value", "headers"))
# `tidegauge_stream` (`pipelines.core.stream_source`): every region's topics as one stream.
STREAM = Layout(("region", "topic", "partition", "offset", "key", "value", "headers", "timestamp"))
# A packed stream row's records (`stream_source.PACKED_SCHEMA`): one range's, so without what is constant in it.
STREAM_RECORDS = Layout(("offset", "key", "value", "headers", "timestamp"))
