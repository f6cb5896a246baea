"""What a Leap Frog run reports for one partition: findings, coverage per region pair, facts per region.

The field names follow the job's output contract (docs/outputs.md, ``leapfrog``): a finding carries, for each
side that is present, the value hash, whether it is a tombstone, the VT offset, the per-key vector and the
high-water mark the record was judged with (the standing one in heartbeat mode, ``hw_at`` in footer mode).
The ``a_*`` fields are None for MISSING_IN_A and the ``b_*`` fields for MISSING_IN_B. ``status`` says whether the
regions still differ at the end of the run (``open``) or a later comparable pair of the key's records agrees
(``healed``; ``leapfrog.compare.status_of``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from leapfrog.compare import OPEN, KeyFinding, KeyRecord
from leapfrog.vectors import Vector


@dataclass(frozen=True)
class Finding:
    """One divergence of one key between ``region_a < region_b`` in one partition."""

    partition: int
    region_a: int
    region_b: int
    type: str
    key: bytes
    a_value_hash: int | None
    a_deleted: bool | None
    a_vt_offset: int | None
    a_vector: Vector | None
    a_high_watermark: Vector | None
    b_value_hash: int | None
    b_deleted: bool | None
    b_vt_offset: int | None
    b_vector: Vector | None
    b_high_watermark: Vector | None
    status: str = OPEN

    @property
    def order(self) -> tuple[int, int]:
        """(B-side VT offset, A-side VT offset), -1 for an absent side: the smallest one is the one reported."""
        b = self.b_vt_offset if self.b_vt_offset is not None else -1
        a = self.a_vt_offset if self.a_vt_offset is not None else -1
        return (b, a)

    @classmethod
    def of(
        cls, partition: int, region_a: int, region_b: int, key: bytes, found: KeyFinding, status: str = OPEN
    ) -> Finding:
        """The finding row for a per-key finding."""
        a = _side(found.a)
        b = _side(found.b)
        return cls(partition, region_a, region_b, found.type, key, *a, *b, status)


def _side(record: KeyRecord | None) -> tuple[Any, ...]:
    if record is None:
        return (None, None, None, None, None)
    return (
        record.value_hash,
        record.value_hash is None,
        record.vt_offset,
        record.vector,
        record.high_watermark,
    )


@dataclass(frozen=True)
class PairCounters:
    """Coverage of one region pair.

    ``keys`` visited; ``comparable_pairs`` = record pairs found comparable (in a resumed run: pairs that became
    comparable in this run, so that runs add up); ``skipped_pairs`` = real records comparable with no record of
    the other region (footer mode: non-comparable walk steps); ``pending_keys`` = keys whose current values are
    not yet comparable; ``findings`` = findings so far by type.
    """

    region_a: int
    region_b: int
    keys: int
    comparable_pairs: int
    skipped_pairs: int
    pending_keys: int
    findings: dict[str, int]


@dataclass(frozen=True)
class RegionFacts:
    """What one region's scan saw. ``gaps`` are (first_missing, last_missing) offset ranges."""

    region: int
    records: int
    heartbeats: int
    heartbeats_by_origin: dict[int, int]
    first_offset: int | None
    last_offset: int
    final_high_watermark: Vector
    gaps: list[tuple[int, int]]
    out_of_range: int
    out_of_range_offsets: list[int]


@dataclass(frozen=True)
class PartitionResult:
    """Findings (sorted by pair, key), counters per pair ``(region_a, region_b)``, facts per region."""

    partition: int
    mode: str
    n_regions: int
    pairs: tuple[tuple[int, int], ...]
    findings: list[Finding]
    pair_counters: dict[tuple[int, int], PairCounters]
    regions: dict[int, RegionFacts]
    # The per-region scans, kept so that leapfrog.reference.state.carry_state can build the next run's state.
    scans: dict[int, Any] = field(default_factory=dict, repr=False, compare=False)


def divergent_keys(findings: Iterable[tuple[int, bytes, str | None]]) -> set[tuple[int, bytes]]:
    """The divergent keys of a run's findings, given as (partition, key, status) — the one definition the
    report, `leapfrog`'s summary and `repair plan` count by: a (partition, key) with at least one *open*
    finding, in any region pair. A key found in three pairs is one divergent key (three findings); a key whose
    findings are all healed is not divergent. A status None (an output written before findings had one) is
    open."""
    return {(int(p), bytes(k)) for p, k, status in findings if status in (None, OPEN)}
