"""Generated histories with known truth for consistent cuts (issue 40): RT writes with broker timestamps, per-region
leaders applying Venice's DCR with lag, VT heartbeats whose vectors may lag the sends.

A seeded model of one partition of a store of 2–3 regions. Each region's RT holds writes on a few hot keys (so
regions conflict: equal timestamps, DELETEs, values of every hash) and a heartbeat every 100 ms; a record's Kafka
timestamp is its send time plus a little jitter (CreateTime: not monotonic in the offset), its logical timestamp
the send time plus the region's clock skew. Each region's leader consumes every RT in arrival order (send time
plus a lag per region pair) and applies `leapfrog.repair.dcr_apply` to its stored records: a write that wins is
appended to its VT with its coordinate (region, RT offset), a heartbeat becomes a VT heartbeat whose vector is the
positions processed some events earlier (it lags the sends) but never decreasing within a term and always
holding its own RT heartbeat (docs/design.md, rule 3). The VTs are read at NOW_MS: what a leader would process
later is not in its VT.

Faults: **duplicates** (a change appended to the VT twice), **leader failovers** (a new term restarts from the
state at the last VT heartbeat and re-consumes every RT after that heartbeat's vector: the changes since appear
again), **a region behind** (one leader lags by most of the run: late cuts find no ceil in its VT).

Truth never looks at the rules under test: the state at a cut C is, per key, the DCR fold of the bulk load and of
every RT write at or below C (`truth`). Every leader here applies the same DCR to every write, so every region
reaches that state for every C; what the VT shows of it is what the rules under test must work out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pyarrow as pa

from heartbeat.change_events import CHANGES_SCHEMA
from leapfrog.repair import DELETE, PUT, Record, dcr_apply, java_bytes_hash

DURATION_MS = 2000
HEARTBEAT_MS = 100
NOW_MS = DURATION_MS + 450  # when the VTs are read: what a leader processes later is not in its VT yet


@dataclass(frozen=True)
class RtEntry:
    offset: int
    ts: int  # the Kafka record timestamp
    key: bytes | None  # None: a heartbeat
    write: Record | None = None


@dataclass(frozen=True)
class VtEntry:
    offset: int
    key: bytes | None  # None: a heartbeat
    write: Record | None = None  # a change or a bulk record (coordinate None)
    origin: tuple[int, int, int] | None = None  # a heartbeat's (region, RT offset, time)
    vector: tuple[int, ...] | None = None


@dataclass
class CutHistory:
    seed: int
    n: int
    bulk: dict[bytes, Record]
    rts: list[list[RtEntry]]
    vts: list[list[VtEntry]] = field(default_factory=list)
    behind: int | None = None
    failovers: int = 0
    duplicates: int = 0

    def times(self, every_ms: int | None = None) -> list[int]:
        """Cut times to try, rising: before the first write, throughout (at random, or every `every_ms`), after
        the last."""
        rng = random.Random(self.seed)
        inside = (
            range(0, DURATION_MS + 300, every_ms)
            if every_ms
            else [rng.randrange(DURATION_MS + 300) for _ in range(7)]
        )
        return sorted({-5, *inside, DURATION_MS + 500})

    def heartbeats(self, region: int) -> list[tuple[int, tuple[int, ...]]]:
        return [(e.offset, e.vector) for e in self.vts[region] if e.key is None]

    def rt_writes(self, cut: tuple[int, ...]) -> dict[bytes, list[Record]]:
        """Per key, its RT writes at or below the cut (what `--rt` reads)."""
        out: dict[bytes, list[Record]] = {}
        for r, rt in enumerate(self.rts):
            for e in rt:
                if e.key is not None and e.offset <= cut[r]:
                    out.setdefault(e.key, []).append(e.write)
        return out

    def truth(self, cut: tuple[int, ...]) -> dict[bytes, Record]:
        """Per key written at or below the cut: Venice's DCR fold of its bulk record and its RT writes there."""
        state = dict(self.bulk)
        for r, rt in enumerate(self.rts):
            for e in rt:
                if e.key is not None and e.offset <= cut[r]:
                    state[e.key] = dcr_apply(state.get(e.key), e.write)
        return state

    def events(self, region: int, end: int) -> pa.Table:
        """Region's VT changes (bulk load included) before VT offset `end`, as `tidegauge changes` delivers them."""
        rows = [e for e in self.vts[region] if e.key is not None and e.offset < end]
        return pa.table(
            {
                "partition": [0] * len(rows),
                "vt_offset": [e.offset for e in rows],
                "key": [e.key for e in rows],
                "op": [e.write.op for e in rows],
                "value": [e.write.value for e in rows],
                "logical_ts": [e.write.logical_ts for e in rows],
                "upstream_region": [e.write.region for e in rows],
                "upstream_offset": [e.write.offset for e in rows],
            },
            schema=CHANGES_SCHEMA,
        )


class _Values:
    """Distinct values with distinct Java hashes: DCR's tie-break between two PUTs then never depends on the
    order they arrive in (what `repair plan` calls undecidable), so the truth is one state."""

    def __init__(self) -> None:
        self.hashes: set[int] = set()

    def new(self, text: str) -> bytes:
        v = text.encode()
        while java_bytes_hash(v) in self.hashes:
            v += b"'"
        self.hashes.add(java_bytes_hash(v))
        return v


def _rt(
    region: int, rng: random.Random, keys: list[bytes], values: _Values, quiet: bool, skew_ms: int = 3
) -> list[RtEntry]:
    skew = rng.randint(-skew_ms, skew_ms)
    # heartbeats go on past the last write, so that every leader's vectors come to cover every write
    end = DURATION_MS + 5 * HEARTBEAT_MS
    events: list[tuple[int, bytes | None]] = [(t, None) for t in range(region * 7, end, HEARTBEAT_MS)]
    if not quiet:
        events += [(rng.randrange(DURATION_MS), rng.choice(keys)) for _ in range(rng.randint(20, 60))]
    events.sort(key=lambda e: e[0])
    out = []
    for offset, (t, key) in enumerate(events):
        ts = t + rng.randint(0, 4)
        if ts > NOW_MS:
            break  # not written yet when the topics are read
        write = None
        if key is not None:
            op = DELETE if rng.random() < 0.15 else PUT
            value = values.new(f"{region}:{offset}") if op == PUT else None
            write = Record(
                op, value, (t + skew) // 3, region, offset
            )  # // 3: equal timestamps across regions
        out.append(RtEntry(offset, ts, key, write))
    return out


def _leader(h: CutHistory, x: int, rng: random.Random, lags: list[int], fail_p: float, dup_p: float) -> None:
    vt: list[VtEntry] = [VtEntry(i, k, w) for i, (k, w) in enumerate(h.bulk.items())]
    stored: dict[bytes, Record] = dict(h.bulk)
    pos = [0] * h.n  # next RT entry per region
    processed = [-1] * h.n
    done: list[tuple[int, ...]] = []  # processed positions after each event (vectors lag them)
    term_vector = [-1] * h.n
    at_heartbeat: tuple[dict, tuple[int, ...]] | None = (
        None  # (stored, vector) at this term's last VT heartbeat
    )
    restart = -1  # a new term re-reads what had arrived before it started: at once
    failovers_left = 2

    def arrival(r: int) -> int:
        e = h.rts[r][pos[r]]
        return max(e.ts + lags[r], restart)

    while True:
        ready = [r for r in range(h.n) if pos[r] < len(h.rts[r])]
        if not ready:
            break
        r = min(ready, key=lambda r: (arrival(r), r))
        now = arrival(r)
        if now > NOW_MS:
            break
        e = h.rts[r][pos[r]]
        pos[r] += 1
        processed[r] = e.offset
        done.append(tuple(processed))
        if e.key is None:
            lagged = done[-1 - min(len(done) - 1, rng.randint(0, 4))]
            vec = [max(a, b) for a, b in zip(lagged, term_vector, strict=True)]
            vec[r] = max(vec[r], e.offset)
            term_vector = vec
            vt.append(VtEntry(len(vt), None, origin=(r, e.offset, e.ts), vector=tuple(vec)))
            at_heartbeat = (dict(stored), tuple(vec))
        else:
            won = dcr_apply(stored.get(e.key), e.write)
            if won is e.write:
                stored[e.key] = won
                vt.append(VtEntry(len(vt), e.key, won))
                if rng.random() < dup_p:
                    vt.append(VtEntry(len(vt), e.key, won))
                    h.duplicates += 1
        if at_heartbeat is not None and failovers_left and rng.random() < fail_p:
            failovers_left -= 1
            h.failovers += 1
            stored, vector = dict(at_heartbeat[0]), at_heartbeat[1]
            for q in range(h.n):
                pos[q] = next((i for i, f in enumerate(h.rts[q]) if f.offset > vector[q]), len(h.rts[q]))
            processed, term_vector, restart = list(vector), list(vector), now
            done = [tuple(processed)]
    h.vts.append(vt)


def generate(seed: int, *, faults: bool = True, skew_ms: int = 3) -> CutHistory:
    """A history of `seed`. `skew_ms`: the regions' clocks (logical timestamps) differ by up to that much; a skew
    of hundreds of ms lets a write just below the cut beat one just above it that reached a leader first."""
    rng = random.Random(seed)
    n = rng.choice([2, 3])
    keys = [b"k%d" % i for i in range(rng.randint(4, 10))]
    values = _Values()
    bulk = {k: Record(PUT, values.new(f"bulk:{k.decode()}"), -1) for k in keys if rng.random() < 0.6}
    quiet = rng.randrange(n) if rng.random() < 0.2 else None
    h = CutHistory(seed, n, bulk, [_rt(r, rng, keys, values, r == quiet, skew_ms) for r in range(n)])
    if faults and rng.random() < 0.3:
        h.behind = rng.randrange(n)
    for x in range(n):
        lags = [rng.randint(0, 5) if r == x else rng.randint(10, 300) for r in range(n)]
        if x == h.behind:
            lags = [lag + DURATION_MS * 3 // 4 for lag in lags]
        _leader(h, x, rng, lags, 0.01 if faults else 0.0, 0.05 if faults else 0.0)
    return h
