"""Keys whose record in a region could not be decoded: unverified there, never a finding because of it.

A record that cannot be decoded still occupies its key's history in that region: whatever it held replaced the
value before it, which therefore stood only until that record, not until the key's next readable one. A
comparison the checker made with the earlier value after that point, or a key it believes absent while an
unreadable record may hold it, is not evidence of a divergence; it is missing evidence. So a finding about key k
in the pair (a, b) is withheld — and k counted as unverified in that region — when, in region a or b, k has an
unreadable record

- after the record the finding names on that side (the named record was replaced by it while it was thought to
  stand), or
- anywhere, when the finding names no record on that side (MISSING there: the unreadable record may be it).

A finding about a readable record after the key's last unreadable one stands: from the key's next decodable
record on, the key is verified again.

Pure: the Spark job calls it on the driver over the findings it wrote, the reference model over its own.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping


def index(unverified: Iterable[tuple[int, int, bytes, int]]) -> dict[tuple[int, int, bytes], list[int]]:
    """(region, partition, key) → sorted offsets of its unreadable records, from (region, partition, key,
    offset) tuples."""
    out: dict[tuple[int, int, bytes], list[int]] = {}
    for region, partition, key, offset in unverified:
        out.setdefault((region, partition, key), []).append(offset)
    for offsets in out.values():
        offsets.sort()
    return out


def withheld_side(
    idx: Mapping[tuple[int, int, bytes], list[int]],
    partition: int,
    key: bytes,
    region_a: int,
    region_b: int,
    a_offset: int | None,
    b_offset: int | None,
) -> int | None:
    """The region in which this finding rests on an unreadable record (the finding is then withheld), or None
    when it does not."""
    for region, offset in ((region_a, a_offset), (region_b, b_offset)):
        offsets = idx.get((region, partition, key))
        if not offsets:
            continue
        if offset is None or bisect_right(offsets, offset) < len(offsets):
            return region
    return None
