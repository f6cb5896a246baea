"""The Archiver keeps every record of a cluster whose retention drops data while producers write."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Producer

from div import archive, kafka_log
from sim.archiver import Archiver
from sim.embedded_kafka import EmbeddedKafka

pytestmark = pytest.mark.kafka


@pytest.mark.slow
def test_archives_everything_while_retention_drops_old_records(tmp_path):
    value = bytes(200)
    n = 60_000  # ~12 MiB into one partition: more than twice what the mock cluster keeps
    with EmbeddedKafka(brokers=1) as k:
        k.create_topic("busy", 2)
        arc = Archiver(k.bootstrap_servers, None, str(tmp_path), flush_interval_s=0.5)
        p = Producer({"bootstrap.servers": k.bootstrap_servers, "linger.ms": 5})
        for i in range(n):
            p.produce("busy", key=b"%d" % i, value=value, partition=0)
            if i % 2000 == 0:
                p.flush(30)
                # Never run more than ~2 MiB ahead of the archiver, however slow this machine is today:
                # the test is about correctness under retention, not about speed.
                while i - arc.positions().get(("busy", 0), 0) > 10_000:
                    time.sleep(0.01)
        assert p.flush(30) == 0
        # A topic created while the archiver runs is found too.
        k.create_topic("late", 1)
        p.produce("late", value=b"x", partition=0)
        assert p.flush(30) == 0
        count = arc.stop()
        with kafka_log.KafkaLog(k.bootstrap_servers) as kl:
            low, high = kl.watermarks("busy", 0)
    assert high == n and low > 0, "the mock cluster should have dropped the oldest records"
    assert count == n + 1
    assert arc.gaps() == []
    infos = {(i.topic, i.partition): i for i in archive.describe(tmp_path)}
    assert infos[("busy", 0)] == archive.PartitionInfo("busy", 0, 0, n - 1, n)
    assert infos[("late", 0)].records == 1
    assert ("busy", 1) not in infos
    offsets = [
        o
        for b in archive.iter_partition(tmp_path, "busy", 0, columns=["offset"])
        for o in b.column("offset").to_pylist()
    ]
    assert offsets == list(range(n))


def test_stop_drains_records_produced_just_before(embedded_kafka, tmp_path):
    topic = f"drain-{uuid.uuid4().hex[:8]}"
    embedded_kafka.create_topic(topic, 3)
    arc = Archiver(embedded_kafka.bootstrap_servers, None, str(tmp_path), topics=[topic])
    p = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers})
    for i in range(3000):
        p.produce(topic, value=b"%d" % i, partition=i % 3)
    assert p.flush(30) == 0
    assert arc.stop() == 3000
    assert [(i.partition, i.records) for i in archive.describe(tmp_path)] == [(0, 1000), (1, 1000), (2, 1000)]
    assert archive.topics(tmp_path) == [topic], "only the named topic is archived"


def test_restart_resumes_after_the_archived_offsets(embedded_kafka, tmp_path):
    topic = f"resume-{uuid.uuid4().hex[:8]}"
    embedded_kafka.create_topic(topic, 1)
    p = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers})

    def produce(lo, hi):
        for i in range(lo, hi):
            p.produce(topic, value=b"%d" % i, partition=0)
        assert p.flush(30) == 0

    produce(0, 500)
    assert Archiver(embedded_kafka.bootstrap_servers, None, str(tmp_path), topics=[topic]).stop() == 500
    produce(500, 800)
    second = Archiver(embedded_kafka.bootstrap_servers, None, str(tmp_path), topics=[topic])
    assert second.stop() == 300
    assert archive.describe(tmp_path) == [archive.PartitionInfo(topic, 0, 0, 799, 800)]


def test_stop_reports_a_failed_thread_and_keeps_what_it_consumed(embedded_kafka, tmp_path, monkeypatch):
    topic = f"fail-{uuid.uuid4().hex[:8]}"
    embedded_kafka.create_topic(topic, 1)
    p = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers})
    for i in range(100):
        p.produce(topic, value=b"%d" % i, partition=0)
    assert p.flush(30) == 0
    arc = Archiver(embedded_kafka.bootstrap_servers, None, str(tmp_path), topics=[topic], start=False)
    original = arc._handle
    calls = threading.Event()

    def handle_then_fail(msgs):
        if calls.is_set():
            raise RuntimeError("disk on fire")
        original(msgs)
        calls.set()

    monkeypatch.setattr(arc, "_handle", handle_then_fail)
    arc.start()
    assert calls.wait(30)
    p.produce(topic, value=b"more", partition=0)
    p.flush(30)
    with pytest.raises(Exception, match="disk on fire"):
        arc.stop()
    consumed = arc.records
    assert consumed > 0
    assert sum(i.records for i in archive.describe(tmp_path)) == consumed
