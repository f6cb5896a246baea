"""PubSub position blobs (Venice's PubSubPositionWireFormat, ApacheKafkaOffsetPosition): magic 34, version 1, then Avro {type: int, rawBytes: bytes}.

Kafka offsets are type 0 with rawBytes = the Avro long. EARLIEST (-2) and LATEST (-1) carry no bytes.
Readers prefer the blob and fall back to the legacy long twin exactly as Venice's
`deserializePositionWithOffsetFallback` does (§7.3).
"""

from __future__ import annotations

from .avro_bits import read_long, write_long

MAGIC = 34
VERSION = 1
TYPE_EARLIEST = -2
TYPE_LATEST = -1
TYPE_KAFKA_OFFSET = 0
LATEST_OFFSET = (1 << 63) - 1

EARLIEST_BLOB = bytes([MAGIC, VERSION]) + write_long(TYPE_EARLIEST) + write_long(0)
LATEST_BLOB = bytes([MAGIC, VERSION]) + write_long(TYPE_LATEST) + write_long(0)


class PositionError(ValueError):
    """Bytes that are not a position blob this reader understands."""


def encode_offset(offset: int) -> bytes:
    """Blob of a Kafka offset; -1 is written as EARLIEST, as Venice does for "no position"."""
    if offset == -1:
        return EARLIEST_BLOB
    if offset < -1:
        raise PositionError(f"Kafka offsets below -1 are invalid: {offset}")
    raw = write_long(offset)
    return bytes([MAGIC, VERSION]) + write_long(TYPE_KAFKA_OFFSET) + write_long(len(raw)) + raw


def decode(blob: bytes) -> tuple[int, int]:
    """(type id, numeric offset). EARLIEST → -1, LATEST → Long.MAX_VALUE, Kafka → the offset."""
    if len(blob) < 4 or blob[0] != MAGIC or blob[1] != VERSION:
        raise PositionError(f"not a position blob (magic/version {blob[:2].hex()!r})")
    try:
        type_id, pos = read_long(blob, 2)
        length, pos = read_long(blob, pos)
    except ValueError:  # a varint cut short or longer than 10 bytes
        raise PositionError("truncated position blob") from None
    raw = blob[pos : pos + length]
    if length < 0 or len(raw) != length:
        raise PositionError("truncated position blob")
    if type_id == TYPE_EARLIEST:
        return type_id, -1
    if type_id == TYPE_LATEST:
        return type_id, LATEST_OFFSET
    if type_id == TYPE_KAFKA_OFFSET:
        try:
            offset, end = read_long(raw, 0)
        except ValueError:
            raise PositionError("bad Kafka offset in position blob") from None
        if end != len(raw) or offset < -1:
            raise PositionError("bad Kafka offset in position blob")
        return type_id, offset
    raise PositionError(f"position type {type_id} is not a Kafka offset")


# a Kafka offset's blob up to its raw bytes, by their length (an Avro long is at most 10 bytes)
_KAFKA_PREFIX = [bytes([MAGIC, VERSION]) + write_long(TYPE_KAFKA_OFFSET) + write_long(n) for n in range(11)]


def offset_with_fallback(blob: bytes, legacy_offset: int) -> int:
    """Venice's rule: empty blob → the long; decoded EARLIEST/LATEST or ≥ long → decoded; else → the long."""
    if not blob:
        return legacy_offset
    if legacy_offset >= 0:
        # what leaders write: the blob of the long itself, which decodes to the long. Checked by comparing bytes,
        # a third of decoding's cost: every change reader does this once per record.
        raw = write_long(legacy_offset)
        if blob == _KAFKA_PREFIX[len(raw)] + raw:
            return legacy_offset
    try:
        type_id, offset = decode(blob)
    except PositionError:
        return legacy_offset
    if type_id in (TYPE_EARLIEST, TYPE_LATEST) or offset >= legacy_offset:
        return offset
    return legacy_offset
