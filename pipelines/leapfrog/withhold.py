"""Which findings rest on a record that could not be decoded, for the batch job and the watch alike.

`leapfrog.unverified` states the rule (pure); this module adapts it to the jobs' data: the unverified keys a
plan's region facts list, and a table of finding rows to filter. The batch job applies it once over a run's
findings, the watch to each micro-batch's, with the unverified keys known so far.
"""

from __future__ import annotations

import pyarrow as pa

from pipelines.leapfrog import chunks as C


def unverified_index(facts: dict) -> tuple[dict[tuple[int, int, bytes], list[int]], set[tuple[int, int]]]:
    """(region, partition, key) → offsets of its unreadable records, and the region partitions with more of them
    than a scan lists (every finding there is withheld). In a chunked version every value key carries the
    `02 00` suffix; other suffixes are chunk keys, which a manifest's hash already accounts for."""
    from leapfrog.unverified import index

    chunked = C.chunked_version(facts.values())
    rows = []
    for (region, partition), rp in facts.items():
        for key_hex, offset in rp.unverified:
            key = bytes.fromhex(key_hex)
            if chunked:
                if key[-2:] != C.VALUE_SUFFIX:
                    continue
                key = key[:-2]
            rows.append((region, partition, key, int(offset)))
    overflow = {(rp.region, rp.partition) for rp in facts.values() if rp.unverified_overflow}
    return index(rows), overflow


def withhold(table: pa.Table, unverified: dict, overflow: set) -> pa.Table:
    """The findings that do not rest on an unreadable record (leapfrog.unverified)."""
    from leapfrog.unverified import withheld_side

    if table.num_rows == 0 or (not unverified and not overflow):
        return table
    cols = [
        table.column(c).to_pylist()
        for c in ("partition", "key", "region_a", "region_b", "a_vt_offset", "b_vt_offset")
    ]
    keep = []
    for p, k, a, b, ao, bo in zip(*cols, strict=True):
        held = (
            (a, p) in overflow
            or (b, p) in overflow
            or withheld_side(unverified, p, k, a, b, ao, bo) is not None
        )
        keep.append(not held)
    return table.filter(pa.array(keep, pa.bool_()))
