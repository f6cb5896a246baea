"""`leapfrog.snapshot`: the state at a cut per key from a VT, on hand-made records (the generated histories with
known truth are in tests/pipelines/cut/test_cut_properties.py)."""

from __future__ import annotations

import numpy as np

from leapfrog.repair import Record
from leapfrog.snapshot import dcr_fold, states_at_cut


def test_the_last_record_at_or_below_the_cut_is_the_state_and_a_record_above_first_makes_it_not_exact():
    # key 0: bulk, then a write below;  key 1: a write above, then one below (DCR may have dropped another);
    # key 2: only above;  key 3: below, then above (a write of the cut arriving after it may still have lost to
    # it and never reached the VT: not exact either)
    codes = np.array([0, 0, 1, 1, 2, 3, 3])
    above = np.array([False, False, True, False, True, False, True])
    s = states_at_cut(codes, above)
    assert s.key.tolist() == [0, 1, 2, 3]
    assert s.row.tolist() == [1, 3, -1, 5]
    assert s.exact.tolist() == [True, False, False, False]


def test_no_records_no_keys():
    s = states_at_cut(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))
    assert len(s.key) == len(s.row) == len(s.exact) == 0


def test_the_dcr_fold_is_venice_s_merge_from_the_bulk_record():
    bulk = Record("PUT", b"b", 1)
    writes = [Record("PUT", b"x", 5, 0, 10), Record("DELETE", None, 5, 1, 3), Record("PUT", b"y", 4, 1, 4)]
    assert dcr_fold(bulk, writes) == Record("DELETE", None, 5, 1, 3)  # a DELETE wins a tie
    assert dcr_fold(bulk, []) == bulk
    assert dcr_fold(None, []) is None


def test_a_key_with_records_missing_after_its_last_one_at_or_below_the_cut_is_not_exact() -> None:
    # key 0: its last record at or below the cut is row 1; a compaction removed offsets after it (maybe its newer
    # record at or below the cut): not exact. Key 1's last record (row 2) has nothing missing after it.
    codes = np.array([0, 0, 1])
    above = np.array([False, False, False])
    whole = states_at_cut(codes, above)
    assert whole.exact.tolist() == [True, True]
    holed = states_at_cut(codes, above, np.array([True, True, False]))
    assert holed.row.tolist() == [1, 2]
    assert holed.exact.tolist() == [False, True]
