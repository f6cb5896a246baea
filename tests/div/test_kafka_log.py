"""Reading a live cluster (the embedded mock) as archive-schema batches; the Archiver tailing it."""

from __future__ import annotations

import datetime as dt
import logging
import uuid

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from div import archive, kafka_log
from div.archive import KAFKA_ARROW_SCHEMA
from div.kafka_log import KafkaLogError

pytestmark = pytest.mark.kafka


def _topic(embedded_kafka, partitions: int = 1) -> str:
    name = f"log-{uuid.uuid4().hex[:8]}"
    embedded_kafka.create_topic(name, partitions)
    return name


def _produce(bootstrap: str, topic: str, n: int, partition: int = 0, first: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(first, first + n):
        p.produce(
            topic,
            key=b"k%d" % i,
            value=b"v%d" % i,
            partition=partition,
            timestamp=1_700_000_000_000 + i,
            headers=[("n", b"%d" % i), ("z", None)] if i % 2 else None,
        )
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def _read(bootstrap, topic, partition, start, end, **kw) -> pa.Table:
    return pa.Table.from_batches(
        list(kafka_log.iter_partition(bootstrap, None, topic, partition, start, end, **kw)),
        schema=KAFKA_ARROW_SCHEMA,
    )


@pytest.mark.parametrize(
    "uri,bootstrap",
    [
        ("kafka://localhost:9092", "localhost:9092"),
        ("kafka://a:1,b.example:2/", "a:1,b.example:2"),
        ("kafka://[::1]:9092", "[::1]:9092"),
    ],
)
def test_parse_kafka_uri(uri, bootstrap):
    assert kafka_log.parse_kafka_uri(uri) == bootstrap


@pytest.mark.parametrize(
    "uri",
    [
        "localhost:9092",
        "kafka://",
        "kafka://host",
        "kafka://h:1,,h:2",
        "kafka://user:pw@h:1",
        "kafka://h:port",
        "/tmp/archive",
    ],
)
def test_bad_kafka_uris_are_named_in_the_error(uri):
    with pytest.raises(KafkaLogError) as e:
        kafka_log.parse_kafka_uri(uri)
    assert repr(uri) in str(e.value) or repr(uri.split("//")[-1].split(",")[0]) in str(e.value)


def test_metadata_topics_partitions_watermarks(embedded_kafka):
    topic = _topic(embedded_kafka, 3)
    _produce(embedded_kafka.bootstrap_servers, topic, 7, partition=1)
    assert topic in kafka_log.list_topics(embedded_kafka.uri)
    with kafka_log.KafkaLog(embedded_kafka.uri) as kl:
        assert kl.partitions(topic) == [0, 1, 2]
        assert kl.watermarks(topic, 1) == (0, 7)
        assert kl.watermarks(topic, 0) == (0, 0)
        with pytest.raises(KafkaLogError, match="no-such-topic"):
            kl.partitions("no-such-topic")


def test_read_range_converts_timestamps_and_headers(embedded_kafka):
    topic = _topic(embedded_kafka)
    _produce(embedded_kafka.bootstrap_servers, topic, 50)
    t = _read(embedded_kafka.bootstrap_servers, topic, 0, 10, 40, batch_size=8)
    rows = t.to_pylist()
    assert [r["offset"] for r in rows] == list(range(10, 40))
    r11 = rows[1]
    assert (r11["key"], r11["value"], r11["topic"], r11["partition"]) == (b"k11", b"v11", topic, 0)
    assert r11["timestamp"] == dt.datetime(2023, 11, 14, 22, 13, 20, 11000, tzinfo=dt.UTC)
    assert r11["timestampType"] == 0  # CreateTime, in Spark's numbering
    assert r11["headers"] == [{"key": "n", "value": b"11"}, {"key": "z", "value": None}]
    assert rows[0]["headers"] is None
    batches = list(
        kafka_log.iter_partition(embedded_kafka.bootstrap_servers, None, topic, 0, 10, 40, batch_size=8)
    )
    assert all(b.num_rows <= 8 for b in batches) and all(b.schema.equals(KAFKA_ARROW_SCHEMA) for b in batches)
    assert _read(embedded_kafka.bootstrap_servers, topic, 0, 5, 5).num_rows == 0


def test_read_stops_at_the_fixed_end_while_the_topic_grows(embedded_kafka):
    topic = _topic(embedded_kafka)
    _produce(embedded_kafka.bootstrap_servers, topic, 100)
    with kafka_log.KafkaLog(embedded_kafka.bootstrap_servers) as kl:
        _, end = kl.watermarks(topic, 0)
    _produce(embedded_kafka.bootstrap_servers, topic, 100, first=100)
    offsets = _read(embedded_kafka.bootstrap_servers, topic, 0, 0, end).column("offset").to_pylist()
    assert offsets == list(range(100))


def test_offsets_missing_from_the_log_are_skipped(embedded_kafka):
    """Transaction commit markers take offsets no consumer sees, like compaction does; the last offset of the
    range is such a marker, so the reader must stop on end-of-partition rather than wait for it."""
    topic = _topic(embedded_kafka)
    p = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers, "transactional.id": topic})
    p.init_transactions(30)
    for _ in range(3):
        p.begin_transaction()
        for i in range(5):
            p.produce(topic, value=b"%d" % i, partition=0)
        p.commit_transaction(30)
    with kafka_log.KafkaLog(embedded_kafka.bootstrap_servers) as kl:
        assert kl.watermarks(topic, 0) == (0, 18)
    offsets = _read(embedded_kafka.bootstrap_servers, topic, 0, 0, 18).column("offset").to_pylist()
    assert offsets == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16]
    assert _read(embedded_kafka.bootstrap_servers, topic, 0, 5, 6).num_rows == 0


def test_reading_past_the_log_end_gives_up_with_a_clear_error(embedded_kafka):
    topic = _topic(embedded_kafka)
    _produce(embedded_kafka.bootstrap_servers, topic, 3)
    with pytest.raises(KafkaLogError, match=rf"{topic}\[0\].*requested end offset 10"):
        _read(embedded_kafka.bootstrap_servers, topic, 0, 0, 10, stall_timeout_s=1.0)


def test_conf_values_never_reach_errors_or_logs(embedded_kafka, caplog):
    secret = "hunter2-" + uuid.uuid4().hex
    conf = {"sasl.password": secret, "sasl.username": "u", "security.protocol": "not-a-protocol"}
    caplog.set_level(logging.DEBUG)
    with pytest.raises(KafkaLogError) as e:
        kafka_log.list_topics(embedded_kafka.bootstrap_servers, conf)
    assert secret not in str(e.value) and secret not in caplog.text
    assert kafka_log.topic_config(embedded_kafka.bootstrap_servers, conf, "t", "cleanup.policy", 1.0) is None
    assert secret not in caplog.text


def test_topic_config_is_none_when_the_broker_cannot_answer(embedded_kafka):
    topic = _topic(embedded_kafka)
    assert (
        kafka_log.topic_config(embedded_kafka.bootstrap_servers, None, topic, "cleanup.policy", 1.0) is None
    )


def test_archive_of_a_kafka_read_reads_back_identically(embedded_kafka, tmp_path):
    topic = _topic(embedded_kafka, 2)
    for p in (0, 1):
        _produce(embedded_kafka.bootstrap_servers, topic, 300, partition=p)
    with archive.ArchiveWriter(tmp_path) as w:
        for p in (0, 1):
            for b in kafka_log.iter_partition(embedded_kafka.bootstrap_servers, None, topic, p, 0, 300, 128):
                w.append(b)
    for p in (0, 1):
        from_kafka = _read(embedded_kafka.bootstrap_servers, topic, p, 0, 300)
        from_archive = pa.Table.from_batches(list(archive.iter_partition(tmp_path, topic, p)))
        assert from_archive.equals(from_kafka)


def test_batches_are_bounded_by_bytes(embedded_kafka, monkeypatch):
    limit = 64 << 10
    monkeypatch.setattr(archive, "MAX_BATCH_BYTES", limit)
    topic = _topic(embedded_kafka)
    p = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers, "linger.ms": 5})
    for i in range(40):
        p.produce(topic, key=b"k%d" % i, value=bytes(20 << 10), partition=0)
    assert p.flush(30) == 0
    batches = list(kafka_log.iter_partition(embedded_kafka.bootstrap_servers, None, topic, 0, 0, 40))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(40))
    assert all(sum(len(v) for v in b.column("value").to_pylist()) <= limit for b in batches)
    assert len(batches) >= 14  # 3 values of 20 KiB a batch at most


def test_a_cluster_nobody_answers_for_says_what_to_check_and_never_a_secret(caplog):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secret = "hunter2-" + uuid.uuid4().hex
    conf = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "reader",
        "sasl.password": secret,
    }
    caplog.set_level(logging.DEBUG)
    with pytest.raises(KafkaLogError) as e:
        kafka_log.KafkaLog(f"127.0.0.1:{port}", conf, timeout_s=1.5).topics()
    text = str(e.value)
    assert f"cannot read metadata from 127.0.0.1:{port}" in text
    assert "Connection refused" in text  # what librdkafka's error callback said, not only its code
    assert "waited 1." in text or "waited 2." in text
    for setting in (
        "security.protocol=SASL_PLAINTEXT",
        "sasl.mechanism=SCRAM-SHA-512",
        "sasl.username=reader",
    ):
        assert setting in text
    assert "sasl.password set" in text
    assert secret not in text and secret not in caplog.text


def test_settings_to_check_show_paths_and_names_never_secret_values():
    shown = kafka_log.settings_to_check(
        {
            "security.protocol": "SSL",
            "ssl.ca.location": "/etc/kafka/ca.pem",
            "ssl.key.location": "/etc/kafka/client.key",
            "ssl.key.password": "k3y-pass",
            "ssl.keystore.password": "st0re-pass",
        }
    )
    assert "ssl.ca.location=/etc/kafka/ca.pem" in shown and "ssl.key.location=/etc/kafka/client.key" in shown
    assert "ssl.key.password set" in shown and "ssl.keystore.password set" in shown
    assert "k3y-pass" not in shown and "st0re-pass" not in shown
    assert kafka_log.settings_to_check({}) == "security.protocol=plaintext (not set)"
