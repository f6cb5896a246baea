"""What the job's per-key stage decides, without its Arrow plumbing: the finding a comparison yields, the records
an incremental run carries to the next one, which keys are settled, and which pairs an earlier run already counted.

The Spark job (``pipelines.leapfrog.keys``) cuts its rows into key groups and builds each region's histories of a
chunk's groups with ``leapfrog.vectorized``; everything here works on those arrays (group ids ``gid``, one
``vectorized.Histories`` per region) and knows nothing of Arrow, files or Spark.

**Settled keys.** With ``--state``, a key is *settled* when, at the end of a run,

- no requested pair left it pending: every pair's current records are comparable, so later marks cannot make
  any other pair of its records comparable;
- every region that has it carries exactly one record, its current one (``vectorized.carry`` kept nothing
  superseded), and that record is not the absent prefix.

The next run neither compares a settled key again nor rewrites its carried records unless one of its own new
records touches the key (``untouched_rows``); the settled keys it passes on still count as keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from leapfrog import vectorized as vz
from leapfrog.compare import MISSING_IN_A, MISSING_IN_B, VALUE_MISMATCH
from leapfrog.history import RegionView

Kept = tuple[np.ndarray, np.ndarray, np.ndarray]  # (rows of the histories, last_open, mark to carry)


def finding_type(a_absent: bool, b_absent: bool) -> str:
    """The type of the finding a comparable mismatching pair yields: MISSING on the side whose record is the
    absent prefix (A first), else VALUE_MISMATCH — as ``leapfrog.compare.finding_for`` on records."""
    return MISSING_IN_A if a_absent else MISSING_IN_B if b_absent else VALUE_MISMATCH


def untouched_rows(new_group: np.ndarray, settled_row: np.ndarray) -> np.ndarray:
    """Per row of a chunk cut into key groups (``new_group`` marks each group's first row): whether its key is
    untouched, i.e. every row of its group is a settled carried record. No new record touches such a key, so it
    is passed to the next state unchanged and not compared again."""
    untouched = np.minimum.reduceat(settled_row.astype(np.int8), np.flatnonzero(new_group)).astype(bool)
    return untouched[np.cumsum(new_group) - 1]


def partners(pairs: Iterable[tuple[int, int]], x: int, regions: Iterable[int]) -> list[int]:
    """The regions that `x` is compared with (among `regions`), sorted."""
    regions = set(regions)
    return sorted({z for pair in pairs if x in pair for z in pair if z != x and z in regions})


def carried_last(c: vz.Carried | None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(sorted gids, last_open, carried mark) of each group's carried last record, as ``vectorized.carry`` takes
    them; None when nothing was carried."""
    if c is None or not len(c):
        return None
    starts = np.flatnonzero(np.concatenate([[True], c.gid[1:] != c.gid[:-1]]))
    lasts = np.concatenate([starts[1:], [len(c)]]) - 1
    return c.gid[lasts], c.last_open[lasts], c.mark[lasts]


def carried_records(
    hist: Mapping[int, vz.Histories],
    views: Mapping[int, RegionView],
    pairs: Sequence[tuple[int, int]],
    present: Mapping[int, np.ndarray],
    had_open: Mapping[int, tuple[np.ndarray, np.ndarray, np.ndarray] | None],
    groups: np.ndarray,
) -> dict[int, Kept]:
    """Per region of one partition: the records the next run needs (``vectorized.carry``, against the current
    per-key vectors of every region it is paired with). `views`: region → its view of this partition;
    `present`: region → the groups it has records of (new or carried); `had_open`: region → ``carried_last``."""
    kept = {}
    for x, h in hist.items():
        last_k = [vz.last_vectors(hist[z], views[z], groups) for z in partners(pairs, x, hist)]
        kept[x] = vz.carry(h, views[x], present[x], last_k, groups, had_open[x])
    return kept


def settled_groups(
    hist: Mapping[int, vz.Histories],
    kept: Mapping[int, Kept],
    present: Mapping[int, np.ndarray],
    pending: Sequence[np.ndarray],
) -> np.ndarray:
    """The settled groups of one partition (see the module's docstring). `pending`: the groups each pair left
    pending; `kept`: ``carried_records``."""
    bad = [np.unique(np.concatenate(pending)) if pending else np.zeros(0, np.int64)]
    for x, (keep, _, _) in kept.items():
        h = hist[x]
        g, counts = np.unique(h.gid[keep], return_counts=True)
        bad.append(g[counts > 1])
        bad.append(h.gid[keep][h.absent[keep]])
    real = np.unique(np.concatenate([present[x] for x in present])) if present else np.zeros(0, np.int64)
    return real[~np.isin(real, np.concatenate(bad))]


def comparable_before(
    view_x: RegionView,
    carried_x: vz.Carried | None,
    view_y: RegionView,
    carried_y: vz.Carried | None,
    in_pair: np.ndarray,
) -> int:
    """Pairs of records the previous run already found comparable for the groups `in_pair` of regions x and y
    (so that ``comparable_pairs`` adds up over incremental runs)."""
    if carried_x is None and carried_y is None:
        return 0
    with_state = np.union1d(
        carried_x.gid if carried_x is not None else [], carried_y.gid if carried_y is not None else []
    ).astype(np.int64)
    groups = np.intersect1d(in_pair, with_state)
    if not len(groups):
        return 0
    return int(
        vz.compare(
            vz.previous(view_x, carried_x, groups), vz.previous(view_y, carried_y, groups), groups
        ).comparable_pairs.sum()
    )
