"""`heartbeat.metrics.LeaderMetrics` (issue 19): a leader's own counters as Prometheus reads them, served the way a
leader process would (`prometheus_client.start_http_server(port, registry=...)`) and scraped over loopback.

The numbers are the leader's `LeaderStats`, counted once; these tests check them against what the leader did:
with an in-memory producer step by step (acks held back, then released, then failing; the clock injected, so the
watermark age is exact), and on the embedded Kafka cluster against the topics read back.
"""

from __future__ import annotations

import random
import urllib.request
import uuid

import pytest
from confluent_kafka import Producer
from heartbeat_fixtures import FakeProducer, decode_vt, read_topic, rt_streams, run_loop
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from div import keys
from div.writer import SegmentWriter
from heartbeat import HeartbeatLeader, LeaderBrokenError, parse_vt_heartbeat
from heartbeat.metrics import LeaderMetrics
from heartbeat.records import rt_heartbeat

T0 = 1_700_000_000_000


class Served:
    """A registry served on a free loopback port, scraped into {(sample name, labels): value}."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.httpd, self.thread = start_http_server(0, addr="127.0.0.1", registry=registry)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/metrics"

    def scrape(self) -> dict[tuple[str, frozenset], float]:
        with urllib.request.urlopen(self.url, timeout=30) as response:
            text = response.read().decode("utf-8")
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


@pytest.fixture
def served():
    made = []

    def serve(registry: CollectorRegistry) -> Served:
        made.append(Served(registry))
        return made[-1]

    yield serve
    for s in made:
        s.close()


def L(**kw) -> frozenset:  # noqa: N802 (reads as a label set)
    return frozenset((k, str(v)) for k, v in kw.items())


def value(scraped: dict, name: str, **labels) -> float | None:
    return scraped.get((name, L(**labels)))


def test_counts_ages_and_states_follow_the_leader_step_by_step(served):
    now = [T0]
    fake = FakeProducer(clock=lambda: now[0])
    leader = HeartbeatLeader(
        fake,
        vt_topic="s_v1",
        rt_topic="s_rt",
        partition=2,
        region=0,
        n_regions=2,
        host="leader-0:1",
        interval_ms=10_000,
        clock=lambda: now[0],
    )
    metrics = LeaderMetrics()
    assert metrics.add(leader) is leader
    server = served(metrics.registry)
    me = {"region": 0, "partition": 2, "topic": "s_v1"}
    rt_hb = {"region": 0, "partition": 2, "topic": "s_rt", "kind": "rt"}
    vt_hb = {**me, "kind": "vt"}

    got = server.scrape()  # before the term: counters at zero, no watermark yet
    assert value(got, "tidegauge_leader_heartbeats_written_total", **vt_hb) == 0
    assert value(got, "tidegauge_leader_heartbeat_interval_seconds", **me) == 10
    assert value(got, "tidegauge_leader_broken", **me) == 0
    assert not [k for k in got if k[0] == "tidegauge_leader_watermark"]

    writer = SegmentWriter(b"p" * 16, host_name="producer", clock=lambda: now[0])
    rt = [*writer.put(2, b"k1", b"v1")]  # StartOfSegment + PUT
    fed = 0

    def feed(rec, region: int = 0) -> None:
        nonlocal fed
        r = leader.on_rt_record(region, fed, rec.key, rec.value, rec.headers, now[0])
        fed += 1
        if r.is_heartbeat:
            return
        if r.is_data:
            leader.put(r.key, b"resolved")
        leader.done()

    leader.take_over()  # the term starts at T0: every region's age counts from here
    fake.hold = True  # no acknowledgement comes back for now
    for rec in rt:
        feed(rec)
    now[0] += 30_000
    leader.poll()  # RT heartbeat due; the StartOfSegment (nothing to write) moved region 0's mark
    now[0] += 20_000
    feed(rt_heartbeat("leader-0:1", now[0]))  # its VT heartbeat must wait for the PUT's sends
    got = server.scrape()
    assert value(got, "tidegauge_leader_watermark", **me, source_region=0) == 0
    assert value(got, "tidegauge_leader_watermark", **me, source_region=1) == -1
    assert value(got, "tidegauge_leader_watermark_age_seconds", **me, source_region=0) == 20
    assert value(got, "tidegauge_leader_watermark_age_seconds", **me, source_region=1) == 50
    assert value(got, "tidegauge_leader_pending_heartbeats", **me) == 1
    assert value(got, "tidegauge_leader_pending_sends", **me) == leader.tracker.pending_sends >= 1
    assert value(got, "tidegauge_leader_heartbeats_written_total", **rt_hb) == 1
    assert value(got, "tidegauge_leader_heartbeats_acked_total", **rt_hb) == 0
    assert value(got, "tidegauge_leader_heartbeats_written_total", **vt_hb) == 0

    now[0] += 5_000
    fake.hold = False
    leader.poll()  # acks: the mark passes the PUT and the heartbeat, whose VT heartbeat is written
    leader.flush()
    got = server.scrape()
    assert value(got, "tidegauge_leader_watermark", **me, source_region=0) == 2
    assert value(got, "tidegauge_leader_watermark_age_seconds", **me, source_region=0) == 0
    assert value(got, "tidegauge_leader_watermark_age_seconds", **me, source_region=1) == 55
    assert value(got, "tidegauge_leader_pending_heartbeats", **me) == 0
    assert value(got, "tidegauge_leader_pending_sends", **me) == 0
    vt_log = fake.records("s_v1", 2)
    vt_heartbeats = [m for m in vt_log if keys.is_heartbeat_key(m[1])]
    assert len(vt_heartbeats) == 1
    assert value(got, "tidegauge_leader_heartbeats_written_total", **vt_hb) == 1
    assert value(got, "tidegauge_leader_heartbeats_acked_total", **vt_hb) == 1
    assert (
        value(got, "tidegauge_leader_heartbeats_written_total", **rt_hb) == len(fake.records("s_rt", 2)) == 2
    )
    assert value(got, "tidegauge_leader_heartbeats_acked_total", **rt_hb) == 2
    assert value(got, "tidegauge_leader_records_sent_total", **me) == len(vt_log) - 1 == leader.stats.vt_sends
    assert value(got, "tidegauge_leader_records_acked_total", **me) == leader.stats.vt_sends
    assert value(got, "tidegauge_leader_rt_records_total", region=0, partition=2, topic="s_rt") == 3

    now[0] += 7_000  # time alone ages the marks, at scrape time
    got = server.scrape()
    assert value(got, "tidegauge_leader_watermark_age_seconds", **me, source_region=0) == 7
    assert value(got, "tidegauge_leader_watermark_age_seconds", **me, source_region=1) == 62

    fake.fail_when(lambda m: m.topic == "s_rt")  # an RT heartbeat fails: counted, nothing breaks
    now[0] += 10_000
    leader.poll()
    leader.flush()
    fake.fail_when(lambda m: m.topic == "s_v1")  # a VT send fails for good: the leader breaks
    feed(writer.put(2, b"k2", b"v2")[0])
    with pytest.raises(LeaderBrokenError):
        leader.poll()
    got = server.scrape()
    assert value(got, "tidegauge_leader_heartbeats_failed_total", **rt_hb) == 1
    assert value(got, "tidegauge_leader_heartbeats_failed_total", **vt_hb) == 0
    assert value(got, "tidegauge_leader_records_failed_total", **me) == 1
    assert value(got, "tidegauge_leader_broken", **me) == 1


def test_a_new_term_replaces_its_broken_leader_and_other_partitions_are_shown_beside_it(served):
    def leader(partition: int, term: int) -> HeartbeatLeader:
        return HeartbeatLeader(
            FakeProducer(),
            vt_topic="s_v1",
            rt_topic="s_rt",
            partition=partition,
            region=1,
            n_regions=2,
            host="h:1",
            term_id=term,
            interval_ms=0,
        )

    metrics = LeaderMetrics(CollectorRegistry())
    old, other = leader(0, 1), leader(1, 1)
    metrics.add(old)
    metrics.add(other)
    old.emit_rt_heartbeat(T0)
    old.emit_rt_heartbeat(T0 + 1)
    new = leader(0, 2)
    metrics.add(new)  # same region, VT topic and partition: replaces `old`
    got = served(metrics.registry).scrape()
    written = {
        labels: v for (name, labels), v in got.items() if name == "tidegauge_leader_heartbeats_written_total"
    }
    assert written == {
        L(region=1, partition=0, topic="s_rt", kind="rt"): 0,
        L(region=1, partition=0, topic="s_v1", kind="vt"): 0,
        L(region=1, partition=1, topic="s_rt", kind="rt"): 0,
        L(region=1, partition=1, topic="s_v1", kind="vt"): 0,
    }
    # no interval: the caller emits RT heartbeats itself, so no interval is claimed
    assert not [k for k in got if k[0] == "tidegauge_leader_heartbeat_interval_seconds"]
    metrics.remove(old)  # no longer shown: nothing happens
    metrics.remove(other)
    got = served(metrics.registry).scrape()
    assert {labels for (name, labels) in got if name == "tidegauge_leader_broken"} == {
        L(region=1, partition=0, topic="s_v1")
    }


@pytest.mark.kafka
def test_on_kafka_the_counts_are_what_the_topics_hold(embedded_kafka, served):
    run = uuid.uuid4().hex[:8]
    vt_topic, rt_topic = f"lm{run}_v1", f"lm{run}_rt"
    embedded_kafka.create_topic(vt_topic, 1)
    embedded_kafka.create_topic(rt_topic, 1)
    producer = Producer(
        {"bootstrap.servers": embedded_kafka.bootstrap_servers, "linger.ms": 2, "enable.idempotence": True}
    )
    leader = HeartbeatLeader(
        producer,
        vt_topic=vt_topic,
        rt_topic=rt_topic,
        partition=0,
        region=0,
        n_regions=3,
        host="leader-0:1",
        term_id=1,
        interval_ms=0,
    )
    registry = CollectorRegistry()
    LeaderMetrics(registry).add(leader)
    server = served(registry)
    streams = rt_streams(3, 300, seed=23)
    rt_sent = []

    def emit(i: int) -> None:
        if i % 250 == 0:
            rt_sent.append(leader.emit_rt_heartbeat(T0 + i))

    run_loop(leader, streams, random.Random(5), poll_every=5, on_step=emit)
    assert leader.flush(60) == 0
    got = server.scrape()
    me = {"region": 0, "partition": 0, "topic": vt_topic}

    vt = decode_vt(read_topic(embedded_kafka.bootstrap_servers, vt_topic))
    vt_heartbeats = [x for x in vt if parse_vt_heartbeat(x.key, x.env, x.headers) is not None]
    rt_heartbeats_in = sum(1 for s in streams for x in s if x.key == keys.HEARTBEAT_KEY)
    assert len(vt_heartbeats) == rt_heartbeats_in > 0  # one VT heartbeat per RT heartbeat consumed
    for verb in ("written", "acked"):
        assert value(got, f"tidegauge_leader_heartbeats_{verb}_total", **me, kind="vt") == len(vt_heartbeats)
        assert (
            value(
                got,
                f"tidegauge_leader_heartbeats_{verb}_total",
                region=0,
                partition=0,
                topic=rt_topic,
                kind="rt",
            )
            == len(read_topic(embedded_kafka.bootstrap_servers, rt_topic))
            == len(rt_sent)
        )
    assert value(got, "tidegauge_leader_heartbeats_failed_total", **me, kind="vt") == 0
    data = len(vt) - len(vt_heartbeats)
    assert value(got, "tidegauge_leader_records_sent_total", **me) == data > 0
    assert value(got, "tidegauge_leader_records_acked_total", **me) == data
    assert value(got, "tidegauge_leader_records_failed_total", **me) == 0
    assert value(got, "tidegauge_leader_rt_records_total", region=0, partition=0, topic=rt_topic) == sum(
        len(s) for s in streams
    )
    for region, stream in enumerate(streams):
        assert value(got, "tidegauge_leader_watermark", **me, source_region=region) == len(stream) - 1
    assert value(got, "tidegauge_leader_pending_heartbeats", **me) == 0
    assert value(got, "tidegauge_leader_pending_sends", **me) == 0
    assert value(got, "tidegauge_leader_broken", **me) == 0
    assert leader.close(60) == 0
