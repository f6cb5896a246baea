"""Spark's own Kafka source (`spark-sql-kafka-0-10`) reading the planned `kafka://` VT splits, for comparison with
`tidegauge_vt` (`pipelines.leapfrog.source.read_vt`): bench/bench_vt_kafka_source.py measures both on real
brokers. Only that benchmark uses it: on the path Leap Frog's job takes (records handed to Python to be decoded) it
was slower than today's reader, so the job keeps its own (issue 32).

`kafka_source_jars` resolves the source, its Kafka client and commons-pool2 from Maven Central by
bench/jvm/kafka/pom.xml (`spark_connectors`, through `sim.maven`), once per machine and Spark version; `session_conf` puts them on the driver's
class path (in local mode the executors' too), as `pipelines.watch.checkpoint` does for S3A. `read_kafka` reads
exactly the splits' offset ranges (`assign`, `startingOffsets`/`endingOffsets` per partition) with their headers, as
rows of `tidegauge_vt`'s columns.

Trimmed ranges (records deleted below a split's start): `failOnDataLoss=true` fails the query; `false` silently
starts at the first offset held, so a reader that must report a partial range has to compare the first offset it
got with the split's start itself (see the bench's trimmed-range check).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from spark_connectors import connector_jars

from pipelines.core.errors import UsageError
from pipelines.core.sources import is_kafka
from pipelines.core.spark_jars import with_jars
from pipelines.leapfrog.source import VtSplit

PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def kafka_source_jars(progress: Callable[[str], None] | None = None) -> list[Path]:
    """spark-sql-kafka-0-10 at pyspark's Spark version and what it needs that pyspark lacks (bench/jvm/kafka/pom.xml),
    resolved on first use; UsageError says what to do otherwise."""
    return connector_jars(
        "spark-sql-kafka", "kafka", "spark-sql-kafka-0-10", "Spark's Kafka source", progress
    )


def session_conf(
    conf: Mapping[str, str], master: str | None, progress: Callable[[str], None] | None = None
) -> dict[str, str]:
    """`conf` plus the Kafka source's jars on the class path of a session tidegauge starts; unchanged under
    spark-submit, whose JVM already runs (give it `--packages` or `--jars` there)."""
    from pipelines.core.spark_session import under_spark_submit

    if under_spark_submit():
        return dict(conf)
    return with_jars(conf, master, kafka_source_jars(progress))


def available(spark: SparkSession) -> bool:
    """This session's JVM can load Spark's Kafka source."""
    try:
        spark.sparkContext._jvm.java.lang.Class.forName(PROVIDER)
    except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException
        return False
    return True


def _bootstrap(uri: str) -> str:
    from div.kafka_log import parse_kafka_uri

    return parse_kafka_uri(uri)


def read_kafka(
    spark: SparkSession,
    splits: list[VtSplit],
    topic: str,
    kafka_conf: Mapping[int, Mapping] | None = None,
    fail_on_data_loss: bool = True,
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """The records of the planned `kafka://` splits through Spark's Kafka source: columns region, partition (int),
    offset, key, value, headers (array<struct<key string, value binary>>), like `read_vt` less `split` (Spark's
    source makes its own partitions: one per topic partition, or more with `minPartitions`). One query per region
    (a region is one cluster), unioned. A split's range must not overlap another's of the same partition. `options`
    go to the source as they are (e.g. `kafka.max.poll.records`)."""
    by_region: dict[int, list[VtSplit]] = {}
    for s in splits:
        if not is_kafka(s.uri):
            raise UsageError(
                f"region {s.region}: Spark's Kafka source reads kafka:// sources only, not {s.uri!r}"
            )
        if s.end > s.start:
            by_region.setdefault(s.region, []).append(s)
    frames = []
    for region, ss in sorted(by_region.items()):
        per_part: dict[int, tuple[int, int]] = {}
        for s in ss:
            lo, hi = per_part.get(s.partition, (s.start, s.end))
            per_part[s.partition] = (min(lo, s.start), max(hi, s.end))
        start = {topic: {str(p): lo for p, (lo, _) in per_part.items()}}
        end = {topic: {str(p): hi for p, (_, hi) in per_part.items()}}
        reader = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", _bootstrap(ss[0].uri))
            .option("assign", json.dumps({topic: sorted(per_part)}))
            .option("startingOffsets", json.dumps(start))
            .option("endingOffsets", json.dumps(end))
            .option("includeHeaders", "true")
            .option("failOnDataLoss", "true" if fail_on_data_loss else "false")
        )
        # librdkafka and the Java client share most security settings' names (security.protocol, sasl.mechanism
        # is `sasl.mechanisms` in librdkafka); not checked here: the bench reads plaintext loopback brokers
        for k, v in ((kafka_conf or {}).get(region) or {}).items():
            reader = reader.option(f"kafka.{k}", str(v))
        for k, v in (options or {}).items():
            reader = reader.option(k, str(v))
        frames.append(
            reader.load().select(
                F.lit(region).cast("int").alias("region"),
                F.col("partition").cast("int").alias("partition"),
                "offset",
                "key",
                "value",
                "headers",
            )
        )
    if not frames:
        raise UsageError("no non-empty kafka:// split to read")
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out
