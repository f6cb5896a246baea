"""The online traffic of a run, decided up front from the seed: who writes which key when, and how big.

Generating the whole schedule first (numpy arrays, a few seconds for millions of writes) is what makes a run
deterministic whatever Kafka does: the simulator only replays it. Each region writes as a Poisson process at its
own rate (simulated writes per second), minus its quiet periods; keys follow a Zipf-like popularity (`key_skew`)
over a shuffled key space, so hot keys land in every partition; a fraction of writes are DELETEs.

Keys are Avro-serialized strings (`key-00000042`), as a Venice store with a string key schema would write them,
and are partitioned with Venice's default partitioner (DefaultVenicePartitioner). Values are opaque bytes whose first bytes
name the write (region and write id), so every write's value is distinct and a reader can tell where a value
came from.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from div.avro_bits import write_long

from .config import SimConfig

PUT, DELETE = 0, 1
_VALUE_HEAD = struct.Struct(">cBQ")  # b"W", region, write id
_POOL_SPAN = 4096


def key_content(key_id: int) -> bytes:
    """Key bytes as a Venice store with a string key schema serializes them (Avro string)."""
    text = b"key-%08d" % key_id
    return write_long(len(text)) + text


def venice_partition(key: bytes, partitions: int) -> int:
    """Venice's DefaultVenicePartitioner: MD5 of the serialized key as an unsigned big-endian integer, mod P."""
    return int.from_bytes(hashlib.md5(key).digest(), "big") % partitions


@dataclass
class KeySpace:
    """Every key of the run: its bytes and its partition."""

    keys: list[bytes]
    partition: np.ndarray  # int32 per key id

    @classmethod
    def build(cls, n: int, partitions: int) -> KeySpace:
        keys = [key_content(i) for i in range(n)]
        part = np.fromiter((venice_partition(k, partitions) for k in keys), dtype=np.int32, count=n)
        return cls(keys, part)


@dataclass
class Schedule:
    """Online writes in the order they happen (time, then region, then generation order).

    `heartbeat_after[i]`: write i is the K-th, 2K-th, ... write of its region to its partition, so the leader of
    that region and partition writes an RT heartbeat right after it (the record-count half of the cadence).
    """

    time_ms: np.ndarray  # int64, absolute simulated epoch ms
    region: np.ndarray  # int16
    key: np.ndarray  # int64 key id
    partition: np.ndarray  # int32
    op: np.ndarray  # int8, PUT or DELETE
    size: np.ndarray  # int32 value size (PUTs)
    writer: np.ndarray  # int16 producer index within the region
    heartbeat_after: np.ndarray  # bool
    start_ms: int
    nominal_end_ms: int

    def __len__(self) -> int:
        return int(self.time_ms.size)

    @property
    def end_ms(self) -> int:
        """Time of the last write (the start when there is none)."""
        return int(self.time_ms[-1]) if len(self) else self.start_ms

    def without_keys(self, keys: set[int]) -> Schedule:
        """The schedule minus every write of `keys` (a live run never writes a dropped or poisoned key again,
        so that nothing heals it)."""
        if not keys or not len(self):
            return self
        keep = ~np.isin(self.key, np.fromiter(keys, dtype=np.int64, count=len(keys)))
        if keep.all():
            return self
        return Schedule(
            self.time_ms[keep],
            self.region[keep],
            self.key[keep],
            self.partition[keep],
            self.op[keep],
            self.size[keep],
            self.writer[keep],
            self.heartbeat_after[keep],
            self.start_ms,
            self.nominal_end_ms,
        )


def _key_sampler(cfg: SimConfig, rng: np.random.Generator):
    n = cfg.keys
    ranks = np.arange(1, n + 1, dtype=np.float64)
    weights = ranks ** (-cfg.key_skew) if cfg.key_skew > 0 else np.ones(n)
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    by_rank = rng.permutation(n)  # rank -> key id: popularity is not tied to key order or partition

    def sample(size: int) -> np.ndarray:
        ranks_drawn = np.searchsorted(cdf, rng.random(size), side="right")
        return by_rank[np.minimum(ranks_drawn, n - 1)].astype(np.int64)

    return sample


def build_schedule(cfg: SimConfig, keyspace: KeySpace, rng: np.random.Generator) -> Schedule:
    """The online writes of the run: exactly `cfg.records` of them."""
    start = cfg.start_ms
    nominal = cfg.nominal_duration_ms()
    sample_keys = _key_sampler(cfg, rng)
    total_rate = sum(cfg.rate(r) for r in range(cfg.regions))
    factor = 1.25
    while True:
        times, regions, keys, parts = [], [], [], []
        for r in range(cfg.regions):
            share = cfg.records * cfg.rate(r) / total_rate
            n = int(share * factor) + 64
            gaps = rng.exponential(1000.0 / cfg.rate(r), n)
            t = start + np.floor(np.cumsum(gaps)).astype(np.int64)
            k = sample_keys(n)
            p = keyspace.partition[k]
            keep = np.ones(n, dtype=bool)
            for q in cfg.quiet:
                if q.region != r:
                    continue
                q0, q1 = start + int(q.start * nominal), start + int(q.end * nominal)
                inside = (t >= q0) & (t < q1)
                if q.partitions is not None:
                    inside &= np.isin(p, np.asarray(q.partitions, dtype=np.int32))
                keep &= ~inside
            times.append(t[keep])
            regions.append(np.full(int(keep.sum()), r, dtype=np.int16))
            keys.append(k[keep])
            parts.append(p[keep])
        t = np.concatenate(times) if times else np.zeros(0, np.int64)
        if t.size >= cfg.records:
            break
        factor *= 2  # quiet periods removed more than expected: draw again, longer
    region = np.concatenate(regions)
    order = np.argsort(((t - start) << 5) | region.astype(np.int64), kind="stable")[: cfg.records]
    t, region = t[order], region[order]
    key = np.concatenate(keys)[order]
    part = np.concatenate(parts)[order]
    n = t.size
    op = (rng.random(n) < cfg.delete_ratio).astype(np.int8)
    size = rng.integers(cfg.value_size_min, cfg.value_size_max + 1, n, dtype=np.int32)
    writer = rng.integers(0, cfg.producers_per_region, n, dtype=np.int16)
    return Schedule(
        t,
        region,
        key,
        part,
        op,
        size,
        writer,
        _every_kth(region, part, cfg.partitions, cfg.heartbeat_every_records),
        start,
        start + nominal,
    )


def _every_kth(region: np.ndarray, part: np.ndarray, partitions: int, k: int) -> np.ndarray:
    """True at the k-th, 2k-th, ... write of each (region, partition), in schedule order."""
    n = region.size
    out = np.zeros(n, dtype=bool)
    if n == 0:
        return out
    group = region.astype(np.int64) * partitions + part
    order = np.argsort(group, kind="stable")
    g = group[order]
    starts = np.concatenate(([0], np.flatnonzero(np.diff(g)) + 1))
    first_of_group = np.repeat(starts, np.diff(np.concatenate((starts, [n]))))
    rank = np.arange(n) - first_of_group + 1  # 1-based position within the group
    out[order] = rank % k == 0
    return out


class Values:
    """Value bytes of writes and of the push job: a name (region, write id) followed by seeded filler."""

    def __init__(self, rng: np.random.Generator, max_size: int) -> None:
        self._pool = rng.bytes(max_size + _POOL_SPAN)

    def write(self, write_id: int, region: int, size: int) -> bytes:
        head = _VALUE_HEAD.pack(b"W", region, write_id)
        start = (write_id * 7919) % _POOL_SPAN
        return head + self._pool[start : start + size - len(head)]

    def batch(self, key_id: int, size: int) -> bytes:
        head = _VALUE_HEAD.pack(b"B", 255, key_id)
        start = (key_id * 104729) % _POOL_SPAN
        return head + self._pool[start : start + size - len(head)]


def poison(value: bytes) -> bytes:
    """The value a poisoned leader writes instead of `value`: same size, different bytes."""
    return b"P" + bytes(b ^ 0x5A for b in value[1:9]) + value[9:]
