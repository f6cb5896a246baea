"""One hand-built partition that holds every kind of DIV fault, for tests that cut a validation anywhere.

Built with the independent reference producer (venice_reference.py), it puts in one short log what a resumed
validation must carry across a cut to decide as an uninterrupted one: faults before End of Push (fatal) and after
(warnings); gaps that compaction tolerance forgives (old records) and gaps it does not (`broker_ts=NOW`); offset
holes where the lost records were; undecodable records, one that explains the gap after it and one too few for
another; a keyless record; a duplicate; a wrong checksum; data after an EndOfSegment; an MD5 segment open across
most of the log (its running state is not a plain number); heartbeats (exempt); and a producer that max-age
makes stale before its next record arrives but expires only at the next checkpoint — a resume that expired it
at the cut (as a replica's restore does) would report a false UNREGISTERED_PRODUCER there.

Validate it with `ValidateOptions(min_compaction_lag_ms=LAG, now_ms=NOW, max_age_ms=MAX_AGE,
record_validators=RECORD_VALIDATORS)`; `write` stores it as a VT and as an RT partition (RT rules differ: no
End of Push, no compaction tolerance), so both kinds are validated from one archive.
"""

from __future__ import annotations

import os

import venice_reference as ref

NOW = 1_800_000_000_000
OLD = NOW - 10_000_000  # records this old are past any compaction lag below
LAG = 1_000
MAX_AGE = 1_000_000
STORE = "faulty"
VT, RT = f"{STORE}_v1", f"{STORE}_rt"
RECORD_VALIDATORS = [{"class": "builtin:timestamp_drift", "max_drift_ms": 2_000_000}]

P = bytes.fromhex("50" * 16)
A = bytes.fromhex("a0" * 15 + "01")
B = bytes.fromhex("b0" * 15 + "02")
M = bytes.fromhex("3d" * 15 + "03")
S = bytes.fromhex("5e" * 15 + "04")
N = bytes.fromhex("4e" * 15 + "05")


def faulty_partition() -> list[tuple[int, ref.Rec]]:
    """(offset, record) pairs, offsets increasing with holes where records were lost."""
    start = OLD + 5_000_000  # S runs 5,000 s behind everyone else: stale under MAX_AGE
    p = ref.RefProducer(P, host="push", start_ms=start)
    a = ref.RefProducer(A, start_ms=start + 100)
    b = ref.RefProducer(B, start_ms=start + 200)
    m = ref.RefProducer(M, checksum_type=ref.MD5, start_ms=start + 300)
    s = ref.RefProducer(S, start_ms=OLD)
    out: list[tuple[int, ref.Rec]] = []
    at = [0]

    def emit(*groups, fresh: bool = False, skip: int = 0) -> None:
        at[0] += skip  # the offsets of records lost (or compacted away) before these
        for r in ref.flatten(*groups):
            out.append((at[0], r.replace(broker_ts=NOW) if fresh else r))
            at[0] += 1

    def garbage(label: str, key: bytes | None = b"\x00k-garbage") -> ref.Rec:
        return ref.Rec(key, b"\x17\x0e not an envelope", [], NOW, label=label, broker_ts=NOW)

    emit(p.start_of_push(), s.put(b"s", b"1"), s.put(b"s", b"2"), s.put(b"s", b"3"))
    emit(a.put(b"a", b"1"), a.put(b"a", b"2"), m.put(b"m", b"x" * 23), b.put(b"b", b"1"))
    emit([ref.heartbeat(start + 10)])
    # S is stale now (B is newest) but expires at the next checkpoint only: this record of it is fine
    emit(s.put(b"s", b"4"), m.put(b"m", b"y" * 41))
    emit(p.control(ref.SOIP, {"version": "inc-1"}))  # a checkpoint: S expires
    emit(s.put(b"s", b"5"), fresh=True)  # UNREGISTERED_PRODUCER (fatal)
    lost = a.put(b"a", b"lost")
    emit(a.put(b"a", b"3"), fresh=True, skip=len(lost))  # MISSING (fatal)
    lost = a.put(b"a", b"compacted")
    emit(a.put(b"a", b"4"), m.put(b"m", b"z" * 7), skip=len(lost))  # an old gap: compaction tolerates it
    emit(b.end_segment(checksum=b"\x00" * 8), fresh=True)  # CORRUPT (fatal)
    dup = a.put(b"a", b"5")
    emit(dup, dup, fresh=True)  # DUPLICATE
    a.put(b"a", b"unreadable")  # lost: an undecodable record stands where it was
    emit([garbage("explains")], a.put(b"a", b"6"), fresh=True)  # EXPLAINED_BY_UNDECODABLE
    lost = a.put(b"a", b"l1") + a.put(b"a", b"l2")
    a.put(b"a", b"l3")  # lost, offset and all
    emit([garbage("too few")], fresh=True, skip=len(lost))
    emit(a.put(b"a", b"7"), fresh=True)  # MISSING: three lost, one undecodable in between
    emit([ref.heartbeat(start + 20)], m.put(b"m", b"w" * 64))
    emit(b.put(b"b", b"2"), b.end_segment())
    b.open = True  # the producer writes on after its EndOfSegment
    emit(b.put(b"b", b"after-end"), fresh=True)  # DATA_AFTER_SEGMENT_END (fatal)
    emit([garbage("keyless", key=None)])
    emit(p.end_of_push(), p.end_segment(final=True), m.put(b"m", b"v" * 5))
    lost = a.put(b"a", b"lost-after-eop") + a.put(b"a", b"lost-after-eop")
    emit(a.put(b"a", b"8"), fresh=True, skip=len(lost))  # MISSING (a warning after End of Push)
    emit(b.end_segment())
    dup = b.put(b"b", b"3")
    emit(dup, [ref.heartbeat(start + 30)], dup, fresh=True)  # DUPLICATE (a warning)
    n = ref.RefProducer(N, start_ms=start + 400)
    n.put(b"n", b"0"), n.end_segment()  # segment 0 never seen: joining at segment 1 is fine after EOP
    emit(n.put(b"n", b"1"), m.put(b"m", b"u" * 3), m.end_segment(), a.end_segment(), fresh=True)
    return out


def write(directory: str | os.PathLike) -> str:
    """The partition as partition 0 of the VT and of the RT, in one archive directory; returns it."""
    records = faulty_partition()
    ref.write_archive(directory, VT, 0, records)
    ref.write_archive(directory, RT, 0, records)
    return os.fspath(directory)
