"""A key's history in one region from its records alone: the per-key rules 4 and 5 without the whole log.

`RegionScan` walks a region's whole log; a distributed job never has it in one place. What the per-key rules
need from the rest of the log is small and fixed per region: where the scan started, the baseline that
back-fills vectors, the final high-water mark and the gaps (with the mark just before each). `RegionView` holds
exactly that, and `key_history` builds the key's `KeyRecord`s from the key's own records — the running marks
`hw_before`/`hw_at` of each record having been computed by whoever scanned the log.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from leapfrog.compare import KeyRecord
from leapfrog.vectors import Vector, nothing, padded_vector, raised


@dataclass(frozen=True)
class RegionView:
    """What the per-key rules need to know about one region's scan of one partition.

    `start_after` = the offset the scan starts after (EOP, the baseline heartbeat, or the carried last offset);
    `prefix_known` = the scan started at End of Push, so a key without records there was absent;
    `default_vector` = K before a key's first record (the baseline back-fill in heartbeat mode, else nothing);
    `gap_firsts`/`gap_marks` = first missing offset of each gap and the running mark just before it, in order;
    `latest_kept` = no gap can hide a record after a key's last one (`leapfrog.reference.entries.RegionLog`), so a
    key's last record and the absence of a key without records stand until the end of the scan whatever gaps follow.
    """

    n_regions: int
    mode: str
    start_after: int
    prefix_known: bool
    default_vector: Vector
    final_hw: Vector
    gap_firsts: tuple[int, ...] = ()
    gap_marks: tuple[Vector, ...] = ()
    # Resumed scans: the mark before the first gap of any earlier run, which freezes every absent prefix (None:
    # no gap yet), and the mark the previous run ended with (None: not resumed).
    prefix_freeze: Vector | None = None
    start_hw: Vector | None = None
    latest_kept: bool = True
    start_latest_kept: bool = True  # resumed: the previous run's `latest_kept` (what its marks were)

    def standing(self, after: int, next_offset: int | None, next_hw_before: Vector | None) -> Vector:
        """Standing mark of a value that stands from after `after` until the record at `next_offset` (None: the
        end of the scan): that record's `hw_before`, the final mark, or the mark before the first gap between
        (only before a next record when `latest_kept`)."""
        if next_offset is None and self.latest_kept:
            return self.final_hw
        idx = bisect_right(self.gap_firsts, after)
        if idx < len(self.gap_firsts) and (next_offset is None or self.gap_firsts[idx] < next_offset):
            return self.gap_marks[idx]
        return next_hw_before if next_hw_before is not None else self.final_hw

    def prefix_standing(self, first_offset: int | None, first_hw_before: Vector | None) -> Vector:
        """Standing mark of the absent prefix: the final mark for a key without records when `latest_kept`, else
        frozen at an earlier run's first gap, else from the scan start."""
        if first_offset is None and self.latest_kept:
            return self.final_hw
        if self.prefix_freeze is not None:
            return self.prefix_freeze
        return self.standing(self.start_after, first_offset, first_hw_before)


@dataclass(frozen=True)
class KeyRow:
    """One record of a key in one region as a scan saw it (value_hash None = tombstone)."""

    vt_offset: int
    value_hash: int | None
    source_region: int
    source_offset: int
    hw_before: Vector
    hw_at: Vector
    rmd_vector: Sequence[int] | None = None


def key_vectors(view: RegionView, rows: Sequence[KeyRow], first: Vector | None = None) -> list[Vector]:
    """Per-key vector K of each row: the previous K (or `first`, default the view's) raised by the row's footer;
    in rmd mode the row's RMD vector when it has one."""
    vec = first if first is not None else view.default_vector
    out = []
    for r in rows:
        vec = raised(vec, r.source_region, r.source_offset)
        if view.mode == "rmd" and r.rmd_vector is not None:
            vec = padded_vector(r.rmd_vector, view.n_regions, f"rmd_vector at {r.vt_offset}")
        out.append(vec)
    return out


def key_history(view: RegionView, rows: Sequence[KeyRow]) -> list[KeyRecord]:
    """The key's history as the mode's comparison wants it (no carried state).

    Heartbeat mode: the absent prefix first when the scan started at End of Push, then each record with its
    standing mark. Footer and rmd modes: the real records with their point-in-time marks.
    """
    vectors = key_vectors(view, rows)
    if view.mode != "heartbeat":
        return [KeyRecord(r.value_hash, v, r.hw_at, r.vt_offset) for r, v in zip(rows, vectors, strict=True)]
    out: list[KeyRecord] = []
    if view.prefix_known:
        first = rows[0] if rows else None
        mark = view.prefix_standing(first.vt_offset if first else None, first.hw_before if first else None)
        out.append(KeyRecord(None, nothing(view.n_regions), mark, -1, absent=True))
    for i, (r, v) in enumerate(zip(rows, vectors, strict=True)):
        nxt = rows[i + 1] if i + 1 < len(rows) else None
        mark = view.standing(r.vt_offset, nxt.vt_offset if nxt else None, nxt.hw_before if nxt else None)
        out.append(KeyRecord(r.value_hash, v, mark, r.vt_offset))
    return out
