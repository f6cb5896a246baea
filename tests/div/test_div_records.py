"""div.records: the one record loop — fields, decode errors as values, kinds, broker time in ms, footer source."""

from __future__ import annotations

import pyarrow as pa
import pytest
from vt_builder import CODEC, RegionVt

from div import envelope as E
from div import keys as K
from div.archive import records_to_batch
from div.positions import encode_offset
from div.records import (
    Kind,
    Record,
    footer_source,
    iter_records,
    kind,
    message_type,
)

TOPIC = "store_v1"
BASE_MS = 1_700_000_000_123  # not a multiple of 1000: a µs→ms slip would show


def _batch(vt: RegionVt, partition: int = 3) -> pa.RecordBatch:
    return records_to_batch(
        [
            (TOPIC, partition, off, r.key, r.value, BASE_MS + off, 0, r.headers)
            for off, r in enumerate(vt.records)
        ]
    )


@pytest.fixture(scope="module")
def chunked_log():
    vt = RegionVt(region=1, chunked=True)
    offsets = {
        "sop": vt.start_of_push(),
        "eop": vt.end_of_push(),
        "put": vt.put(b"k1", b"v1", src=0, rt_offset=10),
        "delete": vt.delete(b"k1", src=2, rt_offset=11),
        "heartbeat": vt.heartbeat(origin=1, origin_offset=12, vector=[10, 12, 11]),
        "manifest": vt.put(b"k2", b"x" * 25, src=0, rt_offset=13, chunk_size=10),
        "bad_magic": vt.raw(K.data_key(b"k3"), b"\x00\x0e garbage"),
        "null_value": vt.raw(K.data_key(b"k4"), None),
        "bad_key": vt.raw(b"\x09what", CODEC.encode(_envelope(E.DELETE))),
        "no_key": vt.raw(None, b"x"),
    }
    return vt, offsets


def _envelope(branch: str, footer=None) -> dict:
    body = (
        {
            "putValue": b"v",
            "schemaId": 1,
            "replicationMetadataVersionId": -1,
            "replicationMetadataPayload": b"",
        }
        if branch == E.PUT
        else {"schemaId": -1, "replicationMetadataVersionId": -1, "replicationMetadataPayload": b""}
    )
    return {
        "messageType": 0 if branch == E.PUT else 1,
        "producerMetadata": E.producer_metadata(b"\x01" * 16, 0, 0, BASE_MS),
        "payloadUnion": (branch, body),
        "leaderMetadataFooter": footer,
    }


def test_every_row_is_one_record_with_its_fields(chunked_log):
    vt, _ = chunked_log
    batch = _batch(vt)
    recs = list(iter_records(batch, E.EnvelopeCodec()))
    assert [type(r) for r in recs] == [Record] * len(vt.records)
    assert [r.offset for r in recs] == list(range(len(vt.records)))
    assert [r.key for r in recs] == [r.key for r in vt.records]
    assert [r.value for r in recs] == [r.value for r in vt.records]
    assert {(r.topic, r.partition) for r in recs} == {(TOPIC, 3)}


def test_time_is_the_broker_time_in_milliseconds(chunked_log):
    vt, _ = chunked_log
    recs = list(iter_records(_batch(vt), E.EnvelopeCodec()))
    assert [r.ms for r in recs] == [BASE_MS + off for off in range(len(vt.records))]


def test_each_record_type_has_its_kind(chunked_log):
    vt, at = chunked_log
    recs = list(iter_records(_batch(vt), E.EnvelopeCodec()))
    expected = {
        "sop": Kind.START_OF_PUSH,
        "eop": Kind.END_OF_PUSH,
        "put": Kind.PUT,
        "delete": Kind.DELETE,
        "heartbeat": Kind.HEARTBEAT,
        "manifest": Kind.MANIFEST,
        "bad_magic": Kind.UNDECODABLE,
        "null_value": Kind.UNDECODABLE,
        "bad_key": Kind.UNDECODABLE,
        "no_key": Kind.UNDECODABLE,
    }
    assert {name: recs[off].kind for name, off in at.items()} == expected
    chunks = [r for r in recs if r.kind == Kind.CHUNK]
    assert len(chunks) == 3 and all(r.env is not None and r.key[0] == K.HEADER_PUT_OR_DELETE for r in chunks)
    # the DIV producer's own segment start is a control message of its own kind, not a heartbeat
    assert message_type(recs[at["heartbeat"]].env) == Kind.CONTROL


def test_undecodable_records_come_with_their_reason_not_an_exception(chunked_log):
    vt, at = chunked_log
    recs = list(iter_records(_batch(vt), E.EnvelopeCodec()))
    reasons = {name: recs[at[name]].error for name in ("bad_magic", "null_value", "bad_key", "no_key")}
    assert "magic" in reasons["bad_magic"]
    assert "empty" in reasons["null_value"]
    assert (
        reasons["bad_key"] == "unknown Venice key header byte 9"
    )  # the value decodes; the key is not Venice's
    assert reasons["no_key"].startswith("empty Kafka key")
    assert all(recs[at[name]].env is None for name in reasons)
    assert all(
        r.error is None and r.env is not None
        for i, r in enumerate(recs)
        if i not in {at[name] for name in reasons}
    )


def test_a_batch_with_some_columns_only():
    vt = RegionVt(region=0)
    vt.put(b"k", b"v", src=2, rt_offset=5)
    table = pa.table({"offset": [7], "key": [vt.records[0].key], "value": [vt.records[0].value]})
    (rec,) = iter_records(table, E.EnvelopeCodec())
    assert (rec.offset, rec.kind, rec.ms, rec.headers, rec.topic, rec.partition) == (
        7,
        Kind.PUT,
        None,
        None,
        None,
        None,
    )
    assert list(iter_records(table.slice(0, 0), E.EnvelopeCodec())) == []


def test_a_batch_of_several_partitions_keeps_each_records_partition():
    vt = RegionVt(region=0)
    vt.put(b"k", b"v", src=2, rt_offset=5)
    r = vt.records[0]
    batch = records_to_batch([(TOPIC, p, 0, r.key, r.value, BASE_MS, 0, None) for p in (0, 1, 0)])
    assert [rec.partition for rec in iter_records(batch, E.EnvelopeCodec())] == [0, 1, 0]


def test_kind_follows_the_key_header():
    put = _envelope(E.PUT)
    assert kind(K.data_key(b"k"), put) == Kind.PUT
    assert (
        kind(bytes([K.HEADER_GLOBAL_RT_DIV]) + b"k", put) == Kind.GLOBAL_RT_DIV
    )  # a Put told apart by header
    assert kind(K.control_key(b"\x01" * 16, 0, 1), put) == Kind.OTHER  # a Put under a control key
    assert kind(K.update_key(b"k"), put) == Kind.OTHER
    assert kind(K.HEARTBEAT_KEY, put) == Kind.HEARTBEAT
    assert kind(K.data_key(b"k"), None) == Kind.UNDECODABLE
    assert kind(b"", put) == Kind.UNDECODABLE
    assert kind(b"\x07k", put) == Kind.UNDECODABLE
    assert message_type(put) == Kind.PUT and message_type(_envelope(E.DELETE)) == Kind.DELETE


def test_control_kinds_are_venices_control_message_types():
    order = [
        Kind.START_OF_PUSH,
        Kind.END_OF_PUSH,
        Kind.START_OF_SEGMENT,
        Kind.END_OF_SEGMENT,
        Kind.START_OF_BUFFER_REPLAY,
        Kind.START_OF_INCREMENTAL_PUSH,
        Kind.END_OF_INCREMENTAL_PUSH,
        Kind.TOPIC_SWITCH,
        Kind.VERSION_SWAP,
    ]
    assert [k.name.replace("_", "") for k in order] == [n.upper() for n in E.CONTROL_NAMES]
    key = K.control_key(b"\x01" * 16, 0, 1)
    for ctype, expected in enumerate(order):
        env = {"payloadUnion": (E.CONTROL, {"controlMessageType": ctype})}
        assert kind(key, env) == expected
    assert kind(key, {"payloadUnion": (E.CONTROL, {"controlMessageType": 99})}) == Kind.CONTROL


def test_kinds_fit_the_int8_column_they_are_stored_in():
    assert all(0 <= k < 128 for k in Kind)
    assert pa.array(list(Kind), pa.int8()).to_pylist() == [int(k) for k in Kind]


def test_footer_source_reads_the_position_with_venices_fallback():
    def footer(offset: int, position: bytes) -> tuple:
        name, f = E.leader_footer("h", offset, 2)
        return name, {**f, "upstreamPubSubPosition": position}

    assert footer_source(_envelope(E.PUT, footer(41, encode_offset(41)))) == (2, 41)
    assert footer_source(_envelope(E.PUT, footer(41, b""))) == (2, 41)  # no blob: the legacy long
    assert footer_source(_envelope(E.PUT, footer(41, encode_offset(50)))) == (2, 50)  # a later blob wins
    assert footer_source(_envelope(E.PUT, footer(41, encode_offset(10)))) == (
        2,
        41,
    )  # an earlier one does not
    assert footer_source(_envelope(E.PUT, None)) is None
    decoded = CODEC.decode(CODEC.encode(_envelope(E.PUT, E.leader_footer("h", 77, 1))))
    assert footer_source(decoded) == (1, 77)
