"""The few Avro binary primitives we need by hand: zig-zag varints for position blobs and framing checks.

Everything with a schema goes through a parsed schema (fastavro/cavro); this is only for tiny fixed shapes.
"""

from __future__ import annotations


def write_long(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    z &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def read_long(buf: bytes, pos: int) -> tuple[int, int]:
    """Decode one zig-zag varint at `pos`; returns (value, next position). Raises ValueError when truncated."""
    shift = 0
    z = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated Avro varint")
        b = buf[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("Avro varint longer than 10 bytes")
    return (z >> 1) ^ -(z & 1), pos
