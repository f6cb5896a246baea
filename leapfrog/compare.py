"""The per-key decision: given two regions' histories of one key, is there a divergence?

Both rules work on explicit histories of ``KeyRecord``s, so they can be tested (and Venice's own scenarios
pinned) without building logs. A record carries its value class, its per-key vector ``K`` (offsets of every
write the key's history in that region depends on), the high-water mark it is judged with, and its VT offset.

**Value classes.** A PUT's class is its 64-bit value hash; a tombstone and the absent prefix (the key did not
exist when the scan started) are both class NULL (``value_hash`` None): a tombstone against an absent key is
consistent. Two records mismatch iff their classes differ.

**Comparable.** ``a`` and ``b`` are comparable iff ``covers(hw(a), K(b)) and covers(hw(b), K(a))``: each
region's high-water mark, while its record held, covers every write the other record depends on.

``compare_standing`` (heartbeat mode). Each record's high-water mark is its *standing* one (``hws``): the mark
its region reached while the record's value stood, i.e. until the key's next record there (see
``leapfrog.reference.scan``). The finding is the comparable mismatching pair with the smallest index in B, then the
smallest index in A (index 0 = the absent prefix when it is known). It is written as the plain O(|A|·|B|) loop
on purpose: it is the reference the Spark job is tested against.

Why a finding means divergence: with last-writer-wins conflict resolution, a region's value while a record
stands is the maximum (timestamp, tie-break) over every write it has processed — the record's own write —
and the processed set includes every RT offset at or below the standing high-water mark. If ``a`` and ``b``
are comparable, x had processed b's write while a stood, so ``w(a) >= w(b)``; symmetrically ``w(b) >= w(a)``.
The tie-break makes the order total, so ``w(a) = w(b)`` and the values are equal — unless a region diverged
(applied a value other than that maximum, or skipped a winning write). For the absent prefix the argument is
the same with an empty processed set: covering a write it never applied means the region skipped it.

``lily_pad_walk`` (footer and rmd modes) is Venice's ``LilyPadUtils.findInconsistencyForKey``:
two pointers, point-in-time high-water marks (``hw_at``), one-step look-ahead, and MISSING only when one
region has no record of the key. Two deliberate differences: a tombstone as the other region's last record is
consistent with an absent key (Venice reports it MISSING), and MISSING is only reported when the
empty region's prefix is known to be absent (a mid-stream scan knows nothing about earlier state).

Both functions also count coverage: comparable pairs, records skipped as lag, and whether the two current
values (last records) are still not comparable ("pending").

**Open or healed.** Only the first divergence of a key is reported, but a key's regions may converge after it:
a repair re-emitted the winning write, or a newer write replaced both values. Both functions therefore also say
whether the key's *current* records (the last of each history) are comparable and hold the same value class
(``converged``). A finding is ``healed`` when they are — a later comparable pair of the key's records agrees —,
and ``open`` otherwise: the regions still differ, or their current records cannot be compared yet
(``status_of``). Exit codes and verdicts follow the open findings only; healed ones stay as history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from leapfrog.vectors import Vector, covers

VALUE_MISMATCH = "VALUE_MISMATCH"
MISSING_IN_A = "MISSING_IN_A"
MISSING_IN_B = "MISSING_IN_B"
FINDING_TYPES = (VALUE_MISMATCH, MISSING_IN_A, MISSING_IN_B)
OPEN = "open"
HEALED = "healed"
FINDING_STATUSES = (OPEN, HEALED)


@dataclass(frozen=True)
class KeyRecord:
    """One record of a key's history in one region.

    ``value_hash`` None = tombstone (or, with ``absent``, the key's absence before the scan). ``vector`` = the
    per-key vector K; ``high_watermark`` = the mark the record is judged with (standing in heartbeat mode,
    point-in-time in footer mode); ``vt_offset`` orders records (-1 for the absent prefix).
    """

    value_hash: int | None
    vector: Vector
    high_watermark: Vector
    vt_offset: int
    absent: bool = False

    def __post_init__(self) -> None:
        if self.absent and self.value_hash is not None:
            raise ValueError(f"an absent prefix has no value, got value_hash={self.value_hash}")


@dataclass(frozen=True)
class KeyFinding:
    """The first divergence of a key between regions A and B; the side that is absent is None."""

    type: str
    a: KeyRecord | None
    b: KeyRecord | None


@dataclass(frozen=True)
class KeyVerdict:
    """Outcome of comparing one key's histories: the finding (if any), the coverage counters, and whether the
    key's current records are comparable and agree (``converged``: a finding is then healed)."""

    finding: KeyFinding | None
    comparable_pairs: int
    skipped_pairs: int
    pending: bool
    converged: bool = False

    @property
    def status(self) -> str:
        """The status of this verdict's finding (see ``status_of``)."""
        return status_of(self.converged)


def status_of(converged: bool) -> str:
    """A finding is ``healed`` when the key's current records in the two regions are comparable and hold the
    same value class, ``open`` otherwise (they differ, or cannot be compared yet)."""
    return HEALED if converged else OPEN


def converged(a: Sequence[KeyRecord], b: Sequence[KeyRecord]) -> bool:
    """The two histories' current (last) records are comparable and hold the same value class."""
    return bool(a and b and comparable(a[-1], b[-1]) and a[-1].value_hash == b[-1].value_hash)


def comparable(a: KeyRecord, b: KeyRecord) -> bool:
    """Each record's high-water mark covers the other's per-key vector."""
    return covers(a.high_watermark, b.vector) and covers(b.high_watermark, a.vector)


def finding_for(a: KeyRecord, b: KeyRecord) -> KeyFinding:
    """The finding for a comparable mismatching pair: MISSING on the side that is the absent prefix."""
    if a.absent:
        return KeyFinding(MISSING_IN_A, None, b)
    if b.absent:
        return KeyFinding(MISSING_IN_B, a, None)
    return KeyFinding(VALUE_MISMATCH, a, b)


def _check_order(records: Sequence[KeyRecord], side: str) -> None:
    for before, after in zip(records, records[1:], strict=False):
        if after.vt_offset <= before.vt_offset:
            raise ValueError(
                f"history {side} is not in VT offset order: {before.vt_offset} then {after.vt_offset}"
            )
    if any(r.absent for r in records[1:]):
        raise ValueError(f"history {side}: only the first record may be the absent prefix")


def compare_standing(a: Sequence[KeyRecord], b: Sequence[KeyRecord]) -> KeyVerdict:
    """Heartbeat-mode rule for one key: the comparable mismatching pair with the smallest (j, i).

    ``a`` and ``b`` are the key's histories in regions A and B (absent prefix first when known), each record's
    ``high_watermark`` being its standing high-water mark.
    """
    _check_order(a, "A")
    _check_order(b, "B")
    first: KeyFinding | None = None
    comparable_pairs = 0
    a_matched = [False] * len(a)
    b_matched = [False] * len(b)
    for j, rb in enumerate(b):
        for i, ra in enumerate(a):
            if not comparable(ra, rb):
                continue
            comparable_pairs += 1
            a_matched[i] = b_matched[j] = True
            if first is None and ra.value_hash != rb.value_hash:
                first = finding_for(ra, rb)
    skipped = sum(1 for r, m in zip(a, a_matched, strict=True) if not m and not r.absent)
    skipped += sum(1 for r, m in zip(b, b_matched, strict=True) if not m and not r.absent)
    pending = not (a and b and comparable(a[-1], b[-1]))
    return KeyVerdict(first, comparable_pairs, skipped, pending, converged(a, b))


def _one_sided(
    present: Sequence[KeyRecord], empty_final_hw: Vector, empty_known_absent: bool, missing_type: str
) -> KeyVerdict:
    """Venice's MISSING check: the present side's last record against the empty side's final mark."""
    last = present[-1]
    if not empty_known_absent:
        # A mid-stream scan saw nothing of the key, which says nothing about the key's earlier state.
        return KeyVerdict(None, 0, 1, True)
    covered = covers(empty_final_hw, last.vector)
    if not covered:
        return KeyVerdict(None, 0, 1, True)
    if last.value_hash is None:
        # Deliberate fix of Venice's LilyPadUtils: a tombstone against an absent key is consistent.
        return KeyVerdict(None, 1, 0, False)
    if missing_type == MISSING_IN_A:
        return KeyVerdict(KeyFinding(MISSING_IN_A, None, last), 1, 0, False)
    return KeyVerdict(KeyFinding(MISSING_IN_B, last, None), 1, 0, False)


def lily_pad_walk(
    a: Sequence[KeyRecord],
    b: Sequence[KeyRecord],
    a_final_hw: Vector,
    b_final_hw: Vector,
    *,
    a_known_absent: bool = True,
    b_known_absent: bool = True,
) -> KeyVerdict:
    """Footer/rmd-mode rule for one key: Venice's lily-pad walk (LilyPadUtils) with our two fixes.

    ``a`` and ``b`` hold real records only (no prefix), each ``high_watermark`` being the point-in-time mark
    ``hw_at``. ``*_final_hw`` are the regions' final marks, used when one history is empty;
    ``*_known_absent`` says whether that region's scan started where the key was known to be absent (EOP).
    Counters: each comparable step counts one comparable pair, each non-comparable step one skipped pair
    (with one side empty: the MISSING check is one step). Pending: the two last records are not comparable
    by their ``hw_at``; with one side empty, the other's last record is not covered by the empty side's final
    mark, or that side's earlier state is unknown.
    """
    _check_order(a, "A")
    _check_order(b, "B")
    if any(r.absent for r in (*a, *b)):
        raise ValueError(
            "lily_pad_walk takes real records only; the absent prefix is implied by *_known_absent"
        )
    if not a and not b:
        return KeyVerdict(None, 0, 0, False)
    if not a:
        return _one_sided(b, a_final_hw, a_known_absent, MISSING_IN_A)
    if not b:
        return _one_sided(a, b_final_hw, b_known_absent, MISSING_IN_B)

    pending = not comparable(a[-1], b[-1])
    agree = converged(a, b)
    comparable_steps = skipped_steps = 0
    i = j = 0
    while i < len(a) and j < len(b):
        ra, rb = a[i], b[j]
        a_covers_b = covers(ra.high_watermark, rb.vector)
        b_covers_a = covers(rb.high_watermark, ra.vector)
        if a_covers_b and b_covers_a:
            comparable_steps += 1
            if ra.value_hash != rb.value_hash:
                return KeyVerdict(
                    KeyFinding(VALUE_MISMATCH, ra, rb), comparable_steps, skipped_steps, pending, agree
                )
            next_a_ok = i + 1 < len(a) and covers(rb.high_watermark, a[i + 1].vector)
            if next_a_ok and a[i + 1].value_hash != rb.value_hash:
                finding = KeyFinding(VALUE_MISMATCH, a[i + 1], rb)
                return KeyVerdict(finding, comparable_steps, skipped_steps, pending, agree)
            next_b_ok = j + 1 < len(b) and covers(ra.high_watermark, b[j + 1].vector)
            if next_b_ok and ra.value_hash != b[j + 1].value_hash:
                finding = KeyFinding(VALUE_MISMATCH, ra, b[j + 1])
                return KeyVerdict(finding, comparable_steps, skipped_steps, pending, agree)
            if next_a_ok and not next_b_ok:
                i += 1
            elif next_b_ok and not next_a_ok:
                j += 1
            else:
                i += 1
                j += 1
        else:
            # Not comparable: advance whichever side is behind (both when neither covers the other).
            skipped_steps += 1
            if not a_covers_b and not b_covers_a:
                i += 1
                j += 1
            elif not a_covers_b:
                i += 1
            else:
                j += 1
    return KeyVerdict(None, comparable_steps, skipped_steps, pending, agree)
