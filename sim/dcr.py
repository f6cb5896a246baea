"""Deterministic conflict resolution (DCR) of an active/active replica: which incoming write wins a key.

The rule is Venice's value-level merge (`AbstractMerge` / `MergeUtils`, quoted in `leapfrog.repair`'s module
docstring; `leapfrog.repair.dcr_apply` is the reference this module is tested against): the higher logical
timestamp wins; on an *equal* timestamp a DELETE wins (over a PUT or a DELETE), a stored DELETE stays against a
PUT, and between PUTs the value with the strictly higher Java `ByteBuffer.hashCode` (`java_bytes_hash`) wins —
equal hashes keep the stored value. A leader writes a VT record only for a winning write; losers are dropped.

One addition, for the simulator's failovers: an incoming write with the winner's timestamp *and coordinates*
(source region, RT offset) is the same RT write delivered again — a new leader re-processing the RT records its
predecessor had processed but not checkpointed. Venice's new leader replays them through the same merge; the
simulator models that replay as re-applying the write (Venice's merge would keep the stored value on the equal
hash, and a DELETE wins the tie anyway). It is harmless (same write) and is what puts duplicates in a VT after a
failover, which the change-capture tests count against `truth.json`'s re-applied offsets.

`ReplicaStore` stands for what a replica's storage engine keeps per key for DCR (Venice keeps the RMD in its
own column family and compares against the stored value): the winner's timestamp, whether it is a DELETE, the
Java hash of the value stored (never the value bytes) and its coordinates, packed into one integer per key; and
— only in legacy mode — the per-key `replication_checkpoint_vector` Venice used to maintain (before Venice's
commit 42d5245dfb: extend with zeros up to the region's index, then overwrite that slot with the RT offset of the
applied write).
"""

from __future__ import annotations

from typing import NamedTuple

from leapfrog.repair import java_bytes_hash, tie_replaces

# One int per key: timestamp | region | RT offset | delete bit | Java hash + 2**31 (so that the unsigned field
# compares like the signed hash). The timestamp is on top: one shift reads it.
_HASH_BITS = 32
_DELETE = 1 << _HASH_BITS
_OFFSET_SHIFT = _HASH_BITS + 1
_OFFSET_BITS = 40
_REGION_BITS = 4
_COORD_SHIFT = _OFFSET_SHIFT
_COORD_MASK = (1 << (_REGION_BITS + _OFFSET_BITS)) - 1
_TS_SHIFT = _OFFSET_SHIFT + _OFFSET_BITS + _REGION_BITS
_HASH_MASK = (1 << _HASH_BITS) - 1
_HASH_BIAS = 1 << (_HASH_BITS - 1)


class Winner(NamedTuple):
    """A key's stored DCR state: the winning write's timestamp, op, the Java hash of the value stored (None for a
    DELETE) and coordinates."""

    timestamp: int
    is_delete: bool
    value_hash: int | None
    region: int
    rt_offset: int


class ReplicaStore:
    """Per-key DCR state of one replica (one region's partition). Survives leader failovers."""

    __slots__ = ("legacy", "_winner", "_vector", "values")

    def __init__(self, legacy_vectors: bool = False, track_values: bool = False) -> None:
        self.legacy = legacy_vectors
        self._winner: dict[bytes, int] = {}
        self._vector: dict[bytes, list[int]] = {}
        # key -> the value the replica serves (None: deleted); kept only when a version swap needs a bulk load
        self.values: dict[bytes, bytes | None] | None = {} if track_values else None

    def copy(self) -> ReplicaStore:
        """The replica's state as a re-push carries it into a new version: winners (Venice copies the RMD along
        with the values), vectors and values."""
        out = ReplicaStore(self.legacy, self.values is not None)
        out._winner = dict(self._winner)
        out._vector = {k: list(v) for k, v in self._vector.items()}
        if self.values is not None:
            out.values = dict(self.values)
        return out

    def __len__(self) -> int:
        return len(self._winner)

    def resolve(
        self,
        key: bytes,
        timestamp: int,
        region: int,
        rt_offset: int,
        value: bytes | None,
        stored_value: bytes | None = None,
    ) -> list[int] | None:
        """Apply the write if it wins; returns its RMD vector (empty unless legacy), or None when it loses.

        `value`: the RT write's value (None: a DELETE), what Venice's merge compares on a tie. `stored_value`: what
        the replica stores instead when that differs (a poisoned leader's write): its hash is what a later tie is
        compared with. The hash is computed only for a winning PUT (and for an incoming PUT on a tie)."""
        if not 0 <= region < 1 << _REGION_BITS or not 0 <= rt_offset < 1 << _OFFSET_BITS or timestamp < 0:
            raise ValueError(
                f"write out of range: timestamp {timestamp}, region {region}, RT offset {rt_offset}"
            )
        coord = (region << _OFFSET_BITS) | rt_offset
        stored = self._winner.get(key)
        h = None
        if stored is not None:
            stored_ts = stored >> _TS_SHIFT
            if timestamp < stored_ts:
                return None
            if timestamp == stored_ts and coord != (stored >> _COORD_SHIFT) & _COORD_MASK:
                # a tie between two different writes: Venice's rule, the one implementation in leapfrog.repair
                # (biased hashes compare as the hashes do)
                stored_delete = bool(stored & _DELETE)
                if value is not None and not stored_delete:
                    h = java_bytes_hash(value) + _HASH_BIAS
                if not tie_replaces(stored_delete, stored & _HASH_MASK, value is None, h):
                    return None
        if value is None:
            low = _DELETE
        elif stored_value is not None:
            low = java_bytes_hash(stored_value) + _HASH_BIAS
        else:
            low = java_bytes_hash(value) + _HASH_BIAS if h is None else h
        self._winner[key] = (((timestamp << (_REGION_BITS + _OFFSET_BITS)) | coord) << _COORD_SHIFT) | low
        if not self.legacy:
            return []
        vector = self._vector.get(key)
        vector = [] if vector is None else list(vector)
        if len(vector) <= region:
            vector.extend([0] * (region + 1 - len(vector)))
        vector[region] = rt_offset
        self._vector[key] = vector
        return vector

    def winner(self, key: bytes) -> Winner | None:
        """The key's stored DCR state, None when no write was applied to it."""
        stored = self._winner.get(key)
        if stored is None:
            return None
        coord = (stored >> _COORD_SHIFT) & _COORD_MASK
        is_delete = bool(stored & _DELETE)
        return Winner(
            timestamp=stored >> _TS_SHIFT,
            is_delete=is_delete,
            value_hash=None if is_delete else (stored & _HASH_MASK) - _HASH_BIAS,
            region=coord >> _OFFSET_BITS,
            rt_offset=coord & ((1 << _OFFSET_BITS) - 1),
        )
