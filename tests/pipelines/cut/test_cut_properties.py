"""Properties of consistent cuts (issue 40, item 5) on generated histories with known truth
(tests/support/cut_histories.py: lag, leader failovers, duplicates, conflicts on hot keys, a region behind).

- C, floors and ceils never decrease as T grows (the exact cut and the heartbeat-aligned one), and the aligned cut
  never lies beyond the exact one;
- with the RT writes (`--rt`), every region's snapshot at a cut equals the DCR fold of the RT writes at or below
  it, so two regions' snapshots are equal;
- without them, every row marked exact equals that truth.

Each property is run on a deliberately broken variant too, in the same test, and must fail on some history: the
checks can see what they claim to check.
"""

from __future__ import annotations

import numpy as np
import pytest
from cut_histories import CutHistory, generate

from heartbeat.changes import ChangeFilter, Item, Role, Verdict, from_cut
from heartbeat.cuts import HeartbeatMark, PositionFinder, Positions, aligned_cut, exact_cut, positions
from leapfrog.repair import Record, dcr_apply
from pipelines.cut import snapshot as snap
from pipelines.cut.snapshot import snapshot_table, undecided_keys

HISTORIES = [generate(seed) for seed in range(24)]
FAULT_FREE = [generate(seed, faults=False) for seed in range(100, 108)]


def test_the_histories_hold_the_faults_the_properties_are_about():
    assert sum(h.failovers for h in HISTORIES) >= 10
    assert sum(h.duplicates for h in HISTORIES) >= 10
    assert sum(h.behind is not None for h in HISTORIES) >= 4
    assert all(h.failovers == h.duplicates == 0 and h.behind is None for h in FAULT_FREE)


# -- the rules, and broken variants of them ------------------------------------------------------------------------


def exact(h: CutHistory, at_ms: int) -> tuple[int, ...]:
    return tuple(exact_cut([e.offset for e in rt], [e.ts for e in rt], at_ms) for rt in h.rts)


def aligned(h: CutHistory, at_ms: int) -> tuple[int, ...]:
    marks = [HeartbeatMark(e.offset, *e.origin) for vt in h.vts for e in vt if e.key is None]
    return aligned_cut(marks, at_ms, h.n)


_MATRICES: dict[tuple[int, bool, int], tuple[np.ndarray, np.ndarray]] = {}


def positions_in(h: CutHistory, x: int, cut) -> Positions:
    """Floor, ceil and exact of `cut` in region x's VT, through the batch path the job runs."""
    key = (h.seed, h.behind is None, x)
    if key not in _MATRICES:
        hbs = h.heartbeats(x)
        _MATRICES[key] = (np.array([o for o, _ in hbs]), np.array([v for _, v in hbs]).reshape(len(hbs), h.n))
    finder = PositionFinder(cut)
    finder.feed_batch(*_MATRICES[key])
    return finder.positions


def ceil_of(h: CutHistory, x: int, cut) -> int | None:
    return positions_in(h, x, cut).ceil


def floor_as_ceil(h: CutHistory, x: int, cut) -> int | None:
    """Broken: reading the VT up to floor instead of ceil (the records of the cut between them are missed)."""
    p = positions_in(h, x, cut)
    return None if p.ceil is None else (p.floor if p.floor is not None else 0)


# -- the properties: each returns what failed, or None ------------------------------------------------------------


def ceil_as_floor(h: CutHistory, x: int, cut) -> Positions:
    """Broken: ceil taken as floor (a region whose vectors have not yet reached the cut is not behind)."""
    p = positions_in(h, x, cut)
    return Positions(p.floor, p.floor, p.exact)


def monotone(h: CutHistory, cut_of, positions_of=positions_in) -> str | None:
    """C, floors and ceils at rising T never go down (a ceil of None, behind, is above every offset)."""
    before: tuple[int, ...] | None = None
    floors: dict[int, int] = {}
    ceils: dict[int, int | None] = {}
    for t in h.times(every_ms=50):
        c = cut_of(h, t)
        if before is not None and any(a > b for a, b in zip(before, c, strict=True)):
            return f"seed {h.seed}: C went from {before} to {c} at T={t}"
        before = c
        for x in range(h.n):
            p = positions_of(h, x, c)
            f = -1 if p.floor is None else p.floor
            if f < floors.get(x, -1):
                return f"seed {h.seed}: region {x}'s floor went down at T={t}"
            inf = float("inf")
            if x in ceils and (inf if p.ceil is None else p.ceil) < (inf if ceils[x] is None else ceils[x]):
                return f"seed {h.seed}: region {x}'s ceil went down at T={t}"
            floors[x], ceils[x] = f, p.ceil
    return None


def content(op: str, value: bytes | None) -> tuple[str, bytes | None]:
    return (op, value if op == "PUT" else None)


def snapshots_equal_the_fold(h: CutHistory, cut_of, end_of=ceil_of) -> str | None:
    """With --rt: every region not behind has exactly the truth's keys and contents, all exact."""
    for t in h.times():
        c = cut_of(h, t)
        truth = {k: content(r.op, r.value) for k, r in h.truth(c).items()}
        for x in range(h.n):
            end = end_of(h, x, c)
            if end is None:
                continue
            events = h.events(x, end)
            wanted = set(undecided_keys(events, c))
            writes = h.rt_writes(c)
            rt = {k: writes.get(k, []) for k in wanted}
            rows = snapshot_table(0, events, c, rt).to_pylist()
            got = {r["key"]: content(r["op"], r["value"]) for r in rows}
            if got != truth or not all(r["exact"] for r in rows):
                return f"seed {h.seed}, T={t}, C={c}: region {x}'s snapshot differs from the DCR fold"
    return None


def exact_rows_are_true(h: CutHistory, cut_of) -> str | None:
    """Without --rt: every row marked exact is the truth; every key of the truth has a row."""
    for t in h.times():
        c = cut_of(h, t)
        truth = {k: content(r.op, r.value) for k, r in h.truth(c).items()}
        for x in range(h.n):
            end = ceil_of(h, x, c)
            if end is None:
                continue
            rows = snapshot_table(0, h.events(x, end), c).to_pylist()
            if not set(truth) <= {r["key"] for r in rows}:
                return f"seed {h.seed}, T={t}: region {x}'s snapshot lacks keys of the cut"
            for r in rows:
                if r["exact"] and truth.get(r["key"]) != content(r["op"], r["value"]):
                    return f"seed {h.seed}, T={t}, C={c}: region {x}'s key {r['key']!r} marked exact is wrong"
    return None


def all_hold(prop, histories, *args) -> list[str]:
    return [m for h in histories if (m := prop(h, *args)) is not None]


# -- the tests ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cut_of", [exact, aligned], ids=["from-rt", "heartbeat-aligned"])
def test_cuts_floors_and_ceils_never_decrease_as_t_grows(cut_of):
    assert all_hold(monotone, HISTORIES[:20], cut_of) == []
    assert all_hold(monotone, HISTORIES[:20], cut_of, ceil_as_floor)  # the broken variant fails


def test_the_batch_path_finds_what_one_heartbeat_at_a_time_finds():
    for h in HISTORIES[:6]:
        for t in h.times():
            for x in range(h.n):
                assert positions_in(h, x, exact(h, t)) == positions(h.heartbeats(x), exact(h, t))


def test_a_heartbeat_aligned_cut_never_lies_beyond_the_exact_one():
    for h in HISTORIES:
        for t in h.times():
            assert all(a <= e for a, e in zip(aligned(h, t), exact(h, t), strict=True)), (h.seed, t)


def test_the_cut_finds_regions_behind_and_only_late():
    behind = [h for h in HISTORIES if h.behind is not None]
    late = [ceil_of(h, h.behind, exact(h, 1200)) for h in behind]
    assert late.count(None) >= len(late) // 2  # a region 1.5 s behind has not reached T=1200
    assert all(
        ceil_of(h, h.behind, exact(h, -5)) is not None for h in behind
    )  # nothing is written before T=0


@pytest.mark.parametrize("cut_of", [exact, aligned], ids=["from-rt", "heartbeat-aligned"])
def test_with_rt_every_region_s_snapshot_is_the_dcr_fold_of_the_writes_at_or_below_the_cut(cut_of):
    assert all_hold(snapshots_equal_the_fold, FAULT_FREE + HISTORIES, cut_of) == []
    assert all_hold(snapshots_equal_the_fold, FAULT_FREE + HISTORIES, cut_of, floor_as_ceil)  # broken fails


@pytest.mark.parametrize("cut_of", [exact, aligned], ids=["from-rt", "heartbeat-aligned"])
def test_without_rt_every_row_marked_exact_is_the_truth(cut_of, monkeypatch):
    assert all_hold(exact_rows_are_true, HISTORIES, cut_of) == []
    some_not_exact = sum(
        not r["exact"]
        for h in HISTORIES[:8]
        for t in h.times()
        for x in range(h.n)
        if (end := ceil_of(h, x, cut_of(h, t))) is not None
        for r in snapshot_table(0, h.events(x, end), cut_of(h, t)).to_pylist()
    )
    assert some_not_exact > 0

    real = snap.states_at_cut

    def ignoring_above(codes, above, missing=None):  # broken: exactness ignores the records above the cut
        s = real(codes, above, missing)
        return s._replace(exact=s.exact | True)

    monkeypatch.setattr(snap, "states_at_cut", ignoring_above)
    assert all_hold(exact_rows_are_true, HISTORIES, cut_of)


# -- a snapshot, then the change stream from the cut -------------------------------------------------------------

SKEWED = [generate(seed, skew_ms=300) for seed in range(200, 224)]


def vt_items(h: CutHistory, x: int) -> tuple[list[Item], dict[int, Record]]:
    """Region x's VT as the change rule reads it (an End of Push between the bulk load and the first change;
    positions doubled to make room for it) and each change's write by position."""
    items, writes, online = [], {}, False
    for e in h.vts[x]:
        pos = 2 * e.offset
        if e.key is None:
            items.append(Item(pos, Role.HEARTBEAT, vector=e.vector))
            continue
        writes[pos] = e.write
        if e.write.region is None:
            items.append(Item(pos, Role.CHANGE))
            continue
        if not online:
            items.append(Item(pos - 1, Role.END_OF_PUSH))
            online = True
        items.append(Item(pos, Role.CHANGE, e.write.region, e.write.offset))
    return items, writes


def overwrite(stored: Record | None, change: Record) -> Record:  # broken: a change replaces the row
    return change


def snapshot_then_changes_is_the_end(h: CutHistory, cut_of, apply=dcr_apply) -> str | None:
    """With --rt: region x's snapshot at the cut, then `changes --from-cut` applied on it with Venice's DCR (a
    change with a lower logical timestamp than the row loses), is what x's VT ends with, for every region not
    behind. DCR, not replacing the row: a write of the cut that beat one above it, which reached the leader first,
    is in the snapshot but comes after that one in the VT, where the stream (W = C) drops it."""
    for t in h.times():
        c = cut_of(h, t)
        for x in range(h.n):
            end = ceil_of(h, x, c)
            if end is None:
                continue
            events = h.events(x, end)
            writes = h.rt_writes(c)
            rt = {k: writes.get(k, []) for k in undecided_keys(events, c)}
            state = {
                r["key"]: Record(
                    r["op"], r["value"], r["logical_ts"], r["upstream_region"], r["upstream_offset"]
                )
                for r in snapshot_table(0, events, c, rt).to_pylist()
            }
            items, by_position = vt_items(h, x)
            start, _ = from_cut(items, c, h.n)
            stream = ChangeFilter(start)
            keys = {2 * e.offset: e.key for e in h.vts[x]}
            for it in items:
                if it.position >= start.position and stream.step(it) is Verdict.NEW:
                    key = keys[it.position]
                    state[key] = apply(state.get(key), by_position[it.position])
            final = {e.key: e.write for e in h.vts[x] if e.key is not None}
            got = {k: content(r.op, r.value) for k, r in state.items()}
            if got != {k: content(r.op, r.value) for k, r in final.items()}:
                return f"seed {h.seed}, T={t}, C={c}: region {x}'s snapshot + changes is not its final state"
    return None


@pytest.mark.parametrize("cut_of", [exact, aligned], ids=["from-rt", "heartbeat-aligned"])
def test_a_snapshot_then_the_changes_from_the_cut_is_the_final_state(cut_of):
    assert all_hold(snapshot_then_changes_is_the_end, HISTORIES + SKEWED, cut_of) == []
    # the broken variant (a change replaces the row) fails on some skewed history
    assert all_hold(snapshot_then_changes_is_the_end, SKEWED, cut_of, overwrite)
