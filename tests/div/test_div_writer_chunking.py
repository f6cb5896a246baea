"""`SegmentWriter.put_large`: a large value written as VeniceWriter.putLargeValue writes it (venice-protocol-notes
§1.7), read back through this repo's own chunk readers.

The records are decoded with Venice's schema file (tests/support/venice_reference.py), the chunk suffixes with the
`ChunkedKeySuffix` schema through fastavro, the manifest with `div.records.manifest_chunk_keys`, and the value put
back together by change capture (`heartbeat.change_events.PartitionChanges`, a chunked version); DIV
(`div.validator.PartitionValidator`) checks sequence numbers and the EndOfSegment checksum.
"""

from __future__ import annotations

import io

import fastavro
import pyarrow as pa
import pytest
import venice_reference as ref

from div import envelope as E
from div import keys, schemas
from div.records import Kind, kind, manifest_chunk_keys
from div.validator import PartitionValidator
from div.writer import MAX_PAYLOAD_BYTES, SegmentWriter, ValueTooLargeError, encode_manifest
from heartbeat.change_events import PartitionChanges
from heartbeat.changes import PartitionState

GUID = bytes.fromhex("00112233445566778899aabbccddeeff")
T0 = 1_700_000_000_000
KEY = b"\x10user-key"
SUFFIX = fastavro.parse_schema(schemas.load_json("ChunkedKeySuffix.avsc"))


def _value(n: int) -> bytes:
    return bytes((i * 7 + i // 251) & 0xFF for i in range(n))


def _suffix(content: bytes) -> dict:
    return fastavro.schemaless_reader(io.BytesIO(content[len(KEY) :]), SUFFIX, None)


def _write(value: bytes, **kw):
    w = SegmentWriter(GUID, clock=lambda: T0)
    # an earlier write (in a chunked version every data key has a suffix): the chunks do not start at 1
    recs = w.put(3, b"\x10before" + keys.NON_CHUNK_SUFFIX, b"small")
    recs += w.put_large(3, KEY, value, 7, logical_ts=T0 - 5, **kw)
    return recs + w.close()


def _batch(recs) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([r.key for r in recs], pa.binary()),
            "value": pa.array([r.value for r in recs], pa.binary()),
            "offset": pa.array(range(len(recs)), pa.int64()),
        }
    )


def test_a_large_value_is_chunks_then_a_manifest_in_one_segment():
    value = _value(2_500_000)
    recs = _write(value)
    envs = [ref.decode_envelope(r.value) for r in recs]
    kinds = [kind(r.key, E.EnvelopeCodec().decode(r.value)) for r in recs]
    # SOS, the earlier Put, three chunks (2.5 MB / (950 KiB - key)), the manifest, EOS
    assert kinds == [Kind.START_OF_SEGMENT, Kind.PUT, *[Kind.CHUNK] * 3, Kind.MANIFEST, Kind.END_OF_SEGMENT]
    assert [(r.segment, r.sequence) for r in recs] == [(0, i) for i in range(7)]
    assert all(len(r.key) + len(r.value) < 1_000_000 for r in recs), "every record fits Kafka's 1 MB default"
    chunks, manifest = recs[2:5], recs[5]
    available = MAX_PAYLOAD_BYTES - len(KEY)
    payloads = []
    for i, (r, env) in enumerate(zip(chunks, envs[2:5], strict=True)):
        body = env["payloadUnion"][1]
        pm = env["producerMetadata"]
        assert body["schemaId"] == -10 and body["replicationMetadataVersionId"] == -1
        assert pm["logicalTimestamp"] == -1, "Venice sends chunks with VENICE_DEFAULT_LOGICAL_TS"
        assert E.footer(E.EnvelopeCodec().decode(r.value))["upstreamKafkaClusterId"] == -1, (
            "the default footer"
        )
        assert r.key[1 : 1 + len(KEY)] == KEY
        chunk_id = _suffix(r.key[1:])
        assert chunk_id["isChunk"] is True
        assert chunk_id["chunkId"] == {
            "producerGUID": GUID,
            "segmentNumber": 0,
            "messageSequenceNumber": 2,  # the first chunk's, on every chunk
            "chunkIndex": i,
        }
        assert len(body["putValue"]) == (available if i < 2 else len(value) - 2 * available)
        payloads.append(body["putValue"])
    assert b"".join(payloads) == value
    menv = envs[5]
    mbody = menv["payloadUnion"][1]
    assert manifest.key == b"\x00" + KEY + b"\x02\x00", (
        "the manifest's key: the key with the non-chunk suffix"
    )
    assert mbody["schemaId"] == -20
    assert menv["producerMetadata"]["logicalTimestamp"] == T0 - 5
    assert manifest_chunk_keys(mbody["putValue"]) == ([r.key[1:] for r in chunks], 7)
    assert keys.strip_non_chunk_suffix(manifest.key[1:]) == KEY


def test_change_capture_puts_the_value_back_together_and_div_finds_nothing():
    value = _value(2_500_000)
    recs = _write(value)
    stream = PartitionChanges(3, PartitionState(0, 0, (-1,), (-1,), chunked=True))
    events = stream.feed(_batch(recs))
    assert stream.problems == []
    assert [(e.key, e.op, e.schema_id) for e in events] == [(b"\x10before", "PUT", 1), (KEY, "PUT", 7)]
    big = events[1]
    assert big.value == value and big.logical_ts == T0 - 5
    codec = E.EnvelopeCodec("fastavro")
    v = PartitionValidator()
    findings = [
        f for i, r in enumerate(recs) for f in v.process(i, r.key, codec.decode(r.value, r.headers), T0)
    ]
    assert findings == []


def test_a_value_within_the_limit_is_one_put_under_the_non_chunk_key():
    w = SegmentWriter(GUID, clock=lambda: T0)
    recs = w.put_large(0, KEY, b"v" * 100, 7, logical_ts=5)
    env = ref.decode_envelope(recs[-1].value)
    assert recs[-1].key == b"\x00" + KEY + b"\x02\x00"
    assert env["payloadUnion"][1]["schemaId"] == 7 and env["producerMetadata"]["logicalTimestamp"] == 5
    # exactly at the limit (key + value): still one message, as VeniceWriter's `>` test
    recs = w.put_large(0, KEY, b"v" * (MAX_PAYLOAD_BYTES - len(KEY)), 7)
    assert len(recs) == 1


def test_a_segment_due_to_roll_rolls_before_the_first_chunk():
    t = [T0]
    w = SegmentWriter(GUID, clock=lambda: t[0], max_segment_age_ms=1000)
    w.put(0, b"\x10a", b"x")
    t[0] += 5000
    recs = w.put_large(0, KEY, _value(2_000_000), 1, max_payload=1_000_000)
    # EOS of segment 0, SOS of segment 1, three chunks (2 MB over 1 MB - 9 bytes), the manifest
    assert [(r.segment, r.sequence) for r in recs] == [(0, 2), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4)]
    assert _suffix(recs[2].key[1:])["chunkId"]["segmentNumber"] == 1


def test_what_venice_cannot_chunk_is_refused():
    w = SegmentWriter(GUID, clock=lambda: T0)
    with pytest.raises(ValueTooLargeError, match="key"):
        w.put_large(0, b"k" * 600, b"v" * 2000, 1, max_payload=1000)
    with pytest.raises(ValueTooLargeError, match="manifest"):
        w.put_large(0, b"k" * 100, b"v" * 200_000, 1, max_payload=1000)  # 223 chunk keys of ~125 bytes
    assert w.segment_state(0) is None or w.segment_state(0).next_sequence <= 1


def test_the_manifest_encoding_is_avros():
    parsed = fastavro.parse_schema(schemas.load_json("ChunkedValueManifest.avsc"))
    for ks in ([], [b"a"], [b"x" * 200, b"", b"yz"]):
        data = encode_manifest(ks, -3, 12345)
        got = fastavro.schemaless_reader(io.BytesIO(data), parsed, None)
        assert got == {"keysWithChunkIdSuffix": ks, "schemaId": -3, "size": 12345}
