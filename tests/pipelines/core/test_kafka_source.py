"""The Spark Kafka data source: same rows as the archive of the same records, end offsets fixed at planning."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Producer

from div import kafka_log
from pipelines.core import kafka_source
from pipelines.core.archive_source import read_archive
from pipelines.core.kafka_source import (
    KAFKA_SPARK_SCHEMA,
    KafkaSplit,
    TidegaugeKafkaReader,
    _Options,
    read_kafka,
)
from sim.archiver import Archiver

pytestmark = pytest.mark.kafka


def _topic(embedded_kafka, partitions: int) -> str:
    name = f"src-{uuid.uuid4().hex[:8]}"
    embedded_kafka.create_topic(name, partitions)
    return name


def _produce(bootstrap: str, topic: str, n: int, partitions: int, first: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(first, first + n):
        p.produce(
            topic,
            key=None if i % 17 == 0 else b"k%d" % i,
            value=b"v%d" % i,
            partition=i % partitions,
            headers=[("hbw", bytes(18000))] if i % 97 == 0 else None,
        )
    assert p.flush(30) == 0


def _sorted_rows(df) -> list[tuple]:
    return sorted(map(tuple, df.collect()), key=lambda r: (r[2], r[3], r[4]))


def _options(bootstrap: str, topic: str, **extra) -> _Options:
    return _Options({"bootstrap": bootstrap, "topics": topic, **extra})


@pytest.mark.spark
def test_kafka_source_returns_the_archive_rows(spark, embedded_kafka, tmp_path):
    topic = _topic(embedded_kafka, 3)
    arc = Archiver(embedded_kafka.bootstrap_servers, None, str(tmp_path), topics=[topic])
    _produce(embedded_kafka.bootstrap_servers, topic, 2000, 3)
    assert arc.stop() == 2000
    from_kafka = read_kafka(spark, embedded_kafka.uri, topic)
    from_archive = read_archive(spark, tmp_path, [topic])
    assert from_kafka.schema == from_archive.schema == KAFKA_SPARK_SCHEMA
    rows = _sorted_rows(from_kafka)
    assert len(rows) == 2000
    assert rows == _sorted_rows(from_archive)
    assert any(r[7] and len(r[7][0]["value"]) == 18000 for r in rows)


@pytest.mark.spark
def test_end_offsets_fixed_when_the_dataframe_is_made(spark, embedded_kafka):
    topic = _topic(embedded_kafka, 2)
    _produce(embedded_kafka.bootstrap_servers, topic, 100, 2)
    df = read_kafka(spark, embedded_kafka.bootstrap_servers, [topic])
    _produce(embedded_kafka.bootstrap_servers, topic, 50, 2, first=100)
    assert df.count() == 100
    # Through the raw format (no helper) the range is fixed when Spark plans the query: it sees all 150.
    raw = (
        spark.read.format("tidegauge_kafka")
        .option("bootstrap", embedded_kafka.bootstrap_servers)
        .option("topics", topic)
        .option("max_records_per_split", "20")
        .load()
    )
    assert raw.count() == 150
    assert raw.rdd.getNumPartitions() == 8  # 75 records per partition, 20 per split
    sub = read_kafka(
        spark,
        embedded_kafka.bootstrap_servers,
        topic,
        starting={topic: {"0": 10}},
        ending={topic: {0: 20, "1": 5}},
    )
    got = sorted((r.partition, r.offset) for r in sub.select("partition", "offset").collect())
    assert got == [(0, o) for o in range(10, 20)] + [(1, o) for o in range(5)]


def test_reader_reads_up_to_the_offsets_planned_even_if_records_arrive_later(embedded_kafka):
    topic = _topic(embedded_kafka, 2)
    _produce(embedded_kafka.bootstrap_servers, topic, 40, 2)
    reader = TidegaugeKafkaReader(_options(embedded_kafka.bootstrap_servers, topic))
    splits = reader.partitions()
    assert sorted((s.topic, s.partition, s.start, s.end) for s in splits) == [
        (topic, 0, 0, 20),
        (topic, 1, 0, 20),
    ]
    _produce(embedded_kafka.bootstrap_servers, topic, 40, 2, first=40)
    offsets = sorted(o for s in splits for b in reader.read(s) for o in b.column("offset").to_pylist())
    assert offsets == sorted(list(range(20)) * 2)


def test_splits_cut_partitions_and_honour_start_and_end(embedded_kafka):
    topic = _topic(embedded_kafka, 2)
    _produce(embedded_kafka.bootstrap_servers, topic, 50, 2)  # 25 per partition
    opts = _options(
        embedded_kafka.bootstrap_servers,
        topic,
        max_records_per_split="10",
        starting_offsets=json.dumps({topic: {"1": 3}}),
        ending_offsets=json.dumps({topic: {"0": 12, "1": -1}}),
    )
    splits = TidegaugeKafkaReader(opts).partitions()
    assert [(s.partition, s.start, s.end) for s in splits] == [
        (0, 0, 10),
        (0, 10, 12),
        (1, 3, 13),
        (1, 13, 23),
        (1, 23, 25),
    ]
    empty = _options(
        embedded_kafka.bootstrap_servers, topic, ending_offsets=json.dumps({topic: {"0": 0, "1": 0}})
    )
    [only] = TidegaugeKafkaReader(empty).partitions()
    assert isinstance(only, KafkaSplit) and list(TidegaugeKafkaReader(empty).read(only)) == []


@pytest.mark.parametrize(
    "options,message",
    [
        ({"topics": "t"}, "'bootstrap'"),
        ({"bootstrap": "h:1"}, "'topics'"),
        (
            {"bootstrap": "h:1", "topics": "t", "kafka_secret_conf": "{nope"},
            "'kafka_secret_conf' is not valid JSON",
        ),
        ({"bootstrap": "h:1", "topics": "t", "conf": "[1]"}, "'kafka_secret_conf' must be a JSON object"),
        ({"bootstrap": "h:1", "topics": "t", "starting_offsets": '{"t": 5}'}, "'starting_offsets'"),
        ({"bootstrap": "h:1", "topics": "t", "ending_offsets": '{"t": {"0": "x"}}'}, r"t\[0\]"),
        ({"bootstrap": "h:1", "topics": "t", "max_records_per_split": "0"}, "max_records_per_split"),
        ({"bootstrap": "http://h:1", "topics": "t"}, None),
    ],
)
def test_bad_options_are_named(options, message):
    if message is None:  # a bare host:port list is passed through; only kafka:// URIs are parsed
        assert _Options(options).bootstrap == "http://h:1"
        return
    with pytest.raises(ValueError, match=message):
        _Options(options)


def test_conf_option_is_not_echoed_in_errors():
    secret = "s3cr3t-" + uuid.uuid4().hex
    with pytest.raises(ValueError) as e:
        _Options({"bootstrap": "h:1", "topics": "t", "conf": '{"sasl.password": "' + secret + '"'})
    assert secret not in str(e.value)


def test_unknown_topic_fails_planning_with_its_name(embedded_kafka):
    with pytest.raises(kafka_log.KafkaLogError, match="no-such-topic-here"):
        TidegaugeKafkaReader(_options(embedded_kafka.bootstrap_servers, "no-such-topic-here")).partitions()


def test_short_name():
    assert kafka_source.TidegaugeKafkaDataSource.name() == "tidegauge_kafka"
