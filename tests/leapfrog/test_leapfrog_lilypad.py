"""Footer mode is Venice's lily-pad walk: the scenarios of Venice's LilyPadUtilsTest (venice-protocol-notes §5.11), pinned.

Histories are explicit (positions as plain longs, -1 where Venice has null); every record carries its
point-in-time high-water mark, as Venice's snapshot builder records it.
"""

from __future__ import annotations

from leapfrog import MISSING_IN_A, MISSING_IN_B, VALUE_MISMATCH, KeyRecord, KeyVerdict, lily_pad_walk


def rec(value_hash: int | None, vector: tuple[int, ...], hw: tuple[int, ...], vt_offset: int) -> KeyRecord:
    return KeyRecord(value_hash, vector, hw, vt_offset)


def walk(a: list[KeyRecord], b: list[KeyRecord], a_hw=(100, 100), b_hw=(100, 100)) -> KeyVerdict:
    return lily_pad_walk(a, b, a_hw, b_hw)


def test_value_mismatch_when_both_regions_had_full_information():
    # DC0 wolf {100, [5,10], HW [50,60]} vs DC1 wolf {200, [10,15], HW [20,30]}: mutual coverage, different values.
    wolf = walk([rec(100, (5, 10), (50, 60), 1)], [rec(200, (10, 15), (20, 30), 1)])
    assert wolf.finding is not None and wolf.finding.type == VALUE_MISMATCH
    assert wolf.finding.a.value_hash == 100 and wolf.finding.b.value_hash == 200
    # hawk has the same hash on both sides: nothing to report.
    hawk = walk([rec(300, (5, 10), (50, 60), 2)], [rec(300, (10, 15), (20, 30), 2)])
    assert hawk.finding is None and hawk.comparable_pairs == 1


def test_put_against_delete_is_a_value_mismatch():
    verdict = walk([rec(100, (5, 10), (50, 60), 1)], [rec(None, (10, 15), (20, 30), 1)])
    assert verdict.finding.type == VALUE_MISMATCH
    assert verdict.finding.b.value_hash is None


def test_skips_records_when_one_region_had_incomplete_information():
    # DC1's HW [20, 8] does not cover DC0's vector [5, 10]: lag, not divergence.
    verdict = walk([rec(100, (5, 10), (50, 60), 1)], [rec(200, (10, 15), (20, 8), 1)])
    assert verdict.finding is None
    assert verdict.skipped_pairs == 1 and verdict.pending


def test_missing_in_region_a():
    verdict = walk([], [rec(100, (5, 10), (50, 60), 1)], a_hw=(100, 100))
    assert verdict.finding.type == MISSING_IN_A
    assert verdict.finding.a is None and verdict.finding.b.value_hash == 100


def test_missing_in_region_b():
    verdict = walk([rec(100, (5, 10), (50, 60), 1)], [], b_hw=(100, 100))
    assert verdict.finding.type == MISSING_IN_B
    assert verdict.finding.b is None and verdict.finding.a.value_hash == 100


def test_next_a_lookahead_catches_a_mismatch_that_advancing_both_would_skip():
    # (R0, S0) equal; R1 is covered by S0's HW and differs. Advancing both would pair R1 with S1 (equal).
    a = [rec(100, (1, 1), (10, 10), 1), rec(200, (5, 5), (10, 10), 2)]
    b = [rec(100, (1, 1), (10, 10), 1), rec(200, (5, 5), (10, 10), 2)]
    verdict = walk(a, b)
    assert verdict.finding.type == VALUE_MISMATCH
    assert (verdict.finding.a, verdict.finding.b) == (a[1], b[0])


def test_next_b_lookahead_catches_a_mismatch_that_advancing_both_would_skip():
    # (R0, S0) equal; the nextA look-ahead sees an equal R1, the nextB look-ahead sees S1 differ from R0.
    # Without it both pointers would move on to (R1, S1).
    a = [rec(100, (1, 1), (10, 10), 1), rec(100, (5, 5), (10, 10), 2)]
    b = [rec(100, (1, 1), (10, 10), 1), rec(200, (5, 5), (10, 10), 2)]
    verdict = walk(a, b)
    assert verdict.finding.type == VALUE_MISMATCH
    assert (verdict.finding.a, verdict.finding.b) == (a[0], b[1])


def test_a_advances_alone_until_it_meets_the_mismatch_with_a_pinned_b():
    a = [rec(100, (1, 0), (10, 10), 1), rec(100, (2, 0), (10, 10), 2), rec(300, (3, 0), (10, 10), 3)]
    b = [rec(100, (1, 0), (10, 10), 1)]
    verdict = walk(a, b)
    assert verdict.finding.type == VALUE_MISMATCH
    assert (verdict.finding.a, verdict.finding.b) == (a[2], b[0])
    assert verdict.comparable_pairs == 2  # (R0,S0) then (R1,S0): only A's pointer moved


def test_both_open_advance_both_and_catch_the_mismatch_ahead():
    # At (R0,S0) both look-aheads are comparable and equal: both pointers move; at (R1,S1) nextA reports R2.
    a = [rec(100, (1, 1), (10, 10), 1), rec(100, (2, 2), (10, 10), 2), rec(300, (3, 3), (10, 10), 3)]
    b = [rec(100, (1, 1), (10, 10), 1), rec(100, (2, 2), (10, 10), 2)]
    verdict = walk(a, b)
    assert (verdict.finding.a, verdict.finding.b) == (a[2], b[1])
    assert verdict.comparable_pairs == 2


def test_missing_is_skipped_when_the_other_high_water_mark_does_not_cover():
    verdict = walk([], [rec(100, (5, 5), (50, 60), 1)], a_hw=(2, 3))
    assert verdict.finding is None and verdict.pending


def test_a_tombstone_against_an_absent_key_is_consistent():
    """Deliberate fix of venice-protocol-notes §5.7: Venice reports a key whose only history is a DELETE as MISSING."""
    verdict = walk([], [rec(None, (5, 5), (50, 60), 1)], a_hw=(100, 100))
    assert verdict.finding is None
    assert not verdict.pending and verdict.comparable_pairs == 1
    # The same key with a PUT as last record is reported, as Venice does.
    assert walk([], [rec(100, (5, 5), (50, 60), 1)], a_hw=(100, 100)).finding.type == MISSING_IN_A


def test_missing_needs_a_known_absent_prefix():
    """A mid-stream scan that saw nothing of a key knows nothing of its earlier state: no MISSING."""
    b = [rec(100, (5, 5), (50, 60), 1)]
    verdict = lily_pad_walk([], b, (100, 100), (100, 100), a_known_absent=False)
    assert verdict.finding is None and verdict.pending
