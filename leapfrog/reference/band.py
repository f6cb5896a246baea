"""The heartbeat-mode per-key rule in linear time: the same verdict as `compare_standing`, for long histories.

Along a key's history in one region, standing marks and per-key vectors only grow (marks are taken at later
and later positions; vectors are running maxima). So for a record b of B, the records of A it is comparable with
form an interval [L, R): `covers(hws(a_i), K(b))` becomes true at some i = L and stays true, while
`covers(hws(b), K(a_i))` holds up to some i = R and then stays false. As b moves on, K(b) and hws(b) grow, so L
and R only move forward: two pointers find every interval in O(|A| + |B|) coverage tests. Within an interval,
the first record whose value differs from b's is found through run lengths of equal values.

`compare_standing` (the plain O(|A|·|B|) loop) is the reference; tests check that both give the same verdict.
"""

from __future__ import annotations

from collections.abc import Sequence

from leapfrog.compare import KeyRecord, KeyVerdict, comparable, converged, finding_for
from leapfrog.vectors import covers


def compare_standing_linear(a: Sequence[KeyRecord], b: Sequence[KeyRecord]) -> KeyVerdict:
    """`compare_standing` in O(|A| + |B|): first comparable mismatching pair by (j, i), and the counters."""
    n, m = len(a), len(b)
    # run_end[i]: first index after i whose value differs from a[i]'s (n when none)
    run_end = [n] * n
    for i in range(n - 2, -1, -1):
        run_end[i] = run_end[i + 1] if a[i + 1].value_hash == a[i].value_hash else i + 1
    first = None
    comparable_pairs = 0
    a_cover = [0] * (n + 1)  # difference array: how many b's each a is comparable with
    b_matched = [False] * m
    lo = hi = 0
    for j, rb in enumerate(b):
        while lo < n and not covers(a[lo].high_watermark, rb.vector):
            lo += 1
        if hi < lo:
            hi = lo
        while hi < n and covers(rb.high_watermark, a[hi].vector):
            hi += 1
        if lo >= hi:
            continue
        comparable_pairs += hi - lo
        b_matched[j] = True
        a_cover[lo] += 1
        a_cover[hi] -= 1
        if first is None:
            i = lo if a[lo].value_hash != rb.value_hash else run_end[lo]
            if i < hi:
                first = finding_for(a[i], rb)
    skipped = sum(1 for r, mt in zip(b, b_matched, strict=True) if not mt and not r.absent)
    running = 0
    for i in range(n):
        running += a_cover[i]
        if running == 0 and not a[i].absent:
            skipped += 1
    pending = not (a and b and comparable(a[-1], b[-1]))
    return KeyVerdict(first, comparable_pairs, skipped, pending, converged(a, b))
