"""Our ChunkedKeySuffix / ChunkedValueManifest schema files produce Venice's bytes (venice-protocol-notes §1.7)."""

from __future__ import annotations

import io
import json
import pathlib

import fastavro

SCHEMAS = pathlib.Path(__file__).resolve().parents[2] / "div" / "schemas"


def _load(name: str):
    return fastavro.parse_schema(json.loads((SCHEMAS / name).read_text(encoding="utf-8")))


def _encode(schema, datum) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, datum)
    return buf.getvalue()


def test_non_chunk_key_suffix_is_02_00():
    suffix = _load("ChunkedKeySuffix.avsc")
    assert _encode(suffix, {"chunkId": None, "isChunk": False}) == b"\x02\x00"


def test_chunk_key_suffix_layout_and_round_trip():
    suffix = _load("ChunkedKeySuffix.avsc")
    guid = bytes(range(16))
    datum = {
        "chunkId": {"producerGUID": guid, "segmentNumber": 1, "messageSequenceNumber": 70, "chunkIndex": 3},
        "isChunk": True,
    }
    raw = _encode(suffix, datum)
    # branch 0 (ChunkId) ‖ GUID ‖ zig-zag ints 1, 70, 3 ‖ true
    assert raw == b"\x00" + guid + b"\x02" + b"\x8c\x01" + b"\x06" + b"\x01"
    assert fastavro.schemaless_reader(io.BytesIO(raw), suffix, None) == datum
    assert suffix["fields"][0]["type"][0]["name"] == "com.linkedin.venice.storage.protocol.ChunkId"
    assert (
        suffix["fields"][0]["type"][0]["fields"][0]["type"]["name"]
        == "com.linkedin.venice.kafka.protocol.GUID"
    )


def test_manifest_round_trip():
    manifest = _load("ChunkedValueManifest.avsc")
    assert manifest["name"] == "com.linkedin.venice.storage.protocol.ChunkedValueManifest"
    datum = {
        "keysWithChunkIdSuffix": [b"k\x00" + bytes(16) + b"\x00\x00\x00\x01", b"k2"],
        "schemaId": 7,
        "size": 2_000_000,
    }
    raw = _encode(manifest, datum)
    assert raw[0] == 0x04  # array block of two keys comes first
    assert fastavro.schemaless_reader(io.BytesIO(raw), manifest, None) == datum
