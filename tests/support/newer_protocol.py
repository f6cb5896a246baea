"""Envelopes from a producer newer than us, for the schema-resolution tests (tests/pipelines/div/test_newer_protocol.py).

A Venice release after ours may change the KafkaMessageEnvelope: insert fields (anywhere in a record, not only at
the end), add union branches (a new payload kind, a new control message), and bump the protocol version byte. Its
writers announce the schema in the `vtp` header of every segment-0/sequence-0 message (first SOS, heartbeats). A
reader resolves that writer schema against its own, so every record it knows the kind of decodes to exactly what
the older writer would have produced; a record of a kind it does not know (a new branch) is undecodable.

`newer_schema` builds such a schema from our v15 (fields inserted in ProducerMetadata, Put and LeaderMetadata; a
new payload branch inserted *first*, so every old branch index moves; a new control message appended).
`reencode_archive` rewrites an archive as that producer would have written it: same records, newer bytes, the
newer schema in every `vtp` header.
"""

from __future__ import annotations

import copy
import functools
import io
import json
import os

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
from damage import read_archive

from div import archive
from div import envelope as E
from div import envelope_versions as ev

NEW_PAYLOAD = E.NS + "Frobnicate"
NEW_CONTROL = E.NS + "TierMove"


def _record(schema: dict, name: str) -> dict:
    found = ev._find_record(schema, name)
    assert found is not None, name
    return found


def _field(record: dict, name: str) -> dict:
    return next(f for f in record["fields"] if f["name"] == name)


def _insert_after(record: dict, after: str, field: dict) -> None:
    i = next(i for i, f in enumerate(record["fields"]) if f["name"] == after)
    record["fields"].insert(i + 1, field)


def newer_schema() -> dict:
    """Our v15 with fields inserted mid-record and union branches added (one before every old branch)."""
    s = ev.writer_schema(15)
    _insert_after(
        _record(s, "ProducerMetadata"),
        "producerGUID",
        {"name": "producerRegion", "type": "string", "default": ""},
    )
    _insert_after(
        _record(s, "Put"), "putValue", {"name": "compressionHint", "type": ["null", "int"], "default": None}
    )
    _insert_after(
        _record(s, "LeaderMetadata"), "hostName", {"name": "upstreamPartition", "type": "int", "default": -1}
    )
    _field(s, "payloadUnion")["type"].insert(
        0, {"type": "record", "name": NEW_PAYLOAD, "fields": [{"name": "blob", "type": "bytes"}]}
    )
    control = _record(s, "ControlMessage")
    _field(control, "controlMessageUnion")["type"].append(
        {"type": "record", "name": NEW_CONTROL, "fields": [{"name": "tier", "type": "string"}]}
    )
    return s


def newer_vtp() -> bytes:
    return json.dumps(newer_schema()).encode()


@functools.cache
def _parsed():
    return fastavro.parse_schema(newer_schema())


def to_newer(env: dict) -> dict:
    """A decoded v14 envelope as the newer writer would fill it (the inserted fields carry non-default values)."""
    env = copy.deepcopy(env)
    env["producerMetadata"]["producerRegion"] = "elsewhere"
    name, body = env["payloadUnion"]
    if name == E.PUT:
        body["compressionHint"] = 3
    if name == E.CONTROL and body["controlMessageType"] == E.END_OF_SEGMENT:
        E.control_body(env).setdefault("gracefulLeadershipHandoff", False)
    footer = env.get("leaderMetadataFooter")
    if footer is not None:
        footer[1]["upstreamPartition"] = 5
    return env


def encode_newer(env: dict, version: int) -> bytes:
    buf = io.BytesIO()
    buf.write(bytes([E.MAGIC, version & 0xFF]))
    fastavro.schemaless_writer(buf, _parsed(), env)
    return buf.getvalue()


def new_payload_value(template: dict, version: int) -> bytes:
    """A record of the new payload kind, with `template`'s producer metadata (a kind no older reader knows)."""
    env = to_newer(template)
    env["payloadUnion"] = (NEW_PAYLOAD, {"blob": b"\x01\x02"})
    env["messageType"] = 5
    return encode_newer(env, version)


def announced_first():
    """A `headers_of` for `reencode_rows`: the newer schema in a `vtp` header on each partition's first re-encoded
    row only (rows in offset order), where the records' own headers had none; the rest decode by what it taught."""
    seen: set[int] = set()

    def headers_of(r: dict) -> list:
        kept = _with_vtp(r["headers"])
        if r["partition"] in seen:
            return kept
        seen.add(r["partition"])
        return [h for h in kept if h["key"] != "vtp"] + [{"key": "vtp", "value": newer_vtp()}]

    return headers_of


def _with_vtp(headers):
    return [
        {"key": h["key"], "value": newer_vtp() if h["key"] == "vtp" else h["value"]} for h in headers or []
    ]


def reencode_rows(rows: list[dict], version: int, headers_of) -> int:
    """Re-encode, in place, every decodable value of archive rows (pylist form) by the newer writer as `version`;
    each re-encoded row's headers become `headers_of(row)`. Returns how many were re-encoded."""
    codec = E.EnvelopeCodec("fastavro")
    done = 0
    for r in rows:
        try:
            env = codec.decode(r["value"], r["headers"])
        except E.UndecodableError:
            continue
        r["value"] = encode_newer(to_newer(env), version)
        r["headers"] = headers_of(r)
        done += 1
    return done


def reencode_archive(src: str | os.PathLike, dst: str | os.PathLike, version: int, headers_of=None) -> int:
    """Copy archive `src` to `dst` with every decodable value re-encoded by the newer writer as `version`; the
    `vtp` headers announce the newer schema (`headers_of(row)`: each re-encoded row's headers instead). Returns how
    many values were re-encoded."""
    rows = read_archive(src).to_pylist()
    done = reencode_rows(rows, version, headers_of or (lambda r: _with_vtp(r["headers"])))
    os.makedirs(dst)
    pq.write_table(
        pa.Table.from_pylist(rows, archive.KAFKA_ARROW_SCHEMA), os.path.join(dst, "records.parquet")
    )
    return done
