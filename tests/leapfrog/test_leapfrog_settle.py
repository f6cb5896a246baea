"""leapfrog.settle, the per-key stage's decisions on plain arrays (the Spark job's tests check them end to end)."""

from __future__ import annotations

import itertools

import numpy as np

from leapfrog import vectorized as vz
from leapfrog.compare import KeyRecord, finding_for
from leapfrog.settle import carried_last, finding_type, partners, settled_groups, untouched_rows


def test_finding_type_is_the_record_rule():
    for a_absent, b_absent in itertools.product((False, True), repeat=2):
        a = KeyRecord(None if a_absent else 1, (0,), (0,), -1 if a_absent else 5, absent=a_absent)
        b = KeyRecord(None if b_absent else 2, (0,), (0,), -1 if b_absent else 6, absent=b_absent)
        assert finding_type(a_absent, b_absent) == finding_for(a, b).type


def test_a_key_is_untouched_only_when_every_row_is_settled_and_carried():
    new_group = np.array([True, False, True, False, True])
    settled_row = np.array([True, True, True, False, False])
    assert untouched_rows(new_group, settled_row).tolist() == [True, True, False, False, False]


def test_partners_are_the_paired_regions_present():
    assert partners([(0, 1), (0, 2), (1, 2)], 0, {0, 1, 2}) == [1, 2]
    assert partners([(0, 1), (0, 2)], 0, {0, 2}) == [2]
    assert partners([(0, 1)], 2, {0, 1, 2}) == []


def _histories(gid, absent) -> vz.Histories:
    n = len(gid)
    return vz.Histories(
        np.array(gid, np.int64),
        np.zeros(n, np.int64),
        np.array(absent, bool),
        np.arange(n, dtype=np.int64),
        np.zeros((n, 2), np.int64),
        np.zeros((n, 2), np.int64),
    )


def test_settled_groups():
    # region 0 keeps rows of groups 0, 1, 1 (group 1 keeps a superseded record too) and the absent prefix of 2;
    # region 1 keeps one row each of groups 0, 3; group 3 is pending in a pair
    h0 = _histories([0, 1, 1, 2], [False, False, False, True])
    h1 = _histories([0, 3], [False, False])
    kept = {0: (np.array([0, 1, 2, 3]), None, None), 1: (np.array([0, 1]), None, None)}
    present = {0: np.array([0, 1, 2]), 1: np.array([0, 3, 4])}
    settled = settled_groups({0: h0, 1: h1}, kept, present, [np.array([3])])
    assert settled.tolist() == [0, 4]
    assert settled_groups({0: h0, 1: h1}, kept, present, []).tolist() == [0, 3, 4]


def test_carried_last_is_each_groups_last_record():
    assert carried_last(None) is None
    c = vz.Carried(
        np.array([1, 1, 4], np.int64),
        np.zeros(3, np.int64),
        np.zeros(3, bool),
        np.array([3, 7, 9], np.int64),
        np.zeros((3, 2), np.int64),
        np.array([[1, 1], [2, 2], [3, 3]], np.int64),
        np.array([False, True, False]),
    )
    gids, last_open, marks = carried_last(c)
    assert (
        gids.tolist() == [1, 4] and last_open.tolist() == [True, False] and marks.tolist() == [[2, 2], [3, 3]]
    )
