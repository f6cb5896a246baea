"""Venice's checkpoint record, PartitionState v24 (OffsetRecord): magic 24, version 24, then Avro.

It holds the offset a replica has processed and, in the same record, the DIV state of every producer
(`producerStates`) — saved together so that a restart never pairs data with the wrong DIV state. Map keys of
`producerStates` are the 16 GUID bytes read as ISO-8859-1 text (Venice's convention), not hex.
"""

from __future__ import annotations

import io
import time

import fastavro

from . import positions, schemas

MAGIC = 24
VERSION = 24


class PartitionStateError(ValueError):
    """Bytes that are not a valid PartitionState v24 record."""


_SCHEMA = None


def _schema():
    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = fastavro.parse_schema(schemas.load_json("PartitionState.v24.avsc"))
    return _SCHEMA


def guid_to_key(guid: bytes) -> str:
    return guid.decode("latin-1")


def key_to_guid(key: str) -> bytes:
    try:
        guid = key.encode("latin-1")
    except UnicodeEncodeError:
        raise PartitionStateError(
            f"producerStates key {key!r} is not a GUID (characters beyond Latin-1)"
        ) from None
    if len(guid) != 16:
        raise PartitionStateError(f"producerStates key is not a 16-byte GUID ({len(guid)} bytes)")
    return guid


def build(
    offset: int,
    producer_states: dict[bytes, dict],
    *,
    end_of_push: bool,
    last_update: int | None = None,
    realtime_producer_states: dict[str, dict[bytes, dict]] | None = None,
    heartbeat_timestamp: int = -1,
    leader_topic: str | None = None,
    upstream_offsets: dict[str, int] | None = None,
) -> dict:
    """A complete PartitionState record (defaults for every field we do not track)."""
    pos = positions.encode_offset(offset) if offset >= 0 else b""
    return {
        "offset": offset,
        "offsetLag": -1,
        "endOfPush": end_of_push,
        "lastUpdate": int(time.time() * 1000) if last_update is None else last_update,
        "startOfBufferReplayDestinationOffset": None,
        "databaseInfo": {},
        "incrementalPushInfo": None,
        "leaderTopic": leader_topic,
        "leaderOffset": -1,
        "upstreamOffsetMap": dict(upstream_offsets or {}),
        "upstreamRealTimeTopicPubSubPositionMap": {
            k: positions.encode_offset(v) for k, v in (upstream_offsets or {}).items()
        },
        "upstreamVersionTopicOffset": -1,
        "upstreamVersionTopicPubSubPosition": b"",
        "leaderGUID": None,
        "leaderHostId": None,
        "producerStates": {guid_to_key(g): s for g, s in producer_states.items()},
        "previousStatuses": {},
        "pendingReportIncrementalPushVersions": [],
        "realtimeTopicProducerStates": {
            url: {guid_to_key(g): s for g, s in states.items()}
            for url, states in (realtime_producer_states or {}).items()
        },
        "recordTransformerClassHash": None,
        "lastProcessedVersionTopicPubSubPosition": pos,
        "lastConsumedVersionTopicPubSubPosition": pos,
        "latestObservedTermId": -1,
        "currentTermStartPubSubPosition": b"",
        "lastConsumedVersionTopicOffset": offset,
        "heartbeatTimestamp": heartbeat_timestamp,
        "lastCheckpointTimestamp": -1,
        "keyUrnCompressionDict": None,
        "trackingIncrementalPushStatus": {},
        "uniqueIngestedKeyCountHllSketch": None,
        "activeKeyCount": -1,
        "batchPushRecordCount": 0,
        "upstreamLastConsumedVersionTopicPubSubPosition": b"",
    }


def encode(state: dict) -> bytes:
    buf = io.BytesIO()
    buf.write(bytes([MAGIC, VERSION]))
    fastavro.schemaless_writer(buf, _schema(), state)
    return buf.getvalue()


def decode(data: bytes) -> dict:
    """Decode and check a PartitionState; raises PartitionStateError instead of returning garbage."""
    if len(data) < 3:
        raise PartitionStateError(f"{len(data)} bytes is too short for a PartitionState")
    if data[0] != MAGIC or data[1] != VERSION:
        raise PartitionStateError(
            f"magic/version {data[0]}/{data[1]} is not PartitionState {MAGIC}/{VERSION}"
        )
    buf = io.BytesIO(data[2:])
    try:
        state = fastavro.schemaless_reader(buf, _schema(), None)
    except Exception as exc:
        raise PartitionStateError(
            f"PartitionState Avro does not decode: {type(exc).__name__}: {exc}"
        ) from None
    if buf.tell() != len(data) - 2:
        raise PartitionStateError(
            f"{len(data) - 2 - buf.tell()} trailing bytes after the PartitionState record"
        )
    for key in state["producerStates"]:
        key_to_guid(key)
    return state


def producer_states(state: dict) -> dict[bytes, dict]:
    """The VT producer states of a decoded PartitionState, keyed by GUID bytes."""
    return {key_to_guid(k): v for k, v in state["producerStates"].items()}
