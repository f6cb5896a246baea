"""Segment checksums with Venice's exact feed rules (Segment.addToCheckSum, CheckSum).

Producer and consumer feed the same byte strings, in the same order, one `update` call per feed; ints are 4-byte
big-endian; keys are the key content (no header byte). ADHASH (the default) is the 64-bit wrapping sum of the
CRC32 of each feed *separately*, so it does not depend on how the feeds are split or ordered.
"""

from __future__ import annotations

import struct
import zlib

from .md5state import MD5State

NONE, MD5, ADLER32, CRC32, ADHASH = 0, 1, 2, 3, 4
NAMES = {NONE: "NONE", MD5: "MD5", ADLER32: "ADLER32", CRC32: "CRC32", ADHASH: "ADHASH"}
_MASK64 = 0xFFFFFFFFFFFFFFFF
_INT = struct.Struct(">i")


class ChecksumFinalizedError(Exception):
    """A feed after the checksum was finalized at EOS: data after end of segment."""


class UnsupportedMessageTypeError(Exception):
    """A control message type that Venice refuses to checksum (e.g. the deprecated StartOfBufferReplay)."""


class Checksum:
    """A running segment checksum of one type; `state()`/`restore()` give the checkpointable form."""

    __slots__ = ("type", "_adhash", "_crc", "_md5", "_final")

    def __init__(self, checksum_type: int) -> None:
        if checksum_type not in NAMES:
            raise ValueError(f"unknown checksum type {checksum_type}")
        self.type = checksum_type
        self._adhash = 0
        self._crc = 1 if checksum_type == ADLER32 else 0
        self._md5 = MD5State() if checksum_type == MD5 else None
        self._final: bytes | None = None

    def update(self, data: bytes) -> None:
        if self._final is not None:
            raise ChecksumFinalizedError("checksum already finalized")
        t = self.type
        if t == ADHASH:
            self._adhash = (self._adhash + zlib.crc32(data)) & _MASK64
        elif t == CRC32:
            self._crc = zlib.crc32(data, self._crc)
        elif t == ADLER32:
            self._crc = zlib.adler32(data, self._crc)
        elif t == MD5:
            self._md5.update(data)

    def add_crc(self, crc: int) -> None:
        """ADHASH fast path: add a feed whose CRC32 the caller already knows (e.g. a constant feed)."""
        if self._final is not None:
            raise ChecksumFinalizedError("checksum already finalized")
        self._adhash = (self._adhash + crc) & _MASK64

    def value(self) -> bytes:
        """The value an EOS carries, without finalizing."""
        t = self.type
        if t == ADHASH:
            return self._adhash.to_bytes(8, "big")
        if t in (CRC32, ADLER32):
            return self._crc.to_bytes(8, "big")
        if t == MD5:
            return self._md5.digest()
        return b""

    def finalize(self) -> bytes:
        """Finalize (EOS) and return the checksum value; later feeds raise ChecksumFinalizedError."""
        if self._final is None:
            self._final = self.value()
        return self._final

    @property
    def finalized(self) -> bool:
        return self._final is not None

    def state(self) -> bytes:
        """Checkpointable state: ADHASH 8 bytes, MD5 BouncyCastle blob, NONE empty.

        Venice cannot checkpoint CRC32/ADLER32 segments (it throws); we write their running 32-bit value as
        8 big-endian bytes so that our own restores can continue such a segment (a deliberate extension).
        """
        t = self.type
        if t == MD5:
            return self._md5.encoded_state()
        if t == NONE:
            return b""
        return self.value()

    @classmethod
    def restore(cls, checksum_type: int, state: bytes) -> Checksum:
        cs = cls(checksum_type)
        if checksum_type == ADHASH:
            cs._adhash = int.from_bytes(state, "big") if state else 0
        elif checksum_type in (CRC32, ADLER32):
            cs._crc = int.from_bytes(state, "big") if state else cs._crc
        elif checksum_type == MD5 and state:
            cs._md5 = MD5State.from_encoded_state(state)
        return cs

    def copy(self) -> Checksum:
        cs = Checksum.restore(self.type, self.state())
        cs._final = self._final
        return cs


def int_bytes(n: int) -> bytes:
    return _INT.pack(n)


# Feeds of each message kind, exactly as Venice's Segment.addToCheckSum. EOS feeds nothing.
CHECKSUMMED_CONTROL_TYPES = frozenset(
    {0, 1, 2, 5, 6, 7, 8}
)  # SOP, EOP, SOS, SOIP, EOIP, TopicSwitch, VersionSwap
EOS_TYPE = 3


def feeds(
    message_type: int, kind: str, key_content: bytes, body: dict, control_type: int | None = None
) -> list[bytes]:
    """The byte strings fed to the checksum for one message (empty list for EOS)."""
    if kind == "CONTROL":
        if control_type == EOS_TYPE:
            return []
        if control_type not in CHECKSUMMED_CONTROL_TYPES:
            raise UnsupportedMessageTypeError(f"control message type {control_type} cannot be checksummed")
        return [_INT.pack(message_type), _INT.pack(control_type)]
    if kind == "PUT":
        return [_INT.pack(message_type), key_content, _INT.pack(body["schemaId"]), body["putValue"]]
    if kind == "UPDATE":
        return [
            _INT.pack(message_type),
            key_content,
            _INT.pack(body["schemaId"]),
            _INT.pack(body["updateSchemaId"]),
            body["updateValue"],
        ]
    if kind == "DELETE":
        return [_INT.pack(message_type), key_content]
    raise UnsupportedMessageTypeError(f"unknown message kind {kind}")
