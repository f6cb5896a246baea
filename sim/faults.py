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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import SimConfig
from .traffic import PUT, Schedule

log = logging.getLogger(__name__)

WRITE_FAULTS = ("dropped", "poisoned", "duplicate", "gap", "corrupt")


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
    end_ms: int | None = None  # failover: takeover time; broker: when the broker came back (planned)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "kind": self.kind,
            "region": self.region,
            "partition": self.partition,
            "key": None if self.key is None else self.key.hex(),
            "time_ms": self.time_ms,
            "rt_offset": self.rt_offset,
            "vt_offsets": {str(r): offs for r, offs in sorted(self.vt_offsets.items())},
            "detail": self.detail,
            "expect": self.expect,
        }


@dataclass
class FaultPlan:
    faults: list[Fault] = field(default_factory=list)
    by_write: dict[int, list[Fault]] = field(default_factory=dict)
    requested: dict[str, int] = field(default_factory=dict)
    shortfall: dict[str, str] = field(default_factory=dict)

    def of(self, kind: str) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind]

    def injected(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.faults:
            out[f.kind] = out.get(f.kind, 0) + 1
        return out


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
    cfg: SimConfig, schedule: Schedule, keyspace_keys: list[bytes], rng: np.random.Generator
) -> FaultPlan:
    """Choose every fault's target from the seed. Kinds that cannot be placed (e.g. too few suitable writes in
    a tiny run) are injected fewer times; `shortfall` says why."""
    plan = FaultPlan(requested={k: v for k, v in cfg.faults.items() if v})
    n = len(schedule)
    start, end = schedule.start_ms, schedule.end_ms
    span = max(1, end - start)
    t = schedule.time_ms
    next_id = [1]

    def new(kind: str, **kw: Any) -> Fault:
        f = Fault(next_id[0], kind, **kw)
        next_id[0] += 1
        plan.faults.append(f)
        if f.write is not None:
            plan.by_write.setdefault(f.write, []).append(f)
        return f

    def window(lo: float, hi: float) -> np.ndarray:
        return (t >= start + int(lo * span)) & (t < start + int(hi * span))

    def pick(mask: np.ndarray, k: int, kind: str) -> list[int]:
        cand = np.flatnonzero(mask)
        if cand.size < k:
            plan.shortfall[kind] = f"requested {k}, only {cand.size} suitable write(s) in this run"
            log.warning("fault %s: %s", kind, plan.shortfall[kind])
            k = cand.size
        return sorted(int(i) for i in rng.choice(cand, size=k, replace=False)) if k else []

    used = np.zeros(n, dtype=bool)
    used_keys: set[int] = set()
    rt_window = window(0.1, 0.8)

    def mark(idx: list[int]) -> None:
        used[idx] = True
        used_keys.update(int(schedule.key[i]) for i in idx)

    def add_write_faults(kind: str, idx: list[int]) -> None:
        for i in idx:
            new(
                kind,
                region=int(schedule.region[i]),
                partition=int(schedule.partition[i]),
                key=keyspace_keys[int(schedule.key[i])],
                write=i,
                time_ms=int(t[i]),
            )

    # RT faults first: the keys they touch are kept away from dropped/poisoned, whose expectations assume
    # every earlier write of their key reached every region. Gaps and corruptions go to distinct (producer,
    # partition) pairs, so that each is the only reason for its segment's checksum mismatch.
    stream = (
        (schedule.region.astype(np.int64) << 32)
        | (schedule.writer.astype(np.int64) << 16)
        | schedule.partition.astype(np.int64)
    )
    damaged: set[int] = set()
    for kind, need_put in (("gap", False), ("corrupt", True), ("duplicate", False)):
        k = cfg.faults.get(kind, 0)
        if not k:
            continue
        mask = rt_window & ~used
        if need_put:
            mask &= schedule.op == PUT
        if kind in ("gap", "corrupt"):
            for _ in range(k):  # one at a time: each choice rules out its stream for the next
                one = pick(mask & ~np.isin(stream, np.fromiter(damaged, np.int64, len(damaged))), 1, kind)
                if not one:
                    plan.shortfall[kind] = f"requested {k}, placed {sum(f.kind == kind for f in plan.faults)}"
                    break
                damaged.add(int(stream[one[0]]))
                mark(one)
                add_write_faults(kind, one)
            continue
        idx = pick(mask, k, kind)
        mark(idx)
        add_write_faults(kind, idx)

    k_drop, k_poison = cfg.faults.get("dropped", 0), cfg.faults.get("poisoned", 0)
    if (k_drop or k_poison) and cfg.regions < 2:
        for kind in ("dropped", "poisoned"):
            if cfg.faults.get(kind):
                plan.shortfall[kind] = "needs at least two regions"
        k_drop = k_poison = 0
    if k_drop or k_poison:
        prev, nxt = _neighbours(schedule.key)
        prev_is_put = np.where(prev >= 0, schedule.op[np.maximum(prev, 0)] == PUT, True)
        key_used = np.isin(schedule.key, np.fromiter(used_keys, dtype=np.int64, count=len(used_keys)))
        mask = window(0.15, 0.7) & (nxt < 0) & (schedule.op == PUT) & prev_is_put & ~key_used & ~used
        for kind, k in (("dropped", k_drop), ("poisoned", k_poison)):
            if not k:
                continue
            idx = pick(mask, k, kind)
            mask[idx] = False
            for i in idx:
                origin, part = int(schedule.region[i]), int(schedule.partition[i])
                key_id = int(schedule.key[i])
                had_value = bool(prev[i] >= 0 or key_id < cfg.batch_records)
                # Leap Frog compares what regions wrote after End of Push (as Venice's checker does), so a key
                # whose only earlier value came from the batch load has no record in the dropping region's
                # scan: the finding is MISSING there, although the region still serves the batch value.
                seen_by_scan = bool(prev[i] >= 0)
                f = new(
                    kind, region=origin, partition=part, key=keyspace_keys[key_id], write=i, time_ms=int(t[i])
                )
                if kind == "dropped":
                    f.affected_regions = [x for x in range(cfg.regions) if x != origin]
                    f.detail = {
                        "applied_in": [origin],
                        "dropped_in": f.affected_regions,
                        "key_had_value_before": had_value,
                        "key_had_online_value_before": seen_by_scan,
                    }
                else:
                    x = int(rng.integers(cfg.regions))
                    f.region = x
                    f.affected_regions = [x]
                    f.detail = {"origin_region": origin, "poisoned_in": x}
                f.expect = {
                    "leapfrog": _leapfrog_expect(
                        kind, cfg.regions, origin, f.affected_regions, part, f.key, seen_by_scan
                    ),
                    "div": [],
                }

    pairs = [(x, p) for x in range(cfg.regions) for p in range(cfg.partitions)]
    k = cfg.faults.get("failover", 0)
    if k:
        if k > len(pairs):
            plan.shortfall["failover"] = f"requested {k}, only {len(pairs)} (region, partition) leaders"
            k = len(pairs)
        chosen = rng.choice(len(pairs), size=k, replace=False)
        for c in sorted(int(c) for c in chosen):
            x, p = pairs[c]
            tf = start + int(rng.uniform(0.35, 0.6) * span)
            # The successor must be back before the producers close, so that the run ends with heartbeats of
            # every leader: in a run shorter than the delay the outage is cut short.
            new(
                "failover",
                region=x,
                partition=p,
                time_ms=tf,
                end_ms=max(tf + 1, min(tf + cfg.failover_delay_ms, end)),
            )
    for _ in range(cfg.faults.get("broker", 0)):
        x = int(rng.integers(cfg.regions))
        new("broker", region=x, time_ms=start + int(rng.uniform(0.2, 0.8) * span))
    # Compaction removes superseded records, among them the duplicates a failover leaves: keep it off the
    # failed-over partitions when there is a choice, so each fault stays visible on its own.
    failed = {(f.region, f.partition) for f in plan.faults if f.kind == "failover"}
    spare = [pair for pair in pairs if pair not in failed] or pairs
    for _ in range(cfg.faults.get("compaction", 0)):
        x, p = spare[int(rng.integers(len(spare)))]
        new("compaction", region=x, partition=p, detail={"range_fraction": [0.3, 0.33]})
    return plan


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
