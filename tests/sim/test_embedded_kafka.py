"""The embedded mock cluster: topics through ctypes, several clusters per process, broker faults, errors."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from sim.embedded_kafka import EmbeddedKafka, EmbeddedKafkaError

pytestmark = pytest.mark.kafka


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _produce(bootstrap: str, topic: str, values: list[bytes], partition: int | None = None, **conf) -> list:
    results = []
    p = Producer({"bootstrap.servers": bootstrap, **conf})
    for v in values:
        kw = {} if partition is None else {"partition": partition}
        p.produce(topic, value=v, key=v, on_delivery=lambda err, msg: results.append((err, msg)), **kw)
    assert p.flush(30) == 0
    return results


def _consume_all(bootstrap: str, topic: str, partitions: list[int], expected: int) -> list:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "t",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in partitions])
    out = []
    for _ in range(100):
        out += [m for m in c.consume(1000, timeout=0.2) if m.error() is None]
        if len(out) >= expected:
            break
    c.close()
    return out


def test_topic_with_eight_partitions_round_trip(embedded_kafka):
    topic = _name("eight")
    embedded_kafka.create_topic(topic, 8)
    c = Consumer({"bootstrap.servers": embedded_kafka.bootstrap_servers, "group.id": "t"})
    assert sorted(c.list_topics(topic, timeout=10).topics[topic].partitions) == list(range(8))
    c.close()
    values = [b"v%03d" % i for i in range(80)]
    p = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers})
    for i, v in enumerate(values):
        p.produce(topic, value=v, partition=i % 8, headers=[("h", b"%d" % i)])
    assert p.flush(30) == 0
    got = _consume_all(embedded_kafka.bootstrap_servers, topic, list(range(8)), 80)
    assert sorted(m.value() for m in got) == values
    assert {m.partition() for m in got} == set(range(8))
    assert all(m.headers() == [("h", b"%d" % int(m.value()[1:]))] for m in got)


def test_create_topic_twice_or_with_bad_arguments_fails(embedded_kafka):
    topic = _name("dup")
    embedded_kafka.create_topic(topic, 2)
    with pytest.raises(EmbeddedKafkaError, match=f"{topic}.*TOPIC_ALREADY_EXISTS"):
        embedded_kafka.create_topic(topic, 2)
    with pytest.raises(ValueError, match="partitions"):
        embedded_kafka.create_topic(_name("zero"), 0)
    with pytest.raises(ValueError, match="replication factor 3"):
        embedded_kafka.create_topic(_name("rf"), 1, replication_factor=3)
    with pytest.raises(ValueError, match="broker id 7"):
        embedded_kafka.broker_down(7)


def test_auto_created_topics_get_four_partitions(embedded_kafka):
    topic = _name("auto")
    _produce(embedded_kafka.bootstrap_servers, topic, [b"x"])
    c = Consumer({"bootstrap.servers": embedded_kafka.bootstrap_servers, "group.id": "t"})
    assert len(c.list_topics(topic, timeout=10).topics[topic].partitions) == 4
    c.close()


def test_two_clusters_in_one_process_are_independent():
    with EmbeddedKafka(brokers=1) as a, EmbeddedKafka(brokers=3) as b:
        assert a.bootstrap_servers != b.bootstrap_servers
        assert len(b.bootstrap_servers.split(",")) == 3
        a.create_topic("same", 1)
        b.create_topic("same", 3)
        _produce(a.bootstrap_servers, "same", [b"from-a"] * 3, partition=0)
        _produce(b.bootstrap_servers, "same", [b"from-b"] * 5, partition=2)
        got_a = _consume_all(a.bootstrap_servers, "same", [0], 3)
        got_b = _consume_all(b.bootstrap_servers, "same", [0, 1, 2], 5)
        assert [m.value() for m in got_a] == [b"from-a"] * 3
        assert [m.value() for m in got_b] == [b"from-b"] * 5
    assert a.closed and b.closed
    with pytest.raises(EmbeddedKafkaError, match="closed"):
        a.create_topic("later", 1)
    a.close()  # closing twice is harmless


def test_broker_down_stalls_produce_until_it_comes_back():
    with EmbeddedKafka(brokers=1) as k:
        k.create_topic("t", 1)
        delivered = []
        p = Producer({"bootstrap.servers": k.bootstrap_servers, "message.timeout.ms": 120000})
        p.produce("t", value=b"before", on_delivery=lambda e, m: delivered.append((e, m.value())))
        assert p.flush(30) == 0
        k.broker_down(1)
        p.produce("t", value=b"during", on_delivery=lambda e, m: delivered.append((e, m.value())))
        assert p.flush(2) == 1, "with the only broker down the record must stay queued"
        assert delivered == [(None, b"before")]
        k.broker_up(1)
        assert p.flush(60) == 0
        assert delivered == [(None, b"before"), (None, b"during")]
        assert [m.value() for m in _consume_all(k.bootstrap_servers, "t", [0], 2)] == [b"before", b"during"]


def test_injected_produce_errors_fail_or_get_retried():
    with EmbeddedKafka(brokers=1) as k:
        k.create_topic("t", 1)
        no_retry = {"retries": 0, "enable.idempotence": False}
        _produce(k.bootstrap_servers, "t", [b"warm-up"], **no_retry)
        k.push_produce_errors(1, KafkaError.REQUEST_TIMED_OUT)
        [(err, _)] = _produce(k.bootstrap_servers, "t", [b"lost"], **no_retry)
        assert err is not None and err.code() == KafkaError.REQUEST_TIMED_OUT
        # A retrying producer gets through a burst of transient errors.
        k.push_produce_errors(3, KafkaError.REQUEST_TIMED_OUT)
        [(err, msg)] = _produce(k.bootstrap_servers, "t", [b"kept"])
        assert err is None
        got = _consume_all(k.bootstrap_servers, "t", [0], 2)
        assert [m.value() for m in got] == [b"warm-up", b"kept"]
