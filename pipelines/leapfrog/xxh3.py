"""XXH3-64 (seed 0, default secret) of many byte slices at once, with numpy: the value hash of a whole batch.

Why this exists: Leap Frog keeps a 64-bit hash of every value it compares (`value_hash` in its carried state and
in the watch's), and that hash is xxh3-64 (`pipelines.leapfrog.decode.value_hash`). Called once per Put through
the `xxhash` binding, most of its time went in the Python call and the slice, not in the hash. No library here
hashes an Arrow array with xxh3 (pyarrow's hash kernels are internal, polars' and DuckDB's hashes are other
functions whose output their authors may change), and a different function would make every stored state wrong.
So this module computes XXH3 itself, column-wise: each step of the algorithm is one numpy operation over every
slice of the same length class, and the result is the same 64-bit value `xxhash.xxh3_64_intdigest` gives, to the
bit (tests/pipelines/leapfrog/test_xxh3.py checks every length to past 240 bytes on random data against the
binding). The algorithm is XXH3's short-input paths as the xxHash specification states them (lengths 0, 1-3,
4-8, 9-16, 17-128, 129-240); longer slices, whose time goes in the bytes rather than the call, are still hashed by
the binding one at a time.
"""

from __future__ import annotations

import numpy as np
import xxhash

# XXH3's default secret (192 bytes), from the xxHash specification.
_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
_U = np.uint64
_PRIME64_1 = _U(0x9E3779B185EBCA87)
_PRIME64_2 = _U(0xC2B2AE3D27D4EB4F)
_PRIME64_3 = _U(0x165667B19E3779F9)
_PRIME_MX1 = _U(0x165667919E3779F9)
_PRIME_MX2 = _U(0x9FB21C651E98DF25)
_LOW32 = _U(0xFFFFFFFF)
# longest slice hashed here; longer ones go to the binding (XXH3's long-input path)
MAX_LENGTH = 240
BLOCK = 65536  # slices hashed together


def _s64(at: int) -> np.uint64:
    """The secret's little-endian 64-bit word at byte `at`."""
    return _U(int.from_bytes(_SECRET[at : at + 8], "little"))


def _s32(at: int) -> int:
    return int.from_bytes(_SECRET[at : at + 4], "little")


def _shr(x: np.ndarray, bits: int) -> np.ndarray:
    return x >> _U(bits)


def _shl(x: np.ndarray, bits: int) -> np.ndarray:
    return x << _U(bits)


def _mul128_fold64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The 128-bit product of each pair, its high and low halves xor-ed, from four 32x32-bit products."""
    a_lo, a_hi = a & _LOW32, _shr(a, 32)
    b_lo, b_hi = b & _LOW32, _shr(b, 32)
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    cross = _shr(lo_lo, 32) + (hi_lo & _LOW32) + a_lo * b_hi  # < 2^64: three 32-bit sums and one product
    upper = _shr(hi_lo, 32) + _shr(cross, 32) + a_hi * b_hi
    lower = _shl(cross, 32) | (lo_lo & _LOW32)
    return lower ^ upper


def _avalanche(h: np.ndarray) -> np.ndarray:
    h = h ^ _shr(h, 37)
    h = h * _PRIME_MX1
    return h ^ _shr(h, 32)


def _xxh64_avalanche(h: np.ndarray) -> np.ndarray:
    h = h ^ _shr(h, 33)
    h = h * _PRIME64_2
    h = h ^ _shr(h, 29)
    h = h * _PRIME64_3
    return h ^ _shr(h, 32)


def _rotl(h: np.ndarray, bits: int) -> np.ndarray:
    return _shl(h, bits) | _shr(h, 64 - bits)


class _Words:
    """Little-endian words at any byte position of a buffer: unaligned reads, no copy of the buffer. Reads go
    through byte-string views ("V8", "V16"), which numpy gathers several times faster than an unaligned integer
    view, and are then seen as integers."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.v4 = self._view(data, 4)
        self.v8 = self._view(data, 8)
        self.v16 = self._view(data, 16)

    @staticmethod
    def _view(data: np.ndarray, size: int) -> np.ndarray:
        count = max(len(data) - size + 1, 0)
        if count == 0:
            return np.zeros(0, f"V{size}")
        return np.ndarray((count,), f"V{size}", data, 0, (1,))

    def u32(self, at: np.ndarray) -> np.ndarray:
        return self.v4[at].view("<u4").astype(np.uint64)

    def u64(self, at: np.ndarray) -> np.ndarray:
        return self.v8[at].view("<u8")

    def mix16(self, at: np.ndarray, secret_at: int) -> np.ndarray:
        """XXH3's mix of the 16 bytes at each position with the secret's 16 bytes at `secret_at` (seed 0)."""
        pair = self.v16[at].view("<u8")
        return _mul128_fold64(pair[0::2] ^ _s64(secret_at), pair[1::2] ^ _s64(secret_at + 8))


def hashes(data: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """xxh3-64 of each slice `data[start:end]` of a uint8 buffer, as uint64: the values
    `xxhash.xxh3_64_intdigest(data[s:e])` gives."""
    start = np.asarray(start, np.int64)
    end = np.asarray(end, np.int64)
    words = _Words(data)
    out = np.empty(len(start), np.uint64)
    # a block's temporaries stay in the CPU's cache (a batch's would not: each step would go to memory)
    for lo in range(0, len(start), BLOCK):
        out[lo : lo + BLOCK] = _block(words, start[lo : lo + BLOCK], end[lo : lo + BLOCK])
    return out


def _block(words: _Words, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    data = words.data
    n = len(start)
    out = np.empty(n, np.uint64)
    length = end - start

    def rows(lo: int, hi: int) -> np.ndarray:
        return np.flatnonzero((length >= lo) & (length <= hi))

    out[length == 0] = _xxh64_avalanche(np.array([_s64(56) ^ _s64(64)], np.uint64))[0]
    i = rows(1, 3)
    if len(i):
        s, m = start[i], length[i].astype(np.uint64)
        combined = (
            _shl(data[s].astype(np.uint64), 16)
            | _shl(data[s + (length[i] >> 1)].astype(np.uint64), 24)
            | data[end[i] - 1].astype(np.uint64)
            | _shl(m, 8)
        )
        out[i] = _xxh64_avalanche(combined ^ _U(_s32(0) ^ _s32(4)))
    i = rows(4, 8)
    if len(i):
        first = words.u32(start[i])
        last = words.u32(end[i] - 4)
        h = (last + _shl(first, 32)) ^ (_s64(8) ^ _s64(16))
        h = h ^ _rotl(h, 49) ^ _rotl(h, 24)
        h = h * _PRIME_MX2
        h = h ^ (_shr(h, 35) + length[i].astype(np.uint64))
        h = h * _PRIME_MX2
        out[i] = h ^ _shr(h, 28)
    i = rows(9, 16)
    if len(i):
        lo = words.u64(start[i]) ^ (_s64(24) ^ _s64(32))
        hi = words.u64(end[i] - 8) ^ (_s64(40) ^ _s64(48))
        acc = length[i].astype(np.uint64) + lo.byteswap() + hi + _mul128_fold64(lo, hi)
        out[i] = _avalanche(acc)
    i = rows(17, 128)
    if len(i):
        s, e, m = start[i], end[i], length[i]
        acc = m.astype(np.uint64) * _PRIME64_1
        for k in range(4):  # rounds from both ends, while the slice is longer than 32 k bytes
            more = np.flatnonzero(m > 32 * k)
            if len(more) == 0:
                break
            add = words.mix16(s[more] + 16 * k, 32 * k) + words.mix16(e[more] - 16 * (k + 1), 32 * k + 16)
            acc[more] += add
        out[i] = _avalanche(acc)
    i = rows(129, MAX_LENGTH)
    if len(i):
        s, e, m = start[i], end[i], length[i]
        acc = m.astype(np.uint64) * _PRIME64_1
        for k in range(8):
            acc += words.mix16(s + 16 * k, 16 * k)
        acc = _avalanche(acc)
        acc_end = words.mix16(e - 16, 136 - 17)
        rounds = m // 16
        for k in range(8, 16):  # the middle 16-byte rounds, with the secret read 3 bytes on
            more = np.flatnonzero(rounds > k)
            if len(more) == 0:
                break
            acc_end[more] += words.mix16(s[more] + 16 * k, 16 * (k - 8) + 3)
        out[i] = _avalanche(acc + acc_end)
    i = np.flatnonzero(length > MAX_LENGTH)
    if len(i):
        mv = memoryview(data)
        h = xxhash.xxh3_64_intdigest
        out[i] = np.fromiter(
            (h(mv[a:b]) for a, b in zip(start[i].tolist(), end[i].tolist(), strict=True)), np.uint64, len(i)
        )
    return out
