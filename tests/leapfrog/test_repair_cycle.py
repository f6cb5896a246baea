"""The whole repair cycle over generated many-key histories, pure (no Spark, no Kafka): issue 31's "repair that
converges".

Model. 2–5 regions; 5–40 keys; every region's RT holds writes (key, PUT/DELETE, value bytes, logical timestamp,
coordinate = (origin region, RT offset)), with timestamps drawn from a small range so that equal-timestamp
conflicts happen (two PUTs of different values, a PUT and a DELETE), and now and then two PUTs at the key's top
timestamp whose values' Java hashes collide (Venice's merge is order-dependent there). Every region's replica
applies every RT write through `leapfrog.repair.dcr_apply` (Venice's value-level merge) in its own arrival order.
Faults, at most one per key, with known truth: a **missed** write (some regions, never all, never apply it), a
**poisoned** value (one region applies a modified value with the same timestamp and coordinate), a **lost
delete** (some regions miss a DELETE). The truth of a key is the record the same history gives without the
faults (checked to be the same in every region: the generator's sanity test).

The cycle: detect (keys whose content — what a reader sees — differs between regions, as leapfrog reports once its
heartbeats cover everything); plan (`plan_key` per divergent key, with the RT writes by coordinate, and without);
writes made after the plan (timestamps above every earlier one, to some planned keys and some others, applied in
every region); apply (each planned write becomes one new RT write of the applying region with the plan's
`logical_ts` and value, applied in every region through `dcr_apply`, interleaved with the later writes in an
order that differs by region); detect again.

Properties (truth from the generator, never from the rule under test):

- **Safe: a write made after the plan survives.** A key a later write touched holds that write in every region,
  whichever arrived first.
- **Safe: nothing outside the plan is written.** The apply writes exactly the planned keys with a write; every
  other key (not divergent, or planned without a write) ends exactly as it would without the apply.
- **Safe: undecidable keys are named and left alone.** Op NONE, cause `undecidable`, the conflicting regions in
  `undecided`, no write; with the RTs only a hash collision is undecidable; without them, also a key whose
  regions hold the same RT write with different values (a poisoned one) when no DELETE wins the tie anyway.
- **Safe: applying the plan twice equals applying it once** (every region's final records).
- **Live: every planned key with a write converges**, in every region, to the fault-free record, unless a later
  write touched it. With the RTs a poisoned key is decided (cause `poisoned`), stamped one above the winner
  exactly when the poisoned value would win Venice's tie at the winner's own timestamp. After the cycle, with the
  RTs, every key but the undecidable ones agrees everywhere, and with the fault-free record.

Teeth: two ablations must be caught on the generated histories — a repair stamped with the current time (above the
later writes) breaks "a write made after the plan survives", and a repair stamped with the winner's own timestamp
(no W + 1) leaves some poisoned key unconverged.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from leapfrog.repair import (
    DELETE,
    NONE,
    POISONED,
    PUT,
    UNDECIDABLE,
    Record,
    Repair,
    dcr_apply,
    java_bytes_hash,
    plan_key,
)

HISTORIES = 300
BASE = 100  # the timestamps of the history: BASE..BASE+4, and BASE+10 for hash collisions
NOW = 1_000_000  # the current time: the writes made after the plan are stamped NOW + i

Key = bytes
State = dict[Key, Record | None]


@dataclass
class Fault:
    kind: str  # missed, lost_delete, poisoned
    write: Record  # the RT write it hit
    regions: frozenset[int]  # the regions that miss it, or the region poisoned
    poison: Record | None = None  # what the poisoned region applied instead


@dataclass
class History:
    seed: int
    n: int
    keys: list[Key]
    rt: dict[tuple[int, int], Record]  # coordinate -> the RT write (its content and timestamp)
    fault_free: list[State]  # each region's final records without the faults
    current: list[State]  # each region's final records with them: what the plan reads
    truth: State  # the fault-free record of each key (not for hash-collision keys)
    collisions: set[Key]
    faults: dict[Key, Fault]
    offsets: list[int]  # the next RT offset of each region


def view(rec: Record | None) -> bytes | None:
    """What a reader sees: the value, or nothing (absent or deleted)."""
    return None if rec is None or rec.op == DELETE else rec.value


def fold(states: State, writes: list[tuple[Key, Record]]) -> State:
    out = dict(states)
    for k, w in writes:
        out[k] = dcr_apply(out.get(k), w)
    return out


def detect(states: list[State], keys: list[Key]) -> set[Key]:
    return {k for k in keys if len({view(s.get(k)) for s in states}) > 1}


def _collision_pair(rng: random.Random) -> tuple[bytes, bytes]:
    # hash of 2 bytes = 31*(31 + b1) + b0 (bytes below 128 are their own signed value): (b0+31, b1-1) collides
    b0, b1 = rng.randint(0, 96), rng.randint(1, 127)
    x, y = bytes([b0, b1]), bytes([b0 + 31, b1 - 1])
    assert x != y and java_bytes_hash(x) == java_bytes_hash(y)
    return x, y


def generate(seed: int) -> History:
    rng = random.Random(seed)
    n = rng.randint(2, 5)
    keys = [b"k%03d" % i for i in range(rng.randint(5, 40))]
    offsets = [0] * n
    writes: list[tuple[Key, Record]] = []
    by_key: dict[Key, list[Record]] = {k: [] for k in keys}
    hashes: dict[Key, dict[int, bytes]] = {k: {} for k in keys}

    def emit(key: Key, op: str, value: bytes | None, ts: int) -> None:
        origin = rng.randrange(n)
        w = Record(op, value, ts, origin, offsets[origin])
        offsets[origin] += 1
        writes.append((key, w))
        by_key[key].append(w)

    def fresh(key: Key) -> bytes:
        """A value whose Java hash no other value of the key has (no accidental collision)."""
        while True:
            v = rng.randbytes(rng.randint(1, 6))
            if hashes[key].setdefault(java_bytes_hash(v), v) == v:
                return v

    collisions: set[Key] = set()
    for key in keys:
        for _ in range(rng.randint(1, 5)):
            ts = BASE + rng.randint(0, 4)
            emit(key, *((DELETE, None) if rng.random() < 0.2 else (PUT, fresh(key))), ts)
            if rng.random() < 0.3:  # an equal-timestamp conflict: another write of the key at the same time
                emit(key, *((DELETE, None) if rng.random() < 0.3 else (PUT, fresh(key))), ts)
        if rng.random() < 0.06:  # two PUTs at the top timestamp whose hashes tie: order-dependent in Venice
            collisions.add(key)
            x, y = _collision_pair(rng)
            emit(key, PUT, x, BASE + 10)
            emit(key, PUT, y, BASE + 10)
    orders = [rng.sample(writes, len(writes)) for _ in range(n)]
    fault_free = [fold({}, o) for o in orders]
    truth = {k: fault_free[0][k] for k in keys if k not in collisions}

    faults: dict[Key, Fault] = {}
    for key in keys:
        if key in collisions or rng.random() < 0.4:
            continue
        winner = next(
            w for w in by_key[key] if (w.content, w.logical_ts) == (truth[key].content, truth[key].logical_ts)
        )
        kinds = ["missed", "poisoned", "lost_delete"]
        kind = rng.choice(kinds)
        if kind == "lost_delete":
            deletes = [w for w in by_key[key] if w.op == DELETE]
            if not deletes:
                continue
            w = winner if winner.op == DELETE and rng.random() < 0.7 else rng.choice(deletes)
        elif kind == "poisoned":
            puts = [w for w in by_key[key] if w.op == PUT]
            if not puts:
                continue
            w = winner if winner.op == PUT and rng.random() < 0.7 else rng.choice(puts)
        else:
            w = winner if rng.random() < 0.6 else rng.choice(by_key[key])
        if kind == "poisoned":
            while True:
                bad = w.value + bytes([rng.randrange(256)])
                if java_bytes_hash(bad) not in hashes[key]:
                    break
            x = rng.randrange(n)
            faults[key] = Fault(kind, w, frozenset([x]), Record(PUT, bad, w.logical_ts, w.region, w.offset))
        else:
            faults[key] = Fault(kind, w, frozenset(rng.sample(range(n), rng.randint(1, n - 1))))

    def arrives(x: int, key: Key, w: Record) -> Record | None:
        f = faults.get(key)
        if f is None or f.write is not w or x not in f.regions:
            return w
        return f.poison  # None for a missed write or a lost delete

    current = [
        fold({}, [(k, a) for k, w in orders[x] if (a := arrives(x, k, w)) is not None]) for x in range(n)
    ]
    rt = {w.coordinate: Record(w.op, w.value, w.logical_ts) for _, w in writes}
    return History(seed, n, keys, rt, fault_free, current, truth, collisions, faults, offsets)


# -- the cycle ------------------------------------------------------------------------------------------------------


@dataclass
class Cycle:
    h: History
    divergent: set[Key]
    plans: dict[Key, Repair]
    later: dict[Key, Record]  # the write made after the plan, per key it touched
    repairs: dict[Key, Record] = field(default_factory=dict)  # the RT write the apply made, per key
    after: list[State] = field(default_factory=list)  # each region, after the later writes and the apply
    without: list[State] = field(default_factory=list)  # each region, after the later writes alone


def winners_own(r: Repair) -> int:
    return r.winner_ts


def current_time(r: Repair) -> int:
    return 2 * NOW  # the ablation: "now", above every write made after the plan


def run_cycle(
    h: History, *, with_rt: bool = True, stamp: Callable[[Repair], int] | None = None, copies: int = 1
) -> Cycle:
    rng = random.Random(h.seed * 7919 + 1)  # the same later writes and apply region in every variant
    divergent = detect(h.current, h.keys)
    rt = h.rt if with_rt else None
    plans = {k: plan_key({x: h.current[x].get(k) for x in range(h.n)}, rt) for k in sorted(divergent)}
    offsets = list(h.offsets)

    def rt_write(origin: int, op: str, value: bytes | None, ts: int) -> Record:
        w = Record(op, value, ts, origin, offsets[origin])
        offsets[origin] += 1
        return w

    later: dict[Key, Record] = {}
    for i, k in enumerate(h.keys):
        if rng.random() < (0.35 if k in divergent else 0.15):
            op = DELETE if rng.random() < 0.25 else PUT
            later[k] = rt_write(rng.randrange(h.n), op, None if op == DELETE else rng.randbytes(4), NOW + i)
    c = Cycle(h, divergent, plans, later)
    apply_region = rng.randrange(h.n)
    repair_writes: list[tuple[Key, Record]] = []
    for _ in range(copies):
        for k, r in plans.items():
            if r.has_write:
                ts = r.logical_ts if stamp is None else stamp(r)
                w = rt_write(apply_region, r.op, r.value, ts)
                c.repairs.setdefault(k, w)
                repair_writes.append((k, w))
    later_writes = sorted(later.items())
    for x in range(h.n):
        order = random.Random(h.seed * 31 + x)
        c.after.append(
            fold(
                h.current[x],
                order.sample(later_writes + repair_writes, len(later_writes) + len(repair_writes)),
            )
        )
        c.without.append(fold(h.current[x], order.sample(later_writes, len(later_writes))))
    return c


# -- the properties, each returning its violations (so the ablations can show they are caught) ----------------------


def later_writes_survive(c: Cycle) -> list[str]:
    return [
        f"region {x} key {k!r}: {c.after[x].get(k)} instead of the later {w}"
        for k, w in c.later.items()
        for x in range(c.h.n)
        if c.after[x].get(k) != w
    ]


def planned_keys_converge(c: Cycle, keys: set[Key] | None = None) -> list[str]:
    out = []
    for k, r in c.plans.items():
        if not r.has_write or k in c.later or (keys is not None and k not in keys):
            continue
        for x in range(c.h.n):
            if view(c.after[x].get(k)) != view(c.h.truth[k]):
                out.append(f"region {x} key {k!r} ({r.cause}): {c.after[x].get(k)}, truth {c.h.truth[k]}")
    return out


def only_the_plan_is_written(c: Cycle) -> list[str]:
    out = []
    with_write = {k for k, r in c.plans.items() if r.has_write}
    if set(c.repairs) != with_write:
        out.append(f"apply wrote {sorted(c.repairs)}, the plan has writes for {sorted(with_write)}")
    for x in range(c.h.n):
        for k in c.h.keys:
            if k not in with_write and c.after[x].get(k) != c.without[x].get(k):
                out.append(f"region {x} key {k!r} outside the plan's writes changed by the apply")
    return out


def _same_write_conflict(h: History, k: Key) -> bool:
    """The regions' top records of k include one RT write (a coordinate) held with different values, and no
    DELETE of another write at that timestamp wins the tie anyway (plan_key's rule without the RTs, from the
    records)."""
    recs = [r for x in range(h.n) if (r := h.current[x].get(k)) is not None]
    top = max(r.logical_ts for r in recs)
    top_recs = [r for r in recs if r.logical_ts == top]
    by_coord: dict[tuple[int, int], set] = {}
    for r in top_recs:
        by_coord.setdefault(r.coordinate, set()).add(r.content)
    same = {co for co, contents in by_coord.items() if len(contents) > 1}
    return bool(same) and not any(r.op == DELETE and r.coordinate not in same for r in top_recs)


def check(c: Cycle, with_rt: bool) -> None:
    h = c.h
    where = f"history seed {h.seed} ({h.n} regions, {len(h.keys)} keys, rt={with_rt})"
    overwritten = later_writes_survive(c)
    assert not overwritten, (where, overwritten[:3])
    outside = only_the_plan_is_written(c)
    assert not outside, (where, outside[:3])
    undecidable = {k for k, r in c.plans.items() if r.cause == UNDECIDABLE}
    for k in undecidable:
        r = c.plans[k]
        assert r.op == NONE and not r.regions_to_fix and r.undecided, (where, k, r)
        assert set(r.undecided) <= set(range(h.n)), (where, k, r)
    expected_undecidable = c.divergent & h.collisions
    if not with_rt:
        expected_undecidable |= {k for k in c.divergent - h.collisions if _same_write_conflict(h, k)}
    assert undecidable == expected_undecidable, (where, sorted(undecidable ^ expected_undecidable))
    for k in c.divergent & h.collisions:  # every region applied both colliding writes: all are in conflict
        assert c.plans[k].undecided == tuple(range(h.n)), (where, k, c.plans[k])
    for k, f in h.faults.items():
        # the poisoned region holds the poison and another region the true write of the same coordinate: without
        # the RT nothing says which is right (the generator knows it is the same write)
        if f.kind == "poisoned" and not with_rt:
            (x,) = f.regions
            if h.current[x].get(k) == f.poison and any(h.current[y].get(k) == f.write for y in range(h.n)):
                assert k in undecidable and x in c.plans[k].undecided, (where, k, c.plans[k])
    poisoned = {k for k, f in h.faults.items() if f.kind == "poisoned"}
    if with_rt:
        unconverged = planned_keys_converge(c)
        assert not unconverged, (where, unconverged[:3])
        for k in c.divergent - h.collisions:
            r, truth = c.plans[k], h.truth[k]
            assert r.has_write and r.winner_ts == truth.logical_ts, (where, k, r, truth)
            f = h.faults.get(k)
            shown = (
                f is not None
                and f.kind == "poisoned"
                and any(h.current[x].get(k) == f.poison for x in f.regions)
            )
            if shown:
                assert r.cause == POISONED, (where, k, r)
            # W + 1 exactly when the poisoned record sits at the winner's timestamp and wins Venice's tie there
            bump = (
                shown
                and f.poison.logical_ts == truth.logical_ts
                and truth.op == PUT
                and java_bytes_hash(f.poison.value) >= java_bytes_hash(truth.value)
            )
            assert r.logical_ts == truth.logical_ts + bump, (where, k, r, truth, f)
            assert bool(r.ignored_by) == bump, (where, k, r)
        again = detect(c.after, h.keys)
        assert again <= undecidable, (where, sorted(again - undecidable))
        for k in h.keys:
            if k in h.collisions or k in c.later:
                continue
            views = {view(c.after[x].get(k)) for x in range(h.n)}
            assert views == {view(h.truth[k])}, (where, k, views, h.truth[k])
    else:
        # without the RTs a poisoned value that wins another write's tie looks like that tie's winner: those keys
        # converge (to one value) but the truth needs the RT; every other key converges to the truth
        unconverged = planned_keys_converge(c, set(c.plans) - poisoned)
        assert not unconverged, (where, unconverged[:3])
        for k, r in c.plans.items():
            if r.has_write and k not in c.later:
                assert len({view(c.after[x].get(k)) for x in range(h.n)}) == 1, (where, k, r)


# -- the tests ------------------------------------------------------------------------------------------------------


HISTORY_CACHE: dict[int, History] = {}


def history(seed: int) -> History:
    if seed not in HISTORY_CACHE:
        HISTORY_CACHE[seed] = generate(seed)
    return HISTORY_CACHE[seed]


def test_the_generator_fault_free_history_converges_everywhere_and_faults_show():
    """Sanity of the generator: without faults Venice's merge gives every region the same record (hash-collision
    keys aside), and the faults make divergences for the cycle to repair."""
    kinds: dict[str, int] = {}
    divergent = collided = 0
    for seed in range(HISTORIES):
        h = history(seed)
        for k in h.keys:
            if k in h.collisions:
                collided += len({view(s[k]) for s in h.fault_free}) > 1
                continue
            seen = {(s[k].content, s[k].logical_ts) for s in h.fault_free}
            assert len(seen) == 1, (seed, k, seen)
        assert not detect(h.fault_free, [k for k in h.keys if k not in h.collisions]), seed
        div = detect(h.current, h.keys)
        divergent += len(div)
        for k in div - h.collisions:
            kinds[h.faults[k].kind] = kinds.get(h.faults[k].kind, 0) + 1  # only faults diverge
    assert divergent > 1000 and collided > 0
    assert min(kinds.get(kind, 0) for kind in ("missed", "poisoned", "lost_delete")) > 50, kinds


def test_the_cycle_with_the_rts_converges_and_keeps_later_writes():
    bumped = later_on_planned = 0
    for seed in range(HISTORIES):
        c = run_cycle(history(seed))
        check(c, with_rt=True)
        bumped += sum(1 for r in c.plans.values() if r.stamped_above_winner)
        later_on_planned += len(set(c.later) & {k for k, r in c.plans.items() if r.has_write})
    print(
        f"\nrepair cycle with the RTs: {bumped} writes stamped W+1, {later_on_planned} later writes on planned keys"
    )
    assert bumped > 20 and later_on_planned > 100, (bumped, later_on_planned)


def test_the_cycle_without_the_rts():
    undecided = 0
    for seed in range(HISTORIES):
        c = run_cycle(history(seed), with_rt=False)
        check(c, with_rt=False)
        undecided += sum(1 for k, r in c.plans.items() if r.cause == UNDECIDABLE and k not in c.h.collisions)
    assert undecided > 20, undecided


def test_applying_the_plan_twice_equals_applying_it_once():
    for seed in range(HISTORIES):
        h = history(seed)
        for with_rt in (True, False):
            once, twice = run_cycle(h, with_rt=with_rt), run_cycle(h, with_rt=with_rt, copies=2)
            for x in range(h.n):
                a = {k: (view(r), r and r.logical_ts) for k, r in once.after[x].items()}
                b = {k: (view(r), r and r.logical_ts) for k, r in twice.after[x].items()}
                assert a == b, (seed, x, with_rt)


def test_ablations_are_caught():
    """The properties have teeth: a repair stamped with the current time overwrites a write made after the plan,
    and a repair stamped with the winner's own timestamp (no W + 1) leaves a poisoned key unconverged."""
    overwrote = unconverged = overwritten_keys = unconverged_keys = 0
    for seed in range(HISTORIES):
        h = history(seed)
        lost = later_writes_survive(run_cycle(h, stamp=current_time))
        overwrote += bool(lost)
        overwritten_keys += len(lost)
        c = run_cycle(h, stamp=winners_own)
        poisoned = {k for k, f in h.faults.items() if f.kind == "poisoned"}
        stuck = planned_keys_converge(c, poisoned)
        unconverged += bool(stuck)
        unconverged_keys += len(stuck)
        assert not planned_keys_converge(c, set(c.plans) - poisoned), seed  # only the bump's keys need it
    print(
        f"\nablations over {HISTORIES} histories: stamped with the current time, {overwritten_keys} violations in "
        f"{overwrote} histories; without W+1, {unconverged_keys} poisoned keys unconverged in {unconverged}"
    )
    assert overwrote > 0, "a repair stamped with the current time must be caught overwriting a later write"
    assert unconverged > 0, "a repair without the W + 1 stamp must leave some poisoned key unconverged"
