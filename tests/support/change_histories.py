"""Generated version-topic histories with known truth, for the change-capture rule's property tests.

A seeded model of what a change-capture client reads: a store of 2–5 regions and 1–2 partitions. Online writes
land in each region's RT (some regions may be quiet: heartbeats only), with RT heartbeats between them. Per
partition and version, a leader consumes every RT in its own random interleaving and writes the version's VT:
the bulk load (records without a coordinate, a few of them with a stray footer), End of Push, then one change per
RT write with its coordinate (region, RT position) — a chunked write as chunks, the manifest and sometimes a chunk
cleanup with the same footer — and a VT heartbeat per RT heartbeat. A write that loses conflict resolution loses
it in every version (fixed per write), so it never reaches a VT. (A write whose outcome depends on the
interleaving, winning in one version and losing in another, needs another property than exactly-once:
docs/design.md, "Change capture".)

Heartbeats follow docs/design.md, rule 3, as `heartbeat.leader` does: the leader acknowledges its sends late and at
random, a VT heartbeat waits until its own RT heartbeat's region is acknowledged up to it, and its vector holds
only acknowledged positions, while the leader goes on producing. So records before a heartbeat may carry positions
above its vector ("in flight").

Faults, each with ground truth kept by the generator:

- **redelivery** — a recent change is appended to the VT again (same coordinate);
- **leader failover** — a new term re-produces every RT from the last VT heartbeat's vector (+1), in a new
  interleaving, so the changes after that heartbeat appear again; sometimes the old term's unacknowledged tail
  after that heartbeat is lost first (never read by anyone: Kafka truncates it);
- **version pushes and swaps** — a push creates version N+1: a bulk load, End of Push and an RT replay from a
  rewind point at or before where version N stands, while writes go on; a swap later retires N (its VT ends with
  a VersionSwap message) once N has processed up to the rewind point;
- **quiet regions** — a region that writes nothing, still sending heartbeats;
- **noise** — control messages, undecodable records and changes naming a region outside the store.

Truth never looks at the rule: the changes are the coordinates of the writes that won conflict resolution (all
from RT position 0: the reader starts on version 1, whose replay starts there), and the snapshot is version 1's bulk
load. `tags[i]` says what VT position i of a version is: ("c", region, rt position) for a change (original or
copy), ("b", version, index) for a bulk-load change, None for anything else. `swap_ready` gives, per version, the
first position from which a reader may follow the next version: past End of Push and past every change below the
next version's rewind point (before that, the next version's bulk load holds changes it has not delivered).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from functools import cache

from heartbeat.changes import Item, Role


@dataclass(frozen=True)
class Mix:
    """Probabilities of each fault, per leader step unless said otherwise."""

    name: str
    redelivery: float = 0.0
    failover: float = 0.0  # at most two per version
    lose_tail: float = 0.0  # per failover
    pushes: int = 0  # new versions after version 1
    quiet: bool = False  # one or two regions write nothing
    chunked: float = 0.0  # per write
    noise: float = 0.0
    dcr_drop: float = 0.1  # per write: it loses conflict resolution everywhere


MIXES: dict[str, Mix] = {
    m.name: m
    for m in (
        Mix("clean"),
        Mix("redelivery", redelivery=0.2),
        Mix("failover", failover=0.06, lose_tail=0.4, redelivery=0.05),
        Mix("swaps", pushes=2),
        Mix("quiet", quiet=True, pushes=1, redelivery=0.1),
        Mix("chunked", chunked=0.4, redelivery=0.1, pushes=1),
        Mix(
            "everything",
            redelivery=0.12,
            failover=0.05,
            lose_tail=0.4,
            pushes=2,
            quiet=True,
            chunked=0.2,
            noise=0.05,
        ),
    )
}


@dataclass(frozen=True)
class Write:
    key: int
    dropped: bool  # lost conflict resolution: no VT record in any version
    chunks: int  # 0: a plain value; k: k chunks and a manifest


@dataclass(frozen=True)
class RtHeartbeat:
    pass


@dataclass
class VersionLog:
    """One version's VT partition as a reader finds it at the end of the history."""

    version: int
    rewind: tuple[int, ...]  # the RT position of each region its replay starts at
    items: list[Item]
    tags: list[tuple | None]
    eop: int  # position of End of Push
    term_starts: list[int]  # VT positions where each leader term's output begins
    failovers: int = 0
    lost_tails: int = 0
    redeliveries: int = 0


@dataclass
class PartitionHistory:
    partition: int
    versions: list[VersionLog]  # versions[0] is version 1
    changes: set[tuple[int, int]]  # truth: the coordinates the reader must get, once each
    snapshot: set[tuple]  # truth: version 1's bulk-load tags
    swap_ready: list[int]  # per version (but the last): first position from which to follow the next one


@dataclass
class ChangeHistory:
    seed: int
    mix: Mix
    n_regions: int
    quiet: frozenset[int]
    partitions: list[PartitionHistory]

    @property
    def n_versions(self) -> int:
        return len(self.partitions[0].versions)


class _Leader:
    """One version's leader of one partition (all its terms): consumes the RTs, writes the VT.

    Acknowledgements arrive in VT order (one producer per partition) up to a random point; the marks are
    `heartbeat.watermarks.WatermarkTracker`'s: per region, the last processed RT position whose sends, and those of
    every earlier position of that region, are acknowledged (a position with no send passes once those before it do).
    """

    def __init__(
        self,
        version: int,
        rewind: tuple[int, ...],
        rng: random.Random,
        mix: Mix,
        rts: list[list],
        n: int,
    ) -> None:
        self.version, self.rewind, self.rng, self.mix, self.rts, self.n = version, rewind, rng, mix, rts, n
        self.items: list[Item] = []
        self.tags: list[tuple | None] = []
        for i in range(rng.randint(0, 4)):
            if rng.random() < mix.chunked:
                self._append(Role.PART)
            if rng.random() < 0.2:  # a stray footer: a bulk-load record has no coordinate the rule may use
                self._append(Role.CHANGE, rng.randrange(n), rng.randint(0, 30), tag=("b", version, i))
            else:
                self._append(Role.CHANGE, tag=("b", version, i))
        self._append(Role.END_OF_PUSH)
        self.eop = len(self.items) - 1
        self.log = VersionLog(version, rewind, self.items, self.tags, self.eop, [len(self.items)])
        self._new_term(tuple(p - 1 for p in rewind))

    def _new_term(self, start: tuple[int, ...]) -> None:
        self.pos = [s + 1 for s in start]  # next RT position to consume, per region
        self.processed = list(start)
        self.acked = list(start)
        self.sends = 0  # VT sends of this term
        self.ack_point = 0  # sends [0, ack_point) are acknowledged
        self.queues: list[deque[tuple[int, int]]] = [
            deque() for _ in range(self.n)
        ]  # (rt position, last send)
        self.pending: list[tuple[int, int]] = []  # RT heartbeats consumed, VT heartbeat not written yet

    def _append(self, role: int, region: int = -1, q: int = -1, vector=None, tag=None) -> None:
        self.items.append(Item(len(self.items), role, region, q, vector))
        self.tags.append(tag)

    def _send(self, role: int, region: int = -1, q: int = -1, tag=None) -> None:
        self._append(role, region, q, tag=tag)
        self.sends += 1

    def ready(self) -> list[int]:
        return [r for r in range(self.n) if self.pos[r] < len(self.rts[r])]

    def step(self) -> None:
        rng, mix = self.rng, self.mix
        if rng.random() < 0.35:
            self._ack(rng.randint(self.ack_point, self.sends))
        if self.log.failovers < 2 and rng.random() < mix.failover:
            self._failover()
            return
        if rng.random() < mix.redelivery:
            self._redeliver()
        if rng.random() < mix.noise:
            self._noise()
        ready = self.ready()
        if not ready:
            return
        r = rng.choice(ready)
        q = self.pos[r]
        self.pos[r] += 1
        self.processed[r] = q
        entry = self.rts[r][q]
        first = self.sends
        if isinstance(entry, RtHeartbeat):
            self.pending.append((r, q))
        elif not entry.dropped:
            for _ in range(entry.chunks):
                self._send(Role.PART)
            self._send(Role.CHANGE, r, q, tag=("c", r, q))
            if entry.chunks and rng.random() < 0.5:
                self._send(Role.PART, r, q)  # cleanup of the replaced value's chunks, with the same footer
        self.queues[r].append((q, self.sends - 1 if self.sends > first else -1))
        self._ack(self.ack_point)

    def _ack(self, point: int) -> None:
        self.ack_point = point
        for r, queue in enumerate(self.queues):
            while queue and queue[0][1] < point:
                self.acked[r] = queue.popleft()[0]
        # heartbeat.leader: a VT heartbeat waits until its own region is acknowledged up to its RT heartbeat, and
        # then claims the acknowledged marks of that moment
        keep = []
        for r, q in self.pending:
            if self.acked[r] >= q:
                self._append(Role.HEARTBEAT, vector=tuple(self.acked))
            else:
                keep.append((r, q))
        self.pending = keep

    def _failover(self) -> None:
        log = self.log
        log.failovers += 1
        last_hb = max((i for i, it in enumerate(self.items) if it.role == Role.HEARTBEAT), default=None)
        vector = self.items[last_hb].vector if last_hb is not None else tuple(p - 1 for p in self.rewind)
        floor = max(last_hb + 1 if last_hb is not None else 0, self.eop + 1)
        if self.rng.random() < self.mix.lose_tail and len(self.items) > floor:
            cut = self.rng.randint(floor, len(self.items) - 1)
            del self.items[cut:]
            del self.tags[cut:]
            log.lost_tails += 1
            log.term_starts[:] = [s for s in log.term_starts if s <= cut]
        log.term_starts.append(len(self.items))
        self._new_term(vector)

    def _redeliver(self) -> None:
        recent = [
            i
            for i in range(max(self.eop + 1, len(self.items) - 8), len(self.items))
            if self.tags[i] is not None and self.tags[i][0] == "c"
        ]
        if recent:
            i = self.rng.choice(recent)
            self.items.append(self.items[i]._replace(position=len(self.items)))
            self.tags.append(self.tags[i])
            self.log.redeliveries += 1

    def _noise(self) -> None:
        roll = self.rng.random()
        if roll < 0.4:
            self._append(Role.OTHER)
        elif roll < 0.7:
            self._append(Role.UNDECODABLE)
        else:
            self._append(Role.CHANGE, self.n, self.rng.randint(0, 9))  # a region the store does not have

    def catch_up(self, until: tuple[int, ...] | None = None) -> None:
        """Consume until every region is processed up to `until` (default: every RT to its end), then let every
        send be acknowledged, which writes every pending heartbeat."""
        while True:
            ready = self.ready()
            if not ready or (until is not None and all(self.processed[r] >= until[r] for r in range(self.n))):
                break
            self.step()
        self._ack(self.sends)

    def retire(self) -> None:
        self._append(Role.OTHER)  # the VersionSwap message: this version ends here


def _push(leaders: list[_Leader], current: _Leader, rng: random.Random, mix: Mix, rts: list[list], n: int):
    rewind = tuple(
        rng.randint(max(0, current.processed[r] + 1 - rng.randint(0, 8)), current.processed[r] + 1)
        for r in range(n)
    )
    leader = _Leader(len(leaders) + 1, rewind, rng, mix, rts, n)
    leaders.append(leader)
    return leader


def _swap(current: _Leader, pending: _Leader) -> _Leader:
    current.catch_up(tuple(w - 1 for w in pending.rewind))
    current.retire()
    return pending


def _partition(p: int, rng: random.Random, mix: Mix, n: int, quiet: frozenset[int]) -> PartitionHistory:
    rts: list[list] = [[] for _ in range(n)]
    writers = [r for r in range(n) if r not in quiet]
    leaders = [_Leader(1, (0,) * n, rng, mix, rts, n)]
    current, pending = leaders[0], None
    pushes = mix.pushes
    for _ in range(rng.randint(30, 90)):
        if rng.random() < 0.5:
            r = rng.choice(writers)
            chunks = rng.randint(1, 2) if rng.random() < mix.chunked else 0
            rts[r].append(Write(rng.randrange(4), rng.random() < mix.dcr_drop, chunks))
        if rng.random() < 0.15:
            rts[rng.randrange(n)].append(RtHeartbeat())
        for leader in (current, pending):
            if leader is not None:
                for _ in range(rng.randint(0, 2)):
                    leader.step()
        if pending is None and pushes and rng.random() < 0.06:
            pushes -= 1
            pending = _push(leaders, current, rng, mix, rts, n)
        elif pending is not None and rng.random() < 0.1:
            current, pending = _swap(current, pending), None
    # every partition of the store ends with the same versions: pushes still due happen now
    while pending is not None or pushes:
        if pending is None:
            pushes -= 1
            pending = _push(leaders, current, rng, mix, rts, n)
        current, pending = _swap(current, pending), None
    current.catch_up()

    changes = {
        (r, q) for r in range(n) for q, e in enumerate(rts[r]) if isinstance(e, Write) and not e.dropped
    }
    logs = [ld.log for ld in leaders]
    snapshot = {t for t in logs[0].tags if t is not None and t[0] == "b"}
    swap_ready = []
    for log, nxt in zip(logs, logs[1:], strict=False):
        below = [i for i, t in enumerate(log.tags) if t and t[0] == "c" and t[2] < nxt.rewind[t[1]]]
        swap_ready.append(max([log.eop, *below]) + 1)
    return PartitionHistory(p, logs, changes, snapshot, swap_ready)


def generate(seed: int, mix: Mix) -> ChangeHistory:
    """The history of `seed` under fault mix `mix`."""
    rng = random.Random(f"changes:{mix.name}:{seed}")
    n = rng.randint(2, 5)
    quiet = frozenset(rng.sample(range(n), min(n - 1, rng.randint(1, 2)))) if mix.quiet else frozenset()
    partitions = [_partition(p, rng, mix, n, quiet) for p in range(rng.randint(1, 2))]
    return ChangeHistory(seed, mix, n, quiet, partitions)


@cache
def generated(seeds_per_mix: int) -> tuple[ChangeHistory, ...]:
    """Seeds 0..seeds_per_mix-1 of every mix, generated once per test process."""
    return tuple(generate(seed, mix) for mix in MIXES.values() for seed in range(seeds_per_mix))
