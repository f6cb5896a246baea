"""The part of a partition's Leap Frog state that grows with its keys, kept so that a micro-batch pays for the keys
it touches, not for the keys the partition holds.

What the watch carries for a VT partition (`leapfrog_step.PartitionState`) has two parts of very different sizes:

- per partition and small: each region's scan facts, the records of keys still *in play* (waiting for marks, so
  bounded by the lag window), the reported findings, chunks in flight. It stays one value (`partition_state`),
  read and rewritten by every micro-batch;
- per key: each *settled* key's current record per region (`leapfrog.settle`: every pair's current records are
  comparable, so only a new record can make the key matter again). That is nearly all of the state at 100k keys,
  and a micro-batch needs only the settled records of the keys its new records touch.

The settled records live in the state store as a base (`settled_base`, one Arrow IPC value, written when it is
compacted) and an append-only log (`settled_log`, one entry a micro-batch: the touched keys whose settled records
it took out, and the keys it settled, with their records). A micro-batch appends only its entry. The base is
rewritten once the log has grown to its size, so that cost is amortised over the micro-batches whose entries
made the log that long.

Reading the base and the log on every micro-batch would cost what the whole value did. So each Python worker
keeps the records it last wrote for a partition (`SettledRecords`, looked up by a key's sortkey with a binary
search), under a token: a new random token is written into the small value with every update. A micro-batch whose
small value names the token the worker holds takes the records from memory; any other — a restart, another
worker, a micro-batch Spark runs again with the state before it — rebuilds them from the base and the log, so
what a micro-batch computes never depends on the cache: exactly-once is unchanged.

A value written before this split (everything in `partition_state`, settled records among its carried ones) is
read as it is: its settled records move into a new base on its first micro-batch.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.leapfrog.carried import CARRIED_SCHEMA, sortkeys
from pipelines.leapfrog.state import carry_flags

SETTLED_FLAG = 4  # `state.pack_carry_array`'s flag of a settled key's record
# a log entry's row that only says its key's settled records were taken out (the key is in play again)
TOMBSTONE_REGION = -1
# the base is rewritten when the log holds at least as many rows as it does, and never for fewer than this
MIN_COMPACTION_ROWS = 100_000
# segments of records added since the last merge, before they are merged into one (a lookup searches each)
MAX_SEGMENTS = 8
# what one Python worker keeps of the partitions it ran last (the least recently used go first; the last one is
# always kept): about 100 bytes a settled record, so some 5 M records
CACHE_BYTES = 512 << 20

_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


def ipc_bytes(table: pa.Table) -> bytes:
    """A carried-records table as one LZ4-compressed Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, CARRIED_SCHEMA, options=_IPC_OPTIONS) as w:
        w.write_table(table.cast(CARRIED_SCHEMA))
    return sink.getvalue().to_pybytes()


def ipc_table(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def is_settled(carried: pa.Table) -> np.ndarray:
    """Which carried records are a settled key's."""
    if carried.num_rows == 0:
        return np.zeros(0, bool)
    return (carry_flags(carried.column("carry").combine_chunks()) & SETTLED_FLAG) != 0


def with_sortkeys(t: pa.Table) -> pa.Table:
    """`t` with every sortkey filled in (a record carried by the two-phase path has none)."""
    col = t.column("sortkey")
    if col.null_count == 0:
        return t
    keys = sortkeys(t.column("partition").combine_chunks(), t.column("key").combine_chunks())
    return t.set_column(t.schema.get_field_index("sortkey"), "sortkey", keys)


@dataclass
class _Segment:
    table: pa.Table  # CARRIED_SCHEMA, sorted by sortkey
    sortkey: np.ndarray
    dead: np.ndarray  # rows taken out since
    live: int

    @classmethod
    def of(cls, rows: pa.Table) -> _Segment:
        rows = with_sortkeys(rows.cast(CARRIED_SCHEMA)).combine_chunks()
        sortkey = rows.column("sortkey").to_numpy()
        if len(sortkey) > 1 and (np.diff(sortkey) < 0).any():  # a base is written sorted already
            rows = rows.take(pc.sort_indices(rows.column("sortkey"))).combine_chunks()
            sortkey = rows.column("sortkey").to_numpy()
        return cls(rows, sortkey, np.zeros(rows.num_rows, bool), rows.num_rows)

    def live_rows(self) -> pa.Table:
        return self.table.filter(pa.array(~self.dead)) if self.dead.any() else self.table


class SettledRecords:
    """One partition's settled records in memory: a key's records are found by a binary search on its sortkey
    (crc32 of the key, `carried.sortkeys`), then compared by key, so taking a micro-batch's touched keys out costs
    O(touched × log keys), not a pass over every record."""

    def __init__(self, base: pa.Table | None = None) -> None:
        self.segments: list[_Segment] = []
        if base is not None and base.num_rows:
            self.segments.append(_Segment.of(base))

    @property
    def rows(self) -> int:
        return sum(s.live for s in self.segments)

    @property
    def nbytes(self) -> int:
        return sum(s.table.nbytes + s.sortkey.nbytes + s.dead.nbytes for s in self.segments)

    def take(self, keys: pa.Array, partition: int) -> pa.Table:
        """The records of `keys` (distinct), taken out: their keys are in play again."""
        keys = keys.cast(pa.binary())
        found = []
        if len(keys) and self.segments:
            wanted = sortkeys(pa.array(np.full(len(keys), partition, np.int32)), keys).to_numpy()
            for seg in self.segments:
                lo = np.searchsorted(seg.sortkey, wanted, "left")
                counts = np.searchsorted(seg.sortkey, wanted, "right") - lo
                total = int(counts.sum())
                if total == 0:
                    continue
                starts = np.repeat(lo - (np.cumsum(counts) - counts), counts)
                rows = starts + np.arange(total)
                which = np.repeat(np.arange(len(keys)), counts)
                same = pc.equal(seg.table.column("key").take(rows), keys.take(pa.array(which)))
                rows = rows[same.to_numpy(zero_copy_only=False) & ~seg.dead[rows]]
                if len(rows):
                    seg.dead[rows] = True
                    seg.live -= len(rows)
                    found.append(seg.table.take(pa.array(rows)))
            self.segments = [s for s in self.segments if s.live]
        return pa.concat_tables(found) if found else CARRIED_SCHEMA.empty_table()

    def add(self, rows: pa.Table) -> None:
        """Records of keys that settled (none of them held here)."""
        if rows.num_rows == 0:
            return
        self.segments.append(_Segment.of(rows))
        if len(self.segments) > MAX_SEGMENTS:
            # the newer segments into one; all of them when that outgrows the oldest (the last compaction's)
            first, rest = self.segments[0], self.segments[1:]
            merged = pa.concat_tables([s.live_rows() for s in rest])
            if merged.num_rows >= first.live:
                self.segments = [_Segment.of(pa.concat_tables([first.live_rows(), merged]))]
            else:
                self.segments = [first, _Segment.of(merged)]

    def apply(self, entry: pa.Table) -> None:
        """A log entry (`PartitionStore`): its keys' records out, then its records in."""
        self.take(pc.unique(entry.column("key").combine_chunks()), _partition_of(entry))
        region = entry.column("region").to_numpy()
        self.add(entry.filter(pa.array(region != TOMBSTONE_REGION)))

    def table(self) -> pa.Table:
        """Every record held, sorted by sortkey."""
        if not self.segments:
            return CARRIED_SCHEMA.empty_table()
        if len(self.segments) > 1 or self.segments[0].dead.any():
            self.segments = [_Segment.of(pa.concat_tables([s.live_rows() for s in self.segments]))]
        return self.segments[0].table


def _partition_of(entry: pa.Table) -> int:
    return int(entry.column("partition")[0].as_py()) if entry.num_rows else 0


def log_entry(partition: int, taken_keys: pa.Array, settled: pa.Table) -> pa.Table:
    """A micro-batch's log entry: a tombstone for each key whose settled records it took out, then the records
    of the keys it settled."""
    m = len(taken_keys)
    tombstones = pa.table(
        {
            "partition": pa.array(np.full(m, partition, np.int32)),
            "key": taken_keys.cast(pa.binary()),
            "region": pa.array(np.full(m, TOMBSTONE_REGION, np.int32)),
            "offset": pa.array(np.full(m, -1, np.int64)),
            "value_hash": pa.nulls(m, pa.int64()),
            "carry": pa.nulls(m, pa.binary()),
            "bucket": pa.array(np.full(m, -1, np.int32)),
            "sortkey": pa.nulls(m, pa.int64()),
        },
        schema=CARRIED_SCHEMA,
    )
    return pa.concat_tables([tombstones, settled.cast(CARRIED_SCHEMA)])


class Backend(Protocol):
    """Where a partition's state is kept (Spark's state variables in the watch; a dict in tests and benches)."""

    def value(self) -> bytes | None: ...  # the small value (`partition_state`)

    def update(self, value: bytes) -> None: ...

    def base(self) -> bytes | None: ...  # `settled_base`

    def log(self) -> Iterable[bytes]: ...  # `settled_log`, oldest first

    def append(self, entry: bytes) -> None: ...

    def rewrite(self, base: bytes) -> None: ...  # a new base, and an empty log


@dataclass
class MemoryBackend:
    """A `Backend` in memory, which counts what each micro-batch reads and writes."""

    small: bytes | None = None
    base_value: bytes | None = None
    entries: list[bytes] = field(default_factory=list)
    read_bytes: int = 0
    written_bytes: int = 0

    def value(self) -> bytes | None:
        self.read_bytes += len(self.small or b"")
        return self.small

    def update(self, value: bytes) -> None:
        self.written_bytes += len(value)
        self.small = value

    def base(self) -> bytes | None:
        self.read_bytes += len(self.base_value or b"")
        return self.base_value

    def log(self) -> Iterable[bytes]:
        self.read_bytes += sum(len(e) for e in self.entries)
        return list(self.entries)

    def append(self, entry: bytes) -> None:
        self.written_bytes += len(entry)
        self.entries.append(entry)

    def rewrite(self, base: bytes) -> None:
        self.written_bytes += len(base)
        self.base_value, self.entries = base, []

    def copy(self) -> MemoryBackend:
        """What a state store keeps of this version (a re-run micro-batch starts from it)."""
        return MemoryBackend(self.small, self.base_value, list(self.entries))


# (cache key) → (token, records): what this Python worker last wrote for a partition
_CACHE: OrderedDict[Hashable, tuple[str, SettledRecords]] = OrderedDict()


def forget_cached() -> None:
    """Empty this worker's cache (tests: a restart, another worker)."""
    _CACHE.clear()


@dataclass
class StoreStats:
    """What the last micro-batch read and wrote, and where its time went."""

    cached: bool = False  # its settled records came from this worker's memory
    settled_rows: int = 0  # settled records the partition holds after it
    taken_rows: int = 0  # settled records of the keys it touched
    entry_rows: int = 0  # rows of its log entry (0: it rewrote the base)
    entry_bytes: int = 0
    value_bytes: int = 0  # the small value
    base_bytes: int = 0  # a base it rewrote
    read_s: float = 0.0  # the small value (and, without the cache, the base and log) read and decoded
    step_s: float = 0.0  # the step, with the lookup of its touched keys' settled records
    lookup_s: float = 0.0
    write_s: float = 0.0  # what it wrote, encoded and written


class PartitionStore:
    """Runs `LeapfrogStep` over one partition's micro-batch with its state split in two (this module's
    docstring): the small value in full, the settled records of the touched keys only."""

    def __init__(self, backend: Backend, cache_key: Hashable) -> None:
        self.backend, self.cache_key = backend, cache_key
        self.stats = StoreStats()

    def run(self, step: Callable, partition: int, records: dict, envelopes: dict | None = None):
        """`step(partition, records, state, envelopes, settled=...)` (`LeapfrogStep`) with the partition's state:
        its `PartitionStep`, whose state's `carried` holds only the records of keys in play."""
        from pipelines.watch.leapfrog_step import PartitionState

        stats = self.stats = StoreStats()
        t0 = time.perf_counter()
        value = self.backend.value()
        state = PartitionState.from_bytes(value) if value is not None else None
        settled, converted = self._settled(state, stats)
        stats.read_s = time.perf_counter() - t0
        taken: list[pa.Array] = []

        def lookup(keys: pa.Array) -> pa.Table:
            t = time.perf_counter()
            rows = settled.take(keys, partition)
            stats.lookup_s += time.perf_counter() - t
            if rows.num_rows:
                taken.append(pc.unique(rows.column("key").combine_chunks()))
            stats.taken_rows += rows.num_rows
            return rows

        t1 = time.perf_counter()
        result = step(partition, records, state, envelopes, settled=lookup)
        t2 = time.perf_counter()
        carried = result.state.carried
        if carried is not None and carried.num_rows:
            now_settled = is_settled(carried)
            new = carried.filter(pa.array(now_settled))
            in_play = carried.filter(pa.array(~now_settled))
            result.state.carried = in_play if in_play.num_rows else None
        else:
            new = CARRIED_SCHEMA.empty_table()
        settled.add(new)
        taken_keys = pa.concat_arrays(taken) if taken else pa.array([], pa.binary())
        meta = dict((state.settled if state is not None else None) or {"base_rows": 0, "log_rows": 0})
        entry_rows = len(taken_keys) + new.num_rows
        if converted or meta["log_rows"] + entry_rows >= max(meta["base_rows"], MIN_COMPACTION_ROWS):
            base = ipc_bytes(settled.table())
            self.backend.rewrite(base)
            stats.base_bytes = len(base)
            meta = {"base_rows": settled.rows, "log_rows": 0}
        elif entry_rows:
            entry = ipc_bytes(log_entry(partition, taken_keys, new))
            self.backend.append(entry)
            stats.entry_rows, stats.entry_bytes = entry_rows, len(entry)
            meta["log_rows"] += entry_rows
        token = uuid.uuid4().hex
        result.state.settled = {**meta, "token": token}
        small = result.state.to_bytes()
        self.backend.update(small)
        _CACHE[self.cache_key] = (token, settled)
        _CACHE.move_to_end(self.cache_key)
        while len(_CACHE) > 1 and sum(r.nbytes for _, r in _CACHE.values()) > CACHE_BYTES:
            _CACHE.popitem(last=False)
        stats.value_bytes, stats.settled_rows = len(small), settled.rows
        stats.step_s, stats.write_s = t2 - t1, time.perf_counter() - t2
        return result

    def _settled(self, state, stats: StoreStats) -> tuple[SettledRecords, bool]:
        """The partition's settled records (from this worker's memory when its token matches), and whether they
        came from a value written before the split (then its base is written now)."""
        # taken out while the micro-batch runs: one that fails leaves nothing behind that could be mistaken for
        # the state it would have written
        cached = _CACHE.pop(self.cache_key, None)
        meta = state.settled if state is not None else None
        if meta is not None and cached is not None and cached[0] == meta.get("token"):
            stats.cached = True
            return cached[1], False
        base = self.backend.base() if meta is not None else None
        records = SettledRecords(ipc_table(base) if base else None)
        if meta is not None:
            for entry in self.backend.log():
                records.apply(ipc_table(entry))
        converted = False
        if state is not None and state.carried is not None and state.carried.num_rows:
            old = is_settled(state.carried)
            if old.any():  # a value written before the split: its settled records move out
                records.add(state.carried.filter(pa.array(old)))
                rest = state.carried.filter(pa.array(~old))
                state.carried = rest if rest.num_rows else None
                converted = True
        return records, converted
