"""Reading an archive (a directory of Kafka-schema Parquet files, see `div.archive`) as a Spark DataFrame.

Jobs take either an archive or a live cluster and must give the same answer for the same records; this reader
and `pipelines.core.kafka_source.read_kafka` return DataFrames with the same schema and the same rows for the same
records. Spark, like `div.archive`, ignores files whose names start with '.' or '_', so the writer's
temporary files never show up here.
"""

from __future__ import annotations

import os

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from div.archive import ArchiveError
from pipelines.core.kafka_source import KAFKA_SPARK_SCHEMA


def read_archive(
    spark: SparkSession, directory: str | os.PathLike, topics: str | list[str] | None = None
) -> DataFrame:
    """The archive's records in Spark's Kafka schema, optionally only those of `topics` (a list or comma list).

    Rows come in no particular order (sort by topic, partition, offset when order matters). Records an archive
    holds twice (possible only in archives written by other tools) are returned twice.
    """
    path = os.fspath(directory)
    if not os.path.isdir(path):
        raise ArchiveError(f"archive {path}: no such directory")
    df = spark.read.schema(KAFKA_SPARK_SCHEMA).parquet(path)
    if topics is not None:
        wanted = [t.strip() for t in topics.split(",")] if isinstance(topics, str) else list(topics)
        df = df.where(F.col("topic").isin(wanted))
    return df
