"""``check_partition``: the whole Leap Frog check of one VT partition across regions, as one pure function.

For every region it scans the log (``leapfrog.reference.scan``); for every requested region pair and every key
present in either region (scanned or carried) it applies the per-key rule of the mode (``leapfrog.compare``):

- ``heartbeat`` (ours): heartbeats raise every component of the running mark; records are judged with their
  standing mark; per-key vectors of a mid-stream scan are back-filled with the baseline; any comparable
  mismatching pair is a finding, including the absent prefix after End of Push (MISSING);
- ``footer`` (Venice's lily-pad): footers only, point-in-time marks, the two-pointer walk;
- ``rmd``: the footer walk with per-key vectors taken from the records' RMD checkpoint vectors.

At most one finding per (pair, key), with its status at the end of the run: ``healed`` when the key's current
records in the pair agree and are comparable, else ``open`` (``leapfrog.compare.status_of``; a carried finding
takes the status of this run's comparison). A heartbeat-mode run can be resumed: ``leapfrog.reference.state.carry_state``
turns its result into an ``IncrementalState`` and the next run starts every region ``FromState``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from itertools import combinations

from leapfrog.compare import FINDING_TYPES, KeyRecord, compare_standing, lily_pad_walk
from leapfrog.reference.entries import FromState, RegionLog
from leapfrog.reference.scan import MODES, RegionScan
from leapfrog.reference.state import IncrementalState
from leapfrog.results import Finding, PairCounters, PartitionResult
from leapfrog.vectors import Vector, covers


def check_partition(
    logs: Mapping[int, RegionLog],
    pairs: Iterable[tuple[int, int]] | None = None,
    mode: str = "heartbeat",
    *,
    partition: int = 0,
    n_regions: int | None = None,
) -> PartitionResult:
    """Compare the regions' logs of one partition.

    ``logs`` maps region id to its log; ``pairs`` (default: every pair of those regions) are ``(a, b)`` with
    ``a < b``; ``n_regions`` (default: highest region id + 1, or the state's) is the length of every vector.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if not logs:
        raise ValueError("no region logs given")
    for x in logs:
        if not isinstance(x, int) or x < 0:
            raise ValueError(f"region ids must be non-negative ints, got {x!r}")
    state = _resumed_state(logs, mode, partition)
    if state is not None:
        if n_regions is not None and n_regions != state.n_regions:
            raise ValueError(f"n_regions={n_regions} but the carried state has {state.n_regions}")
        n_regions = state.n_regions
    n = n_regions if n_regions is not None else max(logs) + 1
    if max(logs) >= n:
        raise ValueError(f"region {max(logs)} does not exist with n_regions={n}")
    pair_list = _pairs(logs, pairs)
    if state is not None and pairs is None:
        pair_list = state.pairs
    if state is not None and pair_list != state.pairs:
        raise ValueError(f"pairs {pair_list} differ from the carried state's {state.pairs}")

    scans = {
        x: RegionScan(x, logs[x], n, mode, state.regions[x] if state is not None else None)
        for x in sorted(logs)
    }
    findings: list[Finding] = []
    counters: dict[tuple[int, int], PairCounters] = {}
    for x, y in pair_list:
        sx, sy = scans[x], scans[y]
        keys = sorted(sx.keys() | sy.keys())
        comparable_pairs = skipped = pending = 0
        by_type: Counter[str] = Counter()
        for key in keys:
            a, b = sx.history(key), sy.history(key)
            found: Finding | None
            if mode == "heartbeat":
                verdict = compare_standing(a, b)
                new_pairs = verdict.comparable_pairs
                if state is not None and (key in state.regions[x].keys or key in state.regions[y].keys):
                    new_pairs -= _previously_comparable(a, sx.previous_marks(key), b, sy.previous_marks(key))
                found = (
                    Finding.of(partition, x, y, key, verdict.finding, verdict.status)
                    if verdict.finding
                    else None
                )
                carried = state.findings.get((x, y, key)) if state is not None else None
                if carried is not None and (found is None or carried.order < found.order):
                    found = replace(carried, status=verdict.status)
            else:
                verdict = lily_pad_walk(
                    a,
                    b,
                    sx.final_hw,
                    sy.final_hw,
                    a_known_absent=sx.prefix_known,
                    b_known_absent=sy.prefix_known,
                )
                new_pairs = verdict.comparable_pairs
                found = (
                    Finding.of(partition, x, y, key, verdict.finding, verdict.status)
                    if verdict.finding
                    else None
                )
            comparable_pairs += new_pairs
            skipped += verdict.skipped_pairs
            pending += verdict.pending
            if found is not None:
                findings.append(found)
                by_type[found.type] += 1
        counters[(x, y)] = PairCounters(
            region_a=x,
            region_b=y,
            keys=len(keys),
            comparable_pairs=comparable_pairs,
            skipped_pairs=skipped,
            pending_keys=pending,
            findings={t: by_type[t] for t in FINDING_TYPES},
        )
    return PartitionResult(
        partition=partition,
        mode=mode,
        n_regions=n,
        pairs=pair_list,
        findings=findings,
        pair_counters=counters,
        regions={x: s.facts for x, s in scans.items()},
        scans=scans,
    )


def _resumed_state(logs: Mapping[int, RegionLog], mode: str, partition: int) -> IncrementalState | None:
    """The carried state when the logs resume ``FromState``; all regions must resume from the same one."""
    resumed = {x: log.start.state for x, log in logs.items() if isinstance(log.start, FromState)}
    if not resumed:
        return None
    if len(resumed) != len(logs):
        fresh = sorted(set(logs) - set(resumed))
        raise ValueError(f"regions {fresh} do not resume FromState while others do: resume all or none")
    states = list(resumed.values())
    state = states[0]
    if any(s is not state for s in states[1:]):
        raise ValueError("regions resume from different carried states")
    if mode != "heartbeat":
        raise ValueError(f"incremental runs are defined for heartbeat mode only, not {mode!r}")
    if set(logs) != set(state.regions):
        raise ValueError(f"logs for regions {sorted(logs)} but the state holds {sorted(state.regions)}")
    if partition != state.partition:
        raise ValueError(f"partition {partition} resumes the state of partition {state.partition}")
    return state


def _pairs(
    logs: Mapping[int, RegionLog], pairs: Iterable[tuple[int, int]] | None
) -> tuple[tuple[int, int], ...]:
    if pairs is None:
        return tuple(combinations(sorted(logs), 2))
    out: list[tuple[int, int]] = []
    for pair in pairs:
        x, y = pair
        if not x < y:
            raise ValueError(f"pair {pair!r}: regions must be given as (a, b) with a < b")
        if x not in logs or y not in logs:
            raise ValueError(f"pair {pair!r} names a region without a log (logs: {sorted(logs)})")
        if (x, y) not in out:
            out.append((x, y))
    return tuple(sorted(out))


def _previously_comparable(
    a: Sequence[KeyRecord],
    a_marks: Sequence[Vector | None],
    b: Sequence[KeyRecord],
    b_marks: Sequence[Vector | None],
) -> int:
    """Pairs of records the previous run already had and already found comparable (counted there)."""
    count = 0
    for ra, ma in zip(a, a_marks, strict=True):
        if ma is None:
            continue
        for rb, mb in zip(b, b_marks, strict=True):
            if mb is not None and covers(ma, rb.vector) and covers(mb, ra.vector):
                count += 1
    return count
