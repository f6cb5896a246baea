"""Deterministic conflict resolution (DCR) of an active/active replica: which incoming write wins a key.

The rule is last writer wins on (logical timestamp, region id, RT offset): every region orders the writes of
a key the same way, because a write's RT offset is the same wherever its RT is consumed. A leader writes a VT
record only for a winning write; losers are dropped. A write that compares *equal* to the stored winner is the
same write delivered again (a new leader re-processing RT records after a failover): it is applied again,
which is harmless (same value) and is what puts duplicates in a VT after a failover.

`ReplicaStore` stands for what a replica's storage engine keeps per key for DCR (Venice keeps it in the RMD
column family): the winner's timestamp and coordinates, and — only in legacy mode — the per-key
`replication_checkpoint_vector` Venice used to maintain (before Venice's commit 42d5245dfb: extend with zeros up to the region's
index, then overwrite that slot with the RT offset of the applied write).
"""

from __future__ import annotations

_OFFSET_BITS = 40
_REGION_BITS = 4


def order_key(timestamp: int, region: int, rt_offset: int) -> int:
    """The write's position in the DCR order as one integer (compares like the tuple, cheaper to keep)."""
    return (((timestamp << _REGION_BITS) | region) << _OFFSET_BITS) | rt_offset


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

    def resolve(self, key: bytes, timestamp: int, region: int, rt_offset: int) -> list[int] | None:
        """Apply the write if it wins; returns its RMD vector (empty unless legacy), or None when it loses."""
        incoming = order_key(timestamp, region, rt_offset)
        stored = self._winner.get(key)
        if stored is not None and incoming < stored:
            return None
        self._winner[key] = incoming
        if not self.legacy:
            return []
        vector = self._vector.get(key)
        vector = [] if vector is None else list(vector)
        if len(vector) <= region:
            vector.extend([0] * (region + 1 - len(vector)))
        vector[region] = rt_offset
        self._vector[key] = vector
        return vector

    def winner(self, key: bytes) -> int | None:
        return self._winner.get(key)
