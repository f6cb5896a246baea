"""Safe and Live on any subset of regions: checking some of a store's regions reports exactly what checking all of
them reports for the pairs inside the subset.

A record whose upstream region is not among the regions checked is still evidence about the pair being compared:
its position raises the marks and its value stands. So the rules run with the store's region count, whatever
regions are given; only the comparisons that need a missing region's VT are left out. This file states the
property over the pure reference (`check_partition`) on generated histories with 3 to 5 regions and random
subsets; tests/pipelines/leapfrog/test_leapfrog_job_subsets.py states it for the Spark job, the incremental runs and
the watch.
"""

from __future__ import annotations

import random

import pytest
from leapfrog_histories import History, generated, subsets

from leapfrog.reference import RegionLog, check_partition

SEEDS_PER_MIX = 60


def restricted(result, regions: tuple[int, ...]):
    """A full run's findings and pair counters, for the pairs inside `regions`."""
    inside = set(regions)
    findings = [f for f in result.findings if f.region_a in inside and f.region_b in inside]
    counters = {p: c for p, c in result.pair_counters.items() if set(p) <= inside}
    return findings, counters


def _check(h: History, regions, mode: str):
    logs = {x: RegionLog(h.logs[x].entries, h.logs[x].start, None) for x in regions}
    return check_partition(logs, mode=mode, n_regions=h.n_regions)


@pytest.mark.parametrize("mode", ["heartbeat", "footer", "rmd"])
def test_reference_on_a_subset_equals_the_full_run_restricted(mode):
    histories = generated(SEEDS_PER_MIX, (3, 5))
    assert {h.n_regions for h in histories} == {3, 4, 5}
    checked = 0
    for h in histories:
        full = _check(h, range(h.n_regions), mode)
        rng = random.Random(f"{h.mix.name}:{h.seed}")
        for s in subsets(h.n_regions, rng):
            part = _check(h, s, mode)
            findings, counters = restricted(full, s)
            assert part.findings == findings, (h.mix.name, h.seed, s)
            assert part.pair_counters == counters, (h.mix.name, h.seed, s)
            for x in s:
                assert part.regions[x] == full.regions[x], (h.mix.name, h.seed, s, x)
            checked += 1
    assert checked >= 500
