"""Reading an archive (a directory of Kafka-schema Parquet files, see `div.archive`) as a Spark DataFrame.

Jobs take either an archive or a live cluster and must give the same answer for the same records; this reader
and `pipelines.core.kafka_source.read_kafka` return DataFrames with the same schema and the same rows for the same
records. The archive may be any path or URI `pipelines.core.storage` serves; each task reads one file through it
(`pipelines.core.spark_files`), skipping names that start with '.' or '_' as `div.archive` does, so the writer's
temporary files never show up here.
"""

from __future__ import annotations

import os

import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from div.archive import KAFKA_ARROW_SCHEMA, ArchiveError, conform
from pipelines.core import record_reader
from pipelines.core.spark_files import read_parquet
from pipelines.core.storage import locate


def read_archive(
    spark: SparkSession,
    directory: str | os.PathLike,
    topics: str | list[str] | None = None,
    partition: int | None = None,
) -> DataFrame:
    """The archive's records in Spark's Kafka schema, optionally only those of `topics` (a list or comma list)
    and of one `partition` (filtered in the reader: row groups of other partitions are not read).

    Rows come in no particular order (sort by topic, partition, offset when order matters). Records an archive
    holds twice (possible only in archives written by other tools) are returned twice.
    """
    where = locate(directory)
    if not where.is_dir():
        raise ArchiveError(f"archive {where}: no such directory")
    wanted = None
    if topics is not None:
        wanted = [t.strip() for t in topics.split(",")] if isinstance(topics, str) else list(topics)
    keep = None
    if wanted is not None:
        keep = pc.field("topic").isin(wanted)
    if partition is not None:
        same = pc.field("partition") == partition
        keep = same if keep is None else keep & same
    df = read_parquet(spark, where, KAFKA_ARROW_SCHEMA, convert=conform, where=keep)
    if df is None:
        df = spark.createDataFrame([], record_reader.KAFKA.spark)
    if wanted is not None:
        df = df.where(F.col("topic").isin(wanted))
    if partition is not None:
        df = df.where(F.col("partition") == partition)
    return df
