"""Generated active/active replication histories with known truth, for Leap Frog's property tests.

The shape of Venice's TLA+ model (venice-protocol-notes §5.9), as a seeded Python generator: a few regions, keys and values;
online writes ``(region, key, value or delete, timestamp)`` land in each region's RT log, with RT heartbeats
between them. Each region's leader consumes the N RT logs in its own random interleaving (lag = another
interleaving, or stopping early), resolves conflicts last-writer-wins with a total order (timestamp, then
region id, then RT offset) and appends a ``DataEntry`` to its VT only when the incoming write wins (losers
are dropped, as A/A leaders do). On consuming an RT heartbeat it writes a VT heartbeat whose vector is its
acknowledged frontier — at most what it processed, sometimes strictly less, never decreasing within a term,
and covering the heartbeat's own RT offset (docs/design.md, rule 3).

Faults, each with ground truth kept by the generator:

- **dropped** — a leader silently skips a winning write;
- **poisoned** — a leader applies and writes a different value;

  both only where they make the region's value wrong at once. Skipping a write whose value the region
  already holds (say a delete of an absent key), or poisoning into the value last-writer-wins gives anyway,
  leaves the values right but the VT without the record the protocol requires, or with a record whose value
  is not its write's; Leap Frog may report such a region later, and truth by values alone cannot say it
  should (``test_leapfrog_rules`` pins one such case);
- **duplicates** — an RT record is delivered twice; the copy loses, or re-emits the current value;
- **leader failover** — a new term rewinds each RT to at or below the last VT heartbeat's watermark and
  reprocesses it with the state kept (duplicates in the VT);
- **compaction** — superseded records and old heartbeats are removed from a VT log, leaving gaps;
- **mid-stream scans** — a region's scan starts right after one of its heartbeats (``FromHeartbeat``);
- **noise** — control messages and records from out-of-range regions occupy VT offsets.

Truth never looks at Leap Frog: region x *diverged on key k* if, at any point, its value for k differed from
last-writer-wins over the writes it had processed (a tombstone equals an absent key).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from functools import cache

from leapfrog.reference import (
    DataEntry,
    Entry,
    FromEndOfPush,
    FromHeartbeat,
    HeartbeatEntry,
    OtherEntry,
    RegionLog,
)


@dataclass(frozen=True)
class Mix:
    """Probabilities of each fault (per write, per step or per region as documented on each field)."""

    name: str
    lag: float = 0.0  # per leader: stop consuming early
    drop: float = 0.0  # per winning write
    poison: float = 0.0  # per winning write
    duplicate: float = 0.0  # per consumed RT record
    failover: float = 0.0  # per consumed RT record (at most two per leader)
    compaction: float = 0.0  # per region
    midstream: float = 0.0  # per region
    noise: float = 0.0  # per consumed RT record
    quiet: bool = False  # one region writes nothing (it still sends heartbeats)
    rmd: bool = True  # leaders write RMD checkpoint vectors (old Venice behaviour) on some records


MIXES: dict[str, Mix] = {
    m.name: m
    for m in (
        Mix("clean"),
        Mix("lag", lag=0.7),
        Mix("drop", lag=0.4, drop=0.15),
        Mix("poison", lag=0.4, poison=0.15),
        Mix("duplicates", lag=0.4, duplicate=0.25),
        Mix("failover", lag=0.4, failover=0.08, duplicate=0.1),
        Mix("compaction", lag=0.4, compaction=0.8, noise=0.1),
        Mix("midstream", lag=0.4, midstream=0.7, noise=0.1),
        Mix("midstream-faults", lag=0.2, drop=0.12, poison=0.12, midstream=0.8),
        Mix("compaction-faults", lag=0.2, drop=0.12, poison=0.12, compaction=0.8),
        Mix("quiet", lag=0.5, quiet=True),
        Mix("faults", lag=0.5, drop=0.08, poison=0.08, duplicate=0.15, failover=0.05),
        Mix(
            "everything",
            lag=0.5,
            drop=0.06,
            poison=0.06,
            duplicate=0.15,
            failover=0.05,
            compaction=0.5,
            midstream=0.4,
            noise=0.1,
        ),
    )
}


@dataclass(frozen=True)
class Write:
    """An online write in region ``region``'s RT at ``rt_offset``; ``value`` None = DELETE."""

    region: int
    rt_offset: int
    key: bytes
    value: int | None
    ts: int

    @property
    def order(self) -> tuple[int, int, int]:
        """Last-writer-wins order: timestamp, then region id, then RT offset (a total order)."""
        return (self.ts, self.region, self.rt_offset)


@dataclass(frozen=True)
class RtHeartbeat:
    region: int
    rt_offset: int


@dataclass
class History:
    """One generated history: the scans to check and everything true about it."""

    seed: int
    mix: Mix
    n_regions: int
    keys: tuple[bytes, ...]
    writes: list[Write]
    vt: dict[int, list[Entry]]  # each region's VT after compaction; offset 0 is End of Push
    logs: dict[int, RegionLog]  # what each region's scan reads
    diverged: dict[int, set[bytes]]
    final_value: dict[int, dict[bytes, int | None]]  # None = absent or deleted
    removed: dict[int, set[int]]  # VT offsets removed by compaction
    start_heartbeat: dict[int, HeartbeatEntry | None]  # where a mid-stream scan starts
    term_starts: dict[int, list[int]]  # VT offsets where each leader term's output begins
    failovers: int = 0
    duplicates: int = 0
    notes: dict[str, int] = field(default_factory=dict)

    # -- facts the property tests use as preconditions, computed from the generated logs ---------------

    def midstream(self, region: int) -> bool:
        return self.start_heartbeat[region] is not None

    def baseline(self, region: int) -> tuple[int, ...]:
        hb = self.start_heartbeat[region]
        return hb.watermarks if hb is not None else (-1,) * self.n_regions

    def shown_hw(self, region: int) -> tuple[int, ...]:
        """The highest RT offsets the region's scan shows processed (footers, heartbeats, baseline)."""
        hw = list(self.baseline(region))
        for e in self.logs[region].entries:
            if isinstance(e, DataEntry) and 0 <= e.source_region < self.n_regions:
                hw[e.source_region] = max(hw[e.source_region], e.source_offset)
            elif isinstance(e, HeartbeatEntry):
                hw = [max(h, w) for h, w in zip(hw, e.watermarks, strict=True)]
                hw[e.origin_region] = max(hw[e.origin_region], e.origin_offset)
        return tuple(hw)

    def covers_writes(self, hw: tuple[int, ...], key: bytes) -> bool:
        return all(hw[w.region] >= w.rt_offset for w in self.writes if w.key == key)

    def has_record(self, region: int, key: bytes) -> bool:
        return any(isinstance(e, DataEntry) and e.key == key for e in self.logs[region].entries)

    def removed_after_last(self, region: int, key: bytes) -> bool:
        """Compaction removed something after the key's last record in the scan (or after the scan start)."""
        hb = self.start_heartbeat[region]
        last = hb.vt_offset if hb is not None else 0
        for e in self.logs[region].entries:
            if isinstance(e, DataEntry) and e.key == key:
                last = e.vt_offset
        return any(off > last for off in self.removed[region])


def _poison(rng: random.Random, write: Write, lww_value: int | None, n_values: int) -> int | None:
    """A value other than the write's and other than last-writer-wins's, or None when there is none.

    Poison must make the region's value wrong, or it is not a divergence by the definition of truth. (After
    an earlier dropped delete on an absent key, a poisoned tombstone can coincide with the right value while
    its record still names a write whose value it is not; Leap Frog reports that record, and truth by values
    alone cannot say it should.)
    """
    choices = [v for v in [None, *range(1, n_values + 1)] if v != write.value and v != lww_value]
    return rng.choice(choices) if choices else write.value


class _Leader:
    """One region's leader: consumes every RT, resolves conflicts, writes its VT; keeps the ground truth."""

    def __init__(self, region: int, n: int, rng: random.Random, mix: Mix, rts: list[list], n_values: int):
        self.region = region
        self.n = n
        self.rng = rng
        self.mix = mix
        self.rts = rts
        self.n_values = n_values
        self.pos = [0] * n  # next RT offset to consume
        self.processed = [-1] * n  # highest RT offset consumed in this term
        self.acked = [-1] * n  # highest RT offset whose VT output is acknowledged in this term
        self.state: dict[bytes, tuple[tuple[int, int, int], int | None]] = {}
        self.truth: dict[bytes, Write] = {}  # last-writer-wins over every write processed, any term
        self.diverged: set[bytes] = set()
        self.rmd: dict[bytes, list[int]] = {}
        self.write_rmd = mix.rmd and rng.random() < 0.7
        self.vt: list[Entry] = [OtherEntry(0)]  # End of Push
        self.failovers = 0
        self.duplicates = 0
        self.term_starts = [1]  # VT offsets where each leader term's output begins

    def run(self) -> None:
        total = sum(len(rt) for rt in self.rts)
        steps = self.rng.randint(0, total) if self.rng.random() < self.mix.lag else 10 * total + 10
        for _ in range(steps):
            ready = [r for r in range(self.n) if self.pos[r] < len(self.rts[r])]
            if not ready:
                break
            if self.rng.random() < 0.3:
                # Kafka acknowledges some of what was written; heartbeats may only claim acknowledged offsets.
                self.acked = list(self.processed)
            if self.failovers < 2 and self.rng.random() < self.mix.failover:
                self._failover()
                continue
            if self.rng.random() < self.mix.noise:
                self._noise()
            r = self.rng.choice(ready)
            offset = self.pos[r]
            record = self.rts[r][offset]
            self.pos[r] += 1
            self.processed[r] = offset
            # A duplicate is delivered right after the original, so it never crosses a VT heartbeat of the
            # same term (rule 3); failovers make the duplicates that do.
            deliveries = 2 if self.rng.random() < self.mix.duplicate else 1
            self.duplicates += deliveries - 1
            for _ in range(deliveries):
                if isinstance(record, Write):
                    self._apply(record)
                else:
                    self._heartbeat(record)

    def _failover(self) -> None:
        """A new term: rewind each RT to at or below the last VT heartbeat's watermark, keep the state."""
        self.failovers += 1
        self.term_starts.append(len(self.vt))
        last_hb = next((e for e in reversed(self.vt) if isinstance(e, HeartbeatEntry)), None)
        for r in range(self.n):
            upper = last_hb.watermarks[r] + 1 if last_hb is not None else 0
            self.pos[r] = min(self.pos[r], self.rng.randint(max(0, upper - 2), upper))
            self.processed[r] = self.pos[r] - 1
            self.acked[r] = self.pos[r] - 1

    def _noise(self) -> None:
        if self.rng.random() < 0.5:
            self.vt.append(OtherEntry(len(self.vt)))
        else:
            source = self.rng.choice([-1, self.n])
            self.vt.append(
                DataEntry(len(self.vt), b"chunk", self.rng.randint(1, 9), source, self.rng.randint(0, 5))
            )

    def _emit(self, write: Write, value: int | None) -> None:
        vec = self.rmd.setdefault(write.key, [])
        vec.extend([-1] * (write.region + 1 - len(vec)))
        vec[write.region] = write.rt_offset
        rmd = tuple(vec) if self.write_rmd and self.rng.random() < 0.8 else None
        self.vt.append(DataEntry(len(self.vt), write.key, value, write.region, write.rt_offset, rmd))

    def _apply(self, write: Write) -> None:
        best = self.truth.get(write.key)
        if best is None or write.order > best.order:
            self.truth[write.key] = write
        current = self.state.get(write.key)
        if current is None or write.order > current[0]:
            roll = self.rng.random()
            held = current[1] if current is not None else None
            if roll < self.mix.drop and write.value != held:
                pass  # silently skipped: the state keeps its old value, nothing is written
            elif roll < self.mix.drop + self.mix.poison:
                value = _poison(self.rng, write, self.truth[write.key].value, self.n_values)
                self.state[write.key] = (write.order, value)
                self._emit(write, value)
            else:
                self.state[write.key] = (write.order, write.value)
                self._emit(write, write.value)
        elif write.order == current[0] and self.rng.random() < 0.5:
            self._emit(write, current[1])  # the same write again re-emits the current value
        value = self.state[write.key][1] if write.key in self.state else None
        if value != self.truth[write.key].value:
            self.diverged.add(write.key)

    def _heartbeat(self, hb: RtHeartbeat) -> None:
        # The heartbeat's own region is flushed first, so the vector covers the heartbeat's RT offset.
        self.acked[hb.region] = self.processed[hb.region]
        if self.rng.random() < 0.5:
            self.acked = list(self.processed)
        self.vt.append(HeartbeatEntry(len(self.vt), tuple(self.acked), hb.region, hb.rt_offset))


def _compact(vt: list[Entry], rng: random.Random) -> tuple[list[Entry], set[int]]:
    """Remove superseded records (a later record of the same key exists) and old heartbeats, at random."""
    last_of_key: dict[bytes, int] = {}
    last_hb = -1
    for i, e in enumerate(vt):
        if isinstance(e, DataEntry):
            last_of_key[e.key] = i
        elif isinstance(e, HeartbeatEntry):
            last_hb = i
    kept: list[Entry] = []
    removed: set[int] = set()
    for i, e in enumerate(vt):
        superseded = (isinstance(e, DataEntry) and last_of_key[e.key] != i) or (
            isinstance(e, HeartbeatEntry) and i != last_hb
        )
        if superseded and rng.random() < 0.6:
            removed.add(e.vt_offset)
        else:
            kept.append(e)
    return kept, removed


def generate(seed: int, mix: Mix, regions: tuple[int, int] = (2, 4)) -> History:
    """The history of ``seed`` under fault mix ``mix``, with between ``regions[0]`` and ``regions[1]`` regions."""
    rng = random.Random(f"{mix.name}:{seed}")
    n = rng.randint(*regions)
    keys = tuple(f"k{i}".encode() for i in range(rng.randint(1, 3)))
    n_values = rng.randint(1, 3)
    quiet = rng.randrange(n) if mix.quiet else None
    rts: list[list] = [[] for _ in range(n)]
    writes: list[Write] = []
    for _ in range(rng.randint(1, 9)):
        r = rng.randrange(n)
        if r == quiet:
            r = (r + 1) % n
        value = None if rng.random() < 0.25 else rng.randint(1, n_values)
        write = Write(r, len(rts[r]), rng.choice(keys), value, rng.randint(0, 5))
        rts[r].append(write)
        writes.append(write)
        if rng.random() < 0.4:
            hr = rng.randrange(n)
            rts[hr].append(RtHeartbeat(hr, len(rts[hr])))
    for r in range(n):
        for _ in range(rng.randint(0, 2)):
            rts[r].append(RtHeartbeat(r, len(rts[r])))

    leaders = [_Leader(x, n, rng, mix, rts, n_values) for x in range(n)]
    for leader in leaders:
        leader.run()

    vt: dict[int, list[Entry]] = {}
    logs: dict[int, RegionLog] = {}
    removed: dict[int, set[int]] = {}
    start_heartbeat: dict[int, HeartbeatEntry | None] = {}
    for leader in leaders:
        x = leader.region
        full = leader.vt
        last_offset = len(full) - 1
        entries, gone = _compact(full, rng) if rng.random() < mix.compaction else (list(full), set())
        vt[x], removed[x] = entries, gone
        heartbeats = [e for e in entries if isinstance(e, HeartbeatEntry)]
        if heartbeats and rng.random() < mix.midstream:
            hb = rng.choice(heartbeats)
            start_heartbeat[x] = hb
            after = [e for e in entries if e.vt_offset > hb.vt_offset]
            logs[x] = RegionLog(after, FromHeartbeat(hb.watermarks, hb.vt_offset), last_offset)
        else:
            start_heartbeat[x] = None
            logs[x] = RegionLog(entries[1:], FromEndOfPush(0), last_offset)

    return History(
        seed=seed,
        mix=mix,
        n_regions=n,
        keys=keys,
        writes=writes,
        vt=vt,
        logs=logs,
        diverged={ld.region: ld.diverged for ld in leaders},
        final_value={
            ld.region: {k: (ld.state[k][1] if k in ld.state else None) for k in keys} for ld in leaders
        },
        removed=removed,
        start_heartbeat=start_heartbeat,
        term_starts={ld.region: ld.term_starts for ld in leaders},
        failovers=sum(ld.failovers for ld in leaders),
        duplicates=sum(ld.duplicates for ld in leaders),
    )


@cache
def generated(seeds_per_mix: int, regions: tuple[int, int] = (2, 4)) -> tuple[History, ...]:
    """Seeds ``0..seeds_per_mix-1`` of every mix, generated once per test process."""
    return tuple(generate(seed, mix, regions) for mix in MIXES.values() for seed in range(seeds_per_mix))


def subsets(n: int, rng: random.Random, count: int = 2) -> list[tuple[int, ...]]:
    """Up to `count` random proper subsets of a store's `n` regions, each of at least two regions."""
    every = [s for k in range(2, n) for s in itertools.combinations(range(n), k)]
    return rng.sample(every, min(count, len(every)))


def day_cuts(histories: list[History], rng: random.Random) -> dict[tuple[int, int], int]:
    """Where day 1 ends in each (partition = history index, region): a random VT offset at or after the scan start,
    for tests that split a history into two nights."""
    cuts = {}
    for p, h in enumerate(histories):
        for x in range(h.n_regions):
            offsets = [e.vt_offset for e in h.vt[x]]
            start = h.start_heartbeat[x].vt_offset if h.start_heartbeat[x] is not None else 0
            cuts[(p, x)] = rng.randint(start, max(offsets)) if offsets else 0
    return cuts
