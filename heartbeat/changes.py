"""Change capture without per-record offset vectors: which VT records a client must see, each change exactly once.

A change-capture client (a cache, a search index, an ETL) reads one region's version topic and must see every
change once, although the VT holds duplicates: the broker redelivers a record, a new leader re-produces what its
predecessor wrote after the last heartbeat, a client restarts from an older checkpoint, and a new version's VT
replays the real-time topics from a rewind point. Venice dropped such duplicates with per-record offset vectors;
it stopped writing them, and its changelog consumer is at-least-once since. This module is the exact filter that
heartbeats make possible again (docs/design.md, "Change capture"). It is the one home of the rule: the consumer
API, `tidegauge changes` and the watch all drive it, record by record (`ChangeFilter.step`) or over Arrow-sized
numpy batches (`ChangeFilter.step_batch`, the same answers), so they deliver the same set.

The rule, per VT partition: every change record names the RT write it came from in its leader footer, the
*coordinate* (source region r, RT position q). Keep a mark W[r] per source region. A change is NEW iff q > W[r],
and then raises W[r] to q; any other change is a duplicate, counted and never delivered. A heartbeat raises W to
the componentwise maximum of W and its `hbw` vector. Before End of Push the records are the version's bulk load and
carry no coordinate: delivered once as the initial snapshot by a reader that starts the version with no earlier
state, skipped by one that follows it from an older version (they restate what it delivered).

It is exact because one leader consumes each RT in order: along a VT, the positions of one source region rise
within a leader term, and a new term re-produces only positions above the last heartbeat's vector, which the
reader already passed. Positions of *different* regions are unrelated, which is why W is per region and why no
single number or total order of vectors can replace it (design.md gives the counterexample for Venice's old
lexicographic comparison).

Entry points (pure: no Kafka, no Spark, no I/O):

- `Item` (position, role, region, rt_position, vector): what the rule reads of a record; `item(record, chunked)`
  makes one from `div.records`' one record loop, `role_of`/`ROLE_BY_KIND` map a `div.records.Kind` to its `Role`.
- `ChangeFilter`: the state machine of one partition; `Verdict` says what became of each record.
- `PartitionState` / `ChangeState`: the state to keep (per partition: next VT position, phase, W), as versioned
  bytes (`ChangeState.to_bytes` / `from_bytes`, a strict decoder raising `StateError`).
- `follow` / `swap_start`: reading version N+1 with the state of version N; `restore`: the state at a VT position
  when only the position was kept.
- `from_cut` (and `CutStart`, the same fold fed one record at a time): the state a reader starts from at a
  consistent cut C (`heartbeat.cuts`): only the changes above the cut, each once, no bulk load, W = C.
- `LogId`: which version topic a state was written for (its first record after End of Push), so that a state
  given with another region's VT is refused instead of resumed.

Why `swap_start` and `restore` fold coordinates instead of starting from a heartbeat alone: a heartbeat's vector
holds only *acknowledged* positions (rule 3), while the leader keeps producing; records before a heartbeat H may
carry positions above H's vector. So "start after the last heartbeat whose vector is ≤ W" can skip a change that
W does not cover, and "W of the last heartbeat, folded with the records after it" can miss a position the reader
had delivered; tests/heartbeat/test_changes_properties.py shows both failing on generated histories.

Starting at a cut is the same question (docs/design.md, "Consistent cuts"): a reader that resumes at time T
(a cache restored from a snapshot taken at T) must get exactly the changes above the cut C, the RT positions of T.
W = C says which changes are above it. Where to start cannot come from the cut's heartbeats alone: the *floor* (the
last heartbeat whose vector is <= C) has every record before it at or below the cut only where vectors hold every
send before the heartbeat; a lagging vector leaves later positions before it, so "start at floor" skips them. So
`from_cut` folds the records' coordinates from the version's first record with W = C (the bulk load skipped, as
a version followed from an older one skips it) and stops before the first record a reader must see: a change above
the cut (with the chunks waiting for it: they go with their change), or a record it cannot place (undecodable, or
naming no region of the store: possibly above the cut, so reported by the reader, never skipped). That start is
the floor or later where vectors are exact, and earlier where they lag. Heartbeats passed on the way are not kept
in W: by rule 3 a heartbeat whose vector exceeds C has every change up to its vector before it, and the fold has
met no change above C, so such a heartbeat adds nothing a reader needs and W = C is exact. Duplicates after a
failover are the rule's business as always: a re-produced copy of a change above the cut comes after its first
copy, which the start is before. Precondition, as for a version swap: the version's replay must start at or below
the cut (its rewind point <= C + 1 in every region); changes between the rewind point and the cut are in the bulk
load, without coordinates, and no reader of this version can deliver them alone.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from div import keys
from div.avro_bits import read_long, write_long
from div.heartbeat_headers import HBW_HEADER, HeaderError, decode_hbw, header_value
from div.records import Kind, Record, footer_source


class Role(IntEnum):
    """What a VT record is to change capture. Small integers: a batch carries them as an int8 column."""

    CHANGE = 0  # a Put, Delete or Update of a user key, or a chunked value's manifest: one change
    PART = 1  # a chunk, or a Delete that cleans up a replaced value's chunks: goes with its change
    HEARTBEAT = 2  # a VT heartbeat; its `hbw` vector (if any) raises the marks
    END_OF_PUSH = 3  # the bulk load ends here
    UNDECODABLE = 4  # not a Venice record, or a heartbeat whose hbw header is damaged
    OTHER = 5  # every other control message, Global-RT-DIV records: nothing to deliver


class Verdict(IntEnum):
    """What became of one record. NEW and SNAPSHOT are delivered (`DELIVERED`); nothing else ever is."""

    NEW = 0  # a change seen for the first time
    SNAPSHOT = 1  # the bulk load of a version read with no earlier state
    BELOW_RECORD = 2  # duplicate: a change of its region at this position or later was read before
    BELOW_HEARTBEAT = 3  # duplicate: only a heartbeat's vector covered it
    BULK_SKIPPED = 4  # the bulk load of a version followed from an older one: restates what was delivered
    NO_COORDINATE = 5  # a change after End of Push whose footer names no region of the store or no position
    UNDECODABLE = 6
    PART = 7  # a chunk or chunk cleanup: delivered or not with the change it belongs to
    PASS = 8  # heartbeats and control messages


class Phase(IntEnum):
    """Where a partition's reader stands in its version."""

    SNAPSHOT = 0  # in the bulk load of a version started with no earlier state: deliver it
    SKIP_BULK = 1  # in the bulk load of a version followed from an older one: skip it
    ONLINE = 2  # after End of Push: the rule


DELIVERED = frozenset({Verdict.NEW, Verdict.SNAPSHOT})
DUPLICATES = frozenset({Verdict.BELOW_RECORD, Verdict.BELOW_HEARTBEAT})

# div.records.Kind → Role, as a table a batch can index with its int8 kind column
ROLE_BY_KIND = np.full(max(Kind) + 1, Role.OTHER, dtype=np.int8)
for _k in (Kind.PUT, Kind.DELETE, Kind.UPDATE, Kind.MANIFEST):
    ROLE_BY_KIND[_k] = Role.CHANGE
ROLE_BY_KIND[Kind.CHUNK] = Role.PART
ROLE_BY_KIND[Kind.HEARTBEAT] = Role.HEARTBEAT
ROLE_BY_KIND[Kind.END_OF_PUSH] = Role.END_OF_PUSH
ROLE_BY_KIND[Kind.UNDECODABLE] = Role.UNDECODABLE
ROLE_BY_KIND.setflags(write=False)


def role_of(kind: Kind | int, key: bytes | None = None, chunked: bool = False) -> Role:
    """The role of a record of `div.records.Kind` `kind`. In a chunked version (its StartOfPush says
    `chunked`), a Put or Delete whose key content does not end with the value suffix `02 00` is under a chunk
    key: the cleanup Venice writes after a replaced chunked value, with the new value's footer. It is part of that
    change, not a second copy of it."""
    role = Role(ROLE_BY_KIND[kind])
    if chunked and role is Role.CHANGE and kind in (Kind.PUT, Kind.DELETE):
        if key is not None and not key[1:].endswith(keys.NON_CHUNK_SUFFIX):
            return Role.PART
    return role


class Item(NamedTuple):
    """What the rule reads of one VT record: its VT position and role; for a change (or a part) the footer's
    coordinate (region, rt_position; -1 when absent); for a heartbeat its `hbw` vector (None for a plain Venice
    one)."""

    position: int
    role: int
    region: int = -1
    rt_position: int = -1
    vector: tuple[int, ...] | None = None


def item(record: Record, *, chunked: bool = False, kind: Kind | None = None) -> Item:
    """The `Item` of a record from `div.records.iter_records` (`chunked`: the version's StartOfPush says so).

    The coordinate is `div.records.footer_source`'s reading (Venice's position fallback), the vector the `hbw`
    header's. A heartbeat whose `hbw` cannot be decoded is UNDECODABLE: counted, and its claim is not used.
    """
    if record.offset is None:
        raise ValueError("change capture needs each record's VT offset (the batch has no offset column)")
    kind = record.kind if kind is None else kind  # `kind`: the record's, when the caller has it already
    role = role_of(kind, record.key, chunked)
    if role is Role.CHANGE or role is Role.PART:
        source = footer_source(record.env) if record.env is not None else None
        if source is not None:
            return Item(record.offset, role, source[0], source[1])
    elif role is Role.HEARTBEAT:
        raw = header_value(record.headers, HBW_HEADER)
        if raw is not None:
            try:
                vector = tuple(decode_hbw(raw).high_watermarks)
            except HeaderError:
                return Item(record.offset, Role.UNDECODABLE)
            return Item(record.offset, role, vector=vector)
    return Item(record.offset, role)


class LogId(NamedTuple):
    """Which version topic partition a state was written for: the VT offset of the partition's first record after
    End of Push that another producer than End of Push's wrote, and 8 bytes of the SHA-256 of that record's key
    and value (`log_digest`).

    Why this record: it is the first one a region's own leader (or controller) writes. The bulk load, End of Push
    and the push job's records after it (its EndOfSegment) can be byte-identical in every region; the leader's
    first record carries its own producer GUID and times (in Venice and in the simulator, its StartOfSegment: a
    control message, whose unique key compaction never removes). It is known soon after a reader passes End of
    Push, and it stays at its offset with its bytes when the log moves (an archive copied, archived from Kafka,
    read back). One fetch of one record checks it. Where it is gone (retention) the identity cannot be checked,
    and the reader says so. A state that had none (format 1, or saved before that record) takes the first record
    the next run reads instead: any record of the log, kept with its offset, names the log."""

    offset: int
    digest: bytes


def log_digest(key: bytes | None, value: bytes | None) -> bytes:
    """`LogId.digest` of a record: 8 bytes of SHA-256 over its key (length-prefixed) and value."""
    k, v = key or b"", value or b""
    return hashlib.sha256(len(k).to_bytes(4, "big") + k + v).digest()[:8]


@dataclass(frozen=True)
class PartitionState:
    """One partition's reader state: `position` the next VT position to read, `phase`, `marks` (W, one per source
    region of the store, -1 = nothing yet) and `seen` (per region the highest position of a change read, ≤ marks;
    kept only to tell a duplicate below a record from one below a heartbeat). `chunked`: the version's
    StartOfPush said its values may be chunked (then every data key ends with a chunk suffix); a reader that
    resumes past the StartOfPush learns it from here. `ended`: the reader has read the version's VersionSwap
    message, its end (only then may it follow the next version: `ChangeState.follow`). `log_id`: the VT it was
    written for (`LogId`), once the reader has passed End of Push; None before, and in states written before
    format 2."""

    position: int
    phase: Phase
    marks: tuple[int, ...]
    seen: tuple[int, ...]
    chunked: bool = False
    ended: bool = False
    log_id: LogId | None = None

    def __post_init__(self) -> None:
        if self.position < 0:
            raise ValueError(f"position {self.position} is negative")
        if len(self.marks) != len(self.seen) or not self.marks:
            raise ValueError(f"marks {self.marks} and seen {self.seen} must have one entry per region")
        if any(s < -1 or s > m for m, s in zip(self.marks, self.seen, strict=True)):
            raise ValueError(f"seen {self.seen} must lie between -1 and marks {self.marks}")
        object.__setattr__(self, "phase", Phase(self.phase))

    @classmethod
    def fresh(cls, n_regions: int) -> PartitionState:
        """A reader with no earlier state: from the start of the version, its bulk load delivered as a snapshot."""
        if n_regions < 1:
            raise ValueError(f"n_regions must be at least 1, got {n_regions}")
        return cls(0, Phase.SNAPSHOT, (-1,) * n_regions, (-1,) * n_regions)

    def follow(self) -> PartitionState:
        """The state to read the next version with (version swap): the marks kept, from the new version's start,
        its bulk load skipped. A reader still inside the old version's snapshot has no marks to keep: it takes
        the new version's snapshot instead, as a reader with no earlier state would."""
        if self.phase is Phase.SNAPSHOT:
            return PartitionState.fresh(len(self.marks))
        # chunking: the new StartOfPush's; the log: the new version's VT
        return PartitionState(0, Phase.SKIP_BULK, self.marks, self.seen)


# Verdicts and roles as plain ints: `step` runs once per record.
_NEW, _SNAPSHOT, _BELOW_RECORD, _BELOW_HEARTBEAT = 0, 1, 2, 3
_BULK_SKIPPED, _NO_COORDINATE, _UNDECODABLE, _PART, _PASS = 4, 5, 6, 7, 8
_CHANGE, _R_PART, _HEARTBEAT, _END_OF_PUSH, _R_UNDECODABLE = 0, 1, 2, 3, 4
_ONLINE = Phase.ONLINE
_VERDICTS = tuple(Verdict)
_N_VERDICTS = len(_VERDICTS)


class ChangeFilter:
    """The rule for one VT partition, fed its records once each in VT order from the state's position (gaps
    are fine: compaction, transaction markers). `step` takes one `Item`, `step_batch` many at once as arrays;
    both give the same verdicts and leave the same state. `counts` adds up the verdicts since construction."""

    __slots__ = ("n_regions", "position", "phase", "_marks", "_seen", "_counts")

    def __init__(self, state: PartitionState) -> None:
        self.n_regions = len(state.marks)
        self.position = state.position
        self.phase = state.phase
        self._marks = list(state.marks)
        self._seen = list(state.seen)
        self._counts = [0] * _N_VERDICTS

    @classmethod
    def fresh(cls, n_regions: int) -> ChangeFilter:
        return cls(PartitionState.fresh(n_regions))

    def state(self) -> PartitionState:
        return PartitionState(self.position, self.phase, tuple(self._marks), tuple(self._seen))

    @property
    def marks(self) -> tuple[int, ...]:
        return tuple(self._marks)

    @property
    def counts(self) -> dict[Verdict, int]:
        """How many records got each verdict (verdicts never given are left out)."""
        return {_VERDICTS[v]: n for v, n in enumerate(self._counts) if n}

    def _check_order(self, position: int) -> None:
        if position < self.position:
            raise ValueError(
                f"VT position {position} is before the next one to read ({self.position}): records are fed "
                f"once each, in VT order"
            )

    def step(self, it: Item) -> Verdict:
        """The verdict on one record, and the state moved past it."""
        position, role, region, rt_position, vector = it
        if position < self.position:
            self._check_order(position)
        self.position = position + 1
        if role == _CHANGE:
            if self.phase is not _ONLINE:
                v = _SNAPSHOT if self.phase is Phase.SNAPSHOT else _BULK_SKIPPED
            elif 0 <= region < self.n_regions and rt_position >= 0:
                if rt_position > self._marks[region]:
                    self._marks[region] = rt_position
                    self._seen[region] = rt_position
                    v = _NEW
                elif rt_position <= self._seen[region]:
                    v = _BELOW_RECORD
                else:
                    self._seen[region] = rt_position
                    v = _BELOW_HEARTBEAT
            else:
                v = _NO_COORDINATE
        elif role == _HEARTBEAT:
            if vector:
                marks = self._marks
                for r, mark in enumerate(vector[: self.n_regions]):
                    if mark > marks[r]:
                        marks[r] = mark
            v = _PASS
        elif role == _END_OF_PUSH:
            self.phase = _ONLINE
            v = _PASS
        elif role == _R_PART:
            v = _PART
        elif role == _R_UNDECODABLE:
            v = _UNDECODABLE
        else:
            v = _PASS
        self._counts[v] += 1
        return _VERDICTS[v]

    def step_batch(
        self,
        positions: Sequence[int] | np.ndarray,
        roles: Sequence[int] | np.ndarray,
        regions: Sequence[int] | np.ndarray,
        rt_positions: Sequence[int] | np.ndarray,
        vectors: np.ndarray | None = None,
    ) -> np.ndarray:
        """`step` over many records at once: int8 verdicts, one per row. `vectors` is an (n, width) int64 array
        whose heartbeat rows hold their `hbw` vectors (-1 padded; other rows are ignored; see `vector_matrix`).

        W[r] after a row is the running maximum of W[r] before the batch and the row contributions (a change's
        position in its region's column, a heartbeat's whole vector), so one cumulative maximum per region column
        gives every row the mark it is compared with; the same for `seen` with changes only.
        """
        pos = np.asarray(positions, dtype=np.int64)
        n = len(pos)
        out = np.full(n, _PASS, dtype=np.int8)
        if n == 0:
            return out
        self._check_order(int(pos[0]))
        if n > 1 and not bool(np.all(pos[1:] > pos[:-1])):
            bad = int(np.flatnonzero(pos[1:] <= pos[:-1])[0])
            raise ValueError(
                f"VT position {int(pos[bad + 1])} follows {int(pos[bad])}: records are fed once each, in VT order"
            )
        role = np.asarray(roles, dtype=np.int8)
        region = np.asarray(regions, dtype=np.int64)
        rt = np.asarray(rt_positions, dtype=np.int64)
        out[role == _R_PART] = _PART
        out[role == _R_UNDECODABLE] = _UNDECODABLE
        change = role == _CHANGE
        online_from = 0
        if self.phase is not _ONLINE:
            eops = np.flatnonzero(role == _END_OF_PUSH)
            online_from = int(eops[0]) + 1 if len(eops) else n
            bulk = np.flatnonzero(change[:online_from])
            out[bulk] = _SNAPSHOT if self.phase is Phase.SNAPSHOT else _BULK_SKIPPED
            if len(eops):
                self.phase = _ONLINE
        online = change.copy()
        online[:online_from] = False
        nr = self.n_regions
        valid = online & (region >= 0) & (region < nr) & (rt >= 0)
        out[online & ~valid] = _NO_COORDINATE
        heartbeat = role == _HEARTBEAT
        if vectors is not None and heartbeat.any():
            vec = np.asarray(vectors, dtype=np.int64)
            if vec.ndim != 2 or vec.shape[0] != n:
                raise ValueError(f"vectors must be an (n, width) array with n = {n} rows, got {vec.shape}")
        else:
            heartbeat = np.zeros(n, dtype=bool)
        # Only rows that move a mark take part: changes with a coordinate and heartbeats with a vector.
        rows = np.flatnonzero(valid | heartbeat)
        if len(rows):
            is_change = valid[rows]
            c_rows = np.flatnonzero(is_change)
            c_region = region[rows[c_rows]]
            c_rt = rt[rows[c_rows]]
            contrib = np.full((len(rows) + 1, nr), -1, dtype=np.int64)
            contrib[0] = self._marks
            h_rows = np.flatnonzero(~is_change)
            if len(h_rows):
                width = min(vec.shape[1], nr)
                contrib[h_rows + 1, :width] = vec[rows[h_rows], :width]
            contrib[c_rows + 1, c_region] = c_rt
            marks = np.maximum.accumulate(contrib, axis=0)
            seen_contrib = np.full((len(c_rows) + 1, nr), -1, dtype=np.int64)
            seen_contrib[0] = self._seen
            seen_contrib[np.arange(1, len(c_rows) + 1), c_region] = c_rt
            seen = np.maximum.accumulate(seen_contrib, axis=0)
            before = marks[c_rows, c_region]  # row i of `marks` holds W before contribution i
            seen_before = seen[np.arange(len(c_rows)), c_region]
            new = c_rt > before
            below_record = ~new & (c_rt <= seen_before)
            verdict = np.where(new, _NEW, np.where(below_record, _BELOW_RECORD, _BELOW_HEARTBEAT))
            out[rows[c_rows]] = verdict
            self._marks = [int(x) for x in marks[-1]]
            self._seen = [int(x) for x in seen[-1]]
        self.position = int(pos[-1]) + 1
        for v, c in enumerate(np.bincount(out, minlength=_N_VERDICTS).tolist()):
            self._counts[v] += c
        return out


def vector_matrix(vectors: Sequence[Sequence[int] | None], width: int) -> np.ndarray:
    """An (n, width) int64 array of optional vectors (e.g. the `hbw` column of a decoded batch as Python lists),
    -1 where a row has none or is shorter, cut at `width` where longer: `step_batch`'s `vectors`."""
    out = np.full((len(vectors), width), -1, dtype=np.int64)
    for i, vec in enumerate(vectors):
        if vec:
            k = min(len(vec), width)
            out[i, :k] = vec[:k]
    return out


def swap_start(items: Iterable[Item], state: PartitionState) -> tuple[PartitionState, dict[Verdict, int]]:
    """Where a reader of version N (`state`, its state there) starts in version N+1, given N+1's records from its
    first one: `state.follow()` moved over every record it would drop without delivering (the bulk load,
    duplicates of what it delivered, parts, heartbeats), up to the first that is delivered or must be reported
    (NO_COORDINATE, UNDECODABLE). Returns that state and the verdicts of the records it moved over. Reading on from
    it delivers exactly what reading from the version's start would: it is the same rule, run without output.

    A heartbeat alone cannot give this start (see the module docstring). For the start to be exact, N+1's replay
    must begin no later than W: every change of N+1's bulk load must be one the reader already delivered from N;
    a reader following a version when it meets its VersionSwap message at the end of N has that.
    """
    f = ChangeFilter(state.follow())
    for it in items:
        if it.position < f.position:
            continue
        before = f.state()
        v = f.step(it)
        if v in DELIVERED or v is Verdict.NO_COORDINATE or v is Verdict.UNDECODABLE:
            counts = f.counts
            counts[v] -= 1
            return before, {k: c for k, c in counts.items() if c}
    return f.state(), f.counts


def restore(items: Iterable[Item], position: int, n_regions: int) -> PartitionState:
    """The state of a reader at VT `position` when only the position was kept: the rule run without output over
    the version's records before `position`, from its first record (`items`; later ones are ignored).

    Exact for a reader that read this version from its start (with no earlier state). A reader that came to this
    version from an older one also had the older version's marks, which this version's records before `position`
    need not cover; restore its state from what it stored instead.
    """
    f = ChangeFilter.fresh(n_regions)
    for it in items:
        if it.position >= position:
            break
        f.step(it)
    return PartitionState(position, f.phase, f.marks, tuple(f._seen))


# -- starting at a consistent cut -----------------------------------------------------------------------------------


def cut_marks(cut: Sequence[int], n_regions: int) -> tuple[int, ...]:
    """C as W for a store of `n_regions` regions: a region the cut does not name has nothing in it (-1). Raises
    ValueError when the cut names a region outside the store with a position (it is another store's cut)."""
    extra = [r for r in range(n_regions, len(cut)) if cut[r] >= 0]
    if extra:
        raise ValueError(f"the cut names region(s) {extra}, outside a store of {n_regions} regions")
    return tuple(int(cut[r]) if r < len(cut) else -1 for r in range(n_regions))


def cut_state(cut: Sequence[int], n_regions: int) -> PartitionState:
    """The state that reads a version from its first record as a reader resuming at cut C: W = C, the bulk load
    skipped (it is the state before the version's online writes, not the state at the cut). Reading the whole
    version from it delivers exactly the changes above the cut; `from_cut` finds where to start instead of 0."""
    return PartitionState(0, Phase.SKIP_BULK, cut_marks(cut, n_regions), (-1,) * n_regions)


class CutStart:
    """`from_cut`'s fold, fed one record at a time (a stream cannot look back): `step` each record in VT order
    from the version's first; once it returns True, `state()` is where a reader starts (possibly before the record
    just fed: chunks waiting for their change go with it). Before that, `state()` is a state to resume the fold
    from: no change above the cut lies before its position."""

    __slots__ = ("cut", "filter", "found", "_parts_from", "_parts_phase", "_start", "_phase", "_counts")

    def __init__(self, cut: Sequence[int], n_regions: int) -> None:
        start = cut_state(cut, n_regions)
        self.cut = start.marks
        self.filter = ChangeFilter(start)
        self.found = False
        self._parts_from: int | None = None  # the first part waiting for its change
        self._parts_phase = start.phase
        self._start = 0
        self._phase = start.phase

    @property
    def position(self) -> int:
        """The next record the fold expects."""
        return self.filter.position

    def step(self, it: Item) -> bool:
        """Fold one record; True when the reader must start at or before it (then stop feeding)."""
        if self.found:
            raise ValueError("the start is found already: read on from state()")
        f = self.filter
        if it.position < f.position:
            return False  # read again: folded already
        phase = f.phase
        v = f.step(it)
        if v in DELIVERED or v is Verdict.NO_COORDINATE or v is Verdict.UNDECODABLE:
            self.found = True
            f._counts[v] -= 1  # it is the reader's to count
            if self._parts_from is not None:
                self._start, self._phase = self._parts_from, self._parts_phase
            else:
                self._start, self._phase = it.position, phase
            return True
        if it.role == _R_PART:
            if self._parts_from is None:
                self._parts_from, self._parts_phase = it.position, phase
        elif it.role == _CHANGE:
            self._parts_from = None
        return False

    @property
    def counts(self) -> dict[Verdict, int]:
        """The verdicts of the records folded over (nothing of them is delivered)."""
        return {v: n for v, n in self.filter.counts.items() if n}

    def state(self) -> PartitionState:
        if self.found:
            position, phase = self._start, self._phase
        elif self._parts_from is not None:
            position, phase = self._parts_from, self._parts_phase
        else:
            position, phase = self.filter.position, self.filter.phase
        return PartitionState(position, phase, self.cut, (-1,) * len(self.cut))


def from_cut(
    items: Iterable[Item], cut: Sequence[int], n_regions: int
) -> tuple[PartitionState, dict[Verdict, int]]:
    """Where a reader resuming at cut C (`cut`: C per source region of this partition) starts in a version, given
    the version's records from its first one: the position before which no change above the cut lies (module
    docstring), phase online once End of Push lies before it (no bulk load: the bulk load is not the state at the
    cut), W = C. Returns that state and the verdicts of the records folded over. Reading on from it delivers every
    change above the cut once and nothing at or below it."""
    fold = CutStart(cut, n_regions)
    for it in items:
        if fold.step(it):
            break
    return fold.state(), fold.counts


# -- the state a reader keeps ------------------------------------------------------------------------------------

MAGIC = b"TGCC"
FORMAT_VERSION = 2
READS_FORMATS = (1, 2)  # format 1: no region, no log identity (such a state resumes unchecked)
_CHUNKED_FLAG = 4  # added to a partition's phase: its version is chunked
_ENDED_FLAG = 8  # added to a partition's phase: its version's VersionSwap has been read
_LOG_ID_FLAG = 16  # added to a partition's phase: its LogId follows its marks (format 2)
_FLAGS = _CHUNKED_FLAG | _ENDED_FLAG | _LOG_ID_FLAG


class StateError(ValueError):
    """Bytes that are not a change-capture state this version reads: damaged, truncated, another format
    version, or not a state at all. The message says which."""


@dataclass(frozen=True)
class ChangeState:
    """Everything a change-capture reader keeps: the store and version it reads and, per VT partition it has read,
    its `PartitionState`. `n_regions` is the store's region count (the width of every W). `region`: the region
    whose VT it reads (None: not said; a state belongs to one region's VT, since positions and W differ between
    regions; each partition's `log_id` says which VT it was, whatever the region is called)."""

    store: str
    version: int
    n_regions: int
    partitions: Mapping[int, PartitionState] = field(default_factory=dict)
    region: int | None = None

    def __post_init__(self) -> None:
        if not self.store:
            raise ValueError("a change-capture state names its store")
        if self.version < 0 or self.n_regions < 1:
            raise ValueError(f"version {self.version} / n_regions {self.n_regions} out of range")
        if self.region is not None and self.region < 0:
            raise ValueError(f"region {self.region} is negative")
        for p, ps in self.partitions.items():
            if p < 0 or len(ps.marks) != self.n_regions:
                raise ValueError(f"partition {p}: marks {ps.marks} do not have {self.n_regions} entries")
        object.__setattr__(self, "partitions", dict(sorted(self.partitions.items())))

    def partition(self, p: int) -> PartitionState:
        """Partition p's state, or a fresh one if this state has never read it."""
        ps = self.partitions.get(p)
        return ps if ps is not None else PartitionState.fresh(self.n_regions)

    def replace(self, partitions: Mapping[int, PartitionState]) -> ChangeState:
        """This state with the given partitions' states replaced (others kept)."""
        return ChangeState(
            self.store, self.version, self.n_regions, {**self.partitions, **partitions}, self.region
        )

    def with_region(self, region: int | None) -> ChangeState:
        """This state, saying it reads region `region`'s VT."""
        return ChangeState(self.store, self.version, self.n_regions, self.partitions, region)

    def unended(self) -> list[int]:
        """The partitions this state has read without reaching their version's end (its VersionSwap message)."""
        return [p for p, ps in self.partitions.items() if not ps.ended]

    def follow(self, version: int) -> ChangeState:
        """The state to read `version` (newer than this one's) with: every partition `PartitionState.follow`ed.
        Exact once every partition has read its version's VersionSwap (`unended()` empty; the callers check)."""
        if version <= self.version:
            raise ValueError(f"cannot follow version {version} from version {self.version}: it is not newer")
        return ChangeState(
            self.store,
            version,
            self.n_regions,
            {p: ps.follow() for p, ps in self.partitions.items()},
            self.region,
        )

    def to_bytes(self) -> bytes:
        """`TGCC`, format version 2, then Avro zig-zag varints: store (length, UTF-8), version, n_regions, the
        region read (-1: not said), partition count and per partition (ascending) its id, position, phase (+4 when
        the version is chunked, +8 once its VersionSwap has been read, +16 when a log identity follows), W[0..n)
        and W[r] − seen[r] (usually 0: one byte), then the log identity when flagged (offset, 8 digest bytes); a
        big-endian CRC32 of everything before it closes the bytes. (Format 1 had no region and no identity.)"""
        body = bytearray(MAGIC)
        body.append(FORMAT_VERSION)
        name = self.store.encode("utf-8")
        body += write_long(len(name)) + name
        body += write_long(self.version) + write_long(self.n_regions)
        body += write_long(-1 if self.region is None else self.region) + write_long(len(self.partitions))
        for p, ps in self.partitions.items():
            flags = int(ps.phase) | (_CHUNKED_FLAG if ps.chunked else 0) | (_ENDED_FLAG if ps.ended else 0)
            flags |= _LOG_ID_FLAG if ps.log_id is not None else 0
            body += write_long(p) + write_long(ps.position) + write_long(flags)
            for m in ps.marks:
                body += write_long(m)
            for m, s in zip(ps.marks, ps.seen, strict=True):
                body += write_long(m - s)
            if ps.log_id is not None:
                body += write_long(ps.log_id.offset) + ps.log_id.digest
        return bytes(body) + zlib.crc32(body).to_bytes(4, "big")

    @classmethod
    def from_bytes(cls, data: bytes) -> ChangeState:
        """The state `to_bytes` wrote. Raises StateError for anything else, never returns a partial state."""
        data = bytes(data)
        if len(data) < len(MAGIC) + 5:
            raise StateError(f"change-capture state is truncated ({len(data)} bytes)")
        if data[: len(MAGIC)] != MAGIC:
            raise StateError(
                f"not a tidegauge change-capture state (starts with {data[:4]!r}, not {MAGIC!r})"
            )
        fmt = data[len(MAGIC)]
        if fmt not in READS_FORMATS:
            newer = " (written by a newer tidegauge)" if fmt > FORMAT_VERSION else ""
            raise StateError(
                f"change-capture state format version {fmt}{newer}: this tidegauge reads versions "
                f"{', '.join(map(str, READS_FORMATS))}"
            )
        body, crc = data[:-4], int.from_bytes(data[-4:], "big")
        if zlib.crc32(body) != crc:
            raise StateError("change-capture state is damaged (CRC32 mismatch): truncated or altered")
        try:
            return cls._parse(body, len(MAGIC) + 1, fmt)
        except (ValueError, UnicodeDecodeError) as exc:
            if isinstance(exc, StateError):
                raise
            raise StateError(f"change-capture state is invalid: {exc}") from None

    @classmethod
    def _parse(cls, body: bytes, i: int, fmt: int) -> ChangeState:
        def count(what: str) -> int:
            nonlocal i
            value, i = read_long(body, i)
            if value < 0:
                raise StateError(f"change-capture state is invalid: {what} {value} is negative")
            return value

        length = count("store name length")
        if i + length > len(body):
            raise StateError("change-capture state is invalid: the store name runs past the end")
        store = body[i : i + length].decode("utf-8")
        i += length
        version, n_regions = count("version"), count("region count")
        region = None
        if fmt >= 2:
            region, i = read_long(body, i)
            if region < -1:
                raise StateError(f"change-capture state is invalid: region {region}")
            region = None if region == -1 else region
        n_partitions = count("partition count")
        partitions: dict[int, PartitionState] = {}
        last = -1
        for _ in range(n_partitions):
            p = count("partition")
            if p <= last:
                raise StateError(f"change-capture state is invalid: partition {p} after {last}")
            last = p
            position, flags = count("position"), count("phase")
            phase = flags & ~(_FLAGS if fmt >= 2 else _CHUNKED_FLAG | _ENDED_FLAG)
            if phase >= len(Phase):
                raise StateError(f"change-capture state is invalid: partition {p} has unknown phase {flags}")
            marks = []
            for _ in range(n_regions):
                m, i = read_long(body, i)
                marks.append(m)
            seen = tuple(m - count("mark gap") for m in marks)
            log_id = None
            if flags & _LOG_ID_FLAG and fmt >= 2:
                at = count("log identity offset")
                if i + 8 > len(body):
                    raise StateError("change-capture state is invalid: a log identity runs past the end")
                log_id, i = LogId(at, bytes(body[i : i + 8])), i + 8
            partitions[p] = PartitionState(
                position,
                Phase(phase),
                tuple(marks),
                seen,
                bool(flags & _CHUNKED_FLAG),
                bool(flags & _ENDED_FLAG),
                log_id,
            )
        if i != len(body):
            raise StateError(
                f"change-capture state is invalid: {len(body) - i} bytes after the last partition"
            )
        return cls(store, version, n_regions, partitions, region)
