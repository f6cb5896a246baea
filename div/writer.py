"""Producer-side DIV: a writer that produces Venice records byte for byte (Venice's VeniceWriter and Segment).

One GUID per writer; per partition a segment: StartOfSegment (sequence 0), data (1, 2, …), EndOfSegment carrying
the checksum of everything fed since the SOS. Segments roll on time (default 5 minutes, ≤0 disables) and end as
"final" on `end_segment(final=True)`, `end_of_push` and `close`.

Large values (`put_large`) are written as VeniceWriter.putLargeValue writes them (venice-protocol-notes §1.7):
value chunks (Puts with schema id -10 under chunk-suffixed keys, logical timestamp -1, the default footer) and then
the manifest (a Put with schema id -20 under the key with the non-chunk suffix `02 00`, carrying the caller's
logical timestamp and footer), all in one segment. Such records belong to a *chunked version topic*: Venice's
online producers never chunk into a real-time topic (their RT writers have chunking disabled and refuse a value
over the per-message limit), and a Venice leader does not reassemble chunks it reads from an RT.

The writer never talks to Kafka: it returns finished records (key, value, headers). A caller that must retry a
send re-sends the *same bytes* — unlike Venice's retry path, which re-reads the segment counter and duplicates a
sequence number (a VeniceWriter quirk we do not copy).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from . import checksum as cks
from . import envelope as E
from . import keys, schemas

# VeniceWriter's DEFAULT_MAX_SIZE_FOR_USER_PAYLOAD_PER_MESSAGE_IN_BYTES: above it (key + value) VeniceWriter chunks
# a value when chunking is enabled, and refuses it otherwise.
MAX_PAYLOAD_BYTES = 950 * 1024
CHUNK_SCHEMA_ID, MANIFEST_SCHEMA_ID = -10, -20  # AvroProtocolDefinition.CHUNK / CHUNKED_VALUE_MANIFEST


class ValueTooLargeError(ValueError):
    """A value VeniceWriter could not chunk either (the key is over half the per-message limit, or the manifest
    itself would not fit one message)."""


def encode_manifest(chunk_keys: list[bytes], schema_id: int, size: int) -> bytes:
    """Avro `ChunkedValueManifest {keysWithChunkIdSuffix, schemaId, size}` (no magic byte: schema id -20 says it)."""
    from .avro_bits import write_long

    out = bytearray()
    if chunk_keys:
        out += write_long(len(chunk_keys))
        for k in chunk_keys:
            out += write_long(len(k)) + k
    out += write_long(0)
    out += write_long(schema_id) + write_long(size)
    return bytes(out)


@dataclass(frozen=True)
class OutRecord:
    """A record ready to produce: Kafka key, value and headers for one partition."""

    partition: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()
    segment: int = 0
    sequence: int = 0


@dataclass
class _Segment:
    number: int
    next_sequence: int
    checksum: cks.Checksum
    started_ms: int
    ended: bool = False


def random_guid() -> bytes:
    return uuid.uuid4().bytes


def deterministic_guid(most_significant: int, least_significant: int) -> bytes:
    """Venice's DeterministicGuidGenerator: BE long ‖ BE long."""
    return (most_significant & (2**64 - 1)).to_bytes(8, "big") + (least_significant & (2**64 - 1)).to_bytes(
        8, "big"
    )


_VTP: bytes | None = None


def vtp_header_value() -> bytes:
    """The `vtp` header: the writer's KME schema as JSON (sent on segment 0 / sequence 0 messages)."""
    global _VTP
    if _VTP is None:
        _VTP = json.dumps(schemas.load_json("KafkaMessageEnvelope.v14.avsc"), separators=(",", ":")).encode()
    return _VTP


class SegmentWriter:
    """Writes data and control messages for one producer GUID with Venice's segment and checksum rules.

    `clock` returns epoch milliseconds (injectable so simulations and tests are deterministic).
    `footer(partition)`, when given, supplies the leader footer of each record; otherwise the default footer of a
    plain producer (writer id and -1 / EARLIEST sentinels) is used.
    """

    def __init__(
        self,
        guid: bytes | None = None,
        *,
        checksum_type: int = cks.ADHASH,
        max_segment_age_ms: int = 300_000,
        host_name: str = "tidegauge-writer",
        clock: Callable[[], int] | None = None,
        codec: E.EnvelopeCodec | None = None,
        send_vtp: bool = True,
    ) -> None:
        self.guid = guid or random_guid()
        if len(self.guid) != 16:
            raise ValueError("a producer GUID is 16 bytes")
        self.checksum_type = checksum_type
        self.max_segment_age_ms = max_segment_age_ms
        self.host_name = host_name
        self.clock = clock or (lambda: int(time.time() * 1000))
        self.codec = codec or E.EnvelopeCodec()
        self.send_vtp = send_vtp
        self._segments: dict[int, _Segment] = {}

    # -- segment bookkeeping ----------------------------------------------------------------------
    def segment_state(self, partition: int) -> _Segment | None:
        return self._segments.get(partition)

    def _envelope(
        self,
        message_type: int,
        seg: _Segment,
        sequence: int,
        ts: int,
        payload: tuple,
        footer,
        logical_ts: int,
    ) -> dict:
        return {
            "messageType": message_type,
            "producerMetadata": E.producer_metadata(self.guid, seg.number, sequence, ts, logical_ts),
            "payloadUnion": payload,
            "leaderMetadataFooter": footer if footer is not None else E.default_footer(self.host_name),
        }

    def _emit(self, partition: int, seg: _Segment, key: bytes, env: dict, key_content: bytes) -> OutRecord:
        kind = E.payload_kind(env)
        body = E.payload(env)
        ctype = E.control_type(env)
        if seg.checksum.type != cks.NONE or kind != "CONTROL":
            for f in cks.feeds(env["messageType"], kind, key_content, body, ctype):
                seg.checksum.update(f)
        seq = env["producerMetadata"]["messageSequenceNumber"]
        headers: tuple[tuple[str, bytes], ...] = ()
        if self.send_vtp and seg.number == 0 and seq == 0:
            headers = (("vtp", vtp_header_value()),)
        return OutRecord(partition, key, self.codec.encode(env), headers, seg.number, seq)

    def _start_segment(self, partition: int, number: int, now: int, out: list[OutRecord]) -> _Segment:
        seg = _Segment(number, 0, cks.Checksum(self.checksum_type), now)
        self._segments[partition] = seg
        payload = E.control_message(
            E.START_OF_SEGMENT, {"checksumType": self.checksum_type, "upcomingAggregates": []}
        )
        env = self._envelope(2, seg, 0, now, payload, None, -1)
        seg.next_sequence = 1
        ck = keys.control_key_content(self.guid, number, 0)
        out.append(self._emit(partition, seg, b"\x02" + ck, env, ck))
        return seg

    def _segment_for_send(self, partition: int, now: int, out: list[OutRecord]) -> _Segment:
        seg = self._segments.get(partition)
        if seg is None:
            return self._start_segment(partition, 0, now, out)
        if seg.ended:
            return self._start_segment(partition, seg.number + 1, now, out)
        if self.max_segment_age_ms > 0 and now - seg.started_ms > self.max_segment_age_ms:
            out.append(self._end(partition, seg, final=False, now=now))
            return self._start_segment(partition, seg.number + 1, now, out)
        return seg

    def _end(self, partition: int, seg: _Segment, final: bool, now: int) -> OutRecord:
        seq = seg.next_sequence
        seg.next_sequence += 1
        value = seg.checksum.finalize()
        payload = E.control_message(
            E.END_OF_SEGMENT, {"checksumValue": value, "computedAggregates": [], "finalSegment": final}
        )
        env = self._envelope(2, seg, seq, now, payload, None, -1)
        seg.ended = True
        ck = keys.control_key_content(self.guid, seg.number, seq)
        return self._emit(partition, seg, b"\x02" + ck, env, ck)

    # -- public API -------------------------------------------------------------------------------
    def put(
        self,
        partition: int,
        key_content: bytes,
        value: bytes,
        schema_id: int = 1,
        *,
        logical_ts: int = -2,
        rmd_version: int = -1,
        rmd_payload: bytes = b"",
        footer=None,
        header: int = keys.HEADER_PUT_OR_DELETE,
        message_type: int = 0,
    ) -> list[OutRecord]:
        """A PUT (preceded by SOS/EOS records when a segment starts or rolls). Returns records in send order."""
        payload = (
            E.PUT,
            {
                "putValue": value,
                "schemaId": schema_id,
                "replicationMetadataVersionId": rmd_version,
                "replicationMetadataPayload": rmd_payload,
            },
        )
        return self._data(
            partition, message_type, bytes([header]) + key_content, key_content, payload, footer, logical_ts
        )

    def put_large(
        self,
        partition: int,
        key_content: bytes,
        value: bytes,
        schema_id: int = 1,
        *,
        logical_ts: int = -2,
        footer=None,
        max_payload: int = MAX_PAYLOAD_BYTES,
    ) -> list[OutRecord]:
        """A Put of a value as VeniceWriter writes it with chunking enabled (module docstring), in send order: any
        SOS/EOS, then the chunks, then the manifest (the last record). A key and value within `max_payload` are one
        Put under the key with the non-chunk suffix, as VeniceWriter's put on a chunked version writes them.

        Chunks are `max_payload - len(key_content)` bytes of the value each (VeniceWriter's sizeAvailablePerMessage),
        the last one the rest. All records go into one segment (a segment due to roll rolls before the first
        record), so the manifest's chunks are contiguous sequence numbers right before it. Raises
        ValueTooLargeError where VeniceWriter throws (a key over half of `max_payload`, a manifest over the space
        of one message). RMD is not written (an online producer's Put carries none)."""
        if len(key_content) + len(value) <= max_payload:
            return self.put(
                partition,
                key_content + keys.NON_CHUNK_SUFFIX,
                value,
                schema_id,
                logical_ts=logical_ts,
                footer=footer,
            )
        available = max_payload - len(key_content)
        if available < max_payload // 2:
            raise ValueTooLargeError(
                f"a {len(key_content)}-byte key leaves {available} bytes per chunk, under half of {max_payload}: "
                "VeniceWriter cannot chunk it"
            )
        n = -(-len(value) // available)
        now = self.clock()
        out: list[OutRecord] = []
        seg = self._segment_for_send(partition, now, out)
        first = seg.next_sequence
        chunk_keys = [key_content + keys.chunk_suffix(self.guid, seg.number, first, i) for i in range(n)]
        manifest = encode_manifest(chunk_keys, schema_id, len(value))
        if len(manifest) > available:
            raise ValueTooLargeError(
                f"the manifest of a {len(value)}-byte value ({n} chunks) is {len(manifest)} bytes, over the "
                f"{available} bytes of one message: VeniceWriter cannot chunk it"
            )
        for i, ck in enumerate(chunk_keys):
            payload = (
                E.PUT,
                {
                    "putValue": value[i * available : (i + 1) * available],
                    "schemaId": CHUNK_SCHEMA_ID,
                    "replicationMetadataVersionId": -1,
                    "replicationMetadataPayload": b"",
                },
            )
            out.append(self._data_in(partition, seg, now, 0, b"\x00" + ck, ck, payload, None, -1))
        top = key_content + keys.NON_CHUNK_SUFFIX
        payload = (
            E.PUT,
            {
                "putValue": manifest,
                "schemaId": MANIFEST_SCHEMA_ID,
                "replicationMetadataVersionId": -1,
                "replicationMetadataPayload": b"",
            },
        )
        out.append(self._data_in(partition, seg, now, 0, b"\x00" + top, top, payload, footer, logical_ts))
        return out

    def delete(
        self,
        partition: int,
        key_content: bytes,
        schema_id: int = -1,
        *,
        logical_ts: int = -2,
        rmd_version: int = -1,
        rmd_payload: bytes = b"",
        footer=None,
    ) -> list[OutRecord]:
        payload = (
            E.DELETE,
            {
                "schemaId": schema_id,
                "replicationMetadataVersionId": rmd_version,
                "replicationMetadataPayload": rmd_payload,
            },
        )
        return self._data(partition, 1, b"\x00" + key_content, key_content, payload, footer, logical_ts)

    def update(
        self,
        partition: int,
        key_content: bytes,
        update_value: bytes,
        schema_id: int,
        update_schema_id: int,
        *,
        logical_ts: int = -2,
        footer=None,
    ) -> list[OutRecord]:
        payload = (
            E.UPDATE,
            {"schemaId": schema_id, "updateSchemaId": update_schema_id, "updateValue": update_value},
        )
        return self._data(partition, 3, b"\x04" + key_content, key_content, payload, footer, logical_ts)

    def _data(
        self, partition, message_type, kafka_key, key_content, payload, footer, logical_ts
    ) -> list[OutRecord]:
        now = self.clock()
        out: list[OutRecord] = []
        seg = self._segment_for_send(partition, now, out)
        out.append(
            self._data_in(
                partition, seg, now, message_type, kafka_key, key_content, payload, footer, logical_ts
            )
        )
        return out

    def _data_in(
        self, partition, seg, now, message_type, kafka_key, key_content, payload, footer, logical_ts
    ) -> OutRecord:
        """One data record at the segment's next sequence number."""
        seq = seg.next_sequence
        seg.next_sequence += 1
        env = self._envelope(message_type, seg, seq, now, payload, footer, logical_ts)
        return self._emit(partition, seg, kafka_key, env, key_content)

    def control(
        self,
        partition: int,
        control_type: int,
        body: dict,
        debug_info: dict[str, str] | None = None,
        footer=None,
    ) -> list[OutRecord]:
        """A checksummed control message (StartOfPush, EndOfPush, SOIP, EOIP, TopicSwitch, VersionSwap)."""
        if control_type not in cks.CHECKSUMMED_CONTROL_TYPES or control_type == E.START_OF_SEGMENT:
            raise ValueError(f"control type {control_type} is not sent through control(); use end_segment()")
        now = self.clock()
        out: list[OutRecord] = []
        seg = self._segment_for_send(partition, now, out)
        seq = seg.next_sequence
        seg.next_sequence += 1
        env = self._envelope(2, seg, seq, now, E.control_message(control_type, body, debug_info), footer, -1)
        ck = keys.control_key_content(self.guid, seg.number, seq)
        out.append(self._emit(partition, seg, b"\x02" + ck, env, ck))
        return out

    def start_of_push(
        self, partition: int, *, sorted_: bool = False, chunked: bool = False, compression_strategy: int = 0
    ) -> list[OutRecord]:
        return self.control(
            partition,
            E.START_OF_PUSH,
            {
                "sorted": sorted_,
                "chunked": chunked,
                "compressionStrategy": compression_strategy,
                "compressionDictionary": None,
                "timestampPolicy": 0,
            },
        )

    def end_of_push(self, partition: int) -> list[OutRecord]:
        """EndOfPush, then a final EndOfSegment (Venice's broadcastEndOfPush ends every open segment)."""
        out = self.control(partition, E.END_OF_PUSH, {})
        out.extend(self.end_segment(partition, final=True))
        return out

    def end_segment(self, partition: int, final: bool = True) -> list[OutRecord]:
        """End the partition's open segment (no-op when none is open)."""
        seg = self._segments.get(partition)
        if seg is None or seg.ended:
            return []
        return [self._end(partition, seg, final, self.clock())]

    def close(self) -> list[OutRecord]:
        """Final EndOfSegment for every open segment (graceful close)."""
        out: list[OutRecord] = []
        for p in sorted(self._segments):
            out.extend(self.end_segment(p, final=True))
        return out
