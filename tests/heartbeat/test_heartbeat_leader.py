"""HeartbeatLeader against an in-memory producer: deterministic acks (held back, partial, out of order, failed),
so the heartbeat invariant and the hbd content can be checked exactly."""

from __future__ import annotations

import random

import pytest
from heartbeat_fixtures import (
    FakeProducer,
    LoopResult,
    RecordingProducer,
    check_claims_acked,
    check_div_states,
    check_invariant,
    decode_vt,
    feed_one,
    rt_streams,
    run_loop,
)

from div import envelope as E
from div import keys
from div.heartbeat_headers import decode_hbd
from div.validator import PartitionValidator
from div.writer import SegmentWriter
from heartbeat import HeartbeatLeader, LeaderBrokenError, LeaderUsageError, parse_vt_heartbeat
from heartbeat.records import rt_heartbeat

VT, RT = "store_v1", "store_rt"


def _leader(producer, n_regions=3, **kw) -> HeartbeatLeader:
    kw.setdefault("interval_ms", 0)
    return HeartbeatLeader(
        producer,
        vt_topic=VT,
        rt_topic=RT,
        partition=0,
        region=0,
        n_regions=n_regions,
        host="leader-0:1",
        **kw,
    )


def test_out_of_order_partial_acks_keep_every_heartbeat_true():
    streams = rt_streams(3, 400, seed=11)
    fake = FakeProducer(seed=5)  # each poll delivers a random subset of reports, shuffled
    rec = RecordingProducer(fake)
    leader = _leader(rec, term_id=4)
    run_loop(leader, streams, random.Random(1), poll_every=3)
    assert leader.flush() == 0
    assert leader.pending_heartbeats == 0
    assert check_claims_acked(rec.events, VT) >= 20
    vt = decode_vt(fake.records(VT))
    hbs = check_invariant(vt, {4: leader.guid})
    assert len(hbs) == sum(1 for s in streams for x in s if x.key == keys.HEARTBEAT_KEY)
    check_div_states(vt, streams, hbs)
    # At the end every send is acknowledged: the watermark reaches the last record of every region.
    assert leader.watermarks() == [len(s) - 1 for s in streams]


def test_heartbeat_waits_until_earlier_sends_are_acked():
    streams = rt_streams(2, 30, seed=3, hb_every=1000, anomalies=False)
    fake = FakeProducer()
    leader = _leader(fake, n_regions=2)
    fake.hold = True
    result = LoopResult(positions=[0, 0])
    rng = random.Random(0)
    for x in streams[1][:20]:
        feed_one(leader, 1, x, rng, result)
    hb = rt_heartbeat("leader-1:1", 1_700_000_000_500)
    assert leader.on_rt_record(1, 20, hb.key, hb.value, hb.headers, 1_700_000_000_700).is_heartbeat
    leader.poll()
    assert leader.pending_heartbeats == 1
    assert leader.watermarks()[1] < 20  # only the leading SOS (no VT send) is covered
    assert not any(keys.is_heartbeat_key(m[1]) for m in fake.records(VT)), "heartbeat written before the acks"
    fake.hold = False
    leader.poll()
    assert leader.pending_heartbeats == 0
    [hb_rec] = [m for m in fake.records(VT) if keys.is_heartbeat_key(m[1])]
    parsed = parse_vt_heartbeat(hb_rec[1], E.EnvelopeCodec().decode(hb_rec[2]), hb_rec[3])
    assert parsed.origin_region == 1 and parsed.origin_rt_offset == 20
    assert parsed.origin_ms == 1_700_000_000_700  # max(broker time, producer time)
    assert parsed.watermarks.high_watermarks == [-1, 20]
    assert hb_rec[0] == len(fake.records(VT)) - 1


def test_heartbeat_of_a_quiet_moment_is_written_at_once():
    fake = FakeProducer()
    leader = _leader(fake, n_regions=2)
    hb = rt_heartbeat("leader-1:1", 5)
    leader.on_rt_record(1, 0, hb.key, hb.value, hb.headers, 6)
    [m] = fake.records(VT)
    got = parse_vt_heartbeat(m[1], E.EnvelopeCodec().decode(m[2]), m[3])
    assert got.watermarks.high_watermarks == [-1, 0] and got.lcs is False
    leader.leader_completed = True
    leader.on_rt_record(0, 0, hb.key, hb.value, hb.headers, 7)
    got = parse_vt_heartbeat(
        fake.records(VT)[1][1], E.EnvelopeCodec().decode(fake.records(VT)[1][2]), fake.records(VT)[1][3]
    )
    assert got.lcs is True and got.watermarks.high_watermarks == [0, 0]


def _data_send_for(region: int, rt_offset: int):
    codec = E.EnvelopeCodec()

    def pred(msg):
        if msg.topic != VT or msg.key[0] != keys.HEADER_PUT_OR_DELETE:
            return False
        f = E.footer(codec.decode(msg.value))
        return f["upstreamKafkaClusterId"] == region and f["upstreamOffset"] >= rt_offset

    return pred


def test_failed_send_breaks_the_leader_and_nothing_past_it_is_claimed():
    streams = rt_streams(3, 300, seed=21)
    fake = FakeProducer(seed=2)
    rec = RecordingProducer(fake)
    leader = _leader(rec, term_id=0)
    fake.fail_when(_data_send_for(1, 150))
    with pytest.raises(LeaderBrokenError, match="new term"):
        run_loop(leader, streams, random.Random(4), poll_every=2)
    assert leader.broken
    failed_rt = [
        E.footer(E.EnvelopeCodec().decode(m.value))["upstreamOffset"] for m in fake.logs[(VT, 0)] if m.failed
    ]
    assert len(failed_rt) == 1
    assert leader.watermarks()[1] < failed_rt[0]
    with pytest.raises(LeaderBrokenError):
        leader.on_rt_record(0, 10_000, b"\x00k", b"", None, 1)
    with pytest.raises(LeaderBrokenError):
        leader.poll()
    leader.flush()  # draining still works
    leader.close()
    vt = decode_vt(fake.records(VT))
    hbs = check_invariant(vt, {0: leader.guid})
    check_claims_acked(rec.events, VT)
    assert all(hb.watermarks.high_watermarks[1] < failed_rt[0] for _, hb in hbs)


def test_restart_with_a_new_term_from_the_last_heartbeat():
    streams = rt_streams(3, 300, seed=8)
    fake = FakeProducer(seed=9)
    rec = RecordingProducer(fake)
    old = _leader(rec, term_id=6)
    fake.fail_when(_data_send_for(2, 120))
    with pytest.raises(LeaderBrokenError):
        run_loop(old, streams, random.Random(5), poll_every=3)
    old.flush()
    before = len(fake.logs[(VT, 0)])

    # The new leader: state from the last heartbeat, VT producer states as a follower holds them at the VT end.
    vt = decode_vt(fake.records(VT))
    last = [hb for _, hb in check_invariant(vt, {6: old.guid})][-1]
    follower = PartitionValidator()
    for x in vt:
        follower.process(x.offset, x.key, x.env, x.timestamp_ms)
    rec_new = RecordingProducer(fake)  # claims are per leader: the new term re-sends what the old one lost
    new = _leader(rec_new, term_id=last.watermarks.term_id + 1)
    assert new.guid != old.guid
    v0 = last.watermarks.high_watermarks
    new.take_over(follower.producer_states(), last.div_state.rt_producers, v0)
    with pytest.raises(LeaderUsageError):  # a resumed leader may not go back before its watermarks
        x = streams[0][v0[0]]
        new.on_rt_record(0, x.offset, x.key, x.value, x.headers, x.broker_ts)
    run_loop(new, streams, random.Random(6), positions=[v + 1 for v in v0], poll_every=3)
    assert new.close() == 0
    assert new.watermarks() == [len(s) - 1 for s in streams]

    vt = decode_vt(fake.records(VT))
    hbs = check_invariant(vt, {6: old.guid, 7: new.guid})
    new_hbs = [(r, hb) for r, hb in hbs if hb.watermarks.term_id == 7]
    assert new_hbs and all(hb.watermarks.high_watermarks >= v0 for _, hb in new_hbs)
    check_claims_acked(rec.events, VT)
    assert check_claims_acked(rec_new.events, VT) == len(new_hbs)
    check_div_states(vt, streams, hbs, vt_from_offset=before)
    # The new term's segment ends with a final EndOfSegment on close.
    last_rec = vt[-1]
    assert (
        E.control_type(last_rec.env) == E.END_OF_SEGMENT
        and last_rec.env["producerMetadata"]["producerGUID"] == new.guid
    )


def test_follower_resuming_after_a_heartbeat_sees_what_a_full_replay_sees():
    streams = rt_streams(2, 300, seed=13)
    fake = FakeProducer(seed=1)
    ticks = iter(range(1_700_000_000_000, 1_800_000_000_000, 3))
    leader = _leader(
        fake, n_regions=2, max_segment_age_ms=40, clock=lambda: next(ticks)
    )  # segments roll often
    run_loop(leader, streams, random.Random(2))
    leader.close()
    vt = decode_vt(fake.records(VT))
    hbs = check_invariant(vt, {-1: leader.guid})
    full = PartitionValidator()
    findings_full = []
    for x in vt:
        findings_full += full.process(x.offset, x.key, x.env, x.timestamp_ms)
    assert findings_full == []
    assert sum(1 for x in vt if E.control_type(x.env) == E.END_OF_SEGMENT) > 3
    for rec, hb in hbs[:: max(1, len(hbs) // 5)]:
        resumed = PartitionValidator()
        resumed.restore(hb.div_state.vt_producers)
        for x in vt:
            if x.offset > rec.offset:
                assert resumed.process(x.offset, x.key, x.env, x.timestamp_ms) == []
        assert resumed.producer_states() == full.producer_states()


def test_hbd_over_the_size_limit_keeps_the_newest_producers_and_says_truncated():
    streams = rt_streams(2, 400, seed=4, producers=40, hb_every=390, anomalies=False)
    fake = FakeProducer()
    leader = _leader(fake, n_regions=2, hbd_max_bytes=1500)
    run_loop(leader, streams, random.Random(3))
    leader.flush()
    full = leader.div_state()  # nothing changes it before the heartbeat below, written at once (all acked)
    hb = rt_heartbeat("leader-1:1", 1)
    leader.on_rt_record(1, len(streams[1]), hb.key, hb.value, hb.headers, 2)
    hb_recs = [m for m in fake.records(VT) if keys.is_heartbeat_key(m[1])]
    assert len(hb_recs) >= 2 and leader.stats.hbd_truncated == len(hb_recs)
    for _, _, _, headers, _ in hb_recs:
        raw = dict(headers)["hbd"]
        assert len(raw) <= 1500
        st = decode_hbd(raw)
        assert st.truncated and set(st.rt_producers) == {0, 1}
    # The last heartbeat keeps whole states of the newest producers; everything left out is older.
    st = decode_hbd(dict(hb_recs[-1][3])["hbd"])

    def flat(state):
        return {
            (m, g): s
            for m, states in [("vt", state.vt_producers), *state.rt_producers.items()]
            for g, s in states.items()
        }

    kept, everything = flat(st), flat(full)
    left_out = set(everything) - set(kept)
    assert kept and left_out and set(kept) <= set(everything)
    assert all(kept[k] == everything[k] for k in kept)
    assert min(s["messageTimestamp"] for s in kept.values()) >= max(
        everything[k]["messageTimestamp"] for k in left_out
    )
    assert leader.guid in st.vt_producers  # the leader's own segment is the newest producer


def test_rt_heartbeats_every_interval_from_poll():
    now = [1_700_000_000_000]
    fake = FakeProducer()
    leader = _leader(fake, interval_ms=1000, clock=lambda: now[0])
    leader.poll()
    now[0] += 999
    leader.poll()
    now[0] += 1
    leader.poll()
    got = fake.records(RT)
    assert [m[0] for m in got] == [0, 1]
    expected = [rt_heartbeat("leader-0:1", 1_700_000_000_000), rt_heartbeat("leader-0:1", 1_700_000_001_000)]
    assert [(m[1], m[2], m[3]) for m in got] == [(e.key, e.value, list(e.headers)) for e in expected]
    assert [h[0] for h in got[0][3]] == ["vtp"]  # RT heartbeats carry no lcs, hbw or hbd
    assert leader.stats.rt_heartbeats == 2


def test_calls_out_of_order_are_refused_with_a_reason():
    fake = FakeProducer()
    leader = _leader(fake, n_regions=2)
    w = SegmentWriter(host_name="p")
    recs = w.put(0, b"a", b"1") + w.put(0, b"b", b"2")
    with pytest.raises(LeaderUsageError, match="on_rt_record"):
        leader.put(b"a", b"x")
    with pytest.raises(LeaderUsageError, match="on_rt_record"):
        leader.done()
    leader.on_rt_record(1, 0, recs[0].key, recs[0].value, recs[0].headers, 1)
    with pytest.raises(LeaderUsageError, match="done"):
        leader.on_rt_record(1, 1, recs[1].key, recs[1].value, recs[1].headers, 1)
    leader.done()
    with pytest.raises(LeaderUsageError, match="already processed"):
        leader.on_rt_record(1, 0, recs[0].key, recs[0].value, recs[0].headers, 1)
    with pytest.raises(LeaderUsageError, match="take_over"):
        leader.take_over()
    with pytest.raises(ValueError, match="region 5"):
        leader.on_rt_record(5, 1, recs[1].key, recs[1].value, recs[1].headers, 1)
    bad = leader.on_rt_record(1, 1, b"\x00k", b"not venice", None, 1)
    assert bad.kind == "UNDECODABLE" and bad.findings[0].type == "UNDECODABLE" and "magic" in bad.error
    leader.done()
    assert leader.watermarks() == [-1, 1]
    leader.close()
    with pytest.raises(LeaderUsageError, match="closed"):
        leader.poll()


def test_rt_div_findings_are_handed_to_the_caller():
    fake = FakeProducer()
    leader = _leader(fake, n_regions=2)
    w = SegmentWriter(host_name="p")
    recs = w.put(0, b"a", b"1") + w.put(0, b"b", b"2") + w.put(0, b"c", b"3")
    kinds = []
    for off, r in enumerate([recs[0], recs[1], recs[1], recs[3]]):  # a duplicate, then a gap
        rec = leader.on_rt_record(1, off, r.key, r.value, r.headers, 1)
        kinds.append([f.type for f in rec.findings])
        leader.done()
    assert kinds == [[], [], ["DUPLICATE"], ["MISSING"]]
