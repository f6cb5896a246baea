"""A region's state at a consistent cut, per key, from its version topic (issue 40; docs/outputs.md, `tidegauge
cut --out DIR`).

The state of region X at a cut C is, per key, the bulk load and then the conflict-resolution (DCR) winner among
the writes at or below C. X's VT records are the writes that won DCR *when they arrived*, in arrival order, so
among the records before ceil (the first heartbeat whose vector is >= C: every record of the cut lies before
it) the last one of a key whose coordinate is at or below C (a bulk-load record counts as below: it has no
coordinate and precedes every write) is that winner, provided nothing above C interfered:

- a write above C that reached X's VT before ceil may have beaten a write of the cut that arrived after it;
  the beaten write never reaches the VT, and the winner among the cut's own writes is then unknown from the VT
  alone. So a key is **exact** unless one of its records before ceil has a coordinate above C. (A write above C
  that lost never reaches the VT and dropped nothing; records after ceil hold no write of the cut.)
- A key that is not exact keeps the last record at or below C as its best knowledge, or **NONE** when no record of
  the key at or below C is known.
- A VT whose log cleaner removed records (compaction: offsets missing before ceil) may have lost a key's later
  record at or below C, or one above C, after the last record the reader sees: compaction keeps only a key's
  newest record, and that may lie after ceil. So a key whose last record at or below C has missing offsets after it
  (before ceil) is not exact either.
- With the RT writes at or below C (`--rt`), a key that is not exact is resolved by folding them, from its bulk
  record, with Venice's own DCR (`leapfrog.repair.dcr_apply`, the rule `repair plan` uses): `dcr_fold`.

Pure and columnar: keys arrive as integer codes (the caller dictionary-encodes them), the records as arrays in VT
order, so millions of keys cost a few numpy passes; only keys that are not exact are folded one by one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from leapfrog.repair import Record, dcr_apply


class KeyStates(NamedTuple):
    """Per key present among the records: `key` its code, `row` the index (into the records given) of the record
    that is its state at the cut, -1 when none at or below the cut is known (op NONE), `exact` whether that is the
    state for sure. Ordered by key code."""

    key: np.ndarray
    row: np.ndarray
    exact: np.ndarray


def states_at_cut(
    key_codes: np.ndarray, above: np.ndarray, records_missing_after: np.ndarray | None = None
) -> KeyStates:
    """The state at a cut of every key of one VT partition (module docstring). `key_codes`: each record's key
    code (non-negative integers); `above`: whether its coordinate lies above the cut (False for a bulk-load
    record); `records_missing_after`: whether offsets are missing between the record and ceil (compaction; None:
    the VT is whole). All cover the partition's change records before ceil, in VT order."""
    codes = np.asarray(key_codes, dtype=np.int64)
    hi = np.asarray(above, dtype=bool)
    if codes.shape != hi.shape or codes.ndim != 1:
        raise ValueError(f"{codes.shape} key codes but {hi.shape} above-the-cut flags")
    missing = None if records_missing_after is None else np.asarray(records_missing_after, dtype=bool)
    if missing is not None and missing.shape != codes.shape:
        raise ValueError(f"{codes.shape} key codes but {missing.shape} missing-record flags")
    if not len(codes):
        empty = np.zeros(0, dtype=np.int64)
        return KeyStates(empty, empty.copy(), np.zeros(0, dtype=bool))
    n_codes = int(codes.max()) + 1
    present = np.zeros(n_codes, dtype=bool)
    present[codes] = True
    last_below = np.full(n_codes, -1, dtype=np.int64)
    below = np.flatnonzero(~hi)
    np.maximum.at(last_below, codes[below], below)
    touched_above = np.zeros(n_codes, dtype=bool)
    touched_above[codes[hi]] = True
    keys = np.flatnonzero(present)
    rows = last_below[keys]
    exact = ~touched_above[keys]
    if missing is not None:
        exact &= ~((rows >= 0) & missing[np.maximum(rows, 0)])
    return KeyStates(keys, rows, exact)


def dcr_fold(stored: Record | None, writes: Iterable[Record]) -> Record | None:
    """The record Venice's DCR keeps after applying `writes` (any order: DCR's winner does not depend on it, but
    for Java-hash collisions, which `repair plan` calls undecidable) onto `stored` (the key's bulk record, or
    None)."""
    state = stored
    for w in writes:
        state = dcr_apply(state, w)
    return state
