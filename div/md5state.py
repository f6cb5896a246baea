"""MD5 with an inspectable state, so a segment's running MD5 can be checkpointed the way Venice does.

Venice checkpoints a segment's MD5 as BouncyCastle 1.55's `MD5Digest.getEncodedState()` blob (Venice's MD5CheckSum):
xBuf[4] ‖ BE int32 xBufOff ‖ BE int64 byteCount ‖ BE int32 H1..H4 ‖ BE int32 xOff ‖ xOff BE int32 words.
`hashlib` cannot export or import its internal state, so MD5 segments use this small implementation. It is slow
(pure Python) but MD5 is not Venice's default checksum (ADHASH is); its digests are tested against hashlib.
"""

from __future__ import annotations

import math
import struct

_S = [7, 12, 17, 22] * 4 + [5, 9, 14, 20] * 4 + [4, 11, 16, 23] * 4 + [6, 10, 15, 21] * 4
_K = [int(abs(math.sin(i + 1)) * 2**32) & 0xFFFFFFFF for i in range(64)]
_M = 0xFFFFFFFF
_INIT = (0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476)


def _compress(h: tuple[int, int, int, int], block: bytes) -> tuple[int, int, int, int]:
    x = struct.unpack("<16I", block)
    a, b, c, d = h
    for i in range(64):
        if i < 16:
            f = (b & c) | (~b & d)
            g = i
        elif i < 32:
            f = (d & b) | (~d & c)
            g = (5 * i + 1) & 15
        elif i < 48:
            f = b ^ c ^ d
            g = (3 * i + 5) & 15
        else:
            f = c ^ (b | (~d & _M))
            g = (7 * i) & 15
        f = (f + a + _K[i] + x[g]) & _M
        a, d, c = d, c, b
        b = (b + ((f << _S[i]) | (f >> (32 - _S[i])))) & _M
    return ((h[0] + a) & _M, (h[1] + b) & _M, (h[2] + c) & _M, (h[3] + d) & _M)


class MD5State:
    """Running MD5 whose state can be encoded in, and restored from, BouncyCastle's layout."""

    __slots__ = ("_h", "_buf", "_count")

    def __init__(self) -> None:
        self._h = _INIT
        self._buf = b""
        self._count = 0

    def update(self, data: bytes) -> None:
        self._count += len(data)
        buf = self._buf + bytes(data)
        n = len(buf) - len(buf) % 64
        h = self._h
        for i in range(0, n, 64):
            h = _compress(h, buf[i : i + 64])
        self._h = h
        self._buf = buf[n:]

    def digest(self) -> bytes:
        h = self._h
        bit_len = (self._count * 8) & 0xFFFFFFFFFFFFFFFF
        tail = self._buf + b"\x80" + b"\x00" * ((55 - len(self._buf)) % 64) + struct.pack("<Q", bit_len)
        for i in range(0, len(tail), 64):
            h = _compress(h, tail[i : i + 64])
        return struct.pack("<4I", *h)

    def encoded_state(self) -> bytes:
        words = len(self._buf) // 4
        rest = self._buf[words * 4 :]
        x_buf = rest + b"\x00" * (4 - len(rest))
        out = x_buf + struct.pack(">iq", len(rest), self._count)
        out += struct.pack(">4I", *self._h) + struct.pack(">i", words)
        out += b"".join(
            struct.pack(">I", struct.unpack("<I", self._buf[i * 4 : i * 4 + 4])[0]) for i in range(words)
        )
        return out

    @classmethod
    def from_encoded_state(cls, blob: bytes) -> MD5State:
        if len(blob) < 36:
            raise ValueError(f"MD5 state blob too short ({len(blob)} bytes; at least 36 expected)")
        x_buf_off, count = struct.unpack(">iq", blob[4:16])
        h = struct.unpack(">4I", blob[16:32])
        (words,) = struct.unpack(">i", blob[32:36])
        if not 0 <= x_buf_off < 4 or not 0 <= words < 16 or len(blob) < 36 + 4 * words:
            raise ValueError("MD5 state blob is inconsistent (offsets out of range)")
        pending = (
            b"".join(
                struct.pack("<I", struct.unpack(">I", blob[36 + 4 * i : 40 + 4 * i])[0]) for i in range(words)
            )
            + blob[:x_buf_off]
        )
        if count % 64 != len(pending):
            raise ValueError("MD5 state blob byte count does not match its buffered bytes")
        st = cls()
        st._h, st._buf, st._count = h, pending, count
        return st
