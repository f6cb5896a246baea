"""The segment writer against Venice's producer rules (venice-protocol-notes §2): numbering, time rolling, final segments, the
five checksums end to end, and retries that resend identical bytes.

Every record is decoded with Venice's own schema file (tests/support/venice_reference.py), and every EndOfSegment
checksum is recomputed independently from the feed rules of §2.3, so the writer is not checked against itself.
"""

from __future__ import annotations

import hashlib
import random

import pytest
import venice_reference as ref

from div import checksum as cks
from div import envelope as E
from div import keys
from div.md5state import MD5State
from div.validator import PartitionValidator
from div.writer import SegmentWriter

GUID = bytes.fromhex("00112233445566778899aabbccddeeff")
T0 = 1_700_000_000_000


class Clock:
    def __init__(self, t: int = T0) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def _decoded(recs):
    return [ref.decode_envelope(r.value) for r in recs]


def _shape(recs) -> list[tuple]:
    """(segment, sequence, kind) of each record, read back with Venice's schema."""
    out = []
    for r, env in zip(recs, _decoded(recs), strict=True):
        pm = env["producerMetadata"]
        name, body = env["payloadUnion"]
        kind = name.rsplit(".", 1)[1]
        if kind == "ControlMessage":
            kind = ref.CONTROL_RECORDS[body["controlMessageType"]]
        assert (pm["segmentNumber"], pm["messageSequenceNumber"]) == (r.segment, r.sequence)
        out.append((pm["segmentNumber"], pm["messageSequenceNumber"], kind))
    return out


def _eos(env) -> dict:
    return env["payloadUnion"][1]["controlMessageUnion"][1]


# -- numbering (venice-protocol-notes §2.2) ----------------------------------------------------------------------------------------


def test_first_message_starts_segment_zero_with_an_sos_at_sequence_zero():
    w = SegmentWriter(GUID, clock=Clock())
    recs = w.put(0, b"a", b"1") + w.put(0, b"b", b"2") + w.delete(0, b"a") + w.update(0, b"c", b"u", 1, 2)
    assert _shape(recs) == [
        (0, 0, "StartOfSegment"),
        (0, 1, "Put"),
        (0, 2, "Put"),
        (0, 3, "Delete"),
        (0, 4, "Update"),
    ]
    sos = _decoded(recs)[0]["payloadUnion"][1]
    assert sos["controlMessageUnion"][1] == {"checksumType": cks.ADHASH, "upcomingAggregates": []}
    assert recs[0].key == ref.control_key(GUID, 0, 0)
    assert [r.key for r in recs[1:]] == [b"\x00a", b"\x00b", b"\x00a", b"\x04c"]


def test_end_of_segment_takes_the_next_sequence_and_the_next_message_opens_a_new_segment():
    w = SegmentWriter(GUID, clock=Clock())
    recs = w.put(0, b"a", b"1") + w.end_segment(0, final=False) + w.put(0, b"b", b"2") + w.end_segment(0)
    assert _shape(recs) == [
        (0, 0, "StartOfSegment"),
        (0, 1, "Put"),
        (0, 2, "EndOfSegment"),
        (1, 0, "StartOfSegment"),
        (1, 1, "Put"),
        (1, 2, "EndOfSegment"),
    ]
    # Every control message has its own key: GUID ‖ segment ‖ sequence (venice-protocol-notes §1.2).
    assert [r.key for r in recs if r.key[0] == 2] == [
        ref.control_key(GUID, s, q) for s, q in ((0, 0), (0, 2), (1, 0), (1, 2))
    ]
    assert w.end_segment(0) == []  # nothing open


def test_partitions_are_numbered_independently():
    w = SegmentWriter(GUID, clock=Clock())
    recs = (
        w.put(3, b"a", b"1")
        + w.put(5, b"b", b"2")
        + w.put(3, b"c", b"3")
        + w.end_segment(5)
        + w.put(5, b"d", b"")
    )
    assert [(r.partition, r.segment, r.sequence) for r in recs] == [
        (3, 0, 0),
        (3, 0, 1),
        (5, 0, 0),
        (5, 0, 1),
        (3, 0, 2),
        (5, 0, 2),
        (5, 1, 0),
        (5, 1, 1),
    ]


def test_vtp_header_only_on_segment_zero_sequence_zero():
    w = SegmentWriter(GUID, clock=Clock())
    recs = w.put(0, b"a", b"1") + w.end_segment(0) + w.put(0, b"b", b"2") + w.put(1, b"c", b"3")
    with_vtp = [(r.partition, r.segment, r.sequence) for r in recs if r.headers]
    assert with_vtp == [(0, 0, 0), (1, 0, 0)]
    assert all([k for k, _ in r.headers] == ["vtp"] for r in recs if r.headers)
    assert not SegmentWriter(GUID, clock=Clock(), send_vtp=False).put(0, b"a", b"1")[0].headers


def test_timestamps_come_from_the_clock_and_logical_timestamps_follow_venice():
    clock = Clock(T0)
    w = SegmentWriter(GUID, clock=clock)
    recs = w.put(0, b"a", b"1")
    clock.t += 5
    recs += w.put(0, b"b", b"2", logical_ts=1234) + w.delete(0, b"a")
    pm = [e["producerMetadata"] for e in _decoded(recs)]
    assert [p["messageTimestamp"] for p in pm] == [T0, T0, T0 + 5, T0 + 5]
    # -1 on control messages, -2 when the caller gave none, the caller's value otherwise (venice-protocol-notes §2.5).
    assert [p["logicalTimestamp"] for p in pm] == [-1, -2, 1234, -2]


# -- time-based rolling (venice-protocol-notes §2.2) -------------------------------------------------------------------------------


def test_segment_rolls_when_older_than_the_max_age_on_the_next_send():
    clock = Clock()
    w = SegmentWriter(GUID, clock=clock, max_segment_age_ms=1000)
    recs = w.put(0, b"a", b"1")
    clock.t = T0 + 1000  # exactly the max age: not yet older than it
    recs += w.put(0, b"b", b"2")
    clock.t = T0 + 1001
    recs += w.put(0, b"c", b"3")
    assert _shape(recs) == [
        (0, 0, "StartOfSegment"),
        (0, 1, "Put"),
        (0, 2, "Put"),
        (0, 3, "EndOfSegment"),
        (1, 0, "StartOfSegment"),
        (1, 1, "Put"),
    ]
    envs = _decoded(recs)
    assert _eos(envs[3])["finalSegment"] is False
    assert envs[4]["producerMetadata"]["messageTimestamp"] == T0 + 1001
    # The new segment's age counts from its own start.
    clock.t = T0 + 2001
    assert len(w.put(0, b"d", b"4")) == 1
    clock.t = T0 + 2002
    assert [r.sequence for r in w.put(0, b"e", b"5")] == [3, 0, 1]


def test_control_messages_roll_too_but_end_of_segment_does_not():
    clock = Clock()
    w = SegmentWriter(GUID, clock=clock, max_segment_age_ms=10)
    w.put(0, b"a", b"1")
    clock.t += 11
    recs = w.start_of_push(0)
    assert _shape(recs) == [(0, 2, "EndOfSegment"), (1, 0, "StartOfSegment"), (1, 1, "StartOfPush")]
    clock.t += 100
    assert _shape(w.end_segment(0)) == [(1, 2, "EndOfSegment")]


@pytest.mark.parametrize("age", [0, -1])
def test_non_positive_max_age_disables_rolling(age):
    clock = Clock()
    w = SegmentWriter(GUID, clock=clock, max_segment_age_ms=age)
    w.put(0, b"a", b"1")
    clock.t += 10**9
    assert [r.sequence for r in w.put(0, b"b", b"2")] == [2]


def test_default_max_age_is_five_minutes():
    clock = Clock()
    w = SegmentWriter(GUID, clock=clock)
    w.put(0, b"a", b"1")
    clock.t += 300_000
    assert len(w.put(0, b"b", b"2")) == 1
    clock.t += 1
    assert len(w.put(0, b"c", b"3")) == 3


# -- final segments ------------------------------------------------------------------------------------------------


def test_end_of_push_then_final_end_of_segment():
    w = SegmentWriter(GUID, clock=Clock())
    recs = w.start_of_push(0) + w.put(0, b"a", b"1") + w.end_of_push(0)
    assert _shape(recs) == [
        (0, 0, "StartOfSegment"),
        (0, 1, "StartOfPush"),
        (0, 2, "Put"),
        (0, 3, "EndOfPush"),
        (0, 4, "EndOfSegment"),
    ]
    assert _eos(_decoded(recs)[-1])["finalSegment"] is True


def test_close_ends_every_open_segment_as_final():
    w = SegmentWriter(GUID, clock=Clock())
    w.put(2, b"a", b"1")
    w.put(1, b"b", b"2")
    w.put(4, b"c", b"3")
    w.end_segment(4)
    recs = w.close()
    assert [(r.partition, r.segment, r.sequence) for r in recs] == [(1, 0, 2), (2, 0, 2)]
    assert all(_eos(e)["finalSegment"] for e in _decoded(recs))
    assert w.close() == []
    # A later segment from the same GUID after a final EOS is legal (finalSegment is informational).
    after = w.put(1, b"d", b"4")
    assert [(r.segment, r.sequence) for r in after] == [(1, 0), (1, 1)]


def test_control_refuses_segment_messages():
    w = SegmentWriter(GUID, clock=Clock())
    for ctype in (E.START_OF_SEGMENT, E.END_OF_SEGMENT, E.START_OF_BUFFER_REPLAY):
        with pytest.raises(ValueError):
            w.control(0, ctype, {})


# -- checksums end to end (venice-protocol-notes §2.3–2.4) ----------------------------------------------------------------------

ALL_TYPES = [cks.NONE, cks.MD5, cks.ADLER32, cks.CRC32, cks.ADHASH]


def _stream(ctype: int, rng: random.Random):
    w = SegmentWriter(GUID, checksum_type=ctype, clock=Clock(), max_segment_age_ms=-1)
    recs = w.start_of_push(0)
    for i in range(40):
        k = b"key-%d" % rng.randrange(10)
        r = rng.random()
        if r < 0.6:
            recs += w.put(0, k, rng.randbytes(rng.randrange(0, 150)), schema_id=rng.randrange(1, 4))
        elif r < 0.8:
            recs += w.delete(0, k)
        else:
            recs += w.update(0, k, rng.randbytes(20), 1, rng.randrange(1, 3))
        if i == 25:
            recs += w.end_segment(0, final=False)
    recs += w.put(0, b"GLOBAL_RT_DIV_KEY.0.b\x02\x00", b"grd", header=keys.HEADER_GLOBAL_RT_DIV)
    recs += w.end_of_push(0)
    return recs


def _expected_checksums(recs, ctype: int) -> list[bytes]:
    """EOS values recomputed from the decoded records with the feed rules of §2.3, without our checksum code."""
    out = []
    cs = None
    for r in recs:
        env = ref.decode_envelope(r.value)
        name, body = env["payloadUnion"]
        mt = env["messageType"]
        content = r.key[1:]
        if name.endswith("ControlMessage"):
            ct = body["controlMessageType"]
            if ct == ref.SOS:
                cs = ref.RunningChecksum(ctype)
            if ct == ref.EOS:
                out.append(cs.value())
                continue
            feeds = [ref.i32(mt), ref.i32(ct)]
        elif name.endswith("Put"):
            feeds = [ref.i32(mt), content, ref.i32(body["schemaId"]), body["putValue"]]
        elif name.endswith("Update"):
            feeds = [
                ref.i32(mt),
                content,
                ref.i32(body["schemaId"]),
                ref.i32(body["updateSchemaId"]),
                body["updateValue"],
            ]
        else:
            feeds = [ref.i32(mt), content]
        for f in feeds:
            cs.feed(f)
    return out


@pytest.mark.parametrize("ctype", ALL_TYPES, ids=[cks.NAMES[t] for t in ALL_TYPES])
def test_each_checksum_type_end_to_end(ctype):
    recs = _stream(ctype, random.Random(ctype))
    sos = [ref.decode_envelope(r.value) for r in recs if r.key[0] == 2 and r.sequence == 0]
    assert {s["payloadUnion"][1]["controlMessageUnion"][1]["checksumType"] for s in sos} == {ctype}
    eos = [
        _eos(ref.decode_envelope(r.value))["checksumValue"]
        for r in recs
        if r.key[0] == 2 and ref.decode_envelope(r.value)["payloadUnion"][1]["controlMessageType"] == ref.EOS
    ]
    assert len(eos) == 2
    assert eos == _expected_checksums(recs, ctype)
    assert {len(v) for v in eos} == {{cks.NONE: 0, cks.MD5: 16}.get(ctype, 8)}
    # A Venice consumer accepts the stream: no finding.
    codec = E.EnvelopeCodec("fastavro")
    v = PartitionValidator()
    findings = [
        f for i, r in enumerate(recs) for f in v.process(i, r.key, codec.decode(r.value, r.headers), T0)
    ]
    assert findings == []
    assert v.end_of_push


@pytest.mark.parametrize("ctype", ALL_TYPES, ids=[cks.NAMES[t] for t in ALL_TYPES])
def test_a_changed_value_is_caught_by_every_checksum_but_none(ctype):
    recs = _stream(ctype, random.Random(100 + ctype))
    codec = E.EnvelopeCodec("fastavro")
    victim = next(i for i, r in enumerate(recs) if r.key[0] == 0 and r.sequence > 3)
    env = ref.decode_envelope(recs[victim].value)
    body = env["payloadUnion"][1]
    if "putValue" in body:
        body["putValue"] = body["putValue"] + b"!"
    recs[victim] = recs[victim].__class__(
        recs[victim].partition,
        recs[victim].key + b"x",
        ref.encode_envelope(env),
        recs[victim].headers,
        recs[victim].segment,
        recs[victim].sequence,
    )
    v = PartitionValidator()
    findings = [
        f for i, r in enumerate(recs) for f in v.process(i, r.key, codec.decode(r.value, r.headers), T0)
    ]
    if ctype == cks.NONE:
        assert findings == []
    else:
        assert [(f.type, f.fatal) for f in findings] == [("CORRUPT", True)]
        eos_offsets = [
            i
            for i, r in enumerate(recs)
            if r.key[0] == 2
            and ref.decode_envelope(r.value)["payloadUnion"][1]["controlMessageType"] == ref.EOS
        ]
        assert findings[0].offset == min(o for o in eos_offsets if o > victim)


def test_md5_state_matches_hashlib_and_round_trips_mid_block():
    rng = random.Random(5)
    for _ in range(30):
        feeds = [rng.randbytes(rng.randrange(0, 200)) for _ in range(rng.randrange(1, 8))]
        st = MD5State()
        h = hashlib.md5()
        for f in feeds:
            st.update(f)
            h.update(f)
            blob = st.encoded_state()
            pending = st._count % 64
            # BouncyCastle layout: 36 bytes + 4 per complete buffered word (venice-protocol-notes §2.4).
            assert len(blob) == 36 + 4 * (pending // 4)
            assert int.from_bytes(blob[4:8], "big") == pending % 4
            assert int.from_bytes(blob[8:16], "big") == st._count
            st = MD5State.from_encoded_state(blob)
        assert st.digest() == h.digest()


def test_md5_state_blob_refuses_inconsistent_input():
    st = MD5State()
    st.update(b"x" * 70)
    blob = st.encoded_state()
    for bad in (blob[:20], blob[:-1], blob[:8] + (999).to_bytes(8, "big") + blob[16:]):
        with pytest.raises(ValueError):
            MD5State.from_encoded_state(bad)


@pytest.mark.parametrize("ctype", ALL_TYPES, ids=[cks.NAMES[t] for t in ALL_TYPES])
def test_checksum_state_restore_continues_the_same_value(ctype):
    a = cks.Checksum(ctype)
    for f in (b"one", b"two" * 30):
        a.update(f)
    b = cks.Checksum.restore(ctype, a.state())
    for c in (a, b):
        c.update(b"three")
    assert a.finalize() == b.finalize()
    if ctype == cks.ADHASH:
        assert a.state() == a.value()  # ADHASH's checkpointable state is its 8-byte value


# -- retries (venice-protocol-notes §2.7) --------------------------------------------------------------------------------------


def test_a_retry_resends_identical_bytes_and_a_consumer_drops_it_as_one_duplicate():
    w = SegmentWriter(GUID, clock=Clock())
    first = w.put(0, b"a", b"1")
    retried = first[1]
    # The writer hands out immutable records; a retry is the same object, hence the same bytes.
    with pytest.raises(AttributeError):
        retried.value = b"other"
    log = first + [retried] + w.put(0, b"b", b"2") + w.end_segment(0)
    assert [r.sequence for r in log] == [0, 1, 1, 2, 3]  # the retry did not consume a sequence number
    codec = E.EnvelopeCodec("fastavro")
    v = PartitionValidator()
    findings = [
        f for i, r in enumerate(log) for f in v.process(i, r.key, codec.decode(r.value, r.headers), T0)
    ]
    assert [(f.offset, f.type, f.fatal) for f in findings] == [(2, "DUPLICATE", False)]


@pytest.mark.parametrize("ctype", [cks.ADHASH, cks.MD5], ids=["ADHASH", "MD5"])
def test_simulated_multi_producer_traffic_validates_clean(ctype):
    from sim.div_traffic import TrafficSpec, generate

    spec = TrafficSpec(
        partitions=3,
        producers=4,
        records=1500,
        batch_records=50,
        keys=40,
        segment_every=200,
        checksum_type=ctype,
    )
    validators = {p: PartitionValidator() for p in range(spec.partitions)}
    codec = E.EnvelopeCodec("fastavro")
    findings = []
    for r in generate(spec):
        findings += validators[r.partition].process(
            r.offset, r.key, codec.decode(r.value, r.headers), r.timestamp_ms
        )
    assert findings == []
    # Per partition: the push job's SOS, SOP, the batch records, then EOP.
    assert {v.eop_offset for v in validators.values()} == {spec.batch_records + 2}
    assert all(len(v.segments) == 1 + spec.producers for v in validators.values())
