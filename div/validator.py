"""Consumer-side DIV: Venice's decision procedure per record (DataIntegrityValidator, PartitionTracker), one partition at a time.

`PartitionValidator.process(offset, key, env, broker_ts)` classifies one record and returns its findings. The
rules are Venice's `PartitionTracker`; where Venice has a known quirk we choose the correct behaviour, listed here
and pinned by tests (tests/div/test_div_quirks.py):

1. Resync after a post-EOP fault: Venice re-validates with `tolerate = true`, and for CORRUPT-at-EOS and
   data-after-EOS that second pass raises DUPLICATE, silently dropping the record (§3.4, §9 #2). We resync the
   state without the second classification: one finding per fault, and the segment is ended as the EOS says.
2. Fatal faults before EOP stop a Venice replica. A batch validator must go on, so it resyncs exactly as after
   EOP and marks the finding `fatal`; later records are judged against the resynced state.
3. A segment restored from a checkpoint with an ended status keeps its checksum finalized, so data after its EOS
   is still DATA_AFTER_SEGMENT_END after a restore (Venice forgets this on restart, §3.3).
4. Producer-state max age is anchored at the newest producer timestamp of the current state, not the previous
   checkpoint's (Venice lags one checkpoint, §3.6). Wall-clock time alone never expires anything.
5. After an UNREGISTERED_PRODUCER the record is resynced too (Venice leaves the segment's "new" flag set, so an
   immediate duplicate of that record would pass unnoticed).
6. A control message Venice refuses to checksum (the deprecated StartOfBufferReplay inside a checksummed
   segment: Venice's UnsupportedMessageTypeException, fatal) is reported as CORRUPT, the nearest finding type
   of the contract, with the reason in `detail`.

Heartbeat and DoL records are exempt (they reuse segment 0 / sequence 0 forever); Global-RT-DIV records (key
header 8) are validated like PUTs. Compaction tolerance (§3.4 #2) applies to version topics when
`min_compaction_lag_ms` is set: a gap is tolerated when `now - record time ≥ lag`, the record time being the
*incoming* record's broker timestamp (producer timestamp when the broker's is missing).
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple
from zlib import crc32

from . import checksum as cks
from . import envelope as E
from . import keys

UNREGISTERED_PRODUCER = "UNREGISTERED_PRODUCER"
MISSING = "MISSING"
CORRUPT = "CORRUPT"
DUPLICATE = "DUPLICATE"
DATA_AFTER_SEGMENT_END = "DATA_AFTER_SEGMENT_END"
UNDECODABLE = "UNDECODABLE"
EXPLAINED = "EXPLAINED_BY_UNDECODABLE"
FINDING_TYPES = (UNREGISTERED_PRODUCER, MISSING, CORRUPT, DUPLICATE, DATA_AFTER_SEGMENT_END)
FATAL_KINDS = frozenset({UNREGISTERED_PRODUCER, MISSING, CORRUPT, DATA_AFTER_SEGMENT_END})
# Rows that are not findings: a record that could not be read is missing evidence, not a broken log (it makes a
# run partial), and a gap or checksum mismatch that undecodable records in between can explain may be nothing but
# them. Neither is ever fatal nor counted as a finding.
NOT_FINDINGS = frozenset({UNDECODABLE, EXPLAINED})

_FAST_KIND = {E.PUT: 1, E.DELETE: 2}
_MASK64 = 0xFFFFFFFFFFFFFFFF
_INT4 = struct.Struct(">i")
_CRC_INT = {
    n: crc32(_INT4.pack(n)) for n in range(-64, 256)
}  # CRC32 of small ints (message types, schema ids)
_NO_FINDINGS: list = []
_CHECKPOINT_BYTES = 32 * 1024 * 1024  # Venice syncs offsets and DIV state every 32 MiB processed

# segmentStatus of ProducerPartitionState
NOT_STARTED, IN_PROGRESS, END_OF_INTERMEDIATE_SEGMENT, END_OF_FINAL_SEGMENT = 0, 1, 2, 3


class Finding(NamedTuple):
    offset: int
    producer_guid: bytes | None
    segment: int
    sequence: int
    type: str
    fatal: bool
    detail: str


class _Fault(Exception):
    """`needs`: how many unreadable records between the producer's last record and this one could account for the
    fault (None: none could, e.g. a duplicate); `since_start`: count them from the segment's first record instead
    (a checksum covers the whole segment)."""

    def __init__(self, kind: str, detail: str, needs: int | None = None, since_start: bool = False) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.needs = needs
        self.since_start = since_start


class Segment:
    """What a consumer knows about one producer's current segment in one partition (PartitionTracker's Segment)."""

    __slots__ = (
        "number",
        "sequence",
        "checksum",
        "debug_info",
        "aggregates",
        "registered",
        "started",
        "ended",
        "final",
        "new_segment",
        "last_producer_ts",
        "fast",
        "adhash",
        "first_offset",
        "last_offset",
    )

    def __init__(self, number: int, sequence: int, checksum: cks.Checksum) -> None:
        self.number = number
        self.sequence = sequence
        self.checksum = checksum
        self.debug_info: dict[str, str] = {}
        self.aggregates: dict[str, int] = {}
        self.registered = False
        self.started = False
        self.ended = False
        self.final = False
        self.new_segment = True
        self.last_producer_ts = -1
        self.fast = False  # the validator's fast path may decide this segment's next data record
        self.adhash = False
        # offsets of the segment's first and the producer's last record in this run (-1: none read in this run);
        # they bound the undecodable records that could explain a gap
        self.first_offset = -1
        self.last_offset = -1

    def refresh_fast(self) -> None:
        """Recompute the fast-path flags after anything but a fast-path record changed this segment."""
        ck = self.checksum
        self.adhash = ck.type == cks.ADHASH
        self.fast = (
            self.registered
            and self.started
            and not self.ended
            and not ck.finalized
            and ck.type in (cks.ADHASH, cks.NONE)
        )

    @property
    def status(self) -> int:
        if not self.started:
            return NOT_STARTED
        if not self.ended:
            return IN_PROGRESS
        return END_OF_FINAL_SEGMENT if self.final else END_OF_INTERMEDIATE_SEGMENT

    def to_state(self) -> dict:
        """This segment as Venice's ProducerPartitionState record."""
        return {
            "segmentNumber": self.number,
            "segmentStatus": self.status,
            "isRegistered": self.registered,
            "messageSequenceNumber": self.sequence,
            "messageTimestamp": self.last_producer_ts,
            "checksumType": self.checksum.type,
            "checksumState": self.checksum.state(),
            "aggregates": dict(self.aggregates),
            "debugInfo": dict(self.debug_info),
        }

    @classmethod
    def from_state(cls, state: dict) -> Segment:
        status = state["segmentStatus"]
        seg = cls(
            state["segmentNumber"],
            state["messageSequenceNumber"],
            cks.Checksum.restore(state["checksumType"], state.get("checksumState") or b""),
        )
        seg.registered = bool(state.get("isRegistered", False))
        seg.started = status != NOT_STARTED
        seg.ended = status in (END_OF_INTERMEDIATE_SEGMENT, END_OF_FINAL_SEGMENT)
        seg.final = status == END_OF_FINAL_SEGMENT
        seg.new_segment = False
        seg.last_producer_ts = state.get("messageTimestamp", -1)
        seg.aggregates = dict(state.get("aggregates") or {})
        seg.debug_info = dict(state.get("debugInfo") or {})
        if seg.ended:  # quirk decision 3: an ended segment stays ended after a restore
            seg.checksum.finalize()
        seg.refresh_fast()
        return seg

    def run_fields(self) -> list:
        """What Venice's record (`to_state`) leaves out and a later decision of this run reads: whether the
        segment's first record is still being judged (`new_segment`), the offsets that bound the undecodable records
        able to explain a fault, and whether the checksum is finalized (an unregistered segment ends without it).
        `Segment.resume(seg.to_state(), seg.run_fields())` is the same segment."""
        return [self.new_segment, self.first_offset, self.last_offset, self.checksum.finalized]

    @classmethod
    def resume(cls, state: dict, run_fields: list) -> Segment:
        """The segment `to_state()` and `run_fields()` were taken from, exactly (not a restart: see `from_state`)."""
        seg = cls.from_state(state)
        seg.new_segment, seg.first_offset, seg.last_offset, finalized = run_fields
        if not finalized and seg.checksum.finalized:
            seg.checksum = cks.Checksum.restore(state["checksumType"], state.get("checksumState") or b"")
        seg.refresh_fast()
        return seg

    def copy(self) -> Segment:
        return Segment.resume(self.to_state(), self.run_fields())


@dataclass
class ValidatorConfig:
    """Tolerances of one validator (the knobs Venice reads from topic and server configuration)."""

    min_compaction_lag_ms: int | None = None  # None: the topic is not compacted (no tolerance)
    now_ms: int | None = None  # fixed "now" for compaction tolerance (batch runs); None → wall clock
    max_age_ms: int = -1  # div.producer.state.max.age.ms; -1 disables
    tolerate_rt_gaps: bool = False  # A/A drainer on RT records (DCR may drop upstream records)


def _record_time(broker_ts: int | None, env: dict) -> int:
    if broker_ts is not None and broker_ts > 0:
        return broker_ts
    return env["producerMetadata"]["messageTimestamp"]


class PartitionValidator:
    """DIV state and decisions for one topic partition. Records must be fed in offset order."""

    def __init__(
        self,
        *,
        is_realtime: bool = False,
        config: ValidatorConfig | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.config = config or ValidatorConfig()
        self.is_realtime = is_realtime
        # An RT carries no EndOfPush: leaders read it only after the VT's EOP, so it is always "after EOP".
        self.end_of_push = is_realtime
        self.eop_offset: int | None = None
        self.segments: dict[bytes, Segment] = {}
        self._clock = clock
        self._bytes_since_checkpoint = 0
        self.records = 0  # counted by the caller (per batch) to keep the per-record path short
        self.undecodable: list[int] = []  # offsets of records that could not be decoded, in order
        # Checkpoints only matter for max-age expiry; without it, skip the per-record byte accounting.
        self._track_bytes = self.config.max_age_ms is not None and self.config.max_age_ms >= 0

    # -- state ------------------------------------------------------------------------------------
    def producer_states(self) -> dict[bytes, dict]:
        return {guid: seg.to_state() for guid, seg in self.segments.items()}

    def restore(self, producer_states: dict[bytes, dict], end_of_push: bool | None = None) -> None:
        """OFFLINE→STANDBY: load checkpointed producer states (with max-age filtering)."""
        self.segments = {guid: Segment.from_state(st) for guid, st in producer_states.items()}
        if end_of_push is not None:
            self.end_of_push = end_of_push or self.is_realtime
        self.expire_stale_producers()

    def run_state(self) -> dict:
        """The rest of this run's state, beside `producer_states()` and `end_of_push`: what Venice does not
        checkpoint but later decisions here read (End-of-Push offset, bytes since the last checkpoint for max-age
        expiry, the undecodable offsets so far and each segment's `run_fields`), JSON-ready. `resume` takes it."""
        return {
            "eop_offset": self.eop_offset,
            "bytes_since_checkpoint": self._bytes_since_checkpoint,
            "undecodable": list(self.undecodable),
            "segments": {guid.hex(): seg.run_fields() for guid, seg in self.segments.items()},
        }

    def resume(self, producer_states: dict[bytes, dict], end_of_push: bool, run_state: dict) -> None:
        """Continue a run exactly where `producer_states()`, `end_of_push` and `run_state()` were taken, as a
        streaming job does between micro-batches: the next record is judged as the uninterrupted run would judge
        it. Unlike `restore` (a replica's restart) it expires no producer: expiry happens at checkpoints only."""
        runs = run_state["segments"]
        self.segments = {guid: Segment.resume(st, runs[guid.hex()]) for guid, st in producer_states.items()}
        self.end_of_push = end_of_push
        self.eop_offset = run_state["eop_offset"]
        self._bytes_since_checkpoint = run_state["bytes_since_checkpoint"]
        self.undecodable = list(run_state["undecodable"])

    def clone_from(self, other: PartitionValidator) -> None:
        """STANDBY→LEADER: the consumer validator starts from deep copies of the drainer's states."""
        self.segments = {guid: seg.copy() for guid, seg in other.segments.items()}
        self.end_of_push = other.end_of_push
        self.eop_offset = other.eop_offset
        other_expired = self.expire_stale_producers()
        for guid in other_expired:  # Venice also deletes the stale entries from the source
            other.segments.pop(guid, None)

    def clear(self) -> None:
        """STANDBY→OFFLINE: drop in-memory state; nothing is persisted."""
        self.segments = {}

    def expire_stale_producers(self) -> list[bytes]:
        """Drop producers whose last producer timestamp is older than (newest one − max age). Data-relative."""
        max_age = self.config.max_age_ms
        if max_age is None or max_age < 0 or not self.segments:
            return []
        newest = max(seg.last_producer_ts for seg in self.segments.values())
        stale = [g for g, seg in self.segments.items() if seg.last_producer_ts < newest - max_age]
        for g in stale:
            del self.segments[g]
        return stale

    # -- classification ---------------------------------------------------------------------------
    def process(
        self, offset: int, key: bytes, env: dict, broker_ts: int | None = None, value_size: int = 0
    ) -> list[Finding]:
        """Validate one decoded record; returns its findings (usually none; never mutate the returned list)."""
        pm = env["producerMetadata"]
        name, body = env["payloadUnion"]
        fast_kind = _FAST_KIND.get(name)
        seg = self.segments.get(pm["producerGUID"])
        # (a segment that is not `fast` is never the common case: asking would cost more than it saves)
        if (
            fast_kind is not None
            and seg is not None
            and seg.fast
            and self.process_common(
                offset,
                key,
                pm["producerGUID"],
                pm["segmentNumber"],
                pm["messageSequenceNumber"],
                pm["messageTimestamp"],
                env["messageType"],
                body["schemaId"],
                body["putValue"] if fast_kind == 1 else None,
                value_size,
            )
        ):
            return _NO_FINDINGS
        return self.process_rest(offset, key, env, broker_ts, value_size)

    def process_common(
        self,
        offset: int,
        key: bytes,
        guid: bytes,
        segment: int,
        sequence: int,
        message_timestamp: int,
        message_type: int,
        schema_id: int,
        put_value: bytes | None,
        value_size: int,
    ) -> bool:
        """The common case, decided exactly as the full procedure would, from a Put's or a Delete's fields
        (`put_value` None: a Delete): the next sequence number of a known producer's open, registered ADHASH/NONE
        segment. True: the record is validated (it has no finding). False: nothing changed, and the record needs
        `process_rest` with its whole envelope. Readers that do not decode the common records into envelopes
        (`div.batch.PartitionRun`'s fast lane) call this first."""
        seg = self.segments.get(guid)
        if seg is None or not seg.fast or sequence != seg.sequence + 1 or segment != seg.number:
            return False
        if seg.adhash:
            crc = _CRC_INT.get(message_type) or crc32(_INT4.pack(message_type))
            crc += crc32(key[1:])
            if put_value is not None:
                crc += (_CRC_INT.get(schema_id) or crc32(_INT4.pack(schema_id))) + crc32(put_value)
            ck = seg.checksum
            ck._adhash = (ck._adhash + crc) & _MASK64
        seg.sequence = sequence
        seg.last_producer_ts = message_timestamp
        seg.last_offset = offset
        if self._track_bytes:
            self._count_bytes(value_size)
        return True

    def process_rest(
        self, offset: int, key: bytes, env: dict, broker_ts: int | None = None, value_size: int = 0
    ) -> list[Finding]:
        """`process` for a record `process_common` did not take (or was not offered)."""
        findings = self._process_slow(offset, key, env, broker_ts, value_size)
        seg = self.segments.get(env["producerMetadata"]["producerGUID"])
        if seg is not None:
            seg.refresh_fast()
        return findings

    def _count_bytes(self, value_size: int) -> None:
        self._bytes_since_checkpoint += value_size
        if self._bytes_since_checkpoint >= _CHECKPOINT_BYTES:
            self.checkpoint()

    def _process_slow(
        self, offset: int, key: bytes, env: dict, broker_ts: int | None, value_size: int
    ) -> list[Finding]:
        if keys.is_div_exempt(key):
            return []
        kind = E.payload_kind(env)
        ctype = E.control_type(env) if kind == "CONTROL" else None
        eop = self.end_of_push
        findings: list[Finding] = []
        pm = env["producerMetadata"]
        before = self.segments.get(pm["producerGUID"])
        bounds = (before.first_offset, before.last_offset) if before is not None else None
        try:
            self._validate(offset, key, env, kind, ctype, eop, broker_ts)
        except _Fault as fault:
            kind_, fatal, detail = fault.kind, fault.kind in FATAL_KINDS and not eop, fault.detail
            unread = self._unreadable_between(fault, bounds, offset)
            if unread:
                kind_, fatal = EXPLAINED, False
                shown = ", ".join(str(o) for o in unread[:5]) + (", ..." if len(unread) > 5 else "")
                detail = (
                    f"{fault.kind} explained: {detail}; {len(unread)} undecodable record(s) in between "
                    f"(offsets {shown}) may hold what is missing"
                )
            findings.append(
                Finding(
                    offset,
                    pm["producerGUID"],
                    pm["segmentNumber"],
                    pm["messageSequenceNumber"],
                    kind_,
                    fatal,
                    detail,
                )
            )
            if fault.kind != DUPLICATE:
                self._resync(offset, key, env, kind, ctype, broker_ts)
        seg = self.segments.get(pm["producerGUID"])
        if seg is not None:
            if seg is not before or seg.first_offset < 0:
                seg.first_offset = offset
            seg.last_offset = offset
        if kind == "CONTROL":
            if ctype == E.END_OF_PUSH and not self.is_realtime:
                self.end_of_push = True
                if self.eop_offset is None:
                    self.eop_offset = offset
            if ctype not in (E.START_OF_SEGMENT, E.END_OF_SEGMENT):
                self.checkpoint()  # Venice syncs offsets and DIV state after other control messages
        if self._track_bytes:
            self._count_bytes(value_size)
        return findings

    def note_undecodable(self, offset: int) -> None:
        """A record of this partition that could not be decoded (offsets arrive in order)."""
        self.undecodable.append(offset)

    def _unreadable_between(self, fault: _Fault, bounds: tuple[int, int] | None, offset: int) -> list[int]:
        """The undecodable offsets that can explain `fault` at `offset`, or [] when they cannot."""
        if fault.needs is None or not self.undecodable:
            return []
        first, last = bounds if bounds is not None else (-1, -1)
        # -1: no record of the producer (or its segment) was read in this run: its StartOfSegment, or what the
        # restored state was missing, may be any unreadable record so far
        low = first if fault.since_start else last
        i = bisect.bisect_right(self.undecodable, low)
        j = bisect.bisect_left(self.undecodable, offset)
        between = self.undecodable[i:j]
        return between if len(between) >= fault.needs else []

    def checkpoint(self) -> None:
        self._bytes_since_checkpoint = 0
        self.expire_stale_producers()

    def _now(self) -> int:
        if self.config.now_ms is not None:
            return self.config.now_ms
        if self._clock is not None:
            return self._clock()
        import time

        return int(time.time() * 1000)

    def _tolerate_fn(self, env: dict, broker_ts: int | None) -> Callable[[], bool]:
        cache: list[bool] = []

        def tolerate() -> bool:
            if not cache:
                ok = False
                if self.is_realtime:
                    ok = self.config.tolerate_rt_gaps
                elif self.config.min_compaction_lag_ms is not None and self.config.min_compaction_lag_ms >= 0:
                    ok = self._now() - _record_time(broker_ts, env) >= self.config.min_compaction_lag_ms
                cache.append(ok)
            return cache[0]

        return tolerate

    def _resync(self, offset, key, env, kind, ctype, broker_ts) -> None:
        try:
            self._validate(offset, key, env, kind, ctype, True, broker_ts, always_tolerate=True)
        except _Fault:
            pass  # quirk decision 1: no second classification

    def _validate(self, offset, key, env, kind, ctype, eop, broker_ts, always_tolerate=False) -> None:
        pm = env["producerMetadata"]
        guid = pm["producerGUID"]
        tolerate = (lambda: True) if always_tolerate else self._tolerate_fn(env, broker_ts)
        seg = self.segments.get(guid)
        had_prev = seg is not None
        seg = self._track_segment(seg, guid, pm, env, kind, ctype, eop, tolerate)
        self._track_sequence(seg, pm, eop, had_prev, tolerate)
        self._track_checksum(seg, key, env, kind, ctype, tolerate)
        seg.new_segment = False

    def _track_segment(self, seg, guid, pm, env, kind, ctype, eop, tolerate) -> Segment:
        n = pm["segmentNumber"]
        if seg is None:
            if n != 0 and not eop:
                raise _Fault(UNREGISTERED_PRODUCER, f"unknown producer starts at segment {n}, not 0", needs=1)
            return self._init_segment(guid, pm, env, kind, ctype, eop, True)
        if n == seg.number:
            return seg
        if n == seg.number + 1 and seg.ended:
            return self._init_segment(guid, pm, env, kind, ctype, eop, False)
        if n > seg.number:
            if tolerate():
                return self._init_segment(guid, pm, env, kind, ctype, eop, True)
            reason = (
                "was not ended" if n == seg.number + 1 else f"skipped segment(s) {seg.number + 1}..{n - 1}"
            )
            # at least its EndOfSegment, and a StartOfSegment and EndOfSegment per skipped segment
            raise _Fault(
                MISSING,
                f"segment {n} after segment {seg.number}, which {reason}",
                needs=1 + 2 * (n - seg.number - 1),
            )
        raise _Fault(DUPLICATE, f"segment {n} is older than the current segment {seg.number}")

    def _init_segment(self, guid, pm, env, kind, ctype, eop, tolerate_any_type) -> Segment:
        is_sos = kind == "CONTROL" and ctype == E.START_OF_SEGMENT
        if is_sos:
            body = E.control_body(env)
            checksum = (
                cks.Checksum(body["checksumType"]) if body["checksumType"] in cks.NAMES else cks.Checksum(0)
            )
        else:
            checksum = cks.Checksum(cks.NONE)
        seq = pm["messageSequenceNumber"]
        seg = Segment(pm["segmentNumber"], seq, checksum)
        seg.started = seq > 0
        seg.new_segment = True
        seg.last_producer_ts = pm["messageTimestamp"]
        if is_sos:
            seg.debug_info = dict(env["payloadUnion"][1].get("debugInfo") or {})
            seg.aggregates = {a: 0 for a in E.control_body(env).get("upcomingAggregates") or []}
        self.segments[guid] = seg  # stored before the possible raise, as Venice does
        if not is_sos and (not eop or not tolerate_any_type):
            raise _Fault(
                UNREGISTERED_PRODUCER,
                f"segment {seg.number} begins without a StartOfSegment (sequence {seq})",
                needs=1,
            )
        seg.registered = is_sos
        return seg

    def _track_sequence(self, seg: Segment, pm, eop, had_prev, tolerate) -> None:
        prev, inc, ts = seg.sequence, pm["messageSequenceNumber"], pm["messageTimestamp"]
        if not seg.started:
            seg.started = True
            seg.last_producer_ts = ts
            return
        if inc == prev:
            if not seg.new_segment:
                raise _Fault(DUPLICATE, f"sequence {inc} was already consumed in segment {seg.number}")
            seg.last_producer_ts = ts
            return
        if inc == prev + 1:
            seg.sequence = inc
            seg.last_producer_ts = ts
            return
        if inc < prev:
            if not had_prev:
                seg.last_producer_ts = ts
                return
            raise _Fault(
                DUPLICATE, f"sequence {inc} is behind the last consumed {prev} in segment {seg.number}"
            )
        if (eop and not seg.registered) or tolerate():
            seg.sequence = inc
            seg.last_producer_ts = ts
            return
        raise _Fault(
            MISSING, f"sequence jumped from {prev} to {inc} in segment {seg.number}", needs=inc - prev - 1
        )

    def _track_checksum(self, seg: Segment, key: bytes, env, kind, ctype, tolerate) -> None:
        is_eos = kind == "CONTROL" and ctype == E.END_OF_SEGMENT
        if not seg.registered:
            if is_eos:
                body = E.control_body(env)
                seg.ended = True
                seg.final = body["finalSegment"]
            return
        if is_eos:
            self._verify_eos(seg, env, tolerate)
            return
        try:
            for f in cks.feeds(env["messageType"], kind, key[1:], E.payload(env), ctype):
                seg.checksum.update(f)
        except cks.ChecksumFinalizedError:
            if not tolerate():
                raise _Fault(DATA_AFTER_SEGMENT_END, f"data after the end of segment {seg.number}") from None
        except cks.UnsupportedMessageTypeError as exc:
            raise _Fault(CORRUPT, f"{exc} (unsupported in a checksummed segment)") from None

    def _verify_eos(self, seg: Segment, env, tolerate) -> None:
        body = E.control_body(env)
        final = body["finalSegment"]
        expected = seg.checksum.finalize()  # a repeated EOS is compared with the same finalized value
        if expected == bytes(body["checksumValue"]) or tolerate():
            seg.ended = True
            seg.final = final
            return
        seg.ended = True
        seg.final = final
        raise _Fault(
            CORRUPT,
            f"segment {seg.number} checksum mismatch: EndOfSegment says "
            f"{bytes(body['checksumValue']).hex()}, the data gives {expected.hex()} "
            f"({cks.NAMES.get(seg.checksum.type, seg.checksum.type)})",
            needs=1,
            since_start=True,
        )
