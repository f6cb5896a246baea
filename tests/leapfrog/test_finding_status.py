"""Open or healed (issue 41): a finding is the first divergence of its key, and stays; its status says whether the
regions still differ at the end of the run. One rule (`leapfrog.compare.status_of`) for every path: the pure
per-key rules, the reference's full and resumed runs (checked against each other by the differential tests), and
`leapfrog.results.divergent_keys`, the one definition of a divergent key."""

from __future__ import annotations

from leapfrog import (
    HEALED,
    MISSING_IN_B,
    OPEN,
    VALUE_MISMATCH,
    KeyRecord,
    compare_standing,
    divergent_keys,
    lily_pad_walk,
)
from leapfrog.reference import (
    DataEntry,
    FromEndOfPush,
    HeartbeatEntry,
    RegionLog,
    carry_state,
    check_partition,
    resume_logs,
)
from leapfrog.reference.band import compare_standing_linear

K = b"k"


def put(off, value, src, src_off, key=K):
    return DataEntry(off, key, value, src, src_off)


def hb(off, watermarks, origin, origin_off):
    return HeartbeatEntry(off, tuple(watermarks), origin, origin_off)


def eop_log(*entries):
    return RegionLog(list(entries), FromEndOfPush(0), None)


def _poisoned(*, repaired: bool) -> dict[int, RegionLog]:
    """Region 1's leader applied RT write 0@1 with another value (a poisoned value); with `repaired`, a repair
    re-emitted the winner as RT write 0@3, which region 1 applied and region 0 (holding it already) ignored."""
    zero = [put(1, 10, 0, 1), hb(2, (2, 2), 1, 2)]
    one = [put(1, 99, 0, 1), hb(2, (2, 2), 0, 2)]
    if repaired:
        zero += [hb(3, (4, 4), 1, 4)]
        one += [put(3, 10, 0, 3), hb(4, (4, 4), 0, 4)]
    return {0: eop_log(*zero), 1: eop_log(*one)}


def test_a_repaired_divergence_is_reported_healed_and_a_standing_one_open():
    before = check_partition(_poisoned(repaired=False)).findings
    assert [(f.type, f.status) for f in before] == [(VALUE_MISMATCH, OPEN)]
    after = check_partition(_poisoned(repaired=True)).findings
    # the same first divergence, kept as history, now healed
    assert [(f.type, f.status) for f in after] == [(VALUE_MISMATCH, HEALED)]
    assert (after[0].a_value_hash, after[0].b_value_hash) == (10, 99)


def test_a_missing_key_heals_when_the_region_gets_it_and_a_newer_divergence_opens_it_again():
    logs = {
        0: eop_log(put(1, 10, 0, 1), hb(2, (2, 2), 1, 2), hb(3, (4, 4), 1, 4), put(4, 11, 0, 5)),
        1: eop_log(hb(1, (2, 2), 0, 2), put(2, 10, 0, 3), hb(3, (4, 4), 0, 4), hb(4, (6, 6), 0, 6)),
    }
    f = check_partition(logs).findings
    # region 1 dropped 0@1 (MISSING_IN_B), got the repair 0@3, then dropped the newer write 0@5: open again
    assert [(x.type, x.status) for x in f] == [(MISSING_IN_B, OPEN)]
    logs[1] = eop_log(
        hb(1, (2, 2), 0, 2), put(2, 10, 0, 3), hb(3, (4, 4), 0, 4), put(4, 11, 0, 5), hb(5, (6, 6), 0, 6)
    )
    assert [(x.type, x.status) for x in check_partition(logs).findings] == [(MISSING_IN_B, HEALED)]


def test_current_records_that_cannot_be_compared_yet_leave_the_finding_open():
    big, low = (9, 9), (3, -1)

    def r(v, vec, hw, off):
        return KeyRecord(v, vec, hw, off)

    a = [r(1, (1, -1), big, 1), r(2, (5, -1), big, 2)]  # A's repair (0@5) ...
    b = [r(3, (1, -1), low, 1)]  # ... B has not caught up with: its mark stops at 3
    verdict = compare_standing(a, b)
    assert verdict.finding is not None and verdict.pending and verdict.status == OPEN
    caught_up = [r(3, (1, -1), big, 1), r(2, (5, -1), big, 2)]
    healed = compare_standing(a, caught_up)
    assert healed.finding is not None and not healed.pending and healed.status == HEALED
    assert compare_standing_linear(a, caught_up) == healed
    # footer mode (Venice's walk) follows the same rule on its point-in-time marks
    walk = lily_pad_walk(a, caught_up, big, big)
    assert walk.finding is not None and walk.status == HEALED


def test_a_resumed_run_heals_the_finding_of_an_earlier_one():
    whole = _poisoned(repaired=True)
    first = {x: RegionLog(log.entries[:2], log.start, None) for x, log in whole.items()}
    night1 = check_partition(first)
    assert [f.status for f in night1.findings] == [OPEN]
    rest = {x: log.entries[2:] for x, log in whole.items()}
    night2 = check_partition(resume_logs(carry_state(night1), rest))
    assert night2.findings == check_partition(whole).findings  # the same finding, healed, as one full run
    assert [f.status for f in night2.findings] == [HEALED]


def test_a_divergent_key_is_a_partition_and_key_with_an_open_finding_in_any_pair():
    rows = [
        (0, b"a", OPEN),
        (0, b"a", OPEN),  # the same key in another pair: one divergent key
        (0, b"a", HEALED),
        (1, b"a", HEALED),  # healed in its only pair: not divergent
        (2, b"b", None),  # an output without statuses: open
    ]
    assert divergent_keys(rows) == {(0, b"a"), (2, b"b")}
