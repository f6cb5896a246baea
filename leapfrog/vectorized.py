"""The heartbeat-mode rule for many keys at once, in numpy: `leapfrog.reference.band` over arrays, not records.

A distributed job meets thousands of keys per batch; a Python loop per record costs more than decoding them.
Here every region's histories of a batch's keys are flat arrays in (key group, VT order), built with the rules of
`leapfrog.history` (per-key vectors as running maxima from the region's default vector, standing marks from the
next record's `hw_before` or the final mark, capped at the first gap, and the absent prefix when the scan started
at End of Push). `compare` then applies the band rule to all groups together:

- for a record b of B, the comparable records of A in b's group are [L, R): L = first i with
  `covers(hws(a_i), K(b))`, R = first i with not `covers(hws(b), K(a_i))`. Both vectors grow along a history, so
  per region component each bound is one `searchsorted` on (group, rank) composites, and the bound is the max (L)
  or min (R) over components;
- the first value in [L, R) that differs from b's comes from run boundaries of equal value classes;
- the finding of a group is its first such b (then the first a), as in `compare_standing`;
- a group has converged (its finding is healed) when its last records are comparable and of one value class.

Value classes: a PUT's 64-bit hash; tombstones and the absent prefix share NULL_CLASS (a real hash equal to it,
one chance in 2^64, would be taken for a tombstone). Tested against `compare_standing` on generated histories.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from leapfrog.history import RegionView

NULL_CLASS = np.int64(np.iinfo(np.int64).min)


@dataclass
class Histories:
    """One region's histories of many keys: rows in (gid, VT order), prefix rows first in their group."""

    gid: np.ndarray  # int64, non-decreasing
    cls: np.ndarray  # int64 value class
    absent: np.ndarray  # bool: the absent prefix
    offset: np.ndarray  # int64 VT offset (-1 for the prefix)
    vector: np.ndarray  # (n, N) int64 per-key vector K
    mark: np.ndarray  # (n, N) int64 standing high-water mark

    def __len__(self) -> int:
        return len(self.gid)


def _segment_starts(gid: np.ndarray) -> np.ndarray:
    return (
        np.flatnonzero(np.concatenate([[True], gid[1:] != gid[:-1]])) if len(gid) else np.zeros(0, np.int64)
    )


def _find_sorted(ref: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(found, position) of each x in `ref`, sorted and unique: a binary search per value instead of a Python set
    or dict lookup per row (carried and prefix rows run to hundreds of thousands per task)."""
    pos = np.searchsorted(ref, x)
    found = pos < len(ref)
    found[found] = ref[pos[found]] == x[found]
    return found, pos


def segmented_cummax(values: np.ndarray, gid: np.ndarray) -> np.ndarray:
    """Running maximum of `values` (n, N) restarting at every change of `gid` (sorted)."""
    out = np.empty_like(values)
    if not len(gid):
        return out
    # dense ranks per component keep the composite (group, rank) within int64
    for r in range(values.shape[1]):
        col = values[:, r]
        order = np.argsort(col, kind="stable")
        sorted_vals = col[order]
        rank = np.empty(len(col), np.int64)
        rank[order] = np.cumsum(np.concatenate([[0], sorted_vals[1:] != sorted_vals[:-1]]))
        span = int(rank.max()) + 1 if len(rank) else 1
        composite = gid.astype(np.int64) * span + rank
        running = np.maximum.accumulate(composite) - gid.astype(np.int64) * span
        # map ranks back to values
        values_by_rank = np.empty(span, col.dtype)
        values_by_rank[rank] = col
        out[:, r] = values_by_rank[running]
    return out


@dataclass
class Carried:
    """Records an earlier run carried for one region (`leapfrog.reference.state`): arrays in (gid, VT order).

    `mark` is each record's mark at the end of that run; `last_open` (read on each group's last row) says whether
    that record's value still stands with no gap after it, so its mark grows in this run.
    """

    gid: np.ndarray
    cls: np.ndarray
    absent: np.ndarray
    offset: np.ndarray
    vector: np.ndarray
    mark: np.ndarray
    last_open: np.ndarray

    def __len__(self) -> int:
        return len(self.gid)


def build(
    view: RegionView,
    gid: np.ndarray,
    offset: np.ndarray,
    cls: np.ndarray,
    src: np.ndarray,
    src_offset: np.ndarray,
    hw_before: np.ndarray,
    groups: np.ndarray,
    carried: Carried | None = None,
) -> Histories:
    """Histories of one region from its data rows (sorted by gid, offset) for every gid in `groups` (sorted),
    continuing the records an earlier run carried when the scan resumes."""
    n = view.n_regions
    m = len(gid)
    gid = gid.astype(np.int64)
    contrib = np.full((m, n), -1, np.int64)
    if m:
        contrib[np.arange(m), src] = src_offset
    # K before each group's first new record: the carried last record's, else the region's default
    init = np.tile(np.asarray(view.default_vector, np.int64), (len(groups), 1))
    c_first = c_last = np.zeros(0, np.int64)
    if carried is not None and len(carried):
        c_first = _segment_starts(carried.gid)
        c_last = np.concatenate([c_first[1:], [len(carried)]]) - 1
        init[np.searchsorted(groups, carried.gid[c_last])] = carried.vector[c_last]
    row_group = np.searchsorted(groups, gid)
    vector = np.maximum(segmented_cummax(contrib, gid), init[row_group]) if m else np.zeros((0, n), np.int64)
    # standing marks: the next record's hw_before in the same group, else the final mark; capped at a gap
    nxt_same = np.zeros(m, bool)
    if m > 1:
        nxt_same[:-1] = gid[1:] == gid[:-1]
    mark = np.tile(np.asarray(view.final_hw, np.int64), (m, 1))
    idx = np.flatnonzero(nxt_same)
    mark[idx] = hw_before[idx + 1]
    next_offset = np.full(m, np.iinfo(np.int64).max, np.int64)
    next_offset[idx] = offset[idx + 1]
    _cap(view, offset, next_offset, mark)
    parts = [Histories(gid, cls, np.zeros(m, bool), offset, vector, mark)]
    # the first new record of each group (for the value standing before it)
    starts = _segment_starts(gid)
    with_new = gid[starts]  # groups with a record in this scan

    def standing_from_start(gids: np.ndarray, base: np.ndarray) -> np.ndarray:
        out = base.copy()
        nxt = np.full(len(gids), np.iinfo(np.int64).max, np.int64)
        has, at = _find_sorted(with_new, gids)
        if has.any():
            firsts = starts[at[has]]
            out[has] = hw_before[firsts]
            nxt[has] = offset[firsts]
        _cap(view, np.full(len(gids), view.start_after, np.int64), nxt, out)
        return out

    if carried is not None and len(carried):
        c_mark = carried.mark.copy()
        runs_on = carried.last_open[c_last]
        if view.latest_kept:  # still the key's last record: it stands to the end, whatever gap froze it
            runs_on = runs_on | ~np.isin(carried.gid[c_last], with_new)
        open_last = c_last[runs_on]
        if len(open_last):  # a value still standing: its mark runs on into this scan
            base = np.tile(np.asarray(view.final_hw, np.int64), (len(open_last), 1))
            c_mark[open_last] = standing_from_start(carried.gid[open_last], base)
        parts.insert(
            0,
            Histories(
                carried.gid.astype(np.int64),
                carried.cls,
                carried.absent,
                carried.offset,
                carried.vector,
                c_mark,
            ),
        )
    if view.prefix_known:
        p_gids = groups[~_find_sorted(_carried_groups(carried), groups)[0]].astype(np.int64)
        g = len(p_gids)
        p_mark = standing_from_start(p_gids, np.tile(np.asarray(view.final_hw, np.int64), (g, 1)))
        if view.prefix_freeze is not None:  # an earlier run's gap lies before the key's first record (if any)
            frozen = np.isin(p_gids, with_new) if view.latest_kept else np.ones(g, bool)
            p_mark[frozen] = np.asarray(view.prefix_freeze, np.int64)
        parts.insert(
            0,
            Histories(
                p_gids,
                np.full(g, NULL_CLASS, np.int64),
                np.ones(g, bool),
                np.full(g, -1, np.int64),
                np.full((g, n), -1, np.int64),
                p_mark,
            ),
        )
    return _merge(parts)


def _carried_groups(carried: Carried | None) -> np.ndarray:
    """The groups (sorted, unique) that have carried records."""
    if carried is None or not len(carried):
        return np.zeros(0, np.int64)
    return carried.gid[_segment_starts(carried.gid)].astype(np.int64)


def previous(view: RegionView, carried: Carried | None, groups: np.ndarray) -> Histories:
    """What the previous run held of these groups, with its marks: the carried records and, where the key had
    none, the absent prefix (its mark frozen at a gap, else the previous run's final mark)."""
    n = view.n_regions
    parts = []
    if carried is not None and len(carried):
        mark = carried.mark
        if (
            view.start_latest_kept and view.start_hw is not None
        ):  # each key's last record stood to the previous end
            mark = mark.copy()
            mark[np.concatenate([_segment_starts(carried.gid)[1:], [len(carried)]]) - 1] = view.start_hw
        parts.append(
            Histories(
                carried.gid.astype(np.int64),
                carried.cls,
                carried.absent,
                carried.offset,
                carried.vector,
                mark,
            )
        )
    if view.prefix_known and view.start_hw is not None:
        p_gids = groups[~_find_sorted(_carried_groups(carried), groups)[0]].astype(np.int64)
        g = len(p_gids)
        prev = (
            view.prefix_freeze
            if view.prefix_freeze is not None and not view.start_latest_kept
            else view.start_hw
        )
        parts.insert(
            0,
            Histories(
                p_gids,
                np.full(g, NULL_CLASS, np.int64),
                np.ones(g, bool),
                np.full(g, -1, np.int64),
                np.full((g, n), -1, np.int64),
                np.tile(np.asarray(prev, np.int64), (g, 1)),
            ),
        )
    if not parts:
        return Histories(
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            np.zeros(0, bool),
            np.zeros(0, np.int64),
            np.zeros((0, n), np.int64),
            np.zeros((0, n), np.int64),
        )
    return _merge(parts)


def last_vectors(h: Histories, view: RegionView, groups: np.ndarray) -> np.ndarray:
    """K of each group's current record (its last history row), or the region's default vector."""
    out = np.tile(np.asarray(view.default_vector, np.int64), (len(groups), 1))
    if len(h):
        starts = _segment_starts(h.gid)
        lasts = np.concatenate([starts[1:], [len(h)]]) - 1
        ok, pos = _find_sorted(groups, h.gid[lasts])
        out[pos[ok]] = h.vector[lasts[ok]]
    return out


def carry(
    h: Histories,
    view: RegionView,
    real_groups: np.ndarray,
    partner_last: list[np.ndarray],
    groups: np.ndarray,
    carried_last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of `h` the next run needs (leapfrog.reference.state rule), and for each kept row `last_open` and the
    mark to carry.

    Kept: every group's last record, and superseded records whose mark covers the current K of some partner
    region (they may still become comparable). Only groups where the region has real records (`real_groups`).
    A last record with a gap after it carries the mark before that gap (its mark should a later record of the key
    turn up). `carried_last` = (sorted gids, last_open, mark) of each group's carried last record.
    """
    n = h.vector.shape[1] if len(h) else view.n_regions
    if not len(h):
        return np.zeros(0, np.int64), np.zeros(0, bool), np.zeros((0, n), np.int64)
    starts = _segment_starts(h.gid)
    lasts = np.concatenate([starts[1:], [len(h)]]) - 1
    is_last = np.zeros(len(h), bool)
    is_last[lasts] = True
    pos = np.searchsorted(groups, h.gid)
    covered = np.zeros(len(h), bool)
    for last_k in partner_last:
        covered |= np.all(h.mark >= last_k[pos], axis=1)
    real = np.isin(h.gid, real_groups)
    keep = np.flatnonzero(real & (is_last | covered))
    marks = h.mark[keep].copy()
    last_open = np.zeros(len(keep), bool)
    j = np.flatnonzero(is_last[keep])
    rows = keep[j]
    firsts = np.asarray(view.gap_firsts, np.int64)
    gap_marks = np.asarray(view.gap_marks, np.int64).reshape(len(firsts), n)
    new = h.offset[rows] > view.start_after
    # a record of this run: open unless a gap follows it (then frozen before the first such gap)
    after = np.searchsorted(firsts, h.offset[rows], side="right")
    open_new = after == len(firsts)
    frozen = np.tile(np.asarray(view.final_hw, np.int64), (len(rows), 1))
    frozen[~open_new] = gap_marks[after[~open_new]]
    # a record carried in: still open only if it was and no gap came since; a closed one keeps its frozen mark
    open_old = np.zeros(len(rows), bool)
    if carried_last is not None and len(carried_last[0]):
        cg, flags, c_marks = carried_last
        found, at = _find_sorted(cg, h.gid[rows])
        old = found & ~new
        open_old[old] = flags[at[old]] & (len(firsts) == 0)
        was_closed = old & ~flags[np.minimum(at, len(cg) - 1)]
        frozen[was_closed] = c_marks[at[was_closed]]
        if len(firsts):  # open until this scan, closed by one of its gaps
            frozen[old & ~was_closed & ~open_old] = gap_marks[0]
    last_open[j] = np.where(new, open_new, open_old)
    closed = ~last_open[j]
    marks[j[closed]] = frozen[closed]
    return keep, last_open, marks


def _cap(view: RegionView, after: np.ndarray, next_offset: np.ndarray, mark: np.ndarray) -> None:
    """Replace marks whose standing interval (after, next) contains a gap by the mark before the first gap; an
    interval open to the end of the scan (next = int64 max) is not capped when the view keeps latest records."""
    if not view.gap_firsts or not len(after):
        return
    firsts = np.asarray(view.gap_firsts, np.int64)
    marks = np.asarray(view.gap_marks, np.int64)
    i = np.searchsorted(firsts, after, side="right")
    ok = i < len(firsts)
    if view.latest_kept:
        ok &= next_offset != np.iinfo(np.int64).max
    capped = np.flatnonzero(ok)
    capped = capped[firsts[i[capped]] < next_offset[capped]]
    mark[capped] = marks[i[capped]]


def _merge(parts: list[Histories]) -> Histories:
    """Concatenate histories and order them by gid, keeping the parts' order within a gid (prefix and carried
    records come before the new records of their group)."""
    gid = np.concatenate([p.gid for p in parts])
    order = np.argsort(gid, kind="stable")
    return Histories(
        gid[order],
        np.concatenate([p.cls for p in parts])[order],
        np.concatenate([p.absent for p in parts])[order],
        np.concatenate([p.offset for p in parts])[order],
        np.concatenate([p.vector for p in parts])[order],
        np.concatenate([p.mark for p in parts])[order],
    )


def _group_bounds(gid: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.searchsorted(gid, groups, side="left"), np.searchsorted(gid, groups, side="right")


def ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The row indices of the ranges [lo[k], hi[k]) one after another, and the k of each (no loop per group:
    a chunk holds tens of thousands of them)."""
    lengths = (hi - lo).astype(np.int64)
    starts = np.cumsum(lengths) - lengths
    total = int(lengths.sum())
    rows = np.repeat(lo.astype(np.int64) - starts, lengths) + np.arange(total, dtype=np.int64)
    return rows, np.repeat(np.arange(len(lo), dtype=np.int64), lengths)


def inside(size: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """A mask of `size` positions, True inside the ranges [lo[k], hi[k]), which must lie apart (none overlapping
    another; empty ones are ignored): byte slices of a buffer picked with one byte of mask per byte, where the
    positions themselves (`ranges`) would take eight."""
    lo, hi = np.asarray(lo), np.asarray(hi)
    taken = hi > lo
    edges = np.zeros(size + 1, np.int8)
    edges[lo[taken]] = 1
    edges[hi[taken]] -= 1  # a range may end where the next begins: 1 - 1, still inside
    return np.cumsum(edges[:-1], dtype=np.int8).view(bool)


def _joint_rank(*arrays: np.ndarray) -> list[np.ndarray]:
    """Dense ranks of several arrays over their union (order preserved across them)."""
    allv = np.concatenate(arrays)
    if not len(allv):
        return [np.zeros(0, np.int64) for _ in arrays]
    order = np.argsort(allv, kind="stable")
    s = allv[order]
    rank = np.empty(len(allv), np.int64)
    rank[order] = np.cumsum(np.concatenate([[0], s[1:] != s[:-1]]))
    out, start = [], 0
    for a in arrays:
        out.append(rank[start : start + len(a)])
        start += len(a)
    return out


def _group_keys(
    gid_x: np.ndarray, x: np.ndarray, gid_y: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One int64 per element of x and of y, ordered as (gid, value) pairs are: gid * span + value. The values
    themselves when every key fits in 63 bits (offsets do, for the groups of a chunk), their dense joint ranks
    otherwise: the ranks cost a sort, the values nothing."""
    if len(x) == 0 and len(y) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo = min(int(x.min(initial=0)), int(y.min(initial=0)))
    hi = max(int(x.max(initial=0)), int(y.max(initial=0)))
    top = max(int(gid_x.max(initial=0)), int(gid_y.max(initial=0))) + 1
    span = hi - lo + 2
    gid_x, gid_y = gid_x.astype(np.int64, copy=False), gid_y.astype(np.int64, copy=False)
    if lo >= -(1 << 62) and top * span < (1 << 62):
        return gid_x * span + (x - lo), gid_y * span + (y - lo)
    rx, ry = _joint_rank(x, y)
    span = int(max(rx.max(initial=0), ry.max(initial=0))) + 2
    return gid_x * span + rx, gid_y * span + ry


@dataclass
class PairResult:
    """Per group of `groups`: the finding's rows (-1: none) and the counters."""

    groups: np.ndarray
    find_a: np.ndarray  # index into A, -1 when no finding
    find_b: np.ndarray  # index into B
    comparable_pairs: np.ndarray
    skipped: np.ndarray
    pending: np.ndarray
    # the groups' current records are comparable and hold the same value class: a finding there is healed
    # (`leapfrog.compare.status_of`)
    converged: np.ndarray


def compare(a: Histories, b: Histories, groups: np.ndarray) -> PairResult:
    """The band rule for every group in `groups` (sorted gids present in A or B with real records)."""
    g = len(groups)
    a_lo, a_hi = _group_bounds(a.gid, groups)
    b_lo, b_hi = _group_bounds(b.gid, groups)
    # B rows of these groups, and their group's A bounds
    b_rows, b_group = ranges(b_lo, b_hi)
    start, end = a_lo[b_group], a_hi[b_group]
    n_regions = a.vector.shape[1] if len(a) else b.vector.shape[1] if len(b) else 0
    low = start.copy()
    high = end.copy()
    gid_a = a.gid
    gid_b = b.gid[b_rows]
    for r in range(n_regions):
        # L: first a (in group) with mark_a[r] >= K_b[r]
        comp_a, key_b = _group_keys(gid_a, a.mark[:, r], gid_b, b.vector[b_rows, r])
        low = np.maximum(low, np.searchsorted(comp_a, key_b, side="left"))
        # R: first a with K_a[r] > mark_b[r]
        comp_k, key_m = _group_keys(gid_a, a.vector[:, r], gid_b, b.mark[b_rows, r])
        high = np.minimum(high, np.searchsorted(comp_k, key_m, side="right"))
    band = np.maximum(high - low, 0)
    comparable_pairs = np.bincount(b_group, weights=band, minlength=g).astype(np.int64)
    # records matched with nothing on the other side
    b_matched = band > 0
    diff = np.zeros(len(a) + 1, np.int64)
    np.add.at(diff, low[b_matched], 1)
    np.add.at(diff, high[b_matched], -1)
    a_matched = np.cumsum(diff[:-1]) > 0
    a_group = np.full(len(a), -1, np.int64)
    a_rows, a_row_group = ranges(a_lo, a_hi)
    a_group[a_rows] = a_row_group
    a_in = a_group >= 0
    skipped = np.bincount(a_group[a_in & ~a_matched & ~a.absent], minlength=g)
    skipped += np.bincount(b_group[~b_matched & ~b.absent[b_rows]], minlength=g)
    # first mismatch: runs of equal class in A (a run never crosses a group)
    if len(a):
        change = np.concatenate([[True], (a.cls[1:] != a.cls[:-1]) | (gid_a[1:] != gid_a[:-1])])
        run_starts = np.concatenate([np.flatnonzero(change), [len(a)]])
    else:
        run_starts = np.array([0])
    cand = np.flatnonzero(b_matched)
    lo_c = low[cand]
    differs = a.cls[lo_c] != b.cls[b_rows[cand]]
    run_end = run_starts[np.searchsorted(run_starts, lo_c, side="right")]
    i_first = np.where(differs, lo_c, run_end)
    ok = i_first < high[cand]
    find_a = np.full(g, -1, np.int64)
    find_b = np.full(g, -1, np.int64)
    hit = cand[ok]
    if len(hit):
        hit_groups = b_group[hit]
        first = np.concatenate([[True], hit_groups[1:] != hit_groups[:-1]])  # first hit per group (B order)
        chosen = hit[first]
        find_b[b_group[chosen]] = b_rows[chosen]
        find_a[b_group[chosen]] = i_first[ok][first]
    # pending: the groups' last records are not comparable (or a side has no history)
    pending = np.ones(g, bool)
    both = (a_hi > a_lo) & (b_hi > b_lo)
    la, lb = a_hi[both] - 1, b_hi[both] - 1
    comparable_last = np.all(a.mark[la] >= b.vector[lb], axis=1) & np.all(b.mark[lb] >= a.vector[la], axis=1)
    pending[both] = ~comparable_last
    converged = np.zeros(g, bool)
    converged[both] = comparable_last & (a.cls[la] == b.cls[lb])
    return PairResult(groups, find_a, find_b, comparable_pairs, skipped.astype(np.int64), pending, converged)
