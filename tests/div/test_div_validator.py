"""The consumer-side DIV validator against Venice's decision procedure (venice-protocol-notes §3.3–3.8).

Records come from the independent reference producer (tests/support/venice_reference.py) and are decoded by our codec,
then fed to `PartitionValidator`. Each test names the rule of the §3.3 pseudocode it exercises and checks the
finding type and its fatal flag before and after End of Push.
"""

from __future__ import annotations

import random

import pytest
import venice_reference as ref

from div import envelope as E
from div import partition_state as ps
from div.validator import (
    END_OF_FINAL_SEGMENT,
    END_OF_INTERMEDIATE_SEGMENT,
    IN_PROGRESS,
    PartitionValidator,
    ValidatorConfig,
)

P = bytes.fromhex("50" * 16)  # the push job
A = bytes.fromhex("a0" * 15 + "01")
B = bytes.fromhex("b0" * 15 + "02")
NOW = 1_800_000_000_000
CODEC = E.EnvelopeCodec("fastavro")


class Feeder:
    """Feeds reference records to one validator with consecutive offsets; reports findings by record label."""

    def __init__(self, validator: PartitionValidator | None = None, **config) -> None:
        self.v = validator or PartitionValidator(config=ValidatorConfig(**config))
        self.offset = 0
        self.labels: dict[int, str] = {}

    def feed(self, *groups, broker_ts: int | None = None) -> list[tuple[str, str, bool]]:
        out = []
        for group in groups:
            for r in group if isinstance(group, list) else [group]:
                self.labels[self.offset] = r.label
                ts = (
                    broker_ts if broker_ts is not None else (r.broker_ts if r.broker_ts is not None else r.ts)
                )
                for f in self.v.process(self.offset, r.key, CODEC.decode(r.value, r.headers), ts):
                    out.append((r.label, f.type, f.fatal))
                self.offset += 1
        return out

    def push_start(self) -> ref.RefProducer:
        push = ref.RefProducer(P, host="push")
        assert self.feed(push.start_of_push()) == []
        return push

    def to_phase(self, after_eop: bool) -> ref.RefProducer:
        push = self.push_start()
        if after_eop:
            assert self.feed(push.end_of_push(), push.end_segment(final=True)) == []
            assert self.v.end_of_push
        return push


PHASES = [pytest.param(False, id="before-EOP"), pytest.param(True, id="after-EOP")]


# -- track_segment ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("after_eop", PHASES)
def test_unknown_producer_at_a_later_segment(after_eop):
    d = Feeder()
    d.to_phase(after_eop)
    a = ref.RefProducer(A)
    a.put(b"x", b"0"), a.end_segment(), a.put(b"y", b"1"), a.end_segment()  # segments 0 and 1, never seen
    got = d.feed(a.put(b"k", b"v"), a.put(b"k2", b"v"), a.end_segment())
    assert got == ([] if after_eop else [("SOS2", "UNREGISTERED_PRODUCER", True)])
    assert d.v.segments[A].number == 2 and d.v.segments[A].ended


@pytest.mark.parametrize("after_eop", PHASES)
def test_unknown_producer_mid_segment_zero_and_its_unverified_end(after_eop):
    d = Feeder()
    d.to_phase(after_eop)
    a = ref.RefProducer(A)
    a.put(b"x", b"0"), a.put(b"x", b"1")  # SOS, 1, 2 never seen
    got = d.feed(a.put(b"k", b"v"), a.put(b"k", b"w"), a.end_segment(checksum=b"\x00" * 8))
    # The EOS of a segment whose SOS was not seen is never verified, even with a wrong checksum.
    assert got == ([] if after_eop else [("PUT0.3", "UNREGISTERED_PRODUCER", True)])
    seg = d.v.segments[A]
    assert not seg.registered and seg.ended


@pytest.mark.parametrize("after_eop", PHASES)
def test_next_segment_without_its_start_of_segment(after_eop):
    d = Feeder()
    d.to_phase(after_eop)
    a = ref.RefProducer(A)
    assert d.feed(a.put(b"k", b"v"), a.end_segment()) == []
    a.put(b"k", b"lost")[0]  # SOS1 lost, the put arrives
    got = d.feed(a.put(b"k", b"w"), a.end_segment())
    # n == seg + 1 after an ended segment without an SOS: unregistered even after EOP (no "any type" tolerance).
    assert got == [("PUT1.2", "UNREGISTERED_PRODUCER", not after_eop)]


@pytest.mark.parametrize("after_eop", PHASES)
def test_next_segment_while_the_previous_is_not_ended(after_eop):
    d = Feeder()
    d.to_phase(after_eop)
    a = ref.RefProducer(A)
    assert d.feed(a.put(b"k", b"v")) == []
    a.end_segment()  # EOS0 lost
    got = d.feed(a.put(b"k", b"w"), a.end_segment())
    assert got == [("SOS1", "MISSING", not after_eop)]


@pytest.mark.parametrize("after_eop", PHASES)
def test_skipped_segments(after_eop):
    d = Feeder()
    d.to_phase(after_eop)
    a = ref.RefProducer(A)
    assert d.feed(a.put(b"k", b"v"), a.end_segment()) == []
    a.put(b"k", b"lost"), a.end_segment()  # all of segment 1 lost
    got = d.feed(a.put(b"k", b"w"), a.put(b"k", b"x"), a.end_segment())
    assert got == [("SOS2", "MISSING", not after_eop)]
    assert d.v.segments[A].number == 2 and d.v.segments[A].registered


@pytest.mark.parametrize("after_eop", PHASES)
def test_older_segment_is_a_duplicate(after_eop):
    d = Feeder()
    d.to_phase(after_eop)
    a = ref.RefProducer(A)
    seg0 = a.put(b"k", b"v") + a.end_segment()
    assert d.feed(seg0, a.put(b"k", b"w")) == []
    got = d.feed(seg0[1], a.put(b"k", b"x"), a.end_segment())
    assert got == [("PUT0.1", "DUPLICATE", False)]


# -- track_sequence -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("after_eop", PHASES)
def test_repeated_and_older_sequences_are_duplicates_and_are_dropped(after_eop):
    d = Feeder()
    d.to_phase(after_eop)
    a = ref.RefProducer(A)
    recs = a.put(b"k", b"1") + a.put(b"k", b"2") + a.put(b"k", b"3")
    got = d.feed(recs, recs[3], recs[1], recs[0], a.put(b"k", b"4"), a.end_segment())
    # Never fatal; the duplicates are not fed to the checksum, so the EOS still verifies.
    assert got == [
        ("PUT0.3", "DUPLICATE", False),
        ("PUT0.1", "DUPLICATE", False),
        ("SOS0", "DUPLICATE", False),
    ]


@pytest.mark.parametrize("after_eop", PHASES)
def test_gap_inside_a_segment(after_eop):
    d = Feeder()
    d.to_phase(after_eop)
    a = ref.RefProducer(A)
    first = a.put(b"k", b"1")
    a.put(b"k", b"lost")
    got = d.feed(first, a.put(b"k", b"3"), a.put(b"k", b"4"), a.end_segment())
    # MISSING at the first record after the gap; the state resyncs, and the EOS (whose checksum covers the lost
    # record) is CORRUPT.
    assert got == [("PUT0.3", "MISSING", not after_eop), ("EOS0", "CORRUPT", not after_eop)]
    assert d.v.segments[A].sequence == 5 and d.v.segments[A].ended


def test_gap_in_an_unregistered_segment_after_eop_is_accepted():
    d = Feeder()
    d.to_phase(True)
    a = ref.RefProducer(A)
    a.put(b"k", b"1")
    assert d.feed(a.put(b"k", b"2")) == []
    a.put(b"k", b"lost")
    assert d.feed(a.put(b"k", b"4")) == []  # eop and not registered


def test_gap_in_an_unregistered_segment_before_eop_is_missing():
    d = Feeder()
    d.to_phase(False)
    a = ref.RefProducer(A)
    a.put(b"k", b"1")
    assert d.feed(a.put(b"k", b"2")) == [("PUT0.2", "UNREGISTERED_PRODUCER", True)]
    a.put(b"k", b"lost")
    assert d.feed(a.put(b"k", b"4")) == [("PUT0.4", "MISSING", True)]


# -- track_checksum ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("after_eop", PHASES)
def test_end_of_segment_checksum_mismatch_is_corrupt(after_eop):
    d = Feeder()
    d.to_phase(after_eop)
    a = ref.RefProducer(A)
    got = d.feed(a.put(b"k", b"1"), a.delete(b"k"), a.end_segment(checksum=b"\x00" * 8))
    assert got == [("EOS0", "CORRUPT", not after_eop)]
    assert d.v.segments[A].ended  # resynced: the next segment starts cleanly
    assert d.feed(a.put(b"k", b"2"), a.end_segment()) == []


@pytest.mark.parametrize("after_eop", PHASES)
def test_data_after_end_of_segment(after_eop):
    d = Feeder()
    d.to_phase(after_eop)
    a = ref.RefProducer(A)
    assert d.feed(a.put(b"k", b"1"), a.end_segment()) == []
    a.open = True  # a broken producer keeps writing into the ended segment
    got = d.feed(a.put(b"k", b"2"))
    assert got == [("PUT0.3", "DATA_AFTER_SEGMENT_END", not after_eop)]


def test_unsupported_control_message_in_a_checksummed_segment_is_fatal_before_eop():
    d = Feeder()
    d.to_phase(False)
    a = ref.RefProducer(A)
    got = d.feed(
        a.put(b"k", b"1"),
        a.control(ref.SOBR, {"sourceOffsets": [1], "sourceKafkaCluster": "c", "sourceTopicName": "t"}),
    )
    assert [(label, fatal) for label, _, fatal in got] == [("StartOfBufferReplay0.2", True)]
    assert got[0][1] == "CORRUPT"  # Venice's UnsupportedMessageTypeException, reported as CORRUPT


def test_segment_status_follows_the_end_of_segment():
    d = Feeder()
    a, b = ref.RefProducer(A), ref.RefProducer(B)
    d.feed(a.put(b"k", b"1"), a.end_segment(final=True), b.put(b"k", b"1"), b.end_segment(final=False))
    states = d.v.producer_states()
    assert states[A]["segmentStatus"] == END_OF_FINAL_SEGMENT
    assert states[B]["segmentStatus"] == END_OF_INTERMEDIATE_SEGMENT
    c = ref.RefProducer(P)
    d.feed(c.put(b"k", b"1"))
    assert d.v.producer_states()[P]["segmentStatus"] == IN_PROGRESS
    assert d.v.producer_states()[P]["messageSequenceNumber"] == 1
    assert d.v.producer_states()[P]["isRegistered"] is True
    # A producer may start a new segment after a "final" one (finalSegment is informational).
    assert d.feed(a.put(b"k", b"2"), a.end_segment()) == []


# -- tolerance (venice-protocol-notes §3.4) ----------------------------------------------------------------------------------------


def _gap_stream(producer_ts: int):
    a = ref.RefProducer(A, start_ms=producer_ts)
    first = a.put(b"k", b"1")
    a.put(b"k", b"lost")
    return first, a.put(b"k", b"3"), a.end_segment()


@pytest.mark.parametrize("after_eop", PHASES)
@pytest.mark.parametrize("age,tolerated", [(1000, True), (5000, True), (999, False), (0, False)])
def test_compaction_tolerance_uses_the_incoming_broker_timestamp(after_eop, age, tolerated):
    d = Feeder(min_compaction_lag_ms=1000, now_ms=NOW)
    d.to_phase(after_eop)
    first, after_gap, eos = _gap_stream(NOW)  # producer clocks are recent: only broker time counts
    assert d.feed(first, broker_ts=NOW - 10**9) == []  # the previous record is very old: irrelevant
    got = d.feed(after_gap, eos, broker_ts=NOW - age)
    if tolerated:
        assert got == []  # the gap and the EOS checksum mismatch are both tolerated
    else:
        assert got == [("PUT0.3", "MISSING", not after_eop), ("EOS0", "CORRUPT", not after_eop)]


@pytest.mark.parametrize("missing_broker_ts", [None, 0, -1])
def test_compaction_tolerance_falls_back_to_the_producer_timestamp(missing_broker_ts):
    for producer_ts, expected in ((NOW - 2000, []), (NOW - 10, ["MISSING", "CORRUPT"])):
        d = Feeder(min_compaction_lag_ms=1000, now_ms=NOW)
        d.to_phase(True)
        first, after_gap, eos = _gap_stream(producer_ts)
        d.feed(first)
        got = []
        for r in after_gap + eos:
            got += [
                f.type
                for f in d.v.process(d.offset, r.key, CODEC.decode(r.value, r.headers), missing_broker_ts)
            ]
            d.offset += 1
        assert got == expected


def test_compaction_tolerance_needs_a_compacted_version_topic():
    for config, realtime in (({}, False), ({"min_compaction_lag_ms": 1000, "now_ms": NOW}, True)):
        d = Feeder(PartitionValidator(is_realtime=realtime, config=ValidatorConfig(**config)))
        if not realtime:
            d.to_phase(True)
        first, after_gap, eos = _gap_stream(NOW - 10**9)
        d.feed(first)
        assert d.feed(after_gap, eos, broker_ts=NOW - 10**9) == [
            ("PUT0.3", "MISSING", False),
            ("EOS0", "CORRUPT", False),
        ]


def test_compaction_tolerance_uses_the_fixed_now_not_the_wall_clock():
    d = Feeder(min_compaction_lag_ms=1000, now_ms=NOW)
    d.to_phase(True)
    first, after_gap, eos = _gap_stream(NOW)
    d.feed(first)
    # Records from "the future" relative to the fixed now are never old enough, whatever the real time is.
    assert [t for _, t, _ in d.feed(after_gap, eos, broker_ts=NOW + 10**9)] == ["MISSING", "CORRUPT"]


def test_compaction_tolerates_a_skipped_segment_that_starts_with_its_sos():
    d = Feeder(min_compaction_lag_ms=0, now_ms=NOW)
    d.to_phase(False)
    a = ref.RefProducer(A)
    assert d.feed(a.put(b"k", b"1"), a.end_segment(), broker_ts=NOW) == []
    a.put(b"k", b"2"), a.end_segment()
    assert d.feed(a.put(b"k", b"3"), a.end_segment(), broker_ts=NOW) == []


@pytest.mark.parametrize(
    "tolerate,expected", [(True, []), (False, [("PUT0.3", "MISSING", False), ("EOS0", "CORRUPT", False)])]
)
def test_active_active_drainer_tolerates_rt_gaps(tolerate, expected):
    d = Feeder(PartitionValidator(is_realtime=True, config=ValidatorConfig(tolerate_rt_gaps=tolerate)))
    assert d.v.end_of_push  # an RT is read after the version's EOP: nothing there is fatal
    first, after_gap, eos = _gap_stream(NOW)
    assert d.feed(first, after_gap, eos) == expected


# -- outcomes (venice-protocol-notes §3.4) -----------------------------------------------------------------------------------------


def test_the_end_of_push_record_itself_is_judged_before_eop():
    d = Feeder()
    push = d.push_start()
    push.put(b"k", b"lost")
    assert d.feed(push.end_of_push()) == [("EndOfPush0.3", "MISSING", True)]
    assert d.v.end_of_push and d.v.eop_offset == 2
    a = ref.RefProducer(A)
    a.put(b"k", b"lost")
    assert d.feed(a.put(b"k", b"1")) == []  # unknown, mid-segment, after EOP: accepted


def test_an_rt_topic_never_sets_an_eop_offset():
    d = Feeder(PartitionValidator(is_realtime=True))
    push = ref.RefProducer(P)
    d.feed(push.start_of_push(), push.end_of_push())
    assert d.v.eop_offset is None


# -- heartbeats, DoL stamps and Global-RT-DIV records -------------------------------------------------------------


def test_heartbeats_and_dol_stamps_are_exempt_and_not_tracked():
    d = Feeder()
    d.push_start()
    recs = [ref.heartbeat(NOW + i) for i in range(5)] + [ref.dol_stamp(NOW + i) for i in range(3)]
    assert d.feed(recs) == []  # seg 0 / seq 0 over and over, before EOP
    assert set(d.v.segments) == {P}


def test_a_data_record_from_the_heartbeat_guid_is_validated():
    d = Feeder()
    d.push_start()
    hb_producer = ref.RefProducer(ref.HB_GUID)
    hb_producer.put(b"k", b"1")
    assert d.feed(hb_producer.put(b"k", b"2")) == [("PUT0.2", "UNREGISTERED_PRODUCER", True)]


def _grd_key(partition: int = 0) -> bytes:
    return f"GLOBAL_RT_DIV_KEY.{partition}.broker:9092".encode() + b"\x02\x00"


@pytest.mark.parametrize(
    "fault,expected",
    [
        (None, []),
        ("drop", [("PUT0.3", "MISSING", False), ("EOS0", "CORRUPT", False)]),
        ("value", [("EOS0", "CORRUPT", False)]),
        ("key", [("EOS0", "CORRUPT", False)]),
    ],
)
def test_global_rt_div_records_are_validated_like_puts(fault, expected):
    d = Feeder()
    d.to_phase(True)
    a = ref.RefProducer(A)
    recs = (
        a.put(_grd_key(), b"state-1", header=8)
        + a.put(_grd_key(), b"state-2", header=8)
        + a.put(_grd_key(), b"state-3", header=8)
        + a.end_segment()
    )
    assert {r.key[0] for r in recs if r.label.startswith("PUT")} == {8}
    if fault == "drop":
        del recs[2]
    elif fault == "value":
        env = ref.decode_envelope(recs[2].value)
        env["payloadUnion"][1]["putValue"] = b"state-X"
        recs[2] = recs[2].replace(value=ref.encode_envelope(env))
    elif fault == "key":
        recs[2] = recs[2].replace(key=b"\x08" + _grd_key(1))  # the key content is part of the checksum
    assert d.feed(recs) == expected


# -- producer-state max age (venice-protocol-notes §3.6) ---------------------------------------------------------------------------


def _max_age_log(max_age: int, now_ms: int | None = None) -> list[tuple[str, str, bool]]:
    d = Feeder(max_age_ms=max_age, now_ms=now_ms)
    push = ref.RefProducer(P, start_ms=9_000)
    a = ref.RefProducer(A, start_ms=1_000)
    b = ref.RefProducer(B, start_ms=10_000)
    got = d.feed(push.start_of_push(), a.put(b"k", b"1"), b.put(b"k", b"1"))
    assert set(d.v.segments) == {P, A, B}
    # A control message other than SOS/EOS is a checkpoint: producers older than newest − max age go.
    got += d.feed(b.control(ref.SOIP, {"version": "inc"}))
    got += d.feed(a.put(b"k", b"2"))
    return got


def test_max_age_expires_producers_relative_to_the_newest_producer_timestamp():
    assert _max_age_log(5_000) == [("PUT0.2", "UNREGISTERED_PRODUCER", True)]  # A came back as a stranger
    assert _max_age_log(9_001) == []  # A's 1_001 is within 9_001 of B's 10_002
    assert _max_age_log(-1) == []  # disabled by default


def test_max_age_ignores_the_wall_clock():
    assert _max_age_log(9_001, now_ms=10**15) == []


def test_max_age_on_restore_and_clone():
    states = {A: _state(ts=1_000), B: _state(ts=10_000), P: _state(ts=8_000)}
    v = PartitionValidator(config=ValidatorConfig(max_age_ms=5_000))
    v.restore(states)
    assert set(v.segments) == {B, P}
    drainer = PartitionValidator()
    drainer.restore(states)
    assert set(drainer.segments) == {A, B, P}  # no max age: nothing expires
    leader = PartitionValidator(config=ValidatorConfig(max_age_ms=1_500))
    leader.clone_from(drainer)
    assert set(leader.segments) == {B}
    assert set(drainer.segments) == {B}  # Venice also deletes the stale entries from the source


# -- state transitions (venice-protocol-notes §3.8) --------------------------------------------------------------------------------


def _state(ts: int, seq: int = 3) -> dict:
    return {
        "segmentNumber": 0,
        "segmentStatus": IN_PROGRESS,
        "isRegistered": True,
        "messageSequenceNumber": seq,
        "messageTimestamp": ts,
        "checksumType": ref.ADHASH,
        "checksumState": b"\0" * 8,
        "aggregates": {},
        "debugInfo": {},
    }


def test_offline_to_standby_restores_a_checkpoint_and_continues():
    d = Feeder()
    push = d.push_start()
    a = ref.RefProducer(A, checksum_type=ref.MD5)
    b = ref.RefProducer(B)
    early = a.put(b"k", b"1" * 70) + b.put(b"k", b"2") + a.put(b"j", b"3")
    assert d.feed(early) == []
    # Checkpoint: offsets and DIV state together in PartitionState form, then a new replica loads it.
    blob = ps.encode(ps.build(d.offset - 1, d.v.producer_states(), end_of_push=d.v.end_of_push))
    loaded = ps.decode(blob)
    restored = Feeder(PartitionValidator())
    restored.v.restore(ps.producer_states(loaded), end_of_push=loaded["endOfPush"])
    restored.offset = loaded["offset"] + 1
    later = a.put(b"k", b"4") + a.end_segment() + b.end_segment() + push.end_of_push()
    assert restored.feed(later) == []  # sequence numbers and running checksums (MD5 mid-block) carried over
    # Replaying what the checkpoint already covers gives duplicates only.
    assert {t for _, t, _ in restored.feed(early)} <= {"DUPLICATE"}


def test_standby_to_leader_clones_deep_copies():
    drainer = Feeder()
    drainer.push_start()
    a = ref.RefProducer(A)
    assert drainer.feed(a.put(b"k", b"1")) == []
    leader = Feeder(PartitionValidator())
    leader.v.clone_from(drainer.v)
    assert leader.v.segments[A] is not drainer.v.segments[A]
    assert leader.v.segments[A].checksum is not drainer.v.segments[A].checksum
    nxt = a.put(b"k", b"2") + a.end_segment()
    assert leader.feed(nxt) == []  # the leader validates the next records from the cloned state...
    assert drainer.feed(nxt) == []  # ...and the drainer, untouched by that, validates them again
    assert leader.v.end_of_push == drainer.v.end_of_push


def test_standby_to_offline_clears_the_state():
    d = Feeder()
    d.push_start()
    a = ref.RefProducer(A)
    d.feed(a.put(b"k", b"1"))
    d.v.clear()
    assert d.v.segments == {}
    assert d.feed(a.put(b"k", b"2")) == [("PUT0.2", "UNREGISTERED_PRODUCER", True)]


# -- the fast path decides exactly as the full procedure ----------------------------------------------------------


class FullProcedureOnly(PartitionValidator):
    def process(self, offset, key, env, broker_ts=None, value_size=0):
        return list(self._process_slow(offset, key, env, broker_ts, value_size))


def _random_log(rng: random.Random) -> list[ref.Rec]:
    push = ref.RefProducer(P, host="push")
    producers = [
        ref.RefProducer(
            bytes([i]) * 16, checksum_type=rng.choice([ref.ADHASH, ref.ADHASH, ref.NONE, ref.MD5, ref.CRC32])
        )
        for i in range(1, 5)
    ]
    log = push.start_of_push()
    for i in range(300):
        p = rng.choice(producers)
        r = rng.random()
        if r < 0.55:
            log += p.put(b"k%d" % rng.randrange(20), rng.randbytes(rng.randrange(1, 30)))
        elif r < 0.7:
            log += p.delete(b"k%d" % rng.randrange(20))
        elif r < 0.75 and p.open:
            log += p.end_segment(final=rng.random() < 0.3)
        elif r < 0.78:
            log += p.update(b"k", b"u")
        if i == 120:
            log += push.end_of_push()
    out = []
    for r in log:
        x = rng.random()
        if x < 0.04:
            continue  # lost
        out.append(r)
        if x > 0.97:
            out.append(r)  # resent
        elif 0.93 < x < 0.95 and r.key[0] == 0:
            env = ref.decode_envelope(r.value)
            env["payloadUnion"][1]["schemaId"] = 77
            out[-1] = r.replace(value=ref.encode_envelope(env))  # changed in flight
    for _ in range(5):  # a few swapped neighbours
        i = rng.randrange(1, len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_fast_path_matches_the_full_procedure(seed):
    log = _random_log(random.Random(seed))
    fast, full = Feeder(PartitionValidator()), Feeder(FullProcedureOnly())
    got_fast, got_full = fast.feed(log), full.feed(log)
    assert got_fast == got_full
    assert fast.v.producer_states() == full.v.producer_states()
    assert len(got_fast) > 0  # the faults were noticed
