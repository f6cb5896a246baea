"""Offset vectors: the one data shape every Leap Frog rule is written in.

A vector has one component per region (index = region id) holding an RT offset; ``-1`` means "nothing from
that region" so that coverage needs no special null case (Venice's ``null`` components in DiffValidationUtils.hasOffsetAdvanced). Vectors
are plain tuples of ints: hashable, immutable, cheap to copy into findings.
"""

from __future__ import annotations

from collections.abc import Sequence

Vector = tuple[int, ...]

#: The component value meaning "nothing seen from that region yet".
NOTHING = -1


def nothing(n_regions: int) -> Vector:
    """The all-``-1`` vector: no offset of any region."""
    return (NOTHING,) * n_regions


def covers(hw: Sequence[int], vec: Sequence[int]) -> bool:
    """True iff ``hw[r] >= vec[r]`` for every region r (rule 1; equality counts as covered)."""
    if len(hw) != len(vec):
        raise ValueError(f"cannot compare vectors of different lengths: {tuple(hw)} and {tuple(vec)}")
    return all(h >= v for h, v in zip(hw, vec, strict=True))


def vmax(a: Vector, b: Vector) -> Vector:
    """Component-wise maximum of two vectors of the same length."""
    if len(a) != len(b):
        raise ValueError(f"cannot merge vectors of different lengths: {a} and {b}")
    return tuple(x if x >= y else y for x, y in zip(a, b, strict=True))


def raised(vec: Vector, region: int, offset: int) -> Vector:
    """``vec`` with component ``region`` raised to at least ``offset`` (a footer position joining a vector)."""
    if vec[region] >= offset:
        return vec
    return vec[:region] + (offset,) + vec[region + 1 :]


def checked_vector(values: Sequence[int], n_regions: int, what: str) -> Vector:
    """``values`` as a vector of exactly ``n_regions`` components, each ``>= -1``; ``what`` names it in errors."""
    vec = tuple(int(v) for v in values)
    if len(vec) != n_regions:
        raise ValueError(f"{what}: expected {n_regions} components, got {len(vec)}: {vec}")
    if any(v < NOTHING for v in vec):
        raise ValueError(f"{what}: components must be >= -1, got {vec}")
    return vec


def padded_vector(values: Sequence[int], n_regions: int, what: str) -> Vector:
    """A possibly shorter vector (an RMD checkpoint vector) padded with ``-1`` to ``n_regions`` components.

    A longer vector names regions this partition does not have; that is refused rather than guessed at.
    """
    vec = tuple(int(v) for v in values)
    if len(vec) > n_regions:
        raise ValueError(f"{what}: {len(vec)} components for {n_regions} regions: {vec}")
    return checked_vector(vec + (NOTHING,) * (n_regions - len(vec)), n_regions, what)
