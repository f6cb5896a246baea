"""The hand-written encoders on hot write paths give fastavro's bytes exactly.

A leader encodes an envelope, an RMD and a position blob per record; doing that by hand instead of through
fastavro's generic writer is what lets the simulator reach its goal size. These tests generate many values,
edge values included (negative, zero, int32 and int64 limits, empty and long byte strings, unicode host names,
missing fields that have defaults), and compare the bytes with the parsed-schema reference.
"""

from __future__ import annotations

import random

import pytest

from div import avro_bits, positions
from div import envelope as E
from div.rmd import encode_value_level_rmd, encode_value_level_rmd_reference

INT32 = [0, 1, -1, 63, 64, -64, -65, 8191, 8192, -8192, -8193, 2**31 - 1, -(2**31)]
INT64 = INT32 + [2**31, -(2**31) - 1, 1_700_000_000_123, 2**63 - 1, -(2**63)]


def _int32(rng: random.Random) -> int:
    return rng.choice(INT32) if rng.random() < 0.3 else rng.randint(-(2**31), 2**31 - 1)


def _int64(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.3:
        return rng.choice(INT64)
    if r < 0.6:
        return rng.randint(-10_000, 10_000)
    return rng.randint(-(2**63), 2**63 - 1)


def _bytes(rng: random.Random) -> bytes:
    return rng.randbytes(rng.choice([0, 1, 3, 60, 200, 5000]))


def _footer(rng: random.Random):
    if rng.random() < 0.15:
        return None
    f = {
        "hostName": rng.choice(["", "dc0-p1-leader-t1", "hôte-ü-漢字", "h" * 300]),
        "upstreamOffset": _int64(rng),
        "upstreamKafkaClusterId": _int32(rng),
        "upstreamPubSubPosition": rng.choice(
            [positions.EARLIEST_BLOB, positions.encode_offset(rng.randint(0, 2**40)), b""]
        ),
        "termId": _int64(rng),
        "upstreamMessageTimestamp": _int64(rng),
    }
    for name in ("upstreamOffset", "upstreamKafkaClusterId", "termId", "upstreamMessageTimestamp"):
        if rng.random() < 0.1:
            del f[name]  # the reader schema's default fills it in
    return (E.LEADER_METADATA, f)


def _envelope(rng: random.Random) -> dict:
    kind = rng.choice(["PUT", "DELETE", "UPDATE"])
    if kind == "PUT":
        body = {
            "putValue": _bytes(rng),
            "schemaId": _int32(rng),
            "replicationMetadataVersionId": _int32(rng),
            "replicationMetadataPayload": _bytes(rng),
        }
        payload = (E.PUT, body)
    elif kind == "DELETE":
        body = {
            "schemaId": _int32(rng),
            "replicationMetadataVersionId": _int32(rng),
            "replicationMetadataPayload": _bytes(rng),
        }
        payload = (E.DELETE, body)
    else:
        payload = (
            E.UPDATE,
            {"schemaId": _int32(rng), "updateSchemaId": _int32(rng), "updateValue": _bytes(rng)},
        )
    env = {
        "messageType": E.MESSAGE_TYPE[kind],
        "producerMetadata": E.producer_metadata(
            rng.randbytes(16), _int32(rng), _int32(rng), _int64(rng), _int64(rng)
        ),
        "payloadUnion": payload,
    }
    footer = _footer(rng)
    if footer is not None or rng.random() < 0.5:
        env["leaderMetadataFooter"] = footer
    return env


def _outcome(fn, env):
    try:
        return fn(env)
    except Exception as exc:  # noqa: BLE001 - the outcome compared is the exception's type
        return type(exc)


def test_data_envelopes_are_byte_identical_to_fastavro():
    rng = random.Random(7)
    codec = E.EnvelopeCodec()
    for i in range(3000):
        env = _envelope(rng)
        assert codec.encode(env) == codec.encode_reference(env), (i, env)
        assert E._encode_data(env) is not None, env  # the hand-written path took it


def test_control_messages_and_input_fastavro_rejects_go_through_fastavro():
    codec = E.EnvelopeCodec()
    sos = {
        "messageType": 2,
        "producerMetadata": E.producer_metadata(b"\x01" * 16, 0, 0, 5),
        "payloadUnion": E.control_message(E.START_OF_SEGMENT, {"checksumType": 3, "upcomingAggregates": []}),
        "leaderMetadataFooter": E.default_footer("w"),
    }
    assert E._encode_data(sos) is None and codec.encode(sos) == codec.encode_reference(sos)
    good = {
        "messageType": 0,
        "producerMetadata": E.producer_metadata(b"\x01" * 16, 0, 1, 5),
        "payloadUnion": (
            E.PUT,
            {
                "putValue": b"v",
                "schemaId": 1,
                "replicationMetadataVersionId": -1,
                "replicationMetadataPayload": b"",
            },
        ),
        "leaderMetadataFooter": E.leader_footer("h", 5, 1),
    }
    odd = [
        {**good, "producerMetadata": {**good["producerMetadata"], "producerGUID": b"\x01" * 15}},
        {**good, "payloadUnion": (E.PUT, {"putValue": "text", "schemaId": 1})},
        {
            **good,
            "payloadUnion": (E.PUT, {"putValue": b"v", "schemaId": True, "replicationMetadataPayload": b""}),
        },
        {
            **good,
            "payloadUnion": (E.PUT, {"putValue": b"v", "schemaId": 1}),
        },  # bytes default: fastavro's call
        {**good, "payloadUnion": (E.DELETE, {})},
        {**good, "messageType": 2**40},
        {**good, "messageType": 1.0},
        {**good, "messageType": 2**70},
        {
            **good,
            "leaderMetadataFooter": (E.LEADER_METADATA, {**good["leaderMetadataFooter"][1], "termId": False}),
        },
        {**good, "leaderMetadataFooter": (E.LEADER_METADATA, {"hostName": "h"})},
        {**good, "extra": 1},
    ]
    assert E._encode_data(good) is not None
    for env in odd:
        assert _outcome(codec.encode, env) == _outcome(codec.encode_reference, env), env


@pytest.mark.parametrize("seed", range(3))
def test_value_level_rmd_is_byte_identical_to_fastavro(seed):
    rng = random.Random(seed)
    for _ in range(2000):
        vector = [_int64(rng) for _ in range(rng.choice([0, 0, 1, 2, 3, 7, 40]))]
        ts = _int64(rng)
        assert encode_value_level_rmd(ts, vector) == encode_value_level_rmd_reference(ts, vector)


def test_write_long_matches_the_varint_definition_across_the_small_table_edges():
    for n in [*INT64, *range(-8300, 8300)]:
        assert avro_bits.write_long(n) == avro_bits._write_long_slow(n)
        assert avro_bits.read_long(avro_bits.write_long(n), 0) == (n, len(avro_bits.write_long(n)))
