"""The Leap Frog rules one at a time, on small hand-written logs and histories."""

from __future__ import annotations

import pytest

from leapfrog import MISSING_IN_A, MISSING_IN_B, VALUE_MISMATCH, KeyRecord, compare_standing, covers
from leapfrog.reference import (
    DataEntry,
    FromEndOfPush,
    FromHeartbeat,
    HeartbeatEntry,
    OtherEntry,
    RegionLog,
    carry_state,
    check_partition,
    resume_logs,
)

K = b"k"


def put(off, value, src, src_off, key=K, rmd=None):
    return DataEntry(off, key, value, src, src_off, rmd)


def delete(off, src, src_off, key=K):
    return DataEntry(off, key, None, src, src_off)


def hb(off, watermarks, origin, origin_off):
    return HeartbeatEntry(off, tuple(watermarks), origin, origin_off)


def eop_log(*entries, last_offset=None):
    return RegionLog(list(entries), FromEndOfPush(0), last_offset)


def only(result):
    assert len(result.findings) == 1, result.findings
    return result.findings[0]


# -- rule 1: coverage ---------------------------------------------------------------------------------------


def test_coverage_is_component_wise_and_minus_one_is_nothing():
    assert covers((5, 3), (5, 3))
    assert covers((5, -1), (4, -1))
    assert not covers((5, -1), (4, 0))
    with pytest.raises(ValueError, match="different lengths"):
        covers((1, 2), (1, 2, 3))


# -- rule 2: running high-water mark ------------------------------------------------------------------------


def test_heartbeats_raise_every_component_in_heartbeat_mode_only():
    log = eop_log(put(1, 7, 0, 4), hb(2, (3, 9, -1), 2, 6))
    hw = check_partition({0: log, 1: eop_log()}, n_regions=3).regions[0].final_high_watermark
    assert hw == (4, 9, 6)  # footer 4 kept over watermark 3; origin offset 6 raises region 2
    for mode in ("footer", "rmd"):
        facts = check_partition({0: log, 1: eop_log()}, mode=mode, n_regions=3).regions[0]
        assert facts.final_high_watermark == (4, -1, -1)
        assert facts.heartbeats == 1 and facts.heartbeats_by_origin == {2: 1}


def test_mid_stream_scan_starts_at_the_baseline():
    log = RegionLog([put(11, 7, 1, 3)], FromHeartbeat((5, 2), vt_offset=10))
    assert check_partition({0: log, 1: eop_log()}).regions[0].final_high_watermark == (5, 3)


# -- rule 3: gaps ---------------------------------------------------------------------------------------------


def test_gaps_are_missing_offsets_from_scan_start_to_last_offset():
    log = eop_log(put(3, 7, 0, 1), OtherEntry(4), put(5, 8, 5, 1), put(8, 9, 0, 2), last_offset=10)
    facts = check_partition({0: log, 1: eop_log()}).regions[0]
    assert facts.gaps == [(1, 2), (6, 7), (9, 10)]
    # The record from region 5 (out of range for 2 regions) is counted, ignored, and is not a gap.
    assert facts.out_of_range == 1 and facts.out_of_range_offsets == [5]
    assert facts.records == 2 and facts.first_offset == 1 and facts.last_offset == 10


def test_heartbeats_from_out_of_range_origins_are_counted_and_ignored():
    log = eop_log(hb(1, (4, 4), 7, 9), OtherEntry(2))
    facts = check_partition({0: log, 1: eop_log()}).regions[0]
    assert (facts.heartbeats, facts.out_of_range, facts.out_of_range_offsets) == (0, 1, [1])
    assert facts.final_high_watermark == (-1, -1) and facts.gaps == []


def test_no_leading_gap_when_the_start_offset_is_unknown():
    log = RegionLog([put(3, 7, 0, 1)], FromEndOfPush())
    assert check_partition({0: log, 1: eop_log()}).regions[0].gaps == []


# -- rule 4: per-key vectors ----------------------------------------------------------------------------------


def test_per_key_vector_accumulates_footers_and_back_fills_the_baseline():
    entries = [put(11, 7, 0, 8), put(12, 9, 1, 4)]
    other = eop_log(put(1, 9, 0, 8), put(2, 9, 1, 4), hb(3, (20, 20), 0, 20))
    mid = RegionLog(entries, FromHeartbeat((6, 9), vt_offset=10))
    heartbeat = check_partition({0: mid, 1: other})
    footer = check_partition({0: mid, 1: other}, mode="footer")
    # K(first record) = max(baseline, footer) = (8, 9) in heartbeat mode; footer mode starts from nothing.
    hb_history = heartbeat.scans[0].history(K)
    assert [r.vector for r in hb_history] == [(8, 9), (8, 9)]
    assert [r.vector for r in footer.scans[0].history(K)] == [(8, -1), (8, 4)]
    # A mid-stream scan has no prefix: its earlier state is unknown and not compared.
    assert not any(r.absent for r in hb_history)


def test_rmd_mode_takes_the_rmd_vector_padded_with_minus_one():
    log = eop_log(put(1, 7, 0, 8, rmd=(8,)), put(2, 7, 1, 4))
    history = check_partition({0: log, 1: eop_log()}, mode="rmd", n_regions=3).scans[0].history(K)
    assert [r.vector for r in history] == [(8, -1, -1), (8, 4, -1)]
    with pytest.raises(ValueError, match="rmd_vector at 1"):
        check_partition({0: eop_log(put(1, 7, 0, 8, rmd=(1, 2, 3))), 1: eop_log()}, mode="rmd")


# -- rule 5: standing high-water mark -----------------------------------------------------------------------


def test_a_record_stands_until_the_next_record_of_its_key():
    log = eop_log(
        put(1, 7, 0, 1), put(2, 5, 0, 2, key=b"x"), hb(3, (4, 4), 1, 4), put(4, 8, 0, 5), hb(5, (6, 6), 0, 6)
    )
    history = check_partition({0: log, 1: eop_log()}).scans[0].history(K)
    prefix, first, last = history
    assert prefix.absent and prefix.high_watermark == (-1, -1)  # superseded at once by the first record
    assert first.high_watermark == (4, 4)  # hw_before of the next record of k, after the heartbeat
    assert last.high_watermark == (6, 6)  # the final mark


def test_a_gap_inside_the_standing_interval_caps_the_standing_mark():
    # Offset 3 was compacted away: a record of k that offset 5 replaced may have been there.
    log = eop_log(
        put(1, 7, 0, 1), put(2, 5, 0, 2, key=b"x"), hb(4, (9, 9), 1, 9), put(5, 8, 0, 10), last_offset=5
    )
    first, last = check_partition({0: log, 1: eop_log()}).scans[0].history(K)[1:]
    assert first.high_watermark == (2, -1)  # the mark just before the gap, not (9, 9)
    assert last.high_watermark == (10, 9)


def test_a_gap_after_a_keys_last_record_does_not_cap_it_when_latest_records_are_kept():
    # Compaction keeps every key's latest record: nothing of k can hide at offset 3, after k's last record.
    entries = (put(1, 7, 0, 1), put(2, 5, 0, 2, key=b"x"), hb(4, (9, 9), 1, 9))
    kept = check_partition({0: eop_log(*entries, last_offset=4), 1: eop_log()}).scans[0]
    assert kept.history(K)[-1].high_watermark == (9, 9)
    assert kept.history(b"absent")[0].high_watermark == (9, 9)  # a key without records: absent to the end
    # a log that cannot promise it (read while the cleaner ran): the mark before the gap
    raced = RegionLog(list(entries), FromEndOfPush(0), last_offset=4, latest_kept=False)
    scan = check_partition({0: raced, 1: eop_log()}).scans[0]
    assert scan.history(K)[-1].high_watermark == (2, -1)
    assert scan.history(b"absent")[0].high_watermark == (2, -1)


# -- rules 6 and 7: value classes and the heartbeat-mode comparison -----------------------------------------


def test_a_tombstone_matches_an_absent_key_but_a_put_does_not():
    covered = hb(1, (5, 5), 1, 5)
    tomb = check_partition({0: eop_log(covered), 1: eop_log(delete(1, 1, 2))})
    assert tomb.findings == []
    missing = only(check_partition({0: eop_log(covered), 1: eop_log(put(1, 7, 1, 2))}))
    assert missing.type == MISSING_IN_A
    assert missing.a_value_hash is None and missing.a_vt_offset is None and missing.a_high_watermark is None
    assert missing.b_value_hash == 7 and missing.b_vector == (-1, 2) and missing.b_deleted is False
    mirror = only(check_partition({0: eop_log(put(1, 7, 1, 2)), 1: eop_log(covered)}))
    assert mirror.type == MISSING_IN_B and mirror.b_vt_offset is None


def test_put_against_tombstone_reports_deleted_side():
    logs = {
        0: eop_log(put(1, 7, 0, 1), hb(2, (1, 1), 1, 1)),
        1: eop_log(delete(1, 0, 1), hb(2, (1, 1), 0, 1)),
    }
    f = only(check_partition(logs))
    assert f.type == VALUE_MISMATCH and f.a_deleted is False and f.b_deleted is True
    assert f.a_high_watermark == (1, 1) and f.b_high_watermark == (1, 1)


def test_the_reported_pair_is_the_smallest_j_then_i():
    def r(v, vec, hw, off, absent=False):
        return KeyRecord(v, vec, hw, off, absent)

    big = (9, 9)
    a = [r(None, (-1, -1), big, -1, True), r(1, (1, -1), big, 1), r(2, (2, -1), big, 2)]
    b = [r(None, (-1, -1), big, -1, True), r(2, (2, -1), big, 1)]
    verdict = compare_standing(a, b)
    # j=0 (B's prefix) mismatches A[1] and A[2]: the smallest i wins, so A[1] is MISSING_IN_B.
    assert verdict.finding.type == MISSING_IN_B and verdict.finding.a == a[1]
    assert verdict.comparable_pairs == 6 and verdict.skipped_pairs == 0 and not verdict.pending


def test_heartbeat_mode_finds_a_write_dropped_on_a_key_both_regions_had():
    """The case footer mode cannot see: region 1 silently skips w2 and later proves it processed it."""
    w1, w2 = (0, 1), (0, 5)
    region0 = eop_log(put(1, 10, *w1), put(2, 20, *w2), put(3, 30, 1, 2, key=b"other"), hb(4, (5, 2), 1, 2))
    region1 = eop_log(put(1, 10, *w1), put(2, 30, 1, 2, key=b"other"), hb(3, (5, 2), 0, 5))
    heartbeat = check_partition({0: region0, 1: region1})
    f = only(heartbeat)
    assert f.type == VALUE_MISMATCH and (f.a_value_hash, f.b_value_hash) == (20, 10)
    assert f.b_high_watermark == (5, 2)  # the mark reached while value 10 still stood
    assert check_partition({0: region0, 1: region1}, mode="footer").findings == []


def test_a_quiet_region_blocks_footer_mode_but_not_heartbeat_mode():
    # Region 1's write (RT offset 5) loses at region 0 and leaves no footer there; region 1 then goes quiet.
    region0 = eop_log(put(1, 7, 0, 3), hb(2, (3, 5), 1, 5))
    region1 = eop_log(put(1, 6, 1, 5), put(2, 7, 0, 3), hb(3, (3, 5), 0, 3))
    footer = check_partition({0: region0, 1: region1}, mode="footer").pair_counters[(0, 1)]
    heartbeat = check_partition({0: region0, 1: region1}).pair_counters[(0, 1)]
    assert footer.pending_keys == 1 and heartbeat.pending_keys == 0
    assert heartbeat.findings[VALUE_MISMATCH] == 0


def test_a_skipped_write_that_leaves_the_value_right_is_still_reported():
    """Region 0 drops a delete of an absent key (its value stays right) and then, by last-writer-wins, ignores
    an older PUT that region 1 still holds. Region 0's VT lacks the tombstone the protocol requires, so it
    looks as if region 0 processed the PUT and kept nothing: MISSING_IN_A. Values alone would call both
    regions consistent (region 1 merely lags); this is why the generator only injects faults that change
    the value at once."""
    region0 = eop_log(hb(1, (0, 0), 0, 0))  # processed the delete (0, 0) and the PUT (1, 0): no record
    region1 = eop_log(put(1, 7, 1, 0))  # processed the PUT only
    assert only(check_partition({0: region0, 1: region1})).type == MISSING_IN_A


# -- rule 9: counters ---------------------------------------------------------------------------------------


def test_counters_count_comparable_skipped_and_pending():
    # Region 1 lags: its mark never covers region 0's second write.
    region0 = eop_log(put(1, 7, 0, 1), put(2, 8, 0, 2), hb(3, (2, -1), 0, 2))
    region1 = eop_log(put(1, 7, 0, 1))
    c = check_partition({0: region0, 1: region1}).pair_counters[(0, 1)]
    # Standing marks: prefixes (-1,-1); region 0's records (1,-1) then (2,-1); region 1's record (1,-1).
    # Comparable: the two prefixes, and the two first records. Region 0's second record matches nothing.
    assert c.comparable_pairs == 2
    assert (c.keys, c.pending_keys, c.skipped_pairs) == (1, 1, 1)
    assert c.findings == {VALUE_MISMATCH: 0, MISSING_IN_A: 0, MISSING_IN_B: 0}


# -- errors name the bad input ------------------------------------------------------------------------------


def test_bad_inputs_are_refused_with_their_names():
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        check_partition({0: eop_log(), 1: eop_log()}, mode="fast")
    with pytest.raises(ValueError, match="region 0: entries not in increasing offset order: 2 then 2"):
        check_partition({0: eop_log(put(2, 1, 0, 1), put(2, 1, 0, 2)), 1: eop_log()})
    with pytest.raises(ValueError, match="region 1: heartbeat at 1: expected 2 components"):
        check_partition({0: eop_log(), 1: eop_log(hb(1, (1, 2, 3), 0, 1))})
    with pytest.raises(ValueError, match=r"pair \(1, 0\)"):
        check_partition({0: eop_log(), 1: eop_log()}, pairs=[(1, 0)])
    with pytest.raises(ValueError, match="last_offset 1 is before the last entry at 2"):
        check_partition({0: eop_log(put(2, 1, 0, 1), last_offset=1), 1: eop_log()})
    with pytest.raises(ValueError, match="entry at 0 lies before the scan start 1"):
        check_partition({0: RegionLog([put(0, 1, 0, 1)], FromEndOfPush(0)), 1: eop_log()})
    with pytest.raises(ValueError, match="region 3 does not exist with n_regions=2"):
        check_partition({0: eop_log(), 3: eop_log()}, n_regions=2)


def test_resuming_is_heartbeat_mode_only_and_all_regions_resume():
    first = check_partition({0: eop_log(put(1, 7, 0, 1)), 1: eop_log()})
    state = carry_state(first)
    logs = resume_logs(state, {0: [put(2, 8, 0, 2)]})
    with pytest.raises(ValueError, match="heartbeat mode only"):
        check_partition(logs, mode="footer")
    with pytest.raises(ValueError, match=r"regions \[1\] do not resume FromState"):
        check_partition({0: logs[0], 1: eop_log()})
    with pytest.raises(ValueError, match="heartbeat mode only"):
        carry_state(check_partition({0: eop_log(), 1: eop_log()}, mode="footer"))
