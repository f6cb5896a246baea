"""hbw/hbd codecs and heartbeat records: round trips, refusals, Venice's bytes (venice-protocol-notes §1.9) and Venice's schema."""

from __future__ import annotations

import io
import json

import fastavro
import pytest

from div import envelope as E
from div import keys, schemas
from div.heartbeat_headers import (
    DivState,
    HeaderError,
    Watermarks,
    decode_hbd,
    decode_hbw,
    encode_hbd,
    encode_hbw,
)
from div.validator import PartitionValidator
from heartbeat.records import parse_vt_heartbeat, rt_heartbeat, vt_heartbeat

RT_VECTOR = (
    "170e0481545f3cbd093909a467a583ef39e468000080a0abfef96201060400040800"
    "0212686f73743a31323334010108220103000101"
)
VT_VECTOR = (
    "170e0481545f3cbd093909a467a583ef39e468000080a0abfef9620106040004080002166c65616465723a31323334"
    "c801020c22010004c8010101"
)
TS = 1_700_000_000_000


def _state(seq: int, ts: int = 5, status: int = 1, ck: bytes = b"\x00" * 8) -> dict:
    return {
        "segmentNumber": 2,
        "segmentStatus": status,
        "isRegistered": True,
        "messageSequenceNumber": seq,
        "messageTimestamp": ts,
        "checksumType": 4,
        "checksumState": ck,
        "aggregates": {"n": 3},
        "debugInfo": {"host": "h"},
    }


def test_hbw_round_trip_and_framing():
    w = Watermarks(2, 1234, [10, -1, 1234], "leader:1", 7, TS, [b"\x22\x01\x00\x02\x14", b"", b"x"])
    data = encode_hbw(w)
    assert data[:2] == b"\x48\x01"
    assert decode_hbw(data) == w
    assert decode_hbw(encode_hbw(Watermarks(0, -1, [], "", emit_ts_ms=0))).high_watermarks == []


def test_hbd_round_trip_with_non_ascii_guids():
    guids = [bytes(range(i, i + 16)) for i in (0, 120, 240 - 16)]  # bytes ≥ 0x80 become 2-byte UTF-8
    s = DivState(
        {guids[0]: _state(1)}, {0: {}, 1: {guids[1]: _state(9, 8, 3)}, 2: {guids[2]: _state(4)}}, True
    )
    data = encode_hbd(s)
    assert data[:2] == b"\x44\x01"
    assert decode_hbd(data) == s


def test_hbd_uses_the_protocol_schema_file(shared_dir):
    """Our copy of the schema is the shared protocol file, and a generic Avro reader decodes our bytes."""
    for name in ("HeartbeatDivState.v1.avsc", "HeartbeatWatermarks.v1.avsc"):
        assert schemas.load_json(name) == json.loads((shared_dir / "protocol" / name).read_text())
    g = bytes(range(200, 216))
    data = encode_hbd(DivState({g: _state(3)}, {1: {}}, False))
    schema = fastavro.parse_schema(
        json.loads((shared_dir / "protocol" / "HeartbeatDivState.v1.avsc").read_text())
    )
    d = fastavro.schemaless_reader(io.BytesIO(data[2:]), schema, None)
    assert list(d["vtProducerStates"]) == [g.decode("latin-1")]
    assert d["rtProducerStates"] == [{"regionId": 1, "producerStates": {}}]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (None, "shorter"),
        (b"\x48", "shorter"),
        (b"\x49\x01\x00", "magic"),
        (b"\x48\x02\x00", "version 2"),
        (b"\x48\x01\x02", "Avro"),
    ],
)
def test_bad_hbw_is_refused_with_the_reason(data, message):
    with pytest.raises(HeaderError, match=message) as info:
        decode_hbw(data)
    assert "hbw" in str(info.value)


def test_bad_hbd_is_refused_with_the_reason():
    good = encode_hbd(DivState({b"g" * 16: _state(1)}, {}, False))
    with pytest.raises(HeaderError, match="trailing"):
        decode_hbd(good + b"\x00")
    with pytest.raises(HeaderError, match="Avro"):
        decode_hbd(good[:-5])
    with pytest.raises(HeaderError, match="magic"):
        decode_hbd(encode_hbw(Watermarks(0, 0, [0], "h")))
    short_key = encode_hbd(DivState({}, {}, False))[:2] + fastavro_map_with_key("abc")
    with pytest.raises(HeaderError, match="3 bytes"):
        decode_hbd(short_key)
    twice = encode_hbd(DivState({}, {1: {}}, False))
    twice = twice[:3] + b"\x04" + b"\x02\x00" + b"\x02\x00" + b"\x00\x00"  # region 1 listed two times
    with pytest.raises(HeaderError, match="twice"):
        decode_hbd(twice)
    with pytest.raises(HeaderError, match="16 bytes"):
        encode_hbd(DivState({b"short": _state(1)}, {}, False))


def fastavro_map_with_key(key: str) -> bytes:
    """Avro of HeartbeatDivState with one VT producer under `key` (not a 16-byte GUID)."""
    from div.heartbeat_headers import _hbd_schema

    buf = io.BytesIO()
    fastavro.schemaless_writer(
        buf, _hbd_schema(), {"vtProducerStates": {key: _state(1)}, "rtProducerStates": [], "truncated": False}
    )
    return buf.getvalue()


def test_heartbeat_records_reproduce_the_notes_vectors():
    rt = rt_heartbeat("host:1234", TS)
    assert rt.key == keys.HEARTBEAT_KEY
    assert rt.key.hex() == "0281545f3cbd093909a467a583ef39e4680000000000000000"
    assert rt.value.hex() == RT_VECTOR
    assert [h for h, _ in rt.headers] == ["vtp"]
    vt = vt_heartbeat("leader:1234", origin_region=1, origin_rt_offset=100, timestamp_ms=TS)
    assert vt.value.hex() == VT_VECTOR
    assert dict(vt.headers)["lcs"] == b"\x00"
    ours = vt_heartbeat(
        "leader:1234",
        origin_region=1,
        origin_rt_offset=100,
        timestamp_ms=TS,
        leader_completed=True,
        hbw=Watermarks(1, 100, [3, 100], "leader:1234"),
        hbd=DivState({}, {0: {}, 1: {}}, False),
    )
    assert ours.value.hex() == VT_VECTOR, "our headers must not change the Venice record"
    assert [h for h, _ in ours.headers] == ["vtp", "lcs", "hbw", "hbd"]
    assert dict(ours.headers)["lcs"] == b"\x01"


def test_vt_heartbeat_decodes_with_venices_own_schema(shared_dir):
    schema = fastavro.parse_schema(
        json.loads((shared_dir / "reference" / "schemas" / "KafkaMessageEnvelope.v14.avsc").read_text())
    )
    g = bytes(range(16))
    rec = vt_heartbeat(
        "leader:1",
        origin_region=2,
        origin_rt_offset=77,
        timestamp_ms=TS,
        hbw=Watermarks(2, 77, [5, 6, 77], "leader:1", 3, TS + 9),
        hbd=DivState({g: _state(4)}, {2: {g: _state(8)}}, False),
    )
    assert rec.value[:2] == b"\x17\x0e"
    env = fastavro.schemaless_reader(io.BytesIO(rec.value[2:]), schema, None, return_record_name=True)
    assert env["messageType"] == 2
    pm = env["producerMetadata"]
    assert (pm["producerGUID"], pm["segmentNumber"], pm["messageSequenceNumber"]) == (
        keys.HEARTBEAT_GUID,
        0,
        0,
    )
    assert (pm["messageTimestamp"], pm["logicalTimestamp"]) == (TS, -1)
    cm = env["payloadUnion"][1]
    assert cm["controlMessageType"] == E.START_OF_SEGMENT and cm["debugInfo"] == {}
    assert cm["controlMessageUnion"][1] == {"checksumType": 4, "upcomingAggregates": []}
    footer = env["leaderMetadataFooter"][1]
    assert (footer["hostName"], footer["upstreamOffset"], footer["upstreamKafkaClusterId"]) == (
        "leader:1",
        77,
        2,
    )
    assert (footer["termId"], footer["upstreamMessageTimestamp"]) == (-1, -1)
    # The vtp header is the writer schema, as Venice sends it; Venice's reader resolves it to the same record.
    assert json.loads(dict(rec.headers)["vtp"])["name"] == "KafkaMessageEnvelope"
    # An unmodified Venice consumer skips it for DIV via the key, like every heartbeat.
    v = PartitionValidator()
    for off in range(3):
        assert v.process(off, rec.key, E.EnvelopeCodec().decode(rec.value), TS) == []
    assert v.producer_states() == {}


def test_parse_vt_heartbeat_reads_ours_and_plain_venice_ones():
    codec = E.EnvelopeCodec()
    plain = vt_heartbeat("l:1", origin_region=1, origin_rt_offset=100, timestamp_ms=TS)
    hb = parse_vt_heartbeat(plain.key, codec.decode(plain.value), list(plain.headers))
    assert (hb.origin_region, hb.origin_rt_offset, hb.origin_ms, hb.leader_host) == (1, 100, TS, "l:1")
    assert hb.watermarks is None and hb.div_state is None and hb.lcs is False and hb.hbd_size == 0
    w = Watermarks(1, 100, [4, 100], "l:1", 2, TS)
    s = DivState({}, {0: {}, 1: {}}, False)
    ours = vt_heartbeat(
        "l:1", origin_region=1, origin_rt_offset=100, timestamp_ms=TS, hbw=w, hbd=s, leader_completed=True
    )
    archive_headers = [{"key": k, "value": v} for k, v in ours.headers]  # the archive's header shape
    hb = parse_vt_heartbeat(ours.key, codec.decode(ours.value), archive_headers)
    assert hb.watermarks == w and hb.div_state == s and hb.lcs is True
    lazy = parse_vt_heartbeat(ours.key, codec.decode(ours.value), ours.headers, decode_div_state=False)
    assert lazy.div_state is None and lazy.hbd_size == len(dict(ours.headers)["hbd"])
    assert parse_vt_heartbeat(b"\x00k", codec.decode(ours.value), ours.headers) is None
    broken = [(k, v[:-1] if k == "hbw" else v) for k, v in ours.headers]
    with pytest.raises(HeaderError, match="hbw"):
        parse_vt_heartbeat(ours.key, codec.decode(ours.value), broken)
