"""A checkpoint store that saves a partition's offset and DIV state together, atomically.

Each checkpoint file is Venice's PartitionState v24 bytes followed by a 12-byte trailer (payload length, CRC32,
`TGCK`), so a torn or bit-flipped file is refused with a clear error instead of being loaded as garbage.
Writes go to a temporary file in the same directory, are fsynced, then renamed over the old checkpoint (and the
directory fsynced): a writer killed at any instant leaves either the old or the new checkpoint, never a mix.
"""

from __future__ import annotations

import os
import re
import struct
import uuid
import zlib
from pathlib import Path

from . import partition_state as ps

_TRAILER = struct.Struct(">IIl")  # length, crc32, magic
_MAGIC = int.from_bytes(b"TGCK", "big", signed=True)


class CorruptCheckpointError(Exception):
    """A checkpoint file that is truncated, corrupted or not a checkpoint; names the file."""


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the complete new one. The file gets the
    mode of any file a program creates, 0666 less the umask (0644 under the usual 022), as the Parquet files
    beside it do: a temporary file from `tempfile` would be private (0600), and so would the file renamed from it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def frame(payload: bytes) -> bytes:
    return payload + _TRAILER.pack(len(payload), zlib.crc32(payload), _MAGIC)


def unframe(data: bytes, name: str) -> bytes:
    if len(data) < _TRAILER.size:
        raise CorruptCheckpointError(f"checkpoint {name} is truncated ({len(data)} bytes)")
    length, crc, magic = _TRAILER.unpack(data[-_TRAILER.size :])
    payload = data[: -_TRAILER.size]
    if magic != _MAGIC:
        raise CorruptCheckpointError(
            f"checkpoint {name} has no tidegauge trailer (not a checkpoint, or torn)"
        )
    if length != len(payload) or zlib.crc32(payload) != crc:
        raise CorruptCheckpointError(f"checkpoint {name} is corrupted (length or CRC32 mismatch)")
    return payload


class CheckpointStore:
    """Checkpoints of many (topic, partition)s in one directory, one file each."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def path(self, topic: str, partition: int) -> Path:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", topic):
            raise ValueError(f"topic name {topic!r} is not a valid Kafka topic name")
        return self.directory / f"{topic}-{partition}.partition_state"

    def save(
        self,
        topic: str,
        partition: int,
        offset: int,
        producer_states: dict[bytes, dict],
        *,
        end_of_push: bool,
        **extra,
    ) -> Path:
        """Save offset and DIV state as one PartitionState record, atomically."""
        state = ps.build(offset, producer_states, end_of_push=end_of_push, **extra)
        path = self.path(topic, partition)
        atomic_write(path, frame(ps.encode(state)))
        return path

    def load(self, topic: str, partition: int) -> dict | None:
        """The decoded PartitionState, or None when no checkpoint exists. Raises CorruptCheckpointError."""
        path = self.path(topic, partition)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        payload = unframe(data, str(path))
        try:
            return ps.decode(payload)
        except ps.PartitionStateError as exc:
            raise CorruptCheckpointError(f"checkpoint {path}: {exc}") from None
