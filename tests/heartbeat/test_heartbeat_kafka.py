"""HeartbeatLeader on the embedded mock cluster: a 3-region leader loop writing real topics while brokers go down
and produce requests fail; the VT read back must satisfy the heartbeat invariant and the hbd replay rule."""

from __future__ import annotations

import random

import pytest
from confluent_kafka import KafkaError, Producer
from heartbeat_fixtures import (
    RecordingProducer,
    check_claims_acked,
    check_div_states,
    check_invariant,
    decode_vt,
    read_topic,
    rt_streams,
    run_loop,
)

from div import envelope as E
from div import keys
from div.validator import PartitionValidator
from heartbeat import HeartbeatLeader, LeaderBrokenError
from heartbeat.records import rt_heartbeat
from sim.embedded_kafka import EmbeddedKafka

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

VT, RT = "store_v1", "store_rt"


IDEMPOTENT = {"enable.idempotence": True}
# librdkafka's mock cluster, with errors injected on whole Produce requests, can make an idempotent producer
# report a message delivered that it never appended (the retry meets a sequence number the mock already
# counted: DUPLICATE_SEQUENCE_NUMBER is treated as delivered). A real broker does not do that, so the
# injected-error test uses a non-idempotent producer that keeps order with one request in flight.
ORDERED_RETRIES = {"enable.idempotence": False, "max.in.flight.requests.per.connection": 1, "retries": 1000}


def _leader(
    k: EmbeddedKafka, term_id: int, conf: dict | None = None, **kw
) -> tuple[HeartbeatLeader, RecordingProducer]:
    producer = Producer(
        {
            "bootstrap.servers": k.bootstrap_servers,
            "linger.ms": 2,
            "message.timeout.ms": 120_000,
            "log_level": 2,
            **(conf or IDEMPOTENT),
        }
    )
    rec = RecordingProducer(producer)
    leader = HeartbeatLeader(
        rec,
        vt_topic=VT,
        rt_topic=RT,
        partition=0,
        region=0,
        n_regions=3,
        host="leader-0:1",
        term_id=term_id,
        interval_ms=0,
        **kw,
    )
    return leader, rec


@pytest.mark.parametrize("fault", ["broker outage", "transient produce errors"])
def test_leader_loop_through_faults_writes_only_true_heartbeats(fault):
    streams = rt_streams(3, 500, seed=31)
    total = sum(len(s) for s in streams)
    with EmbeddedKafka(brokers=1) as k:
        k.create_topic(VT, 1)
        k.create_topic(RT, 1)
        leader, rec = _leader(k, term_id=1, conf=IDEMPOTENT if fault == "broker outage" else ORDERED_RETRIES)
        seen = {"pending_heartbeats_at_up": 0}
        rt_hb_times = []

        def faults(i: int) -> None:
            if fault == "broker outage" and i == total // 4:
                k.broker_down(1)
            elif fault == "broker outage" and i == total // 2:
                seen["pending_heartbeats_at_up"] = leader.pending_heartbeats
                k.broker_up(1)
            elif fault == "transient produce errors" and i % 150 == 0:
                k.push_produce_errors(3, KafkaError.NOT_LEADER_FOR_PARTITION)
                seen["pending_heartbeats_at_up"] = max(
                    seen["pending_heartbeats_at_up"], leader.pending_heartbeats
                )
            if i % 400 == 0:
                rt_hb_times.append(leader.emit_rt_heartbeat(1_700_000_000_000 + i))

        run_loop(leader, streams, random.Random(7), poll_every=5, on_step=faults)
        assert leader.close(60) == 0
        assert leader.pending_heartbeats == 0 and leader.stats.vt_failed == 0
        if fault == "broker outage":  # no ack came back meanwhile: heartbeats consumed then had to wait
            assert seen["pending_heartbeats_at_up"] > 0
        assert leader.watermarks() == [len(s) - 1 for s in streams]

        vt = decode_vt(read_topic(k.bootstrap_servers, VT))
        hbs = check_invariant(vt, {1: leader.guid})
        assert len(hbs) == sum(1 for s in streams for x in s if x.key == keys.HEARTBEAT_KEY)
        assert check_claims_acked(rec.events, VT) == len(hbs)
        check_div_states(vt, streams, hbs)
        follower = PartitionValidator()
        assert [f for x in vt for f in follower.process(x.offset, x.key, x.env, x.timestamp_ms)] == [], (
            "retries must not duplicate or reorder VT records"
        )

        rt = read_topic(k.bootstrap_servers, RT)
        assert [(m[1], m[2]) for m in rt] == [
            (rt_heartbeat("leader-0:1", t).key, rt_heartbeat("leader-0:1", t).value) for t in rt_hb_times
        ]
        assert all([h for h, _ in m[3]] == ["vtp"] for m in rt)


def test_failed_send_then_restart_with_a_new_term():
    streams = rt_streams(3, 400, seed=41)
    with EmbeddedKafka(brokers=1) as k:
        k.create_topic(VT, 1)
        k.create_topic(RT, 1)
        old, rec_old = _leader(k, term_id=3)

        def inject(i: int) -> None:
            # INVALID_RECORD is not retriable: the batch in that Produce request fails for good. Repeat in
            # case a request carried only a heartbeat (a failed heartbeat does not break the leader).
            if i in (300, 500, 700) and not old.broken:
                k.push_produce_errors(1, KafkaError.INVALID_RECORD)

        with pytest.raises(LeaderBrokenError, match="term_id 4"):
            run_loop(old, streams, random.Random(8), poll_every=4, poll_timeout=0.002, on_step=inject)
            old.flush(30)  # the failure may only be reported here; flush never raises, poll does
            old.poll()
        k.clear_request_errors()
        old.flush(30)
        assert old.stats.vt_failed > 0

        vt = decode_vt(read_topic(k.bootstrap_servers, VT))
        old_hbs = check_invariant(vt, {3: old.guid})
        check_claims_acked(rec_old.events, VT)
        assert old_hbs, "the old term wrote heartbeats before the failure"
        last = old_hbs[-1][1]
        follower = PartitionValidator()  # a follower's VT state at the end of the VT
        for x in vt:
            follower.process(x.offset, x.key, x.env, x.timestamp_ms)
        vt_end = len(vt) and vt[-1].offset + 1

        new, rec_new = _leader(k, term_id=last.watermarks.term_id + 1)
        v0 = last.watermarks.high_watermarks
        new.take_over(follower.producer_states(), last.div_state.rt_producers, v0)
        run_loop(new, streams, random.Random(9), positions=[v + 1 for v in v0], poll_every=4)
        assert new.close(60) == 0
        assert new.watermarks() == [len(s) - 1 for s in streams]

        vt = decode_vt(read_topic(k.bootstrap_servers, VT))
        hbs = check_invariant(vt, {3: old.guid, 4: new.guid})
        new_hbs = [hb for r, hb in hbs if r.offset >= vt_end]
        assert new_hbs and all(hb.watermarks.term_id == 4 for hb in new_hbs)
        assert check_claims_acked(rec_new.events, VT) == len(new_hbs)
        check_div_states(vt, streams, hbs, vt_from_offset=vt_end)
        # The new term writes with a fresh GUID from segment 0; the old GUID's state is carried unchanged.
        assert new_hbs[-1].div_state.vt_producers[old.guid] == follower.producer_states()[old.guid]
        first_new = next(x for x in vt if x.offset >= vt_end and not keys.is_heartbeat_key(x.key))
        assert first_new.env["producerMetadata"]["producerGUID"] == new.guid
        assert E.control_type(first_new.env) == E.START_OF_SEGMENT
