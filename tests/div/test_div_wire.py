"""Venice's wire format, checked against the reference notes and Venice's schema files rather than our own code.

Keys (§1.2), value framing and every protocol version (§1.3), the byte vectors of §1.9, §2.4 and §7.2, positions
(§7), `vtp` learning, the messageType/branch pitfall (§8 #1), and both directions of interoperability: what our
writer emits decodes with Venice's schema file, and what an independent encoder built from that file emits
decodes with our codec. cavro and fastavro must give identical envelopes for every version and message kind.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import zlib

import fastavro
import pytest
import venice_reference as ref
from fastavro.schema import to_parsing_canonical_form

from div import checksum as cks
from div import envelope as E
from div import envelope_versions as ev
from div import keys, positions
from div.writer import SegmentWriter, deterministic_guid, random_guid

GUID = bytes(range(16))
TS = 1_700_000_000_000
BACKENDS = ["fastavro", "cavro"]


@pytest.fixture(scope="module")
def codecs() -> dict[str, E.EnvelopeCodec]:
    return {b: E.EnvelopeCodec(b) for b in BACKENDS}


# -- keys (venice-protocol-notes §1.2) --------------------------------------------------------------------------------------------


def test_heartbeat_and_dol_guids_are_venices_type3_uuids():
    assert keys.HEARTBEAT_GUID.hex() == "81545f3cbd093909a467a583ef39e468"
    assert keys.DOL_GUID.hex() == "4a5ead6ef3a932f0864e3b7c324c9275"
    # The notes' recipe (MD5 of the name, version and variant bits set), computed here independently.
    assert keys.HEARTBEAT_GUID == ref.type3_uuid("heartbeatControlMessage")
    assert keys.name_based_guid("x") == ref.type3_uuid("x")


def test_full_heartbeat_and_dol_keys():
    assert keys.HEARTBEAT_KEY.hex() == "02" + "81545f3cbd093909a467a583ef39e468" + "00000000" + "00000000"
    assert keys.DOL_KEY.hex() == "02" + "4a5ead6ef3a932f0864e3b7c324c9275" + "00000000" + "00000000"
    assert len(keys.HEARTBEAT_KEY) == len(keys.DOL_KEY) == 25


def test_key_header_bytes():
    assert keys.data_key(b"k") == b"\x00k"  # PUT and DELETE share header 0 (compaction supersedes either)
    assert keys.update_key(b"k") == b"\x04k"
    assert keys.encode_key(keys.HEADER_GLOBAL_RT_DIV, b"g") == b"\x08g"
    assert (
        keys.HEADER_PUT_OR_DELETE,
        keys.HEADER_CONTROL_MESSAGE,
        keys.HEADER_UPDATE,
        keys.HEADER_GLOBAL_RT_DIV,
    ) == (0, 2, 4, 8)


def test_control_key_is_guid_then_big_endian_segment_and_sequence():
    # §1.9: the SOS key of GUID 00..0f, segment 0, sequence 0.
    assert keys.control_key(GUID, 0, 0).hex() == "02000102030405060708090a0b0c0d0e0f0000000000000000"
    k = keys.control_key(GUID, 7, 0x01020304)
    assert k == b"\x02" + GUID + b"\x00\x00\x00\x07\x01\x02\x03\x04"
    assert keys.control_key(GUID, -1, -2)[-8:] == b"\xff" * 7 + b"\xfe"  # two's complement ints


def test_split_key_refuses_what_a_venice_consumer_refuses():
    assert keys.split_key(b"\x00abc") == (0, b"abc")
    assert keys.split_key(b"\x08x") == (8, b"x")
    assert keys.split_key(b"\x02") == (2, b"")
    for bad in (b"\x01k", b"\x03k", b"\x05k", b"\xffk"):
        with pytest.raises(keys.KeyError_, match=str(bad[0])):
            keys.split_key(bad)
    for empty in (b"", None):
        with pytest.raises(keys.KeyError_):
            keys.split_key(empty)


def test_div_exemption_compares_the_whole_control_key():
    assert keys.is_div_exempt(keys.HEARTBEAT_KEY) and keys.is_div_exempt(keys.DOL_KEY)
    assert keys.is_heartbeat_key(keys.HEARTBEAT_KEY) and not keys.is_heartbeat_key(keys.DOL_KEY)
    assert keys.is_dol_key(keys.DOL_KEY) and not keys.is_dol_key(keys.HEARTBEAT_KEY)
    # A PUT whose user key happens to equal the heartbeat key content is an ordinary record.
    assert not keys.is_div_exempt(b"\x00" + keys.HEARTBEAT_KEY_CONTENT)
    # A control message from the heartbeat GUID with another segment/sequence is not the heartbeat key.
    assert not keys.is_div_exempt(keys.control_key(keys.HEARTBEAT_GUID, 0, 1))


def test_non_chunk_suffix_is_stripped_only_when_present():
    assert keys.NON_CHUNK_SUFFIX == b"\x02\x00"
    assert keys.strip_non_chunk_suffix(b"user\x02\x00") == b"user"
    assert keys.strip_non_chunk_suffix(b"user") == b"user"


# -- GUIDs (venice-protocol-notes §2.1) -----------------------------------------------------------------------------------------


def test_guids_random_per_writer_and_deterministic_layout():
    assert len(random_guid()) == 16 and random_guid() != random_guid()
    assert SegmentWriter().guid != SegmentWriter().guid
    assert deterministic_guid(1, 2) == (1).to_bytes(8, "big") + (2).to_bytes(8, "big")
    assert deterministic_guid(-1, -2) == b"\xff" * 8 + b"\xff" * 7 + b"\xfe"  # Java longs are signed
    with pytest.raises(ValueError):
        SegmentWriter(b"short")


# -- positions (venice-protocol-notes §7) ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "offset,blob",
    [(0, "2201000200"), (1, "2201000202"), (100, "22010004c801"), (123456789, "22010008aab4de75")],
)
def test_kafka_offset_position_vectors(offset, blob):
    assert positions.encode_offset(offset).hex() == blob
    assert positions.decode(bytes.fromhex(blob)) == (positions.TYPE_KAFKA_OFFSET, offset)


def test_symbolic_positions():
    assert positions.EARLIEST_BLOB.hex() == "22010300"
    assert positions.LATEST_BLOB.hex() == "22010100"
    assert positions.decode(positions.EARLIEST_BLOB) == (-2, -1)
    assert positions.decode(positions.LATEST_BLOB) == (-1, (1 << 63) - 1)
    assert positions.encode_offset(-1) == positions.EARLIEST_BLOB  # Venice's "no position"
    with pytest.raises(positions.PositionError):
        positions.encode_offset(-2)


def test_position_blob_matches_venices_schema_file():
    schema = fastavro.parse_schema(ref.schema_json("PubSubPositionWireFormat.v1.avsc"))
    for offset in (0, 5, 1 << 40):
        blob = positions.encode_offset(offset)
        assert blob[:2] == b"\x22\x01"
        rec = fastavro.schemaless_reader(io.BytesIO(blob[2:]), schema, None)
        assert rec["type"] == 0
        raw = io.BytesIO()
        fastavro.schemaless_writer(raw, fastavro.parse_schema("long"), offset)
        assert rec["rawBytes"] == raw.getvalue()


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"\x22",
        b"\x23\x01\x00\x00",
        b"\x22\x02\x00\x00",
        b"\x22\x01\x00\x04\x02",
        b"\x22\x01\x02\x00",
        b"\x22\x01\x00\x02\x03",
        b"\x22\x01\x80\x80",
        b"\x22\x01\x00\x80",
        b"\x22\x01\x00\x02\x80\x80",
    ],
)
def test_bad_position_blobs_are_refused(bad):
    # empty, short, wrong magic, wrong version, truncated raw bytes, unknown type 1, Kafka offset -2; varints cut
    # short in the type, the length and the raw offset (a damaged footer: a PositionError, never a dead task)
    with pytest.raises(positions.PositionError):
        positions.decode(bad)


def test_offset_fallback_rule():
    # §7.3: empty → the long; EARLIEST/LATEST or ≥ the long → decoded; undecodable or behind → the long.
    assert positions.offset_with_fallback(b"", 42) == 42
    assert positions.offset_with_fallback(positions.encode_offset(50), 42) == 50
    assert positions.offset_with_fallback(positions.encode_offset(42), 42) == 42
    assert positions.offset_with_fallback(positions.encode_offset(10), 42) == 42
    assert positions.offset_with_fallback(positions.EARLIEST_BLOB, 42) == -1
    assert positions.offset_with_fallback(positions.LATEST_BLOB, 42) == (1 << 63) - 1
    assert positions.offset_with_fallback(b"\x00garbage", 42) == 42
    assert positions.offset_with_fallback(b"\x22\x01\x00\x02\x80\x80", 42) == 42


# -- §1.9 vectors --------------------------------------------------------------------------------------------------

RT_HB = (
    "170e0481545f3cbd093909a467a583ef39e468000080a0abfef962010604000408000212686f73743a3132333401010822010300"
    "0101"
)
VT_HB = (
    "170e0481545f3cbd093909a467a583ef39e468000080a0abfef9620106040004080002166c65616465723a31323334c801020c2201"
    "0004c8010101"
)
PUT_V = "170e00000102030405060708090a0b0c0d0e0f000280a0abfef96203000276020100020268010108220103000101"


def _hb_env(footer) -> dict:
    return {
        "messageType": 2,
        "producerMetadata": E.producer_metadata(keys.HEARTBEAT_GUID, 0, 0, TS, -1),
        "payloadUnion": E.control_message(E.START_OF_SEGMENT, {"checksumType": 4, "upcomingAggregates": []}),
        "leaderMetadataFooter": footer,
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_rt_heartbeat_vector(codecs, backend):
    codec = codecs[backend]
    assert codec.encode(_hb_env(E.default_footer("host:1234"))).hex() == RT_HB
    env = codec.decode(bytes.fromhex(RT_HB))
    assert env["producerMetadata"]["producerGUID"] == keys.HEARTBEAT_GUID
    assert E.control_type(env) == E.START_OF_SEGMENT and E.control_body(env)["checksumType"] == cks.ADHASH
    assert E.footer(env)["hostName"] == "host:1234"
    assert E.footer(env)["upstreamPubSubPosition"] == positions.EARLIEST_BLOB


@pytest.mark.parametrize("backend", BACKENDS)
def test_vt_heartbeat_vector(codecs, backend):
    codec = codecs[backend]
    assert codec.encode(_hb_env(E.leader_footer("leader:1234", 100, 1))).hex() == VT_HB
    f = E.footer(codec.decode(bytes.fromhex(VT_HB)))
    assert (
        f["hostName"],
        f["upstreamOffset"],
        f["upstreamKafkaClusterId"],
        f["termId"],
        f["upstreamMessageTimestamp"],
    ) == ("leader:1234", 100, 1, -1, -1)
    assert positions.decode(f["upstreamPubSubPosition"]) == (0, 100)


def test_put_vector_from_the_writer():
    w = SegmentWriter(GUID, host_name="h", clock=lambda: TS)
    sos, put = w.put(0, b"k", b"v", schema_id=1)
    assert sos.key.hex() == "02000102030405060708090a0b0c0d0e0f0000000000000000"
    assert put.key.hex() == "006b"
    assert put.value.hex() == PUT_V


@pytest.mark.parametrize("backend", BACKENDS)
def test_put_vector_decodes(codecs, backend):
    env = codecs[backend].decode(bytes.fromhex(PUT_V))
    pm = env["producerMetadata"]
    assert (
        pm["producerGUID"],
        pm["segmentNumber"],
        pm["messageSequenceNumber"],
        pm["messageTimestamp"],
        pm["logicalTimestamp"],
    ) == (GUID, 0, 1, TS, -2)
    assert E.payload_kind(env) == "PUT" and env["messageType"] == 0
    assert E.payload(env)["putValue"] == b"v" and E.payload(env)["schemaId"] == 1


# -- §2.4 checksum vectors ---------------------------------------------------------------------------------------


def _vector_feeds() -> list[bytes]:
    return (
        cks.feeds(2, "CONTROL", b"", {}, E.START_OF_SEGMENT)
        + cks.feeds(0, "PUT", b"k", {"schemaId": 1, "putValue": b"v"})
        + cks.feeds(1, "DELETE", b"k2", {})
    )


@pytest.mark.parametrize(
    "ctype,expected",
    [
        (cks.ADHASH, "00000002ef30be84"),
        (cks.CRC32, "00000000c6f7ffc8"),
        (cks.ADLER32, "0000000009b50185"),
        (cks.MD5, "cb6ee8684f505e23d030afcfc87e2723"),
        (cks.NONE, ""),
    ],
)
def test_checksum_vectors(ctype, expected):
    feeds = _vector_feeds()
    # The feed rule itself (§2.3): ints as 4 BE bytes, the key content without header byte.
    assert feeds == [
        b"\0\0\0\x02",
        b"\0\0\0\x02",
        b"\0\0\0\0",
        b"k",
        b"\0\0\0\x01",
        b"v",
        b"\0\0\0\x01",
        b"k2",
    ]
    c = cks.Checksum(ctype)
    for f in feeds:
        c.update(f)
    assert c.finalize().hex() == expected
    with pytest.raises(cks.ChecksumFinalizedError):
        c.update(b"more")


def test_adhash_is_per_feed_not_per_stream():
    c = cks.Checksum(cks.ADHASH)
    c.update(b"ab")
    c.update(b"cd")
    assert c.value() == ((zlib.crc32(b"ab") + zlib.crc32(b"cd")) & (2**64 - 1)).to_bytes(8, "big")
    assert c.value() != zlib.crc32(b"abcd").to_bytes(8, "big")


def test_update_feeds_and_unsupported_control_types():
    assert cks.feeds(3, "UPDATE", b"k", {"schemaId": 5, "updateSchemaId": 6, "updateValue": b"u"}) == [
        b"\0\0\0\x03",
        b"k",
        b"\0\0\0\x05",
        b"\0\0\0\x06",
        b"u",
    ]
    assert cks.feeds(2, "CONTROL", b"", {}, E.END_OF_SEGMENT) == []
    for ctype in (
        E.START_OF_PUSH,
        E.END_OF_PUSH,
        E.START_OF_INCREMENTAL_PUSH,
        E.END_OF_INCREMENTAL_PUSH,
        E.TOPIC_SWITCH,
        E.VERSION_SWAP,
    ):
        assert cks.feeds(2, "CONTROL", b"", {}, ctype) == [b"\0\0\0\x02", ctype.to_bytes(4, "big")]
    with pytest.raises(cks.UnsupportedMessageTypeError):
        cks.feeds(2, "CONTROL", b"", {}, E.START_OF_BUFFER_REPLAY)


# -- every protocol version, both decoders -----------------------------------------------------------------------


def _find(schema, name):
    return ev._find_record(schema, name)


def _fill(schema, named: dict, choose: dict, seed: list) -> object:
    """A datum for `schema` with distinctive values in every field; unions pick `choose[field]` or non-null."""
    if isinstance(schema, str):
        if schema in named:
            return _fill(named[schema], named, choose, seed)
        seed[0] += 1
        n = seed[0]
        return {
            "int": 1000 + n,
            "long": 10**12 + n,
            "string": f"s{n}",
            "bytes": b"b%d" % n,
            "boolean": True,
            "null": None,
        }[schema]
    if isinstance(schema, list):
        branch = next(b for b in schema if b != "null")
        return _fill(branch, named, choose, seed)
    t = schema["type"]
    if isinstance(t, (dict, list)):
        return _fill(t, named, choose, seed)
    if t == "record":
        named[schema["name"]] = schema
        out = {}
        for f in schema["fields"]:
            if f["name"] in choose:
                out[f["name"]] = choose[f["name"]]
            else:
                out[f["name"]] = _fill(f["type"], named, choose, seed)
        return out
    if t == "fixed":
        named[schema["name"]] = schema
        return GUID
    if t == "array":
        return [_fill(schema["items"], named, choose, seed) for _ in range(2)]
    if t == "map":
        return {"a": _fill(schema["values"], named, choose, seed)}
    return _fill(t, named, choose, seed)


def _kinds(version: int) -> list[tuple[str, int | None]]:
    schema = ev.writer_schema(version)
    union = next(
        f["type"] for f in _find(schema, "KafkaMessageEnvelope")["fields"] if f["name"] == "payloadUnion"
    )
    names = [b["name"] for b in union]
    cmu = next(
        f["type"] for f in _find(schema, "ControlMessage")["fields"] if f["name"] == "controlMessageUnion"
    )
    out: list[tuple[str, int | None]] = [(n, None) for n in ("Put", "Delete", "Update") if n in names]
    out += [("ControlMessage", i) for i in range(len(cmu))]
    return out


CASES = [(v, name, ctype) for v in ev.known_versions() for name, ctype in _kinds(v)]


def _datum(version: int, branch: str, ctype: int | None) -> dict:
    schema = ev.writer_schema(version)
    named: dict = {}
    seed = [0]
    body_schema = _find(schema, branch)
    if branch == "ControlMessage":
        cmu = next(f["type"] for f in body_schema["fields"] if f["name"] == "controlMessageUnion")
        inner = cmu[ctype]
        inner_datum = _fill(inner, named, {}, seed)
        body = _fill(
            body_schema,
            named,
            {"controlMessageType": ctype, "controlMessageUnion": (E.NS + inner["name"], inner_datum)},
            seed,
        )
    else:
        body = _fill(body_schema, named, {}, seed)
    mt = {"Put": 0, "Delete": 1, "ControlMessage": 2, "Update": 3}[branch]
    top = _find(schema, "KafkaMessageEnvelope")
    choose = {
        "messageType": mt,
        "payloadUnion": (E.NS + branch, body),
        "producerMetadata": _fill(_find(schema, "ProducerMetadata"), named, {}, seed),
    }
    if any(f["name"] == "leaderMetadataFooter" for f in top["fields"]):
        choose["leaderMetadataFooter"] = (
            E.NS + "LeaderMetadata",
            _fill(_find(schema, "LeaderMetadata"), named, {}, seed),
        )
    return _fill(top, named, choose, seed)


def _encode_version(version: int, datum: dict) -> bytes:
    return ref.encode_envelope(datum, version, fastavro.parse_schema(ev.writer_schema(version)))


def _expected_record(written: dict, writer_rec: dict, reader_rec: dict) -> dict:
    """What Avro resolution gives for a record: fields matched by name, reader defaults for the rest."""
    writer_names = {f["name"] for f in writer_rec["fields"]}
    out = {}
    for f in reader_rec["fields"]:
        if f["name"] in writer_names:
            out[f["name"]] = written[f["name"]]
        else:
            d = f["default"]
            out[f["name"]] = d.encode("latin-1") if f["type"] == "bytes" else d
    return out


@pytest.mark.parametrize("version,branch,ctype", CASES, ids=[f"v{v}-{b}-{c}" for v, b, c in CASES])
def test_every_version_and_kind_decodes_identically_with_both_backends(codecs, version, branch, ctype):
    datum = _datum(version, branch, ctype)
    value = _encode_version(version, datum)
    assert value[:2] == bytes([23, version])
    got = {b: codecs[b].decode(value) for b in BACKENDS}
    assert got["cavro"] == got["fastavro"]
    env = got["fastavro"]
    # The parts every reader relies on, against what was written.
    pm = env["producerMetadata"]
    wpm = datum["producerMetadata"]
    assert (pm["producerGUID"], pm["segmentNumber"], pm["messageSequenceNumber"], pm["messageTimestamp"]) == (
        wpm["producerGUID"],
        wpm["segmentNumber"],
        wpm["messageSequenceNumber"],
        wpm["messageTimestamp"],
    )
    assert pm["logicalTimestamp"] == wpm.get("logicalTimestamp", -1)
    assert env["messageType"] == datum["messageType"]
    name, body = env["payloadUnion"]
    assert name == E.NS + branch
    writer_schema, reader_schema = ev.writer_schema(version), ev.writer_schema(14)
    if branch == "ControlMessage":
        assert body["controlMessageType"] == ctype
        inner_name, inner = body["controlMessageUnion"]
        assert inner_name == E.CONTROL_RECORD_NAMES[ctype]
        rec = E.CONTROL_NAMES[ctype]
        assert inner == _expected_record(
            datum["payloadUnion"][1]["controlMessageUnion"][1],
            _find(writer_schema, rec),
            _find(reader_schema, rec),
        )
        assert body["debugInfo"] == datum["payloadUnion"][1]["debugInfo"]
    else:
        assert body == _expected_record(
            datum["payloadUnion"][1], _find(writer_schema, branch), _find(reader_schema, branch)
        )
    footer = env["leaderMetadataFooter"]
    if "leaderMetadataFooter" in datum:
        assert footer[1] == _expected_record(
            datum["leaderMetadataFooter"][1],
            _find(writer_schema, "LeaderMetadata"),
            _find(reader_schema, "LeaderMetadata"),
        )
    else:
        assert footer is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_old_version_byte_with_the_wrong_body_is_undecodable(codecs, backend):
    # A v14 body framed as v1 does not resolve; the error says which version failed.
    body = bytes.fromhex(PUT_V)[2:]
    with pytest.raises(E.UndecodableError, match="version"):
        codecs[backend].decode(bytes([23, 1]) + body[:20])


# -- vtp learning (venice-protocol-notes §1.3) -------------------------------------------------------------------------------------


def _v99_schema() -> dict:
    s = ev.writer_schema(15)
    _find(s, "ProducerMetadata")["fields"].append({"name": "shiny", "type": "long", "default": 0})
    return s


def _v99_value() -> bytes:
    s = _v99_schema()
    datum = _datum(15, "Put", None)
    datum["producerMetadata"]["shiny"] = 7
    return ref.encode_envelope(datum, 99, fastavro.parse_schema(s))


@pytest.mark.parametrize("backend", BACKENDS)
def test_unknown_version_is_learnt_from_vtp(backend):
    codec = E.EnvelopeCodec(backend)
    value = _v99_value()
    with pytest.raises(E.UndecodableError, match="99"):
        codec.decode(value, None)
    with pytest.raises(E.UndecodableError, match="99"):
        codec.decode(value, [("lcs", b"\x01")])
    vtp = json.dumps(_v99_schema()).encode()
    env = codec.decode(value, [("vtp", vtp)])
    assert "shiny" not in env["producerMetadata"]  # resolved to the v14 reader
    assert E.payload_kind(env) == "PUT"
    # Archive rows carry headers as {key, value} structs; the learnt schema is kept for later records.
    assert codec.decode(value, [{"key": "vtp", "value": vtp}]) == env
    assert codec.decode(value, None) == env
    assert 99 in codec.known_versions()


def test_learnt_version_decodes_identically_with_both_backends():
    vtp = json.dumps(_v99_schema()).encode()
    got = [E.EnvelopeCodec(b).decode(_v99_value(), [("vtp", vtp)]) for b in BACKENDS]
    assert got[0] == got[1]


def test_garbage_vtp_is_undecodable_and_does_not_poison_the_codec():
    codec = E.EnvelopeCodec("fastavro")
    with pytest.raises(E.UndecodableError, match="vtp"):
        codec.decode(_v99_value(), [("vtp", b"{not json")])
    with pytest.raises(E.UndecodableError):
        codec.decode(_v99_value(), [("vtp", b'{"type": "nonsense"}')])
    env = codec.decode(_v99_value(), [("vtp", json.dumps(_v99_schema()).encode())])
    assert E.payload_kind(env) == "PUT"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "vtp",
    [
        b"\xff\xfe",
        b'"string"',
        b"[]",
        json.dumps({"type": "record", "name": "X", "fields": [{"name": "a", "type": "int"}]}).encode(),
    ],
)
def test_a_vtp_that_is_no_envelope_schema_makes_the_record_undecodable(backend, vtp):
    # Never another exception: a run must be able to turn this record into an UNDECODABLE row and go on.
    with pytest.raises(E.UndecodableError):
        E.EnvelopeCodec(backend).decode(_v99_value(), [("vtp", vtp)])


def test_an_unresolvable_vtp_is_not_kept():
    codec = E.EnvelopeCodec("cavro")
    bad = json.dumps({"type": "record", "name": "X", "fields": [{"name": "a", "type": "int"}]}).encode()
    with pytest.raises(E.UndecodableError, match="vtp"):
        codec.decode(_v99_value(), [("vtp", bad)])
    assert 99 not in codec.known_versions()
    assert E.payload_kind(codec.decode(_v99_value(), [("vtp", json.dumps(_v99_schema()).encode())])) == "PUT"


# -- undecodable values ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "value,reason",
    [
        (None, "empty"),
        (b"", "empty"),
        (b"\x17", "empty"),
        (b"\x16" + bytes.fromhex(PUT_V)[1:], "magic"),
        (bytes.fromhex(PUT_V)[:-7], "failed"),
        (bytes.fromhex(PUT_V)[:30], "failed"),
        (b"\x17\x63" + bytes.fromhex(PUT_V)[2:], "unknown protocol version 99"),
    ],
)
def test_undecodable_values(codecs, backend, value, reason):
    with pytest.raises(E.UndecodableError, match=reason):
        codecs[backend].decode(value)


def _with_message_type(value_hex: str, message_type: int) -> bytes:
    env = ref.decode_envelope(bytes.fromhex(value_hex))
    env["messageType"] = message_type
    return ref.encode_envelope(env)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "value_hex,message_type",
    [(PUT_V, 1), (PUT_V, 2), (PUT_V, 3), (RT_HB, 0), (RT_HB, 1), (RT_HB, 3), (RT_HB, 4)],
)
def test_message_type_that_contradicts_the_payload_branch_is_undecodable(
    codecs, backend, value_hex, message_type
):
    # §1.3 pitfall: branch indices are Put 0, Update 1, Delete 2, ControlMessage 3; messageType ints are
    # PUT 0, DELETE 1, CONTROL 2, UPDATE 3. A record whose two disagree is not a Venice record.
    with pytest.raises(E.UndecodableError, match="messageType"):
        codecs[backend].decode(_with_message_type(value_hex, message_type))


@pytest.mark.parametrize("backend", BACKENDS)
def test_branch_index_is_not_the_message_type(codecs, backend):
    ref_p = ref.RefProducer(GUID)
    recs = ref.flatten(ref_p.delete(b"k"), ref_p.update(b"k", b"u"))
    kinds = [E.payload_kind(codecs[backend].decode(r.value)) for r in recs]
    assert kinds == ["CONTROL", "DELETE", "UPDATE"]
    # On the wire, Delete is union branch 2 and Update branch 1 (zig-zag 4 and 2 right after producer metadata).
    delete_env = codecs[backend].decode(recs[1].value)
    assert delete_env["messageType"] == 1 and recs[1].value[2] == 2  # messageType 1 = zig-zag 0x02
    # messageType 4 (GLOBAL_RT_DIV) maps to a Put payload and is accepted as such.
    grd = _with_message_type(PUT_V, 4)
    assert E.payload_kind(codecs[backend].decode(grd)) == "PUT"


# -- interoperability with Venice's schema file ------------------------------------------------------------------


def _writer_records() -> list:
    w = SegmentWriter(GUID, host_name="writer:1", clock=iter(range(TS, TS + 1000)).__next__)
    out = []
    out += w.start_of_push(0, sorted_=True, chunked=True, compression_strategy=2)
    out += w.put(0, b"key", b"value", schema_id=3, logical_ts=77, rmd_version=1, rmd_payload=b"rmd")
    out += w.delete(0, b"key", rmd_version=1, rmd_payload=b"r2")
    out += w.update(0, b"key", b"upd", 3, 4)
    out += w.put(
        0, b"GLOBAL_RT_DIV_KEY.0.broker\x02\x00", b"state", schema_id=1, header=keys.HEADER_GLOBAL_RT_DIV
    )
    out += w.control(0, E.START_OF_INCREMENTAL_PUSH, {"version": "inc-1"})
    out += w.control(
        0,
        E.TOPIC_SWITCH,
        {"sourceKafkaServers": ["a:1"], "sourceTopicName": "s_rt", "rewindStartTimestamp": 5},
    )
    out += w.end_of_push(0)
    out += w.put(0, b"k2", b"v2", footer=E.leader_footer("leader:9", 123, 2, upstream_timestamp=TS))
    out += w.close()
    return out


def test_writer_output_decodes_with_venices_schema_file():
    recs = _writer_records()
    assert len(recs) == 13
    for r in recs:
        env = ref.decode_envelope(r.value)  # Venice's own v14 schema, no resolution, no trailing bytes
        # Re-encoding what Venice's schema read gives back the very same bytes.
        assert ref.encode_envelope(env) == r.value
        pm = env["producerMetadata"]
        assert pm["producerGUID"] == GUID and (pm["segmentNumber"], pm["messageSequenceNumber"]) == (
            r.segment,
            r.sequence,
        )
        name, body = env["payloadUnion"]
        header = r.key[0]
        if name.endswith("ControlMessage"):
            assert r.key == ref.control_key(GUID, r.segment, r.sequence) and env["messageType"] == 2
            assert pm["logicalTimestamp"] == -1
        elif name.endswith("Put"):
            assert header in (0, 8) and env["messageType"] == 0
        elif name.endswith("Delete"):
            assert header == 0 and env["messageType"] == 1
        else:
            assert header == 4 and env["messageType"] == 3
    put = ref.decode_envelope(recs[2].value)
    assert put["payloadUnion"][1] == {
        "putValue": b"value",
        "schemaId": 3,
        "replicationMetadataVersionId": 1,
        "replicationMetadataPayload": b"rmd",
    }
    assert put["producerMetadata"]["logicalTimestamp"] == 77
    assert put["leaderMetadataFooter"][1] == ref.default_footer("writer:1")[1]
    sop = ref.decode_envelope(recs[1].value)["payloadUnion"][1]["controlMessageUnion"]
    assert sop == (
        ref.NS + "StartOfPush",
        {
            "sorted": True,
            "chunked": True,
            "compressionStrategy": 2,
            "compressionDictionary": None,
            "timestampPolicy": 0,
        },
    )
    leader = ref.decode_envelope(recs[-2].value)["leaderMetadataFooter"][1]
    assert leader == {
        "hostName": "leader:9",
        "upstreamOffset": 123,
        "upstreamKafkaClusterId": 2,
        "upstreamPubSubPosition": bytes.fromhex("22010004f601"),
        "termId": -1,
        "upstreamMessageTimestamp": TS,
    }


def test_writer_vtp_header_is_venices_v14_schema():
    first = _writer_records()[0]
    assert [k for k, _ in first.headers] == ["vtp"]
    sent = fastavro.parse_schema(json.loads(first.headers[0][1]))
    assert to_parsing_canonical_form(sent) == to_parsing_canonical_form(ref.kme_schema())


def test_venice_encoded_records_decode_with_our_codec(codecs):
    p = ref.RefProducer(
        bytes.fromhex("ff" * 8 + "80" * 8), checksum_type=ref.MD5, host="venice:1", start_ms=TS
    )
    recs = ref.flatten(
        p.start_of_push(),
        p.put(b"a", b"1", schema_id=9),
        p.delete(b"a"),
        p.update(b"b", b"u", 2, 3),
        p.end_of_push(),
        p.end_segment(final=True),
    )
    for backend in BACKENDS:
        envs = [codecs[backend].decode(r.value, r.headers) for r in recs]
        assert [E.payload_kind(e) for e in envs] == [
            "CONTROL",
            "CONTROL",
            "PUT",
            "DELETE",
            "UPDATE",
            "CONTROL",
            "CONTROL",
        ]
        assert [e["producerMetadata"]["messageSequenceNumber"] for e in envs] == list(range(7))
        assert [E.control_type(e) for e in envs] == [2, 0, None, None, None, 1, 3]
        assert E.payload(envs[2]) == {
            "putValue": b"1",
            "schemaId": 9,
            "replicationMetadataVersionId": -1,
            "replicationMetadataPayload": b"",
        }
        assert E.control_body(envs[-1])["checksumValue"] == p.cs.value()
        assert E.control_body(envs[-1])["finalSegment"] is True
        # Decoding and re-encoding with our codec is byte-identical.
        assert [codecs[backend].encode(e) for e in envs] == [r.value for r in recs]


def test_decoded_envelopes_are_not_shared_between_calls(codecs):
    for backend in BACKENDS:
        a = codecs[backend].decode(bytes.fromhex(PUT_V))
        snapshot = copy.deepcopy(a)
        a["producerMetadata"]["segmentNumber"] = 99
        assert codecs[backend].decode(bytes.fromhex(PUT_V)) == snapshot


def test_md5_of_the_reference_agrees_with_hashlib():
    c = ref.RunningChecksum(ref.MD5)
    c.feed(b"abc")
    assert c.value() == hashlib.md5(b"abc").digest()


@pytest.mark.parametrize(
    ("content", "text"),
    [
        (b"\x18key-00001201", "key-00001201"),  # an Avro string: zig-zag length 12, then its bytes
        (b"\x02a", "a"),
        (b"\x00", ""),  # the empty string
        (b"\x02\x07", None),  # not printable
        (b"\x04a", None),  # the length says 2, one byte follows
        (b"\x02\xff", None),  # not UTF-8
        (b"", None),
        (b"\x80" * 12, None),  # a varint that never ends
    ],
)
def test_a_key_is_shown_as_text_only_when_it_is_a_printable_avro_string(content, text):
    assert keys.readable(content) == text
