"""Kafka values as Venice writes them: magic 23, protocol version, Avro `KafkaMessageEnvelope` (Venice's KafkaValueSerializer).

Decoded envelopes are plain dicts in fastavro's shape with record unions as `(full name, dict)` tuples, so the
payload kind is always read from the union branch *name* — never from `messageType`, whose numbering differs from
the branch order (Put=0, Update=1, Delete=2, ControlMessage=3 vs PUT=0, DELETE=1, CONTROL_MESSAGE=2, UPDATE=3).

Two decoders give identical dicts: cavro (about 3× faster here) and fastavro (the reference). Both run on parsed
schemas. Every writer schema is resolved against our v14 reader schema (Avro schema resolution: fields matched by
name, unknown fields skipped, missing ones defaulted, union branches matched by name). Writer schemas come from two
places: the versions we ship (`envelope_versions`), and the `vtp` header (the writer's schema as JSON), which every
segment-0/sequence-0 message carries, heartbeats included. The header is the writer's own word, so it wins: a
version we do not ship is learnt from it, and a shipped version whose header announces a different schema (a fork,
or a Venice release that changed a version after we copied it) is decoded with the announced schema from then on.
"""

from __future__ import annotations

import io
import json
import os
import threading
from collections.abc import Iterable
from typing import Any

import fastavro
import fastavro.schema

from . import schemas
from .avro_bits import write_long
from .heartbeat_headers import header_value

MAGIC = 23
CURRENT_VERSION = 14
NS = "com.linkedin.venice.kafka.protocol."
PUT, UPDATE, DELETE, CONTROL = NS + "Put", NS + "Update", NS + "Delete", NS + "ControlMessage"
LEADER_METADATA = NS + "LeaderMetadata"
KME_NAME = NS + "KafkaMessageEnvelope"
PAYLOAD_KIND = {PUT: "PUT", UPDATE: "UPDATE", DELETE: "DELETE", CONTROL: "CONTROL"}
MESSAGE_TYPE = {"PUT": 0, "DELETE": 1, "CONTROL": 2, "UPDATE": 3}

# controlMessageType ints (Venice's ControlMessageType); the controlMessageUnion branch order equals them.
START_OF_PUSH, END_OF_PUSH, START_OF_SEGMENT, END_OF_SEGMENT = 0, 1, 2, 3
START_OF_BUFFER_REPLAY, START_OF_INCREMENTAL_PUSH, END_OF_INCREMENTAL_PUSH = 4, 5, 6
TOPIC_SWITCH, VERSION_SWAP = 7, 8
CONTROL_RECORD_NAMES = [
    NS + n
    for n in (
        "StartOfPush",
        "EndOfPush",
        "StartOfSegment",
        "EndOfSegment",
        "StartOfBufferReplay",
        "StartOfIncrementalPush",
        "EndOfIncrementalPush",
        "TopicSwitch",
        "VersionSwap",
    )
]
CONTROL_NAMES = [n.rsplit(".", 1)[1] for n in CONTROL_RECORD_NAMES]


class UndecodableError(ValueError):
    """A value that cannot be decoded as a Venice envelope; the message says why (for UNDECODABLE rows)."""


def learned_versions(saved: dict | None) -> dict[int, Any]:
    """`EnvelopeCodec.learned()` back from its JSON form (versions as strings), as a state file keeps it."""
    return {int(v): s for v, s in (saved or {}).items()}


class EnvelopeCodec:
    """Encodes v14 envelopes and decodes every known version; learns unknown versions from `vtp` headers.

    One instance per thread or task: it caches decoders and learnt schemas.
    """

    def __init__(self, backend: str | None = None) -> None:
        backend = backend or os.environ.get("TIDEGAUGE_DECODER", "auto")
        if backend == "auto":
            try:
                import cavro  # noqa: F401

                backend = "cavro"
            except ImportError:
                backend = "fastavro"
        if backend not in ("cavro", "fastavro"):
            raise ValueError(f"unknown decoder backend {backend!r} (use cavro or fastavro)")
        self.backend = backend
        self._reader_json = schemas.load_json("KafkaMessageEnvelope.v14.avsc")
        self._reader = fastavro.parse_schema(self._reader_json)
        self._writer_json: dict[int, Any] = {}
        self._vtp_seen: dict[
            int, bytes
        ] = {}  # by raw version byte: the last vtp header already taken into account
        self._canonical: dict[int, str] = {}  # by protocol version: canonical form of the schema in use
        self._decoders: dict[int, Any] = {}  # by protocol version
        self._by_byte: dict[int, Any] = {}  # by the raw version byte: the per-record lookup
        self._lock = threading.Lock()
        self._encoder = self._make_encoder()

    @classmethod
    def knowing(cls, learned: dict[int, Any]) -> EnvelopeCodec:
        """A new codec given what another had learnt (its `learned()`): it decodes the next record as that one
        would. How a run carried from one micro-batch or task to the next goes on."""
        codec = cls()
        for version, schema in sorted(learned.items()):
            codec.learn(version, schema)
        return codec

    # -- schemas ---------------------------------------------------------------------------------
    def known_versions(self) -> list[int]:
        return sorted(set(schemas.envelope_versions()) | set(self._writer_json))

    def learn(self, version: int, writer_schema_json: str | bytes | dict) -> None:
        """Register the writer schema of protocol `version` (e.g. from a `vtp` header).

        Raises UndecodableError, and keeps nothing, when the header is not JSON, not an Avro schema, or a schema
        our decoder cannot resolve against the v14 reader: a garbage vtp must not poison the cache nor stop a run.
        """
        try:
            schema = (
                json.loads(writer_schema_json)
                if isinstance(writer_schema_json, (str, bytes))
                else writer_schema_json
            )
            parsed = fastavro.parse_schema(schema, _force=True)
        except Exception as exc:
            raise UndecodableError(
                f"vtp header for protocol version {version} is not a valid Avro schema: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(parsed, dict) or parsed.get("name") != KME_NAME:
            raise UndecodableError(
                f"vtp header for protocol version {version} is an Avro schema, but not of a {KME_NAME}"
            )
        with self._lock:
            previous = self._writer_json.get(version)
            self._writer_json[version] = schema
            self._decoders.pop(version, None)
            self._by_byte.pop(version & 0xFF, None)
            try:
                self._decoder_for(version)
            except Exception as exc:
                if previous is None:
                    del self._writer_json[version]
                else:
                    self._writer_json[version] = previous
                self._decoders.pop(version, None)
                raise UndecodableError(
                    f"vtp header for protocol version {version} is not a KafkaMessageEnvelope "
                    f"schema we can resolve: {type(exc).__name__}: {exc}"
                ) from None
            self._canonical.pop(version, None)

    def learned(self) -> dict[int, Any]:
        """The writer schemas this codec took from `vtp` headers, by protocol version: all that sets it apart from a
        new codec (the rest is caches). A new codec given them with `learn` decodes the next record as this one
        would, header or not: how a run resumed elsewhere goes on."""
        with self._lock:
            return dict(self._writer_json)

    def _writer_schema(self, version: int) -> Any | None:
        if version in self._writer_json:
            return self._writer_json[version]
        return schemas.envelope_writer_schema(version)

    def _decoder_for(self, version: int):
        dec = self._decoders.get(version)
        if dec is not None:
            return dec
        writer = self._writer_schema(version)
        if writer is None:
            return None
        same = version == CURRENT_VERSION and version not in self._writer_json
        if self.backend == "cavro":
            dec = self._cavro_decoder(writer, same)
        else:
            parsed_writer = fastavro.parse_schema(writer, _force=True)
            reader = None if same else self._reader
            schemaless_reader = fastavro.schemaless_reader

            if same:

                def dec(buf: bytes, _w=parsed_writer):
                    return schemaless_reader(io.BytesIO(buf), _w, None, return_record_name=True)
            else:

                def dec(buf: bytes, _w=parsed_writer, _r=reader):
                    return _bytes_defaults(
                        schemaless_reader(io.BytesIO(buf), _w, _r, return_record_name=True)
                    )

        self._decoders[version] = dec
        return dec

    def _cavro_decoder(self, writer: Any, same: bool):
        import cavro

        opts = cavro.Options(
            record_decodes_to_dict=True, union_decodes_to=cavro.UnionDecodeOption.TYPE_TUPLE_IF_RECORD
        )
        reader = cavro.Schema(self._reader_json, options=opts)
        if same:
            return reader.binary_decode
        resolved = reader.reader_for_writer(cavro.Schema(writer, options=opts))
        return resolved.binary_decode

    def _make_encoder(self):
        reference = self._reference_encoder = self._make_reference_encoder()

        def enc(env: dict) -> bytes:
            # Data records (every record but a few control messages) take the hand-written path; anything it
            # does not handle, or input it would reject, goes through fastavro, which raises the proper error.
            try:
                out = _encode_data(env)
            except Exception:  # noqa: BLE001 - fastavro decides what is valid
                out = None
            return out if out is not None else reference(env)

        return enc

    def _make_reference_encoder(self):
        parsed = self._reader
        writer = fastavro.schemaless_writer

        def enc(env: dict) -> bytes:
            buf = io.BytesIO()
            buf.write(bytes([MAGIC, CURRENT_VERSION]))
            writer(buf, parsed, env)
            return buf.getvalue()

        return enc

    # -- public ----------------------------------------------------------------------------------
    def encode(self, envelope: dict) -> bytes:
        """Frame and encode a v14 envelope (record unions given as `(full name, dict)` tuples)."""
        return self._encoder(envelope)

    def encode_reference(self, envelope: dict) -> bytes:
        """`encode` through fastavro only: what the hand-written data path is tested against."""
        return self._reference_encoder(envelope)

    def decode(self, value: bytes | None, headers: Iterable | None = None) -> dict:
        """Decode a Kafka value; raises UndecodableError with the reason (bad magic, unknown version, truncated)."""
        if value is None or len(value) < 3:
            raise UndecodableError("value is empty or shorter than the 2-byte Venice framing")
        if value[0] != MAGIC:
            raise UndecodableError(f"bad magic byte {value[0]} (Venice values start with {MAGIC})")
        version = value[1]
        if headers:
            vtp = header_value(headers, "vtp")
            if vtp is not None and self._vtp_seen.get(version) != vtp:
                self._take_vtp(version if version < 128 else version - 256, vtp)
        dec = self._by_byte.get(version)
        if dec is None:
            dec = self._decoder_or_learn(version if version < 128 else version - 256, headers)
        try:
            env = dec(value[2:])
        except Exception as exc:  # truncated / corrupt Avro
            raise UndecodableError(
                f"Avro decode of protocol version {version} failed: {type(exc).__name__}: {exc}"
            ) from None
        name = env["payloadUnion"][0]
        expected = _MESSAGE_TYPE_OF_BRANCH.get(name)
        if expected != env["messageType"] and not (expected == 0 and env["messageType"] == 4):
            raise UndecodableError(
                f"messageType {env.get('messageType')} does not match payload branch {name.rsplit('.', 1)[-1]}"
            )
        return env

    def _take_vtp(self, version: int, vtp: bytes) -> None:
        """Use the writer schema a `vtp` header announces for `version`, unless it is the one already in use.

        For a version we cannot otherwise decode, a bad header makes the record undecodable (UndecodableError). For
        one we can, a header we cannot use is ignored: the record is decoded with the schema we have, and fails on
        its own if that schema is wrong.
        """
        byte = version & 0xFF
        try:
            schema, announced = _announced(vtp)
        except Exception as exc:  # noqa: BLE001 - any garbage header
            if self._writer_schema(version) is None:
                raise UndecodableError(
                    f"vtp header for protocol version {version} is not a valid Avro schema: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            self._vtp_seen[byte] = vtp
            return
        if announced != self._canonical_form(version):
            try:
                self.learn(version, schema)
            except UndecodableError:
                if self._writer_schema(version) is None:
                    raise
        self._vtp_seen[byte] = vtp

    def may_relearn(self, version: int, vtp: bytes) -> bool:
        """Whether taking this `vtp` header could change how `version` is decoded: it announces a schema other than
        the one in use, or cannot be read (the cautious answer; `_take_vtp` then keeps a shipped version's schema).
        For readers that decode the common records without this codec (Leap Frog's vectorised decode)."""
        try:
            announced = _announced(vtp)[1]
        except Exception:  # noqa: BLE001 - any garbage header
            return True
        return announced != self._canonical_form(version)

    def _canonical_form(self, version: int) -> str | None:
        if version not in self._canonical:
            writer = self._writer_schema(version)
            self._canonical[version] = (
                None if writer is None else fastavro.schema.to_parsing_canonical_form(writer)
            )
        return self._canonical[version]

    def _decoder_or_learn(self, version: int, headers):
        dec = self._decoder_for(version)
        if dec is None:
            vtp = header_value(headers, "vtp")
            if vtp is None:
                raise UndecodableError(
                    f"unknown protocol version {version} and no vtp header to learn it from"
                )
            self.learn(version, vtp)
            dec = self._decoder_for(version)
        self._by_byte[version & 0xFF] = dec
        return dec


def _announced(vtp: bytes) -> tuple[Any, str]:
    """(the schema a `vtp` header announces, its parsing canonical form); raises on a header that is not one."""
    schema = json.loads(vtp)
    return schema, fastavro.schema.to_parsing_canonical_form(schema)


def _bytes_defaults(env: dict) -> dict:
    """fastavro fills a reader-side `bytes` default as the str '' when resolving older versions; cavro gives
    b''. Normalise so both decoders return identical envelopes."""
    body = env["payloadUnion"][1]
    if body.get("replicationMetadataPayload") == "":
        body["replicationMetadataPayload"] = b""
    f = env.get("leaderMetadataFooter")
    if isinstance(f, tuple) and f[1].get("upstreamPubSubPosition") == "":
        f[1]["upstreamPubSubPosition"] = b""
    return env


_MESSAGE_TYPE_OF_BRANCH = {branch: MESSAGE_TYPE[kind] for branch, kind in PAYLOAD_KIND.items()}


# -- small accessors shared by every reader ---------------------------------------------------------
def payload_kind(env: dict) -> str:
    """'PUT', 'UPDATE', 'DELETE' or 'CONTROL', from the union branch name."""
    return PAYLOAD_KIND[env["payloadUnion"][0]]


def payload(env: dict) -> dict:
    return env["payloadUnion"][1]


def control_type(env: dict) -> int | None:
    name, body = env["payloadUnion"]
    return body["controlMessageType"] if name == CONTROL else None


def control_body(env: dict) -> dict:
    """The StartOfSegment/EndOfSegment/... record inside a control message."""
    return env["payloadUnion"][1]["controlMessageUnion"][1]


def footer(env: dict) -> dict | None:
    f = env.get("leaderMetadataFooter")
    if f is None:
        return None
    return f[1] if isinstance(f, tuple) else f


# -- builders (writers use these so every envelope has Venice's exact field set) -------------------
def default_footer(host_name: str) -> tuple[str, dict]:
    """Footer of a plain producer: writer id and the -1 / EARLIEST sentinels (VeniceWriter's DEFAULT_LEADER_METADATA_WRAPPER)."""
    from .positions import EARLIEST_BLOB

    return (
        LEADER_METADATA,
        {
            "hostName": host_name,
            "upstreamOffset": -1,
            "upstreamKafkaClusterId": -1,
            "upstreamPubSubPosition": EARLIEST_BLOB,
            "termId": -1,
            "upstreamMessageTimestamp": -1,
        },
    )


def leader_footer(
    host_name: str,
    upstream_offset: int,
    upstream_cluster_id: int,
    term_id: int = -1,
    upstream_timestamp: int = -1,
) -> tuple[str, dict]:
    """Footer of a leader-produced record: the RT position it came from and the region (cluster id)."""
    from .positions import encode_offset

    return (
        LEADER_METADATA,
        {
            "hostName": host_name,
            "upstreamOffset": upstream_offset,
            "upstreamKafkaClusterId": upstream_cluster_id,
            "upstreamPubSubPosition": encode_offset(upstream_offset),
            "termId": term_id,
            "upstreamMessageTimestamp": upstream_timestamp,
        },
    )


def producer_metadata(
    guid: bytes, segment: int, sequence: int, timestamp: int, logical_timestamp: int = -1
) -> dict:
    return {
        "producerGUID": guid,
        "segmentNumber": segment,
        "messageSequenceNumber": sequence,
        "messageTimestamp": timestamp,
        "logicalTimestamp": logical_timestamp,
    }


def control_message(
    control_type_: int, body: dict, debug_info: dict[str, str] | None = None
) -> tuple[str, dict]:
    return (
        CONTROL,
        {
            "controlMessageType": control_type_,
            "debugInfo": debug_info or {},
            "controlMessageUnion": (CONTROL_RECORD_NAMES[control_type_], body),
        },
    )


# -- hand-written encoder of data envelopes --------------------------------------------------------------------
# A leader encodes one envelope per record; fastavro's generic writer costs about 10 µs of it. Put, Delete and
# Update envelopes have a fixed v14 layout, written here field by field; tests/div/test_hand_encoders.py compares the bytes
# with fastavro's on generated envelopes. Control messages (rare) always go through fastavro.
_HEAD = bytes([MAGIC, CURRENT_VERSION])
_HOST_BYTES: dict[str, bytes] = {}


def _host(name: str) -> bytes:
    b = _HOST_BYTES.get(name)
    if b is None:
        raw = name.encode()
        b = write_long(len(raw)) + raw
        if len(_HOST_BYTES) < 4096:
            _HOST_BYTES[name] = b
    return b


def _encode_data(env: dict) -> bytes | None:
    """v14 bytes of a Put/Delete/Update envelope, or None for anything else (fastavro's job)."""
    if len(env) > 4:
        return None
    pm = env["producerMetadata"]
    name, body = env["payloadUnion"]
    guid = pm["producerGUID"]
    if type(guid) is not bytes or len(guid) != 16 or len(pm) > 5:
        return None
    ints = [
        env["messageType"],
        pm["segmentNumber"],
        pm["messageSequenceNumber"],
        pm["messageTimestamp"],
        pm.get("logicalTimestamp", -1),
    ]
    if name == PUT:
        # bytes fields with a default ("") are required here: fastavro cannot apply a string default to bytes
        value, payload = body["putValue"], body["replicationMetadataPayload"]
        if type(value) is not bytes or type(payload) is not bytes or len(body) > 4:
            return None
        rest = [b"\x00", write_long(len(value)), value]
        tail = [body["schemaId"], body.get("replicationMetadataVersionId", -1)]
    elif name == DELETE:
        payload = body["replicationMetadataPayload"]
        if type(payload) is not bytes or len(body) > 3:
            return None
        rest = [b"\x04"]
        tail = [body.get("schemaId", -1), body.get("replicationMetadataVersionId", -1)]
    elif name == UPDATE:
        payload = body["updateValue"]
        if type(payload) is not bytes or len(body) > 3:
            return None
        rest = [b"\x02"]
        tail = [body["schemaId"], body["updateSchemaId"]]
    else:
        return None
    footer = env.get("leaderMetadataFooter")
    if footer is None:
        foot = [b"\x00"]
    else:
        fname, f = footer
        pos = f["upstreamPubSubPosition"]
        if fname != LEADER_METADATA or type(pos) is not bytes or type(f["hostName"]) is not str or len(f) > 6:
            return None
        # write_long raises on anything but an int (floats included), which sends the envelope to fastavro
        w = write_long
        foot = [
            b"\x02",
            _host(f["hostName"]),
            w(f.get("upstreamOffset", -1)),
            w(f.get("upstreamKafkaClusterId", -1)),
            w(len(pos)),
            pos,
            w(f.get("termId", -1)),
            w(f.get("upstreamMessageTimestamp", -1)),
        ]
    w = write_long
    return b"".join(
        [
            _HEAD,
            w(ints[0]),
            guid,
            w(ints[1]),
            w(ints[2]),
            w(ints[3]),
            w(ints[4]),
            *rest,
            *map(w, tail),
            w(len(payload)),
            payload,
            *foot,
        ]
    )
