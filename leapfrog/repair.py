"""The repair rule: for one divergent key, the write that makes every region agree (issue 31).

Pure: no Spark, no Kafka, no files. `plan_key` takes each region's current record of the key (PUT, DELETE or
absent, with its value, its logical timestamp and its coordinate: the RT write its leader footer names) and,
when the real-time topics were read, the RT write each coordinate names; it returns the repair: the write to
re-emit (with the winner's own logical timestamp, so that a write made after the plan still wins, or one above it
where a region's DCR would ignore it there: "The stamp" below), the regions that need it, and why.

**The truth.**

- With the RT writes (`rt`): the write a coordinate names is the ground truth. A region whose record differs
  from the write its own footer names was **poisoned**; its record is judged as that write.
- Then the winner is what Venice's deterministic conflict resolution (DCR) picks among the (true) records.
  From Venice's code (linkedin/venice, `clients/da-vinci-client/src/main/java/com/linkedin/davinci/replication/
  merge/`), value-level timestamps:

  - `AbstractMerge.putWithRecordLevelTimestamp`: a PUT with a higher timestamp than the stored one wins, a
    lower one is ignored; on *equal* timestamps `compareAndReturn(oldValue, newValue)` decides.
  - `MergeUtils.compareAndReturn` (via `MergeByteBuffer.compareAndReturn`): a null old value (the key was
    deleted) wins, "we prefer deletes to win in the case where there is a tie"; otherwise the value with the
    higher `hashCode()` wins, and on equal hash codes the *old* value stays. `ByteBuffer.hashCode` is Java's
    `h = 1; for i from last byte down to first: h = 31*h + (signed byte)` in int32 (`java_bytes_hash`).
    Venice's own TODO there says this "is not deterministic when hash collision happens". The bytes hashed
    are the incoming RT Put's `putValue` (`ActiveActiveStoreIngestionTask` passes it to
    `MergeConflictResolver.put`) against the stored value; for an uncompressed store both are the value bytes a
    VT record carries (not checked for compressed stores).
  - `AbstractMerge.deleteWithValueLevelTimestamp`: a DELETE wins when the stored timestamp is lower *or
    equal* ("Delete wins when old and new write operation timestamps are equal").

  So: the highest logical timestamp wins; on a tie a DELETE beats any PUT; between PUTs the higher Java hash
  of the value bytes wins. (Field-level timestamps, for write-compute stores, are not modelled: records
  without a value-level timestamp are judged by their producer timestamp, as `heartbeat.change_events` reads it.)
- **Undecidable**, where DCR's answer is not the truth or depends on arrival order:
  - two PUTs with equal timestamps, different values and equal Java hashes (the order-dependent collision);
  - regions holding *the same RT write* (same coordinate) with different values, and no RT write to say
    which one is right: one of them was poisoned, and a hash tie-break would as likely spread the bad value
    (the fault pt-table-sync warns of). The RT, or an operator's `tie_break` region, decides it.
  An undecidable key gets no write (op NONE) unless `tie_break` names a region: then that region's record is
  the winner (cause `tie_break`).
- Without the RT writes, a poisoned value that beat *another* write of the same timestamp in its region (the
  true value would have lost that tie) is the only record of its coordinate: it looks exactly like a write the
  other regions missed, and the plan re-emits it (cause `missed`). Only the RT tells (`--rt`);
  `tests/leapfrog/test_repair_cycle.py` generates such keys.

**Causes** (one per key, the first that applies): `undecidable`; `tie_break`; `poisoned` (a region to fix was
shown poisoned by the RT); `lost_delete` (the winner is a DELETE a region holding a value missed); `missed`
(regions to fix hold an older write, a losing one, or nothing); `converged` (the regions agree now: no write).

**The stamp** (`Repair.logical_ts`). The repair is re-emitted through Venice's own DCR in every region, so it
carries the winner's own logical timestamp W: a region that missed the winner holds an older record and takes it,
a region holding it (or a newer write) ignores it, and a write made after the plan (stamped with the current time)
still wins. Except where a region to fix stores a *different* record at the same timestamp W that wins Venice's
tie against the winner — a poisoned value of the same RT write with the higher hash, typically, or a DELETE when
the winner is a PUT: that region's DCR would ignore the write at W (`Repair.ignored_by` names those regions). The
write is then stamped **W + 1**: the smallest timestamp that wins in every region (W is the highest timestamp any
region holds for the key, so every region's record is older), while a write made after the plan, stamped far above
W + 1, still wins over the repair. (`Repair.winner_ts` keeps W. With `tie_break` naming a region whose record is
older than another region's, the stamp is one above the highest timestamp held, so that the chosen record wins.)

The one risk of the bump: a genuine write stamped exactly W + 1 before the plan that no region held when the
plan was made (still in flight, or lost everywhere) ties with the repair at W + 1, and Venice's tie-break (a
DELETE, else the higher hash) decides between them instead of arrival order. A write at W + 1 that some region
holds makes W + 1 the highest timestamp, so the plan sees it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

PUT, DELETE, NONE = "PUT", "DELETE", "NONE"
MISSED, POISONED, LOST_DELETE, UNDECIDABLE, TIE_BREAK, CONVERGED = (
    "missed",
    "poisoned",
    "lost_delete",
    "undecidable",
    "tie_break",
    "converged",
)
CAUSES = (MISSED, POISONED, LOST_DELETE, UNDECIDABLE, TIE_BREAK, CONVERGED)


@dataclass(frozen=True)
class Record:
    """A region's current record of a key, or the RT write a coordinate names. `value` is None for a DELETE;
    `region`/`offset` the coordinate (source region, RT offset), None for a bulk-load record."""

    op: str
    value: bytes | None
    logical_ts: int
    region: int | None = None
    offset: int | None = None

    @property
    def coordinate(self) -> tuple[int, int] | None:
        if self.region is None or self.offset is None:
            return None
        return (self.region, self.offset)

    @property
    def content(self) -> tuple[str, bytes | None]:
        """What a reader of the region sees: the op and the value (a DELETE has none)."""
        return (self.op, self.value if self.op == PUT else None)


@dataclass(frozen=True)
class Repair:
    """The repair of one key. `op` NONE: no write (undecidable, or the regions agree). `regions_to_fix`: the
    regions whose record differs from the winner (for an undecidable key: empty; `undecided` names the regions
    in conflict). `poisoned`: regions the RT showed poisoned. `ignored_by`: regions of `regions_to_fix` whose
    stored record Venice's DCR would keep against the write at the winner's own timestamp (equal timestamp,
    higher hash or a stored DELETE). `logical_ts` is the timestamp to write: the winner's own (`winner_ts`),
    or one above the highest any region holds when `ignored_by` is not empty (module doc, "The stamp")."""

    op: str
    value: bytes | None
    logical_ts: int | None
    source_region: int | None
    source_offset: int | None
    regions_to_fix: tuple[int, ...]
    cause: str
    detail: str = ""
    undecided: tuple[int, ...] = ()
    poisoned: tuple[int, ...] = ()
    ignored_by: tuple[int, ...] = ()
    winner_ts: int | None = None

    @property
    def has_write(self) -> bool:
        return self.op != NONE

    @property
    def stamped_above_winner(self) -> bool:
        """Whether the write carries a timestamp above the winner's own (some region would ignore it there)."""
        return self.has_write and self.logical_ts != self.winner_ts


def java_bytes_hash(value: bytes) -> int:
    """Java's `ByteBuffer.hashCode()` of a buffer holding `value` (what Venice's `MergeUtils.compareAndReturn`
    compares): `h = 1`, then for each byte from the *last* to the first `h = 31*h + b` with b signed, in int32.

    Unrolled, that is `31**n + sum(b[i] * 31**i)` mod 2**32: above a few dozen bytes one numpy dot product
    (uint64 arithmetic wraps mod 2**64, which keeps the residue mod 2**32) is ten to thirty times faster than
    the loop, which the simulator's DCR pays on every winning write."""
    n = len(value)
    if n <= 32:
        h = 1
        for b in reversed(value):
            h = (31 * h + (b - 256 if b > 127 else b)) & 0xFFFFFFFF
    else:
        signed = np.frombuffer(value, dtype=np.int8).astype(np.uint64)  # two's complement, as Java adds it
        h = (int(np.dot(signed, _powers_of_31(n))) + pow(31, n, 1 << 32)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


_POWERS = np.ones(1, dtype=np.uint64)


def _powers_of_31(n: int) -> np.ndarray:
    """`31**i mod 2**32` for i < n (kept, doubled as longer values come)."""
    global _POWERS
    while len(_POWERS) < n:
        step = np.uint64(pow(31, len(_POWERS), 1 << 32))
        _POWERS = np.concatenate([_POWERS, (_POWERS * step) & np.uint64(0xFFFFFFFF)])
    return _POWERS[:n]


def tie_replaces(
    stored_delete: bool, stored_hash: int | None, new_delete: bool, new_hash: int | None
) -> bool:
    """Venice's tie rule on what it compares (`AbstractMerge` + `MergeUtils`), for two writes of one timestamp:
    a DELETE replaces anything (a DELETE too); a stored DELETE stays against a PUT; between PUTs the strictly
    higher Java hash of the value replaces, and equal hashes keep the stored value. The hashes of DELETEs are
    not looked at. (The simulator's DCR keeps hashes, not values: both call this.)"""
    if new_delete:
        return True
    if stored_delete:
        return False
    assert new_hash is not None and stored_hash is not None
    return new_hash > stored_hash


def dcr_put_wins_tie(old: Record, new: Record) -> bool:
    """Whether `new` replaces `old` when both have the same timestamp (`tie_replaces` on their values)."""
    if new.op == DELETE or old.op == DELETE:
        return tie_replaces(old.op == DELETE, None, new.op == DELETE, None)
    return tie_replaces(False, java_bytes_hash(old.value or b""), False, java_bytes_hash(new.value or b""))


def dcr_apply(stored: Record | None, incoming: Record) -> Record:
    """Venice's value-level merge of one incoming write into a key's stored record (None: no record, no RMD:
    the write is applied). Returns the record stored afterwards."""
    if stored is None or incoming.logical_ts > stored.logical_ts:
        return incoming
    if incoming.logical_ts < stored.logical_ts:
        return stored
    return incoming if dcr_put_wins_tie(stored, incoming) else stored


def _ambiguous(records: list[Record]) -> bool:
    """Among records of the highest timestamp: PUTs only, distinct values, and the highest hash shared by two
    distinct values, so that the one stored depends on which arrived first."""
    if any(r.op == DELETE for r in records):
        return False
    values = {r.value for r in records}
    if len(values) < 2:
        return False
    top = max(java_bytes_hash(v or b"") for v in values)
    return sum(1 for v in values if java_bytes_hash(v or b"") == top) > 1


def _tie_winner(records: list[Record]) -> Record:
    """The DCR winner among records of one timestamp (not ambiguous): a DELETE, else the highest hash. Among
    equal contents, the record of the lowest region (any would do: the write is the same)."""
    ordered = sorted(records, key=lambda r: (r.region is None, r.region or 0, r.offset or 0))
    best = ordered[0]
    for r in ordered[1:]:
        if r.content != best.content and dcr_put_wins_tie(best, r):
            best = r
    return best


def plan_key(
    current: Mapping[int, Record | None],
    rt: Mapping[tuple[int, int], Record | None] | None = None,
    tie_break: int | None = None,
) -> Repair:
    """The repair of one key from each region's current record (`current[region]`, None when the region has
    no record of the key) and, optionally, the RT writes the records' coordinates name (`rt[(region, offset)]`,
    None or missing when that write could not be read). Module doc: the rule."""
    regions = sorted(current)
    truth: dict[int, Record | None] = {}
    poisoned: list[int] = []
    for x in regions:
        rec = current[x]
        write = rt.get(rec.coordinate) if (rt is not None and rec is not None and rec.coordinate) else None
        if rec is not None and write is not None and write.content != rec.content:
            poisoned.append(x)
            rec = Record(
                write.op, write.value if write.op == PUT else None, rec.logical_ts, rec.region, rec.offset
            )
        truth[x] = rec
    present = [r for r in truth.values() if r is not None]

    def differs(x: int, winner: Record) -> bool:
        rec = current[x]
        if rec is None:
            return winner.op == PUT  # a tombstone against an absent key is consistent
        return rec.content != winner.content

    if not present:
        return Repair(NONE, None, None, None, None, (), CONVERGED, "no region holds a record of the key")
    top_ts = max(r.logical_ts for r in present)
    top = [r for r in present if r.logical_ts == top_ts]
    conflict: list[int] = []
    reason = ""
    by_coordinate: dict[tuple[int, int], set] = {}
    for r in top:
        if r.coordinate is not None:
            by_coordinate.setdefault(r.coordinate, set()).add(r.content)
    same_write = [c for c, contents in by_coordinate.items() if len(contents) > 1]
    if any(r.op == DELETE and r.coordinate not in same_write for r in top):
        same_write = []  # a DELETE of another write wins the tie whatever the same write's true value was
    if same_write:
        conflict = [x for x in regions if truth[x] is not None and truth[x].coordinate in same_write]
        c = same_write[0]
        reason = (
            f"{_regions(conflict)} hold the same RT write (region {c[0]}, offset {c[1]}) with different "
            "values: one was poisoned, and without that RT write (--rt) nothing says which"
        )
    elif _ambiguous(top):
        conflict = [x for x in regions if truth[x] is not None and truth[x].logical_ts == top_ts]
        reason = (
            f"{_regions(conflict)} hold different values at the same logical timestamp {top_ts} whose Java "
            "hashes tie: Venice keeps whichever arrived first"
        )
    if conflict:
        if tie_break is None or truth.get(tie_break) is None:
            why = "" if tie_break is None else f"; --tie-break {tie_break} holds no record of the key"
            return Repair(
                NONE, None, None, None, None, (), UNDECIDABLE, reason + why, tuple(conflict), tuple(poisoned)
            )
        winner = truth[tie_break]
        cause = TIE_BREAK
        reason = f"{reason}; region {tie_break}'s record chosen by --tie-break"
    else:
        winner = _tie_winner(top)
        cause = None
    fix = tuple(x for x in regions if differs(x, winner))
    if not fix:
        return Repair(NONE, None, None, None, None, (), CONVERGED, "every region holds the winning record")
    if cause is None:
        if any(x in poisoned for x in fix):
            cause = POISONED
        elif winner.op == DELETE:
            cause = LOST_DELETE
        else:
            cause = MISSED
        reason = _explain(cause, winner, fix, poisoned)
    ignored = tuple(
        x
        for x in fix
        if current[x] is not None and dcr_apply(current[x], winner).content == current[x].content
    )
    stamp = winner.logical_ts
    if ignored:
        # the smallest timestamp every region's DCR takes: above every record any region holds (module doc)
        stamp = max(r.logical_ts for r in present) + 1
        reason = (
            f"{reason}; stamped {stamp}, one above the highest timestamp any region holds: at the winner's own "
            f"{winner.logical_ts}, Venice's DCR in {_regions(ignored)} would keep the stored record"
        )
    return Repair(
        winner.op,
        winner.value if winner.op == PUT else None,
        stamp,
        winner.region,
        winner.offset,
        fix,
        cause,
        reason,
        (),
        tuple(poisoned),
        ignored,
        winner.logical_ts,
    )


def _regions(regions: Iterable[int], one: str = "", many: str = "") -> str:
    """`region 1 stores` / `regions 1, 2 store` (the verb as given for one region and for several)."""
    xs = list(regions)
    verb = one if len(xs) == 1 else many
    return f"{'region' if len(xs) == 1 else 'regions'} {_names(xs)}" + (f" {verb}" if verb else "")


def _names(regions: Iterable[int]) -> str:
    return ", ".join(str(x) for x in regions)


def _explain(cause: str, winner: Record, fix: tuple[int, ...], poisoned: list[int]) -> str:
    where = "a bulk-load record" if winner.coordinate is None else f"RT write {winner.region}@{winner.offset}"
    if cause == POISONED:
        bad = [x for x in fix if x in poisoned]
        return f"{_regions(bad, 'stores', 'store')} a value that differs from the RT write its record names; winner: {where}"
    if cause == LOST_DELETE:
        return f"{_regions(fix, 'still holds', 'still hold')} a value the winning DELETE ({where}) removes"
    return f"{_regions(fix, 'does not hold', 'do not hold')} the winning write ({where})"
