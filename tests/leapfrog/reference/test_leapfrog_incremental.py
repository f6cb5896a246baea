"""Incremental runs: a log split into runs, each resuming from the state the previous one carried, gives
exactly the findings of one run over the whole log."""

from __future__ import annotations

import random
from dataclasses import replace

from leapfrog_histories import History, generated

from leapfrog import PartitionResult
from leapfrog.reference import (
    DataEntry,
    FromEndOfPush,
    FromHeartbeat,
    HeartbeatEntry,
    RegionLog,
    carry_state,
    check_partition,
    resume_logs,
)

SEEDS_PER_MIX = 400
K = b"k"


def eop_log(*entries, last_offset=None):
    return RegionLog(list(entries), FromEndOfPush(0), last_offset)


def start_offset(log: RegionLog) -> int:
    """The offset just before the scan's first offset."""
    start = log.start
    return start.vt_offset if isinstance(start, FromHeartbeat) else start.eop_offset


def run_in_pieces(h: History, cuts: dict[int, list[int]]) -> tuple[PartitionResult, list[PartitionResult]]:
    """Run ``h`` cut after each offset in ``cuts[x]`` (ascending, same count for every region)."""
    pieces = len(next(iter(cuts.values()))) + 1
    bounds = {x: [start_offset(log), *cuts[x], log.last_offset] for x, log in h.logs.items()}

    def between(x: int, i: int) -> list:
        lo, hi = bounds[x][i], bounds[x][i + 1]
        return [e for e in h.logs[x].entries if lo < e.vt_offset <= hi]

    def kept(x: int, i: int) -> bool:
        # The logs are compacted as they stand at the end; cut there, an earlier piece may lack a record that
        # only a record after the cut replaced — which its own run, reading before that compaction, would have
        # seen. Such a piece cannot promise every key's latest record (RegionLog.latest_kept).
        return i == pieces - 1 or not any(o <= bounds[x][i + 1] for o in h.removed[x])

    first = {x: RegionLog(between(x, 0), log.start, bounds[x][1], kept(x, 0)) for x, log in h.logs.items()}
    runs = [check_partition(first, n_regions=h.n_regions)]
    for i in range(1, pieces):
        state = carry_state(runs[-1])
        logs = resume_logs(state, {x: between(x, i) for x in h.logs}, {x: bounds[x][i + 1] for x in h.logs})
        runs.append(check_partition({x: replace(log, latest_kept=kept(x, i)) for x, log in logs.items()}))
    return runs[-1], runs


def random_cuts(h: History, rng: random.Random, count: int) -> dict[int, list[int]]:
    return {
        x: sorted(rng.randint(start_offset(log), log.last_offset) for _ in range(count))
        for x, log in h.logs.items()
    }


def assert_same_as_full(
    h: History, full: PartitionResult, last: PartitionResult, runs: list[PartitionResult]
):
    where = (h.mix.name, h.seed)
    assert last.findings == full.findings, where
    for pair, counters in full.pair_counters.items():
        resumed = last.pair_counters[pair]
        assert (resumed.keys, resumed.pending_keys, resumed.findings) == (
            counters.keys,
            counters.pending_keys,
            counters.findings,
        ), where
        assert sum(r.pair_counters[pair].comparable_pairs for r in runs) == counters.comparable_pairs, where
    for x, facts in full.regions.items():
        assert last.regions[x].final_high_watermark == facts.final_high_watermark, where


def test_two_runs_split_at_random_offsets_equal_one_full_run():
    rng = random.Random(7)
    checked = with_findings = 0
    for h in generated(SEEDS_PER_MIX):
        full = check_partition(h.logs, n_regions=h.n_regions)
        last, runs = run_in_pieces(h, random_cuts(h, rng, 1))
        assert_same_as_full(h, full, last, runs)
        checked += 1
        with_findings += bool(full.findings)
    assert checked > 4000 and with_findings > 300


def test_three_runs_equal_one_full_run():
    rng = random.Random(11)
    for h in generated(SEEDS_PER_MIX)[::4]:
        full = check_partition(h.logs, n_regions=h.n_regions)
        last, runs = run_in_pieces(h, random_cuts(h, rng, 2))
        assert_same_as_full(h, full, last, runs)


def test_a_resumed_run_reports_findings_of_earlier_runs_and_improves_them():
    # Run 1: region 1 holds 7 where region 0 holds 8 while both marks cover both writes: a mismatch.
    region0 = [DataEntry(1, K, 8, 0, 2), HeartbeatEntry(2, (2, 2), 1, 2)]
    region1 = [DataEntry(1, K, 7, 1, 1), HeartbeatEntry(2, (2, 2), 0, 2)]
    first = check_partition({0: eop_log(*region0), 1: eop_log(*region1)})
    assert [f.type for f in first.findings] == ["VALUE_MISMATCH"]
    state = carry_state(first)
    # Run 2 sees nothing new: the finding is still reported, with the marks updated by the new heartbeat.
    second = check_partition(resume_logs(state, {0: [HeartbeatEntry(3, (5, 5), 0, 5)]}))
    assert len(second.findings) == 1
    assert second.findings[0].a_high_watermark == (5, 5)
    assert second.findings[0].b_high_watermark == (2, 2)
    assert second.pair_counters[(0, 1)].comparable_pairs == 0  # nothing newly comparable


def test_the_state_carries_only_records_that_can_still_be_compared():
    # Region 0 rewrites k five times while region 1 has never heard of any of it (its mark stays at -1).
    writes = [DataEntry(i, K, i, 0, i) for i in range(1, 6)]
    result = check_partition({0: eop_log(*writes), 1: eop_log()})
    state = carry_state(result)
    # Region 1's absent prefix has K = -1 everywhere, so every record of region 0 may still meet it.
    assert len(state.regions[0].keys[K].records) == 5 + 1  # five records and the absent prefix
    # Once region 1 has the last write, superseded records region 1's K already outgrew are dropped.
    caught_up = check_partition(
        {0: eop_log(*writes), 1: eop_log(DataEntry(1, K, 5, 0, 5), HeartbeatEntry(2, (5, -1), 0, 5))}
    )
    kept = carry_state(caught_up).regions[0].keys[K].records
    assert [r.vt_offset for r in kept] == [5]
    assert carry_state(caught_up).regions[1].keys[K].last_open


def test_a_gap_freezes_the_carried_standing_mark():
    log = eop_log(DataEntry(1, K, 7, 0, 1), HeartbeatEntry(3, (4, 4), 1, 4), last_offset=3)
    state = carry_state(check_partition({0: log, 1: eop_log()}))
    carried = state.regions[0].keys[K]
    assert not carried.last_open and carried.records[-1].high_watermark == (1, -1)
    assert state.regions[0].gap_hw == (1, -1)
    assert state.regions[1].gap_hw is None
