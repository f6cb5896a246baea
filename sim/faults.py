"""Fault injection with ground truth: what to break, where and when — chosen from the seed — and what a correct
checker must find because of it.

Kinds (each entry of `truth.json` says which findings it must cause, in which job, under `expect`):

* dropped   — a write applied only in its origin region: every other region's leader processes it (its
              watermark covers it) but writes nothing. Leap Frog: VALUE_MISMATCH (the key had a value) or
              MISSING_IN_x (it had none) for each pair (origin, x). DIV: nothing.
* poisoned  — one region's leader writes a changed value for a write. Leap Frog: VALUE_MISMATCH for every pair
              with that region. DIV: nothing (the leader checksums what it wrote).
  Both pick a PUT that is the last write of its key (so nothing heals it) in the middle of the run (so
  heartbeats of every region cover it), whose key was absent or held a PUT before it.
* duplicate — a producer's record delivered twice into its RT (a retry after a lost acknowledgement).
              DIV: a non-fatal DUPLICATE in that RT; leaders drop the copy. Leap Frog: nothing.
* gap       — a producer's record never reaches its RT. DIV: MISSING at the producer's next record in that
              partition, and CORRUPT at the segment's EndOfSegment (its checksum covers the lost record) unless
              that EndOfSegment is the next record. Non-fatal (an RT is always after End of Push). Leap Frog:
              nothing (no region ever saw the write).
* corrupt   — a value changed after the producer computed its checksum. DIV: non-fatal CORRUPT at the
              segment's EndOfSegment. Every region applies the corrupted value alike: Leap Frog nothing.
* failover  — a region's partition leader stops mid-stream; after `failover_delay_ms` a successor (new GUID,
              term + 1) resumes from the last VT heartbeat (DIV state from `hbd`, RT positions from `hbw` + 1)
              and re-applies some writes (duplicates in the VT). Expect nothing anywhere.
* compaction — after the run, a VT range of one region's archive is compacted as Kafka log compaction would:
              records superseded by a later record with the same key are removed, leaving offset gaps.
              Expect nothing from Leap Frog, and nothing from DIV run with compaction tolerance.
* broker    — a region's (embedded) broker goes down for `broker_down_s` wall seconds, then its next produce
              requests fail with a retriable error. Content must not change: expect nothing.
* silent    — one leader stops heartbeating for `outage_ms`: the coordinator writes no RT heartbeat on its behalf
              (its data keeps flowing), so no VT anywhere gets a heartbeat that comes from that RT partition.
              Lag monitors must see it; Leap Frog and DIV: nothing.
* isolated  — a region stops replicating for `outage_ms`: its leaders leave every other region's RT unread
              (what arrives meanwhile is processed when the isolation ends, in order); its own RT is still
              applied. Lag grows and falls back; Leap Frog and DIV: nothing.
* redelivery — a leader writes a VT data record twice, byte for byte (same key, value, producer segment and
              sequence, footer coordinate): a producer retry after a lost acknowledgement. Its (region, partition)
              from the seed, its record the leader's first VT write at or after the time (of the new version while
              a swap replays). DIV: a non-fatal DUPLICATE at the copy (after End of Push). Leap Frog: nothing. A
              change-capture reader must drop the copy. Truth: the coordinate and both VT offsets.
* swap      — a re-push of version N+1 (`<store>_v<N+1>`, one per run) while writes go on. At its time the source
              region (from the seed) is snapshotted; every region's new VT gets StartOfPush and that snapshot as
              its bulk load (Puts and Deletes without a leader footer; the same in every region, as Venice's native
              replication gives), the replica state carried over with it; `swap_push_ms` later End of Push, and
              new leaders replay every RT from the rewind point (the first record written `swap_rewind_ms` x
              [0.5, 1.5) before the snapshot; never after where the snapshot stood) in a catch-up interleaving of
              their own, resolving conflicts and heartbeating like any leader, beside version N's. `swap_overlap_ms`
              later (after any failover going on then) version N's leaders write a VersionSwap and step down; from
              then on only N+1 is written. Leap Frog and DIV on either version: nothing. Truth: `changes`.


Counted faults are placed at random in a window of the run (WINDOWS); timed ones (`KIND@SECONDS`) at their
time, a write fault on the first suitable write at or after it. A live run draws its schedule a chunk at a
time and places each chunk's faults as it draws it; `PlanState` carries what placement needs from earlier
chunks (the last operation on every key, keys it must keep away from), so the rules are the same.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import STOP_RESUME_KINDS, SimConfig, TimedFault
from .traffic import DELETE, PUT, Schedule

log = logging.getLogger(__name__)

WRITE_FAULTS = ("dropped", "poisoned", "duplicate", "gap", "corrupt")
CAPTURE_KINDS = ("redelivery", "swap")  # what change capture must see through (placed after the others)
RT_FAULTS = ("gap", "corrupt", "duplicate")  # placed first: their keys are kept away from dropped/poisoned

WINDOWS: dict[str, tuple[float, float]] = {
    "gap": (0.1, 0.8),
    "corrupt": (0.1, 0.8),
    "duplicate": (0.1, 0.8),
    "dropped": (0.15, 0.7),
    "poisoned": (0.15, 0.7),
    "failover": (0.35, 0.6),
    "broker": (0.2, 0.8),
    "silent": (0.2, 0.6),
    "isolated": (0.2, 0.6),
    "redelivery": (0.1, 0.8),
    "swap": (0.15, 0.35),
}
"""Where counted faults go, as fractions of the run: dropped and poisoned writes late enough that the earlier
writes of their key have replicated and early enough that heartbeats of every region cover them; outages early
enough to end before the producers close."""


@dataclass
class Fault:
    """One injected fault; filled in as the run learns offsets. `to_json` is its truth.json entry."""

    id: int
    kind: str
    region: int | None = None
    partition: int | None = None
    key: bytes | None = None
    write: int | None = None  # index in the schedule (write faults)
    time_ms: int | None = None
    rt_offset: int | None = None
    vt_offsets: dict[int, list[int]] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    expect: dict[str, list] = field(default_factory=lambda: {"leapfrog": [], "div": []})
    affected_regions: list[int] = field(default_factory=list)  # dropped: where it is missing; poisoned: where
    # failover: takeover time; silent, isolated: when it ends; broker: when the broker comes back (its
    # outage lasts that long on the wall clock, which only a live run shares with the simulated one)
    end_ms: int | None = None
    at_ms: int | None = None  # live: wall-clock epoch ms when it happened (started)
    end_at_ms: int | None = None  # live: wall-clock epoch ms when a stop/resume fault ended (None: not yet)

    def to_json(self, live: bool = False) -> dict:
        out = {
            "id": self.id,
            "kind": self.kind,
            "region": self.region,
            "partition": self.partition,
            "key": None if self.key is None else self.key.hex(),
            "time_ms": self.time_ms,
            "end_ms": self.end_ms,
            "rt_offset": self.rt_offset,
            "vt_offsets": {str(r): offs for r, offs in sorted(self.vt_offsets.items())},
            "detail": self.detail,
            "expect": self.expect,
        }
        if live:
            out["at"] = self.at_ms
            if self.kind in STOP_RESUME_KINDS or self.kind == "swap":  # a swap ends with its VersionSwap
                out["end_at"] = self.end_at_ms
        return out


@dataclass
class FaultPlan:
    faults: list[Fault] = field(default_factory=list)
    by_write: dict[int, list[Fault]] = field(default_factory=dict)  # global write index -> its faults
    requested: dict[str, int] = field(default_factory=dict)
    shortfall: dict[str, str] = field(default_factory=dict)
    waiting: list[TimedFault] = field(default_factory=list)  # live: timed write faults for the next chunk
    next_id: int = 1

    def add(self, kind: str, **kw: Any) -> Fault:
        f = Fault(self.next_id, kind, **kw)
        self.next_id += 1
        self.faults.append(f)
        if f.write is not None:
            self.by_write.setdefault(f.write, []).append(f)
        return f

    def short(self, kind: str, why: str) -> None:
        self.shortfall[kind] = why
        log.warning("fault %s: %s", kind, why)

    def of(self, kind: str) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind]

    def injected(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.faults:
            out[f.kind] = out.get(f.kind, 0) + 1
        return out


def requested_faults(counted: dict[str, int], timed: list[TimedFault]) -> dict[str, int]:
    """Faults asked for, by kind: counts plus timed ones."""
    out = {k: v for k, v in counted.items() if v}
    for tf in timed:
        out[tf.kind] = out.get(tf.kind, 0) + 1
    return out


@dataclass
class PlanState:
    """What placement remembers from the chunks of a live run's schedule drawn before the current one."""

    last_op: np.ndarray  # per key id: the operation of its last online write so far, -1 when none
    tainted: set[int] = field(
        default_factory=set
    )  # keys an RT fault touched: not every region saw them alike
    retired: set[int] = field(default_factory=set)  # keys of dropped/poisoned writes: never written again
    damaged: set[int] = field(default_factory=set)  # (region, producer, partition) streams with a gap/corrupt

    @classmethod
    def fresh(cls, keys: int) -> PlanState:
        return cls(np.full(keys, -1, dtype=np.int8))

    def observe(self, schedule: Schedule) -> None:
        """Remember the last operation on each key of a chunk that has been placed."""
        _, nxt = _neighbours(schedule.key)
        last = nxt < 0
        self.last_op[schedule.key[last]] = schedule.op[last]


def _neighbours(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the previous and next write of the same key (-1 when none), in schedule order."""
    n = key.size
    prev = np.full(n, -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return prev, nxt
    order = np.argsort(key, kind="stable")
    same = key[order][1:] == key[order][:-1]
    prev[order[1:][same]] = order[:-1][same]
    nxt[order[:-1][same]] = order[1:][same]
    return prev, nxt


def plan_faults(
    cfg: SimConfig,
    schedule: Schedule,
    keyspace_keys: list[bytes],
    rng: np.random.Generator,
    *,
    counted: dict[str, int] | None = None,
    timed: list[TimedFault] | None = None,
    origin_ms: int | None = None,
    plan: FaultPlan | None = None,
    state: PlanState | None = None,
    base: int = 0,
    carry: bool = False,
) -> FaultPlan:
    """Choose every fault's target from the seed. Kinds that cannot be placed (e.g. too few suitable writes in
    a tiny run) are injected fewer times; `shortfall` says why.

    `counted` (default `cfg.faults`) go to random suitable writes or times in their kind's WINDOWS of the
    schedule; `timed` (default `cfg.fault_times`, seconds after `origin_ms`, default the schedule's start) to
    the first suitable write at or after their time, or to their time. A live run calls this once per chunk
    of its schedule with the run's `plan` (fault ids continue), its `state`, `base` (the global index of the
    chunk's first write) and `carry`: a timed write fault with no suitable write in the chunk then waits in
    `plan.waiting` for the next chunk instead of falling short."""
    counted = cfg.faults if counted is None else counted
    timed = list(cfg.fault_times if timed is None else timed)
    if plan is None:
        plan = FaultPlan(requested=requested_faults(counted, timed))
    placer = _Placer(cfg, schedule, keyspace_keys, rng, plan, state or PlanState.fresh(cfg.keys), base)
    origin = schedule.start_ms if origin_ms is None else origin_ms
    timed.sort(key=lambda tf: tf.at_s)

    def at_ms(tf: TimedFault) -> int:
        return origin + int(round(tf.at_s * 1000))

    def write_at(tf: TimedFault) -> None:
        if placer.write_fault_at(tf.kind, at_ms(tf)):
            return
        if carry:
            plan.waiting.append(tf)
        else:
            plan.short(tf.kind, f"{tf}: no suitable write at or after {tf.at_s:g} s in this run")

    # RT faults first: the keys they touch are kept away from dropped/poisoned, whose expectations assume
    # every earlier write of their key reached every region.
    for kind in RT_FAULTS:
        placer.counted_rt(kind, counted.get(kind, 0))
    for tf in (tf for tf in timed if tf.kind in RT_FAULTS):
        write_at(tf)
    two_regions = cfg.regions >= 2
    for kind in ("dropped", "poisoned"):
        if not two_regions and (counted.get(kind) or any(tf.kind == kind for tf in timed)):
            plan.short(kind, "needs at least two regions")
    if two_regions:
        placer.counted_dp(counted.get("dropped", 0), counted.get("poisoned", 0))
        for tf in (tf for tf in timed if tf.kind in ("dropped", "poisoned")):
            write_at(tf)
    placer.counted_failovers(counted.get("failover", 0))
    for _ in range(counted.get("broker", 0)):
        x = int(rng.integers(cfg.regions))
        placer.outage("broker", placer.start + int(rng.uniform(*WINDOWS["broker"]) * placer.span), None, x)
    for kind in ("silent", "isolated"):
        for _ in range(counted.get(kind, 0)):
            placer.outage(kind, placer.start + int(rng.uniform(*WINDOWS[kind]) * placer.span), None)
    for tf in (tf for tf in timed if tf.kind in STOP_RESUME_KINDS):
        placer.outage(tf.kind, at_ms(tf), None if tf.for_s is None else int(round(tf.for_s * 1000)))
    place_compactions(cfg, plan, rng, counted.get("compaction", 0))
    # Placed last, from a generator of their own, so that runs without them are the runs they always were.
    if counted.get("redelivery") or counted.get("swap") or any(tf.kind in CAPTURE_KINDS for tf in timed):
        placer.rng = np.random.default_rng([cfg.seed, 8, base])
        for _ in range(counted.get("redelivery", 0)):
            placer.redelivery(placer.start + int(placer.rng.uniform(*WINDOWS["redelivery"]) * placer.span))
        for _ in range(counted.get("swap", 0)):
            placer.swap(placer.start + int(placer.rng.uniform(*WINDOWS["swap"]) * placer.span))
        for tf in (tf for tf in timed if tf.kind in CAPTURE_KINDS):
            (placer.redelivery if tf.kind == "redelivery" else placer.swap)(at_ms(tf))
    if state is not None:
        state.observe(schedule)
    return plan


def times_for_counts(cfg: SimConfig, rng: np.random.Generator) -> list[TimedFault]:
    """A live run draws its schedule a chunk at a time, so its counted faults get times up front instead: each
    at a random time in its kind's WINDOWS of the run's duration (compaction, done after the run, has none)."""
    out: list[TimedFault] = []
    if cfg.duration_s is None:
        return out
    for kind, n in sorted(cfg.faults.items()):
        if kind == "compaction":
            continue
        lo, hi = WINDOWS[kind]
        out.extend(TimedFault(kind, round(float(rng.uniform(lo, hi)) * cfg.duration_s, 3)) for _ in range(n))
    return out


def place_compactions(cfg: SimConfig, plan: FaultPlan, rng: np.random.Generator, k: int) -> None:
    """Compaction faults (done to the archives after the run). Compaction removes superseded records, among
    them the duplicates a failover leaves: keep it off the failed-over partitions when there is a choice, so
    each fault stays visible on its own."""
    pairs = [(x, p) for x in range(cfg.regions) for p in range(cfg.partitions)]
    failed = {(f.region, f.partition) for f in plan.faults if f.kind == "failover"}
    spare = [pair for pair in pairs if pair not in failed] or pairs
    for _ in range(k):
        x, p = spare[int(rng.integers(len(spare)))]
        plan.add("compaction", region=x, partition=p, detail={"range_fraction": [0.3, 0.33]})


class _Placer:
    """The placement rules over one schedule (a whole run, or a chunk of a live one)."""

    def __init__(
        self,
        cfg: SimConfig,
        schedule: Schedule,
        keyspace_keys: list[bytes],
        rng: np.random.Generator,
        plan: FaultPlan,
        state: PlanState,
        base: int,
    ) -> None:
        self.cfg, self.s, self.keys, self.rng = cfg, schedule, keyspace_keys, rng
        self.plan, self.state, self.base = plan, state, base
        self.t = schedule.time_ms
        self.start, self.end = schedule.start_ms, schedule.end_ms
        self.span = max(1, self.end - self.start)
        self.used = np.zeros(len(schedule), dtype=bool)
        self.stream = (
            (schedule.region.astype(np.int64) << 32)
            | (schedule.writer.astype(np.int64) << 16)
            | schedule.partition.astype(np.int64)
        )
        self.pairs = [(x, p) for x in range(cfg.regions) for p in range(cfg.partitions)]
        self._dp: tuple[np.ndarray, np.ndarray] | None = None

    def window(self, kind: str) -> np.ndarray:
        lo, hi = WINDOWS[kind]
        return (self.t >= self.start + int(lo * self.span)) & (self.t < self.start + int(hi * self.span))

    def pick(self, mask: np.ndarray, k: int, kind: str) -> list[int]:
        cand = np.flatnonzero(mask)
        if cand.size < k:
            self.plan.short(kind, f"requested {k}, only {cand.size} suitable write(s) in this run")
            k = cand.size
        return sorted(int(i) for i in self.rng.choice(cand, size=k, replace=False)) if k else []

    def first_at(self, mask: np.ndarray, t_ms: int) -> int | None:
        cand = np.flatnonzero(mask & (self.t >= t_ms))
        return int(cand[0]) if cand.size else None

    def add_write_faults(self, kind: str, idx: list[int]) -> None:
        s = self.s
        for i in idx:
            self.plan.add(
                kind,
                region=int(s.region[i]),
                partition=int(s.partition[i]),
                key=self.keys[int(s.key[i])],
                write=self.base + i,
                time_ms=int(self.t[i]),
            )

    # -- RT faults: gap, corrupt, duplicate -------------------------------------------------------------
    def rt_mask(self, kind: str) -> np.ndarray:
        """Gaps and corruptions go to distinct (producer, partition) streams, so that each is the only reason
        for its segment's checksum mismatch."""
        mask = ~self.used
        if kind == "corrupt":
            mask &= self.s.op == PUT
        if kind in ("gap", "corrupt"):
            damaged = np.fromiter(self.state.damaged, np.int64, len(self.state.damaged))
            mask &= ~np.isin(self.stream, damaged)
        return mask

    def rt_mark(self, kind: str, idx: list[int]) -> None:
        self.used[idx] = True
        self.state.tainted.update(int(self.s.key[i]) for i in idx)
        if kind in ("gap", "corrupt"):
            self.state.damaged.update(int(self.stream[i]) for i in idx)
        self.add_write_faults(kind, idx)

    def counted_rt(self, kind: str, k: int) -> None:
        if not k:
            return
        if kind in ("gap", "corrupt"):
            for _ in range(k):  # one at a time: each choice rules out its stream for the next
                one = self.pick(self.rt_mask(kind) & self.window(kind), 1, kind)
                if not one:
                    placed = sum(f.kind == kind for f in self.plan.faults)
                    self.plan.short(kind, f"requested {k}, placed {placed}")
                    break
                self.rt_mark(kind, one)
            return
        self.rt_mark(kind, self.pick(self.rt_mask(kind) & self.window(kind), k, kind))

    def write_fault_at(self, kind: str, t_ms: int) -> bool:
        if kind in RT_FAULTS:
            i = self.first_at(self.rt_mask(kind), t_ms)
            if i is None:
                return False
            self.rt_mark(kind, [i])
            return True
        i = self.first_at(self.dp_mask(), t_ms)
        if i is None:
            return False
        self.add_dp(kind, i)
        return True

    # -- dropped and poisoned ---------------------------------------------------------------------------
    def dp_mask(self) -> np.ndarray:
        """A PUT that is the last write of its key (a live run never writes the key again), whose key was
        absent or held a PUT before it, that is strictly newer than the key's write before it (at an equal
        timestamp Venice's tie-break may keep the older write, and the fault would cause nothing), and that no
        RT fault touched."""
        if self._dp is None:
            s, st = self.s, self.state
            prev, nxt = _neighbours(s.key)
            before = st.last_op[s.key]
            prev_is_put = np.where(prev >= 0, s.op[np.maximum(prev, 0)] == PUT, before != DELETE)
            newer = np.where(prev >= 0, s.time_ms[np.maximum(prev, 0)] < s.time_ms, True)
            tainted = np.isin(s.key, np.fromiter(st.tainted, dtype=np.int64, count=len(st.tainted)))
            mask = (nxt < 0) & (s.op == PUT) & prev_is_put & newer & ~tainted & ~self.used
            self._dp = (mask, prev)
        return self._dp[0]

    def counted_dp(self, k_drop: int, k_poison: int) -> None:
        if not (k_drop or k_poison):
            return
        mask = self.dp_mask() & self.window("dropped")
        for kind, k in (("dropped", k_drop), ("poisoned", k_poison)):
            if not k:
                continue
            idx = self.pick(mask, k, kind)
            mask[idx] = False
            for i in idx:
                self.add_dp(kind, i)

    def add_dp(self, kind: str, i: int) -> None:
        cfg, s = self.cfg, self.s
        self.dp_mask()
        mask, prev = self._dp
        mask[i] = False
        origin, part = int(s.region[i]), int(s.partition[i])
        key_id = int(s.key[i])
        # Leap Frog compares what regions wrote after End of Push (as Venice's checker does), so a key whose
        # only earlier value came from the batch load has no record in the dropping region's scan: the finding
        # is MISSING there, although the region still serves the batch value.
        seen_by_scan = bool(prev[i] >= 0 or self.state.last_op[key_id] >= 0)
        had_value = bool(seen_by_scan or key_id < cfg.batch_records)
        f = self.plan.add(
            kind,
            region=origin,
            partition=part,
            key=self.keys[key_id],
            write=self.base + i,
            time_ms=int(self.t[i]),
        )
        self.state.retired.add(key_id)
        if kind == "dropped":
            f.affected_regions = [x for x in range(cfg.regions) if x != origin]
            f.detail = {
                "applied_in": [origin],
                "dropped_in": f.affected_regions,
                "key_had_value_before": had_value,
                "key_had_online_value_before": seen_by_scan,
            }
        else:
            x = int(self.rng.integers(cfg.regions))
            f.region = x
            f.affected_regions = [x]
            f.detail = {"origin_region": origin, "poisoned_in": x}
        f.expect = {
            "leapfrog": _leapfrog_expect(
                kind, cfg.regions, origin, f.affected_regions, part, f.key, seen_by_scan
            ),
            "div": [],
        }

    # -- failovers and outages --------------------------------------------------------------------------
    def counted_failovers(self, k: int) -> None:
        if not k:
            return
        pairs = self.pairs
        if k > len(pairs):
            self.plan.short("failover", f"requested {k}, only {len(pairs)} (region, partition) leaders")
            k = len(pairs)
        chosen = self.rng.choice(len(pairs), size=k, replace=False)
        for c in sorted(int(c) for c in chosen):
            x, p = pairs[c]
            tf = self.start + int(self.rng.uniform(*WINDOWS["failover"]) * self.span)
            self.plan.add("failover", region=x, partition=p, time_ms=tf, end_ms=self._until(tf, None))

    def redelivery(self, t: int) -> None:
        """A VT record written twice by the leader of a (region, partition) drawn from the seed: its first VT
        data record at or after `t` (a producer retry after a lost acknowledgement)."""
        x, p = self.pairs[int(self.rng.integers(len(self.pairs)))]
        self.plan.add("redelivery", region=x, partition=p, time_ms=t)

    def swap(self, t: int) -> None:
        """A re-push of version+1 that snapshots at `t`, ends its push `swap_push_ms` later and replaces version N
        `swap_overlap_ms` after that (a planned run cuts both short at its last write). The new leaders replay the
        RTs from `swap_rewind_ms` x [0.5, 1.5) (drawn from the seed) before the snapshot."""
        cfg = self.cfg
        eop = t + cfg.swap_push_ms
        if not cfg.live:
            eop = max(t + 1, min(eop, self.end - 1))
        vs = eop + cfg.swap_overlap_ms if cfg.live else max(eop + 1, min(eop + cfg.swap_overlap_ms, self.end))
        # A failed leader of version N writes no VersionSwap: the swap waits for the successors of failovers that
        # are going on then.
        for f in self.plan.of("failover"):
            if f.time_ms is not None and f.end_ms is not None and f.time_ms < vs <= f.end_ms:
                vs = f.end_ms + 1
        rewind_ms = int(cfg.swap_rewind_ms * self.rng.uniform(0.5, 1.5))
        source = int(self.rng.integers(cfg.regions))
        self.plan.add(
            "swap",
            time_ms=t,
            end_ms=vs,
            detail={
                "from_version": cfg.version,
                "to_version": cfg.version + 1,
                "from_topic": cfg.vt_topic,
                "to_topic": f"{cfg.store}_v{cfg.version + 1}",
                "source_region": source,
                "snapshot_ms": t,
                "end_of_push_ms": eop,
                "version_swap_ms": vs,
                "rewind_ms": rewind_ms,
                "rewind_from_ms": t - rewind_ms,
            },
        )

    def _until(self, t: int, length_ms: int | None, default_ms: int | None = None) -> int:
        """When an outage that starts at `t` ends. A planned run cuts it short at its last write, so that it
        ends with heartbeats of every leader covering every write; a live run ends it when it stops."""
        cfg = self.cfg
        if default_ms is None:
            default_ms = cfg.failover_delay_ms
        end = t + (default_ms if length_ms is None else length_ms)
        return end if cfg.live else max(t + 1, min(end, self.end))

    def _spare_leader(self) -> tuple[int, int]:
        """A (region, partition) leader that no other failover or silence targets, outside isolated regions, when
        there is one, so that each fault stays visible on its own."""
        taken = {(f.region, f.partition) for f in self.plan.faults if f.kind in ("failover", "silent")}
        cut_off = {f.region for f in self.plan.faults if f.kind == "isolated"}
        spare = [pair for pair in self.pairs if pair not in taken and pair[0] not in cut_off] or [
            pair for pair in self.pairs if pair not in taken
        ]
        spare = spare or self.pairs
        return spare[int(self.rng.integers(len(spare)))]

    def _spare_region(self) -> int:
        """A region where no other outage targets a leader or the whole region, when there is one."""
        taken = {f.region for f in self.plan.faults if f.kind in ("failover", "silent", "isolated")}
        spare = [x for x in range(self.cfg.regions) if x not in taken] or list(range(self.cfg.regions))
        return spare[int(self.rng.integers(len(spare)))]

    def outage(self, kind: str, t: int, length_ms: int | None, region: int | None = None) -> None:
        """A stop/resume fault starting at `t`; its target drawn from the seed unless `region` is given."""
        cfg, rng = self.cfg, self.rng
        if kind == "failover":
            x, p = self._spare_leader()
            self.plan.add("failover", region=x, partition=p, time_ms=t, end_ms=self._until(t, length_ms))
        elif kind == "broker":
            down_ms = int(round(cfg.broker_down_s * 1000)) if length_ms is None else length_ms
            x = int(rng.integers(cfg.regions)) if region is None else region
            self.plan.add("broker", region=x, time_ms=t, end_ms=t + down_ms)
        elif kind == "silent":
            x, p = self._spare_leader()
            end = self._until(t, length_ms, cfg.outage_ms)
            self.plan.add("silent", region=x, partition=p, time_ms=t, end_ms=end)
        elif kind == "isolated":
            if cfg.regions < 2:
                self.plan.short("isolated", "needs at least two regions")
                return
            x = self._spare_region()
            end = self._until(t, length_ms, cfg.outage_ms)
            self.plan.add("isolated", region=x, time_ms=t, end_ms=end)
        else:
            raise ValueError(f"{kind} is not an outage")


def _leapfrog_expect(
    kind: str,
    regions: int,
    origin: int,
    affected: list[int],
    partition: int,
    key: bytes,
    scanned_value_before: bool,
) -> list[dict]:
    out = []
    if kind == "dropped":
        for x in affected:
            a, b = sorted((origin, x))
            if scanned_value_before:
                typ = "VALUE_MISMATCH"
            else:
                typ = "MISSING_IN_A" if x == a else "MISSING_IN_B"
            out.append({"type": typ, "region_a": a, "region_b": b, "partition": partition, "key": key.hex()})
    else:
        x = affected[0]
        for y in range(regions):
            if y != x:
                a, b = sorted((x, y))
                out.append(
                    {
                        "type": "VALUE_MISMATCH",
                        "region_a": a,
                        "region_b": b,
                        "partition": partition,
                        "key": key.hex(),
                    }
                )
    return out


def div_expect(region: int, topic: str, partition: int, offset: int, typ: str) -> dict:
    """One finding `tidegauge div validate` must report (RT findings are never fatal: RTs are after EOP)."""
    return {
        "region": region,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "type": typ,
        "fatal": False,
    }
