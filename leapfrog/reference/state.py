"""Incremental runs: what one heartbeat-mode run carries so that the next run can start where it stopped.

The property this state exists for: running over a log split at any offset into two runs (the second
``FromState``) gives exactly the findings of one run over the whole log. What has to be carried:

- per region: the offset the run stopped at, the final high-water mark, how the first run started (absent
  prefix, or the mid-stream baseline that back-fills per-key vectors), and the mark just before the region's
  first gap (it freezes the standing mark of every key's absent prefix, since compaction may have removed
  anything there);
- per key and region, only the records that can still take part in a future comparison: the last record
  (its value still stands, so its standing mark can still grow — ``last_open`` — unless a gap followed it:
  then it keeps the mark before that gap, which is its mark should a later record of the key turn up; while it
  stays the key's last record it is judged by the final mark, see
  ``leapfrog.reference.entries.RegionLog.latest_kept``), and any superseded record b of region y with
  ``covers(hws(b), K(last record of x))`` for some region x paired with y. A superseded record's mark is final and
  per-key vectors only grow, so a superseded record failing that test can never become comparable with x's current
  or future records; two superseded records were already compared. The absent prefix is carried like any record when
  it qualifies;
- per (pair, key) the finding so far. Findings are ordered by (B-side VT offset, A-side VT offset), which is
  the same order as (j, i) in a full run; a resumed run keeps the smaller of the carried finding and its own.

A resumed run reports every finding so far (not only new ones). Its ``comparable_pairs`` counts pairs that
became comparable in that run, so counts add up over runs; ``skipped_pairs`` and ``pending_keys`` describe the
records in view at the end of the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from leapfrog.compare import KeyRecord
from leapfrog.reference.entries import Entry, FromState, RegionLog
from leapfrog.results import Finding, PartitionResult
from leapfrog.vectors import Vector, covers


@dataclass(frozen=True)
class CarriedKey:
    """A key's records still in play in one region (VT order, the last one being the current value)."""

    records: tuple[KeyRecord, ...]
    last_open: bool


@dataclass(frozen=True)
class RegionState:
    """One region's carried state. ``baseline`` None means the first run started at End of Push."""

    region: int
    last_offset: int
    final_hw: Vector
    baseline: Vector | None
    gap_hw: Vector | None
    keys: Mapping[bytes, CarriedKey]
    latest_kept: bool = (
        True  # that run's log kept every key's latest record: its last records stood to its end
    )


@dataclass(frozen=True)
class IncrementalState:
    """Everything a heartbeat-mode run carries into the next one for one partition."""

    partition: int
    n_regions: int
    pairs: tuple[tuple[int, int], ...]
    regions: Mapping[int, RegionState]
    findings: Mapping[tuple[int, int, bytes], Finding]

    def size(self) -> int:
        """Number of carried records (a measure of how small the state stayed)."""
        return sum(len(c.records) for r in self.regions.values() for c in r.keys.values())


def carry_state(result: PartitionResult) -> IncrementalState:
    """The state to resume from after ``result`` (a heartbeat-mode run of ``check_partition``)."""
    if result.mode != "heartbeat":
        raise ValueError(
            f"incremental state exists for heartbeat mode only, this run used mode {result.mode!r}"
        )
    scans = result.scans
    partners: dict[int, set[int]] = {x: set() for x in scans}
    for x, y in result.pairs:
        partners[x].add(y)
        partners[y].add(x)
    regions: dict[int, RegionState] = {}
    for x, scan in scans.items():
        keys: dict[bytes, CarriedKey] = {}
        for key in scan.keys():
            history = scan.history(key)
            last_vectors = [scans[z].last_vector(key) for z in partners[x]]
            kept = [
                record
                for record in history[:-1]
                if any(covers(record.high_watermark, vec) for vec in last_vectors)
            ]
            last, still_open = history[-1], scan.last_open(key)
            if not still_open:  # it may stand to the end now, but a later record would end it at the gap
                last = replace(last, high_watermark=scan.frozen_mark(key))
            kept.append(last)
            keys[key] = CarriedKey(tuple(kept), still_open)
        regions[x] = RegionState(
            region=x,
            last_offset=scan.last_offset,
            final_hw=scan.final_hw,
            baseline=scan.baseline,
            gap_hw=scan.gap_hw,
            keys=keys,
            latest_kept=scan.view.latest_kept,
        )
    findings = {(f.region_a, f.region_b, f.key): f for f in result.findings}
    return IncrementalState(result.partition, result.n_regions, result.pairs, regions, findings)


def resume_logs(
    state: IncrementalState,
    entries: Mapping[int, Sequence[Entry]],
    last_offsets: Mapping[int, int] | None = None,
) -> dict[int, RegionLog]:
    """Logs for the next run: every region of ``state`` resumes ``FromState`` with its new entries."""
    unknown = set(entries) - set(state.regions)
    if unknown:
        raise ValueError(f"entries for regions {sorted(unknown)} that the state does not hold")
    last_offsets = last_offsets or {}
    return {
        x: RegionLog(list(entries.get(x, ())), FromState(state), last_offsets.get(x))
        for x in sorted(state.regions)
    }
