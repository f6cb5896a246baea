"""Leap Frog's correctness properties, checked over generated A/A histories with known truth.

The TLA+ style of Venice's model (venice-protocol-notes §5.9), as tests: each property is stated over every generated
history of every fault mix (``leapfrog_histories``), and truth comes from the generator, never from the
algorithm under test.

- Safe: a finding for (x, y, k) means x or y diverged on k — heartbeat, footer and rmd modes.
- Live (heartbeat mode): final values that differ are reported once both regions' marks cover every write
  to the key.
- Heartbeat ⊇ footer: heartbeat mode reports every (pair, key) footer mode reports, and leaves no more keys
  pending.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from functools import cache

import pytest
from leapfrog_histories import MIXES, History, generated

from leapfrog import Finding, PairCounters, covers
from leapfrog.reference import DataEntry, HeartbeatEntry, check_partition

SEEDS_PER_MIX = 400


def histories() -> tuple[History, ...]:
    return generated(SEEDS_PER_MIX)


@dataclass(frozen=True)
class Outcome:
    """What the properties look at in a result (the result itself also keeps every scan: too big to cache)."""

    findings: list[Finding]
    pair_counters: dict[tuple[int, int], PairCounters]


@cache
def results(mode: str) -> tuple[Outcome, ...]:
    outcomes = []
    for h in histories():
        result = check_partition(h.logs, mode=mode, n_regions=h.n_regions)
        outcomes.append(Outcome(result.findings, result.pair_counters))
    return tuple(outcomes)


def reported(result: Outcome) -> set[tuple[int, int, bytes]]:
    return {(f.region_a, f.region_b, f.key) for f in result.findings}


def from_end_of_push(h: History) -> bool:
    """Every region scanned from End of Push (compacted or not): footer mode's ground, no baseline back-fill."""
    return not any(h.midstream(x) for x in h.logs)


def test_the_generated_histories_exercise_every_fault():
    hs = histories()
    seen = Counter()
    for h in hs:
        seen["diverged"] += any(h.diverged.values())
        seen["failover"] += h.failovers > 0
        seen["duplicates"] += h.duplicates > 0
        seen["compacted"] += any(h.removed.values())
        seen["midstream"] += any(h.midstream(x) for x in h.logs)
        seen["4 regions"] += h.n_regions == 4
        seen["rmd"] += any(
            isinstance(e, DataEntry) and e.rmd_vector for log in h.logs.values() for e in log.entries
        )
        seen["out of range"] += any(
            isinstance(e, DataEntry) and not 0 <= e.source_region < h.n_regions
            for log in h.logs.values()
            for e in log.entries
        )
        seen["lagging"] += any(
            not h.covers_writes(h.shown_hw(x), k)
            for x in h.logs
            for k in h.keys
            if h.final_value[x][k] is not None
        )
    assert len(hs) == SEEDS_PER_MIX * len(MIXES)
    for what in (
        "diverged",
        "failover",
        "duplicates",
        "compacted",
        "midstream",
        "4 regions",
        "rmd",
        "lagging",
    ):
        assert seen[what] >= len(hs) // 20, (what, seen)
    assert seen["out of range"] > 0


def test_generated_heartbeats_keep_the_heartbeat_invariant():
    """docs/design.md, rule 3, within each leader term: V never decreases, V[origin] covers the RT heartbeat, and
    every later record of the same term from region r has an RT offset above V[r]."""
    checked = 0
    for h in histories():
        for x, entries in h.vt.items():
            starts = h.term_starts[x]

            def term(offset: int, starts=starts) -> int:
                return sum(1 for s in starts if s <= offset)

            for i, e in enumerate(entries):
                if not isinstance(e, HeartbeatEntry):
                    continue
                checked += 1
                assert e.watermarks[e.origin_region] >= e.origin_offset
                for later in entries[i + 1 :]:
                    if term(later.vt_offset) != term(e.vt_offset):
                        break
                    if isinstance(later, HeartbeatEntry):
                        assert covers(later.watermarks, e.watermarks), (h.seed, h.mix.name, x)
                    elif isinstance(later, DataEntry) and 0 <= later.source_region < h.n_regions:
                        assert later.source_offset > e.watermarks[later.source_region], (
                            h.seed,
                            h.mix.name,
                            x,
                        )
    assert checked > 1000


@pytest.mark.parametrize("mode", ["heartbeat", "footer", "rmd"])
def test_safe_a_finding_means_a_region_diverged(mode):
    findings = 0
    for h, result in zip(histories(), results(mode), strict=True):
        for f in result.findings:
            findings += 1
            assert f.key in h.diverged[f.region_a] or f.key in h.diverged[f.region_b], (h.mix.name, h.seed, f)
    assert findings > len(histories()) // 10  # the property is not vacuous


def test_clean_histories_report_nothing():
    clean = ("clean", "lag", "duplicates", "failover", "compaction", "midstream", "quiet")
    for h, result in zip(histories(), results("heartbeat"), strict=True):
        if h.mix.name in clean:
            assert not any(h.diverged.values())
            assert result.findings == [], (h.mix.name, h.seed)


def test_live_differing_final_values_are_reported_once_covered():
    """Preconditions: both regions' final marks cover every write to the key; a mid-stream region has a record
    of the key in its scan, and the other region's mark has passed its baseline (per-key vectors are back-filled
    with it). Compaction is no excuse: it keeps every key's latest record, so no gap after it caps its mark."""
    applicable = midstream = compacted_after = 0
    for h, result in zip(histories(), results("heartbeat"), strict=True):
        found = reported(result)
        hw = {x: h.shown_hw(x) for x in h.logs}
        for x, y in itertools.combinations(sorted(h.logs), 2):
            for k in h.keys:
                if h.final_value[x][k] == h.final_value[y][k]:
                    continue
                if not (h.covers_writes(hw[x], k) and h.covers_writes(hw[y], k)):
                    continue
                if any(
                    h.midstream(z) and not (h.has_record(z, k) and covers(hw[other], h.baseline(z)))
                    for z, other in ((x, y), (y, x))
                ):
                    continue
                applicable += 1
                midstream += h.midstream(x) or h.midstream(y)
                compacted_after += h.removed_after_last(x, k) or h.removed_after_last(y, k)
                assert (x, y, k) in found, (h.mix.name, h.seed, x, y, k)
    assert applicable > 500 and midstream > 50 and compacted_after > 50, (
        applicable,
        midstream,
        compacted_after,
    )


def test_heartbeat_mode_reports_everything_footer_mode_reports():
    checked = stronger = compacted = 0
    for h, hb, footer in zip(histories(), results("heartbeat"), results("footer"), strict=True):
        if not from_end_of_push(h):
            continue
        checked += 1
        compacted += any(h.removed.values()) and bool(reported(footer))
        assert reported(footer) <= reported(hb), (h.mix.name, h.seed)
        stronger += len(reported(hb) - reported(footer))
    assert checked > len(histories()) // 2 and compacted > 20, (checked, compacted)
    assert stronger > 0  # divergences only heartbeat mode sees (writes dropped on keys both regions had)


def test_heartbeat_mode_leaves_no_more_keys_pending_than_footer_mode():
    quiet_hb = quiet_footer = 0
    for h, hb, footer in zip(histories(), results("heartbeat"), results("footer"), strict=True):
        if not from_end_of_push(h):
            continue
        for pair, counters in hb.pair_counters.items():
            assert counters.pending_keys <= footer.pair_counters[pair].pending_keys, (
                h.mix.name,
                h.seed,
                pair,
            )
            if h.mix.quiet:
                quiet_hb += counters.pending_keys
                quiet_footer += footer.pair_counters[pair].pending_keys
    assert quiet_hb < quiet_footer, (quiet_hb, quiet_footer)
