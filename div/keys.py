"""Kafka keys as Venice writes them: one header byte, then the key content (Venice's KafkaKey, KafkaKeySerializer).

Every reader classifies records by the key header, not by the envelope's `messageType`: Global-RT-DIV records
travel with `messageType = 0` and are told apart only by header byte 8 (classify by the key header, never by messageType). Heartbeats and
Declaration-of-Leadership stamps are recognised by comparing the key content with two fixed keys, as Venice does.
"""

from __future__ import annotations

import hashlib
import struct

from .avro_bits import write_long

# Key header bytes (MessageType.Constants in Venice).
HEADER_PUT_OR_DELETE = 0
HEADER_CONTROL_MESSAGE = 2
HEADER_UPDATE = 4
HEADER_GLOBAL_RT_DIV = 8
KNOWN_HEADERS = frozenset({HEADER_PUT_OR_DELETE, HEADER_CONTROL_MESSAGE, HEADER_UPDATE, HEADER_GLOBAL_RT_DIV})

_CONTROL_KEY = struct.Struct(">16sii")


class KeyError_(ValueError):
    """A Kafka key that is not a Venice key (empty, or an unknown header byte)."""


def name_based_guid(name: str) -> bytes:
    """Venice's type-3 (MD5, name-based) UUID of `name`, as 16 bytes (most significant first)."""
    m = bytearray(hashlib.md5(name.encode("ascii")).digest())
    m[6] = (m[6] & 0x0F) | 0x30
    m[8] = (m[8] & 0x3F) | 0x80
    return bytes(m)


HEARTBEAT_GUID = name_based_guid("heartbeatControlMessage")
DOL_GUID = name_based_guid("declarationOfLeadershipControlMessage")


def control_key_content(guid: bytes, segment: int, sequence: int) -> bytes:
    """Key content of a control message: GUID ‖ BE int32 segment ‖ BE int32 sequence (unique per message)."""
    return _CONTROL_KEY.pack(guid, segment, sequence)


HEARTBEAT_KEY_CONTENT = control_key_content(HEARTBEAT_GUID, 0, 0)
DOL_KEY_CONTENT = control_key_content(DOL_GUID, 0, 0)
HEARTBEAT_KEY = bytes([HEADER_CONTROL_MESSAGE]) + HEARTBEAT_KEY_CONTENT
DOL_KEY = bytes([HEADER_CONTROL_MESSAGE]) + DOL_KEY_CONTENT


def encode_key(header: int, content: bytes) -> bytes:
    return bytes([header]) + content


def data_key(content: bytes) -> bytes:
    """Kafka key of a PUT or DELETE (same header on purpose: compaction lets one supersede the other)."""
    return b"\x00" + content


def update_key(content: bytes) -> bytes:
    return b"\x04" + content


def control_key(guid: bytes, segment: int, sequence: int) -> bytes:
    return b"\x02" + control_key_content(guid, segment, sequence)


def split_key(key: bytes | None) -> tuple[int, bytes]:
    """(header byte, content). Raises KeyError_ for an empty key or an unknown header, as a Venice consumer would."""
    if not key:
        raise KeyError_("empty Kafka key: Venice keys carry at least a header byte")
    header = key[0]
    if header not in KNOWN_HEADERS:
        raise KeyError_(f"unknown Venice key header byte {header}")
    return header, key[1:]


def is_heartbeat_key(key: bytes | None) -> bool:
    return key == HEARTBEAT_KEY


def is_dol_key(key: bytes | None) -> bool:
    return key == DOL_KEY


def is_div_exempt(key: bytes | None) -> bool:
    """Heartbeats and DoL stamps reuse segment 0 / sequence 0 forever and are not tracked by DIV (every one would be a DUPLICATE)."""
    return key == HEARTBEAT_KEY or key == DOL_KEY


# Chunking (Venice's ChunkedKeySuffix): with a chunked version every data key carries an Avro ChunkedKeySuffix.
NON_CHUNK_SUFFIX = b"\x02\x00"  # union branch 1 (chunkId = null), isChunk = false


def chunk_suffix(guid: bytes, segment: int, sequence: int, index: int) -> bytes:
    """The `ChunkedKeySuffix` of a value chunk: branch 0 (ChunkId: the producer GUID, segment and sequence number
    of the value's *first* chunk, this chunk's index, Avro ints), then isChunk = true."""
    if len(guid) != 16:
        raise ValueError("a producer GUID is 16 bytes")
    return b"\x00" + guid + write_long(segment) + write_long(sequence) + write_long(index) + b"\x01"


def strip_non_chunk_suffix(content: bytes) -> bytes:
    """The user key of a chunked version's value or manifest key (suffix `02 00`)."""
    if content.endswith(NON_CHUNK_SUFFIX):
        return content[: -len(NON_CHUNK_SUFFIX)]
    return content


def fnv1a_64(data: bytes) -> int:
    """FNV-1a 64 over unsigned bytes, as a signed 64-bit int (the key hash Venice's lily-pad uses, §5.3)."""
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h - (1 << 64) if h >= 1 << 63 else h


def readable(content: bytes) -> str | None:
    """The text a key holds when it is an Avro string of printable characters (what most stores use), for
    pages people read beside the hex; None otherwise. Key content only: no Venice key header byte."""
    n, shift, i = 0, 0, 0
    while i < len(content) and i < 10:  # the zig-zag varint length prefix of an Avro string
        b = content[i]
        n |= (b & 0x7F) << shift
        shift += 7
        i += 1
        if not b & 0x80:
            break
    else:
        return None
    if (n >> 1) ^ -(n & 1) != len(content) - i:
        return None
    try:
        text = content[i:].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


def shown(content: bytes) -> str:
    """A key as text pages show it: its hex, and the text beside it when it is a printable Avro string."""
    text = readable(content)
    return content.hex() if text is None else f"{content.hex()} ({text!r})"
