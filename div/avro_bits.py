"""The few Avro binary primitives we need by hand: zig-zag varints for position blobs and framing checks.

Everything with a schema goes through a parsed schema (fastavro/cavro) except a few fixed shapes on hot write paths
(position blobs, value-level RMD, data envelopes), each pinned byte for byte to fastavro by a test.
"""

from __future__ import annotations


def _varint_unsigned(z: int) -> bytes:
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _write_long_slow(n: int) -> bytes:
    return _varint_unsigned(((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF)


# Encoders of whole records call this for every int and long. Small values (lengths, ids, sequence numbers) come
# from a table; a large one (a timestamp, an offset) is its low 14 bits from a second table followed by the
# varint of the rest, which changes slowly along a log and is remembered.
_SMALL_MIN, _SMALL_MAX = -8192, 8191
_SMALL = [_write_long_slow(n) for n in range(_SMALL_MIN, _SMALL_MAX + 1)]
_LOW14 = [bytes(((z & 0x7F) | 0x80, ((z >> 7) & 0x7F) | 0x80)) for z in range(1 << 14)]
_HIGH: dict[int, bytes] = {}


def write_long(n: int) -> bytes:
    """Avro zig-zag varint of an int or long (TypeError for anything else, floats included)."""
    if type(n) is not int:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"Avro int/long must be an int, not {type(n).__name__}")
    if _SMALL_MIN <= n <= _SMALL_MAX:
        return _SMALL[n - _SMALL_MIN]
    if not -(1 << 63) <= n < (1 << 63):
        raise OverflowError(f"{n} does not fit an Avro long")
    z = (n << 1) ^ (n >> 63)
    high = z >> 14
    tail = _HIGH.get(high)
    if tail is None:
        if len(_HIGH) >= 65536:
            _HIGH.clear()
        tail = _HIGH[high] = _varint_unsigned(high)
    return _LOW14[z & 0x3FFF] + tail


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
