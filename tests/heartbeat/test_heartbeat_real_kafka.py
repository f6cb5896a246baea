"""HeartbeatLeader on a real Apache Kafka broker that is killed (SIGKILL) and restarted mid-run (issue 29).

The mock-cluster tests (test_heartbeat_kafka.py) feed the leader RT streams held in memory and take brokers down
inside librdkafka's mock. Here everything goes through a real broker, one node of the test's own, so that its
death is a true outage: producers write three regions' RT topics while the leader consumes them, writes its VT
through its idempotent producer (acks=all) and emits RT heartbeats; the node is SIGKILLed with VT sends and
heartbeats in flight, the leader keeps working from what it had already consumed, and the node is started again
on the same data. Read back afterwards, the topics must show that the leader never claimed an unacknowledged
offset:

- every VT heartbeat's `hbw` entry of region r names an offset that is in RT[r], and every VT record the leader
  produced for RT[r] offsets up to it lies in the VT before the heartbeat (nothing claimed was lost);
- the vectors never decrease; the heartbeat invariant and the hbd replay rule hold (heartbeat_fixtures);
- the VT is exactly the sends Kafka acknowledged, in order, each once: nothing sent before, during or after the
  outage was lost, duplicated or reordered (a follower's DIV finds nothing);
- `watermarks()`, sampled all along, never named an RT offset whose VT sends were not all acknowledged then.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from heartbeat_fixtures import (
    LoopResult,
    RecordingProducer,
    RtIn,
    check_claims_acked,
    check_div_states,
    check_invariant,
    decode_vt,
    feed_one,
    read_topic,
    rt_streams,
)

from div import envelope as E
from div import keys
from div.validator import PartitionValidator
from heartbeat import HeartbeatLeader
from sim.brokers import KafkaCluster

pytestmark = pytest.mark.slow

VT = "store_v1"
# region 0's RT is the leader's own; 1 and 2 stand for remote regions' RTs (on the same node here)
RTS = ["store_rt_dc0", "store_rt_dc1", "store_rt_dc2"]
REGIONS = len(RTS)
RECORDS = 300  # writes per region
TERM = 1
# A client gives up on nothing during the outage, and reconnects within half a second once the node is back
# (librdkafka's default backoff grows to 10 s, most of this test's time).
CLIENT = {"log_level": 0, "reconnect.backoff.max.ms": 500, "message.timeout.ms": 120_000}


def _rt_data() -> list[list[RtIn]]:
    """What each region's producers write: region 0's stream without heartbeats (its RT heartbeats are the
    leader's own, written into that RT while it runs); regions 1 and 2 with their leaders' heartbeats."""
    streams = rt_streams(REGIONS, RECORDS, seed=29)
    streams[0] = [x for x in streams[0] if x.key != keys.HEARTBEAT_KEY]
    return streams


def _write_rts(bootstrap: str, streams: list[list[RtIn]], failed: list, done: threading.Event) -> None:
    """The regions' producers (one idempotent producer for all three RTs: order per partition is what counts),
    a few records at a time so that writing lasts the whole run, outage included."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2, **CLIENT})
    pos = [0] * REGIONS
    try:
        while any(pos[r] < len(s) for r, s in enumerate(streams)):
            for r, s in enumerate(streams):
                for x in s[pos[r] : pos[r] + 6]:
                    p.produce(
                        RTS[r],
                        key=x.key,
                        value=x.value,
                        headers=x.headers,
                        partition=0,
                        on_delivery=lambda err, _m: err and failed.append(err),
                    )
                pos[r] += 6
            p.poll(0)
            time.sleep(0.02)
        left = p.flush(180)
        if left:
            failed.append(f"{left} RT records not delivered")
    finally:
        done.set()


def _marks_acked(events: list[tuple], samples: list[tuple[int, list[int]]], vt_topic: str) -> None:
    """`watermarks()` read when `events` held n entries claimed RT[r] up to marks[r]: every VT data send for an
    RT[r] offset ≤ marks[r] produced by then had been acknowledged by then."""
    codec = E.EnvelopeCodec()
    sends: list[tuple[int, int, int]] = []  # (event index, region, rt offset)
    acked_at: dict[int, int] = {}  # send number -> event index of its successful report
    numbers: dict[int, int] = {}  # event index -> send number
    for i, ev in enumerate(events):
        if ev[0] == "report":
            if ev[2]:
                acked_at[ev[1]] = i
        elif ev[2] == vt_topic and ev[3][0] == keys.HEADER_PUT_OR_DELETE:
            f = E.footer(codec.decode(ev[4], ev[5]))
            sends.append((i, f["upstreamKafkaClusterId"], f["upstreamOffset"]))
            numbers[i] = ev[1]
    for n_events, marks in samples:
        for i, r, o in sends:
            if i >= n_events:
                break
            if o <= marks[r]:
                assert acked_at.get(numbers[i], n_events) < n_events, (
                    f"watermarks() {marks} claimed RT[{r}] offset {o} before its VT send was acknowledged"
                )


def _end_offset(consumer: Consumer, topic: str) -> int:
    """The end offset (exclusive) of partition 0 of `topic`, asked of the broker."""
    return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30, cached=False)[1]


def _check_log_backs_claims(vt: list, hbs: list, events: list[tuple], last_rt: list[int]) -> None:
    """What each VT heartbeat claims is in the logs: its `hbw` entry of region r is an offset of RT[r] (which
    holds every offset up to `last_rt[r]`), and every VT data record the leader produced for an RT[r] offset up
    to it, whatever became of the send, lies in the VT before the heartbeat."""
    codec = E.EnvelopeCodec()
    produced = {
        (f["upstreamKafkaClusterId"], f["upstreamOffset"])
        for ev in events
        if ev[0] == "produce" and ev[2] == VT and ev[3][0] == keys.HEADER_PUT_OR_DELETE
        for f in [E.footer(codec.decode(ev[4], ev[5]))]
    }
    hb_at = {rec.offset: hb for rec, hb in hbs}
    in_vt_before: set[tuple[int, int]] = set()
    for x in vt:
        hb = hb_at.get(x.offset)
        if hb is not None:
            v = hb.watermarks.high_watermarks
            for r, last in enumerate(last_rt):
                assert -1 <= v[r] <= last, (
                    f"heartbeat at VT {x.offset} claims RT[{r}] {v[r]}, RT ends at {last}"
                )
            lost = {(r, o) for r, o in produced if o <= v[r]} - in_vt_before
            assert not lost, f"heartbeat at VT {x.offset} claims {v}; not in the VT before it: {sorted(lost)}"
        elif x.key[0] == keys.HEADER_PUT_OR_DELETE:
            f = E.footer(x.env)
            in_vt_before.add((f["upstreamKafkaClusterId"], f["upstreamOffset"]))


def test_leader_through_a_killed_and_restarted_broker_claims_only_acknowledged_offsets(kafka_jars, capsys):
    streams = _rt_data()
    t_start = time.monotonic()
    with KafkaCluster(name="hb-outage") as kafka:
        kafka.create_topics({VT: 1, **dict.fromkeys(RTS, 1)})
        bootstrap = kafka.bootstrap_servers
        leader = HeartbeatLeader(
            {  # the leader builds its producer (idempotent, so acks=all) from the settings, as a deployment does
                "bootstrap.servers": bootstrap,
                **CLIENT,
            },
            vt_topic=VT,
            rt_topic=RTS[0],
            partition=0,
            region=0,
            n_regions=REGIONS,
            host="leader-0:1",
            term_id=TERM,
            interval_ms=0,  # RT heartbeats are emitted by the loop below, and stop before the end is measured
        )
        rec = leader.producer = RecordingProducer(leader.producer)  # every send and report, in order
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "hb-real",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                **{k: v for k, v in CLIENT.items() if k != "message.timeout.ms"},
            }
        )
        consumer.assign([TopicPartition(t, 0, 0) for t in RTS])
        region_of = {t: r for r, t in enumerate(RTS)}
        failed: list = []
        written = threading.Event()
        writer = threading.Thread(target=_write_rts, args=(bootstrap, streams, failed, written), daemon=True)
        rng = random.Random(5)
        result = LoopResult(positions=[0] * REGIONS)
        samples: list[tuple[int, list[int]]] = []
        outage: dict[str, object] = {}
        restarted = threading.Event()
        total = sum(len(s) for s in streams)

        def feed(msgs) -> None:
            for m in msgs:
                if m.error() is not None:
                    continue  # the node is down or coming back: the consumer reconnects by itself
                r = region_of[m.topic()]
                if m.offset() < result.positions[r]:
                    continue  # delivered again after the reconnect: a leader hands each record over once
                assert m.offset() == result.positions[r], f"RT[{r}] skipped to {m.offset()}"
                x = RtIn(m.offset(), m.key(), m.value(), list(m.headers() or []), m.timestamp()[1])
                feed_one(leader, r, x, rng, result)
                result.positions[r] = m.offset() + 1
                result.steps += 1

        def restart() -> None:
            try:
                time.sleep(1.0)  # an outage long enough for the leader to keep writing into it
                kafka.restart_broker(1)
                outage["up_event"] = len(rec.events)
            except BaseException as exc:  # noqa: BLE001 - the test's thread reports it
                outage["restart_error"] = exc
            finally:
                restarted.set()

        def kill_with_work_in_flight() -> None:
            """Consume ahead: a first part, fed just before the kill so that some produce requests may be in flight
            (sent, perhaps appended, unanswered: librdkafka sends them again to the restarted node); then
            until some region's RT heartbeat follows ten data records of that region, fed after the kill (their
            VT sends, unacknowledged, must hold the heartbeat back). Nothing consumed is left out (a gap)."""
            before: list = consumer.consume(30, timeout=1.0)
            after: list = []
            data = [0] * REGIONS
            ready = False
            deadline = time.monotonic() + 120  # only against a run that stopped writing
            while not ready:
                assert time.monotonic() < deadline, f"no RT heartbeat after ten data records in {len(after)}"
                for m in consumer.consume(50, timeout=1.0):
                    after.append(m)
                    if m.error() is not None:
                        continue
                    r = region_of[m.topic()]
                    ready = ready or (m.key() == keys.HEARTBEAT_KEY and data[r] >= 10)
                    data[r] += m.key() != keys.HEARTBEAT_KEY
            feed(before)
            leader.poll(0.005)
            kafka.kill_broker(1)
            outage["down_event"] = len(rec.events)
            threading.Thread(target=restart, daemon=True).start()
            feed(after)
            leader.poll(0)
            outage["pending_heartbeats"] = leader.pending_heartbeats
            outage["unacked_sends"] = leader.tracker.pending_sends

        writer.start()
        last_hb = 0.0
        try:
            while not (written.is_set() and restarted.is_set()):
                if "down_event" not in outage and result.steps >= total // 3:
                    kill_with_work_in_flight()
                feed(consumer.consume(200, timeout=0.05))
                leader.poll(0)
                if time.monotonic() - last_hb > 0.15:
                    leader.emit_rt_heartbeat()
                    last_hb = time.monotonic()
                if not restarted.is_set() and "down_event" in outage:
                    outage["pending_heartbeats"] = max(
                        outage["pending_heartbeats"], leader.pending_heartbeats
                    )
                samples.append((len(rec.events), leader.watermarks()))
            assert "restart_error" not in outage, outage["restart_error"]
            assert not failed, failed
            # the end: one last RT heartbeat, then every RT read to its end (the last VT heartbeat claims it all)
            leader.emit_rt_heartbeat()
            assert leader.flush(120) == 0
            ends = [_end_offset(consumer, t) for t in RTS]
            while [p.offset for p in consumer.position([TopicPartition(t, 0) for t in RTS])] != ends:
                feed(consumer.consume(500, timeout=0.5))
                leader.poll(0)
                samples.append((len(rec.events), leader.watermarks()))
            assert leader.close(120) == 0
            samples.append((len(rec.events), leader.watermarks()))
        finally:
            consumer.close()
        writer.join(5)
        run_s = time.monotonic() - t_start

        # the outage was real: the node started twice, and the leader wrote into it with nothing acknowledged
        assert kafka.node(1).started_count() == 2
        assert outage["unacked_sends"] > 0 and outage["pending_heartbeats"] > 0
        down, up = outage["down_event"], outage["up_event"]
        sent_while_down = sum(ev[0] == "produce" and ev[2] == VT for ev in rec.events[down:up])
        assert sent_while_down > 0
        assert leader.pending_heartbeats == 0 and leader.stats.vt_failed == 0 and not leader.broken

        rts = [read_topic(bootstrap, t) for t in RTS]
        logs = [[RtIn(o, k, v, h, ts) for o, k, v, h, ts in rt] for rt in rts]
        # the producers' writes reached the RTs whole, once, in order (regions 1 and 2 hold nothing else)
        for r in (1, 2):
            assert [(x.key, x.value) for x in logs[r]] == [(x.key, x.value) for x in streams[r]]
        rt0_data = [(x.key, x.value) for x in logs[0] if x.key != keys.HEARTBEAT_KEY]
        assert rt0_data == [(x.key, x.value) for x in streams[0]]
        last_rt = [log[-1].offset for log in logs]
        assert leader.watermarks() == last_rt  # everything consumed and claimed in the end

        raw_vt = read_topic(bootstrap, VT)
        vt = decode_vt(raw_vt)
        # the VT is exactly the sends Kafka acknowledged, in the order they were produced: none lost, none twice
        ok = {ev[1] for ev in rec.events if ev[0] == "report" and ev[2]}
        acked = [ev for ev in rec.events if ev[0] == "produce" and ev[2] == VT and ev[1] in ok]
        assert [(k, v, h) for _, k, v, h, _ in raw_vt] == [(ev[3], ev[4], ev[5]) for ev in acked]
        assert len(ok) == sum(1 for ev in rec.events if ev[0] == "produce")  # every send, RT heartbeats too
        follower = PartitionValidator()
        assert [f for x in vt for f in follower.process(x.offset, x.key, x.env, x.timestamp_ms)] == []

        hbs = check_invariant(vt, {TERM: leader.guid})  # vectors never decrease; records on the right side
        assert len(hbs) == sum(1 for log in logs for x in log if x.key == keys.HEARTBEAT_KEY)
        assert check_claims_acked(rec.events, VT) == len(hbs)
        check_div_states(vt, logs, hbs)
        _check_log_backs_claims(vt, hbs, rec.events, last_rt)
        _marks_acked(rec.events, samples, VT)
        assert all(
            all(a <= b for a, b in zip(s0[1], s1[1], strict=True))
            for s0, s1 in zip(samples, samples[1:], strict=False)
        )
        assert all(m[r] <= last_rt[r] for _, m in samples for r in range(REGIONS))
    with capsys.disabled():
        print(
            f"\n[leader, broker killed] {total} RT writes, {len(raw_vt)} VT records, {len(hbs)} VT heartbeats; "
            f"{outage['pending_heartbeats']} heartbeats held back during the outage, "
            f"{sent_while_down} VT sends made while the node was down; {run_s:.1f} s in all"
        )
