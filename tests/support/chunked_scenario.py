"""A chunked version replicated by three regions, with the findings it must give (tests of the Leap Frog job).

`Store` applies the same writes in every region's VT (tests/support/vt_builder.py), with per-region exceptions: a value
one region changed, a value one region stored whole instead of chunked, a write one region dropped. `scenario`
is the set of writes the chunked-values tests and the Kafka tests share; `EXPECTED` its findings.
"""

from __future__ import annotations

import hashlib

from vt_builder import RegionVt, write_archive

STORE, TOPIC = "chunky", "chunky_v1"
REGIONS = (0, 1, 2)
CHUNK = 1000


def big(tag: str, size: int = 2600) -> bytes:
    """A deterministic value larger than a chunk."""
    out = b""
    while len(out) < size:
        out += hashlib.sha256(tag.encode() + len(out).to_bytes(4, "big")).digest()
    return out[:size]


BIG_DIFF = big("big-diff")
BIG_DIFF_POISONED = (
    BIG_DIFF[:CHUNK] + bytes(b ^ 0xFF for b in BIG_DIFF[CHUNK : 2 * CHUNK]) + BIG_DIFF[2 * CHUNK :]
)
MISSING_BIG = big("missing-big")
USER_KEYS = {
    b"big-same",
    b"big-diff",
    b"mixed",
    b"replaced",
    b"replaced-small",
    b"deleted-big",
    b"small",
    b"small-diff",
    b"missing-big",
}
# (key, type, region_a, region_b, a value, b value); None = a tombstone/absent side
EXPECTED = {
    (b"big-diff", "VALUE_MISMATCH", 0, 2, BIG_DIFF, BIG_DIFF_POISONED),
    (b"big-diff", "VALUE_MISMATCH", 1, 2, BIG_DIFF, BIG_DIFF_POISONED),
    (b"small-diff", "VALUE_MISMATCH", 0, 1, b"small-diff-0", b"small-diff-1"),
    (b"small-diff", "VALUE_MISMATCH", 1, 2, b"small-diff-1", b"small-diff-0"),
    (b"missing-big", "MISSING_IN_B", 0, 1, MISSING_BIG, None),
    (b"missing-big", "MISSING_IN_A", 1, 2, None, MISSING_BIG),
}


class Store:
    """The same writes applied by every region's leader; `chunked` picks a chunked or an unchunked version."""

    def __init__(self, chunked: bool) -> None:
        self.chunked = chunked
        self.vts = {x: RegionVt(x, chunked=chunked) for x in REGIONS}
        self.rt_max = dict.fromkeys(REGIONS, -1)
        for vt in self.vts.values():
            vt.start_of_push()
            vt.end_of_push()

    def put(
        self, key: bytes, value: bytes, src: int, rt: int, *, overrides=None, unchunked_in=(), missing_in=()
    ):
        self.rt_max[src] = max(self.rt_max[src], rt)
        for x, vt in self.vts.items():
            if x in missing_in:
                continue
            v = (overrides or {}).get(x, value)
            chunk = CHUNK if self.chunked and x not in unchunked_in and len(v) > CHUNK else None
            vt.put(key, v, src, rt, chunk_size=chunk)

    def delete(self, key: bytes, src: int, rt: int) -> None:
        self.rt_max[src] = max(self.rt_max[src], rt)
        for vt in self.vts.values():
            vt.delete(key, src, rt)

    def heartbeats(self) -> dict[int, int]:
        """One VT heartbeat per origin in every region, covering every write so far; returns the offset of the
        first one per region."""
        firsts = {}
        for x, vt in self.vts.items():
            vector = [self.rt_max[r] + 1 for r in REGIONS]
            firsts[x] = vt.next_offset
            for origin in REGIONS:
                vt.heartbeat(origin, vector[origin], vector)
        for r in REGIONS:
            self.rt_max[r] += 1
        return firsts

    def write(self, root, first: dict[int, int] | None = None) -> dict[int, str]:
        return {
            x: write_archive([vt], root / f"dc-{x}", TOPIC, first=(first or {}).get(x, 0))
            for x, vt in self.vts.items()
        }


def scenario(s: Store) -> None:
    """The writes of the module docstring, from all three regions' RTs."""
    s.put(b"big-same", big("big-same"), 0, 10)
    s.put(b"big-diff", BIG_DIFF, 1, 20, overrides={2: BIG_DIFF_POISONED})  # region 2 changed one chunk
    s.put(b"mixed", big("mixed", 2500), 2, 30, unchunked_in=(1,))  # region 1 stored it whole
    s.put(b"replaced", big("replaced-1"), 0, 11)
    s.put(b"replaced", big("replaced-2", 3500), 1, 21)  # chunks of the first value are deleted
    s.put(b"replaced-small", big("replaced-small"), 0, 12)
    s.put(b"replaced-small", b"now small", 2, 31)
    s.put(b"deleted-big", big("deleted-big"), 1, 22)
    s.delete(b"deleted-big", 0, 13)
    s.put(b"small", b"small value", 0, 14)
    s.put(b"small-diff", b"small-diff-0", 1, 23, overrides={1: b"small-diff-1"})
    s.put(b"missing-big", MISSING_BIG, 0, 15, missing_in=(1,))  # region 1 dropped the write
