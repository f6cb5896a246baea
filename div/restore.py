"""DIV restore: the DIV state a replica holds at any version-topic offset, rebuilt from the last heartbeat before it.

A follower that restarts, rewinds or is promoted needs the DIV state of every producer at the offset where it
resumes; without it Venice's validator reports false UNREGISTERED_PRODUCER errors and skips checksum checks of
every segment it joins mid-way. Replaying the VT from offset 0 costs the length of the topic. Our VT heartbeats
carry the state instead (docs/design.md, rule 4): `hbd.vtProducerStates` is the VT DIV state just before heartbeat H,
`hbd.rtProducerStates[r]` the DIV state of RT[r] after the heartbeat's watermark `hbw[r]`. So the state after
VT offset O is the `hbd` state of the last usable heartbeat H ≤ O advanced over the VT records (H, O], and the RT
state at a resume position is the `hbd` RT state advanced over RT[r] (hbw[r], resume]. Cost: the distance from
O back to H, whatever the length of the topic.

Semantics (the same as a Venice checkpoint's `offset`): a state "at O" includes record O; validation resumes at
O + 1. A region's RT *resume offset* is the last RT offset the replica is known to reflect: the highest of hbw[r]
and the upstream offsets of region r in the VT records after H up to O (footers, and the vectors of later
heartbeats); a new leader consumes RT[r] from resume + 1 with the RT state restored at resume. VT records before
H can reflect RT records beyond hbw[r] — sent but not yet acknowledged when the leader wrote H, or written by an
earlier term that got further than where its successor resumed — and finding them would mean reading the VT
from its start, so they are not counted: a leader resuming at our offset re-applies those writes, as a takeover
from the heartbeat itself does (docs/design.md, rule 4), and its RT state matches where it resumes. (The footer-only
rule, "the highest upstream offset among the VT records up to O", also misses RT records that wrote nothing to
the VT, such as producers' EndOfSegments and conflict losers; hbw covers those.)

Decisions:

* Which heartbeat: the last one at or before O whose `hbd` decodes and is not `truncated` (a truncated state is
  incomplete). Unusable ones are skipped and reported; when none is usable the state comes from a full replay
  from the first offset the source holds, and `fallback_reason` says why.
* Finding it without reading from 0: `find_heartbeat` reads backwards in windows, the first ending at O + 1 and
  each next one ending where the previous began, twice as long (4096 offsets, then 8192, ...), reading only the
  key, offset and headers columns. For an archive each
  window reads the row groups it overlaps; for Kafka each is one seek and fetch. The cost is bounded by twice the
  distance to the heartbeat (plus one row group), so it does not grow with the topic.
* End of Push: heartbeats carrying `hbd` are written by leaders consuming RTs, which Venice leaders do only after
  End of Push, so a state restored from one is "after EOP". Its EOP offset is unknown (None) unless the replay
  meets the EOP record.
* Equality with a full replay holds with producer-state max age disabled (the default): with it, expiry happens
  at checkpoints whose positions depend on where a run started, as in Venice.

Everything here is pure with respect to sources: records come through a `ReadRange` callback
`read(start, end, columns) -> iterable of Arrow batches` (archive schema, offsets in [start, end), ascending), so
the batch job (`pipelines.div.restore`), `div validate --restore-at` and a live follower or new leader use the
same code. A live process that already has the heartbeat's headers uses `from_heartbeat` and then keeps feeding
records with `Restored.feed_vt` / `feed_vt_record` (and `feed_rt` for a new leader's RT catch-up).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from . import checksum as cks
from . import envelope as E
from . import keys
from . import partition_state as ps
from .heartbeat_headers import (
    HBD_HEADER,
    HBW_HEADER,
    DivState,
    HeaderError,
    Watermarks,
    decode_hbd,
    decode_hbw,
    header_value,
)
from .records import decode_record, footer_source, iter_records
from .validator import (
    END_OF_FINAL_SEGMENT,
    END_OF_INTERMEDIATE_SEGMENT,
    IN_PROGRESS,
    NOT_STARTED,
    Finding,
    PartitionValidator,
    ValidatorConfig,
)

ReadRange = Callable[[int, int, Sequence[str] | None], Iterable[pa.RecordBatch]]
"""`read(start, end, columns)`: a partition's records with offsets in [start, end), ascending, as Arrow batches in
the archive schema (only `columns` when given; the reader may return more)."""

SEARCH_COLUMNS = ["key", "offset", "headers"]
REPLAY_COLUMNS = ["key", "value", "offset", "timestamp", "headers"]
FIRST_WINDOW = 4096
MAX_LISTED = 100  # undecodable offsets listed per replay; the count is always whole
MAX_WINDOW = 1 << 22
STATUS_NAMES = {
    NOT_STARTED: "NOT_STARTED",
    IN_PROGRESS: "IN_PROGRESS",
    END_OF_INTERMEDIATE_SEGMENT: "END_OF_INTERMEDIATE_SEGMENT",
    END_OF_FINAL_SEGMENT: "END_OF_FINAL_SEGMENT",
}
FROM_HEARTBEAT, FROM_START = "heartbeat", "full_replay"


class UnusableHeartbeat(ValueError):
    """A VT heartbeat whose `hbd` cannot serve as a restore point; the message says why."""


@dataclass(frozen=True)
class Heartbeat:
    """A usable VT heartbeat: its offset, the DIV state of its `hbd` and the vector of its `hbw` (None if absent)."""

    offset: int
    div_state: DivState
    watermarks: Watermarks | None

    def watermark(self, region: int) -> int | None:
        """hbw[region], or None when the heartbeat carries no vector entry for it."""
        w = self.watermarks
        if w is None or not 0 <= region < len(w.high_watermarks):
            return None
        return int(w.high_watermarks[region])


@dataclass(frozen=True)
class SkippedHeartbeat:
    offset: int
    reason: str


def heartbeat_at(offset: int, headers: Iterable | None) -> Heartbeat:
    """The restore point a VT heartbeat's headers give; raises UnusableHeartbeat (no, bad or truncated `hbd`)."""
    raw = header_value(headers, HBD_HEADER)
    if raw is None:
        raise UnusableHeartbeat("no hbd header (a plain Venice heartbeat)")
    try:
        state = decode_hbd(raw)
    except HeaderError as exc:
        raise UnusableHeartbeat(str(exc)) from None
    if state.truncated:
        raise UnusableHeartbeat("hbd is truncated (the leader left producers out to fit its size limit)")
    hbw = header_value(headers, HBW_HEADER)
    watermarks = None
    if hbw is not None:
        try:
            watermarks = decode_hbw(hbw)
        except HeaderError:
            watermarks = (
                None  # the VT state is still good; RT states then cannot be anchored (see restore_rt)
            )
    return Heartbeat(offset, state, watermarks)


@dataclass
class Search:
    """What `find_heartbeat` found: the restore point (None: no usable heartbeat at or before the offset), the
    heartbeats it passed over on the way and why, and what the search read."""

    heartbeat: Heartbeat | None
    skipped: list[SkippedHeartbeat] = field(default_factory=list)
    records_read: int = 0
    reads: int = 0


def find_heartbeat(
    read: ReadRange,
    at: int,
    first_offset: int = 0,
    *,
    first_window: int = FIRST_WINDOW,
    max_window: int = MAX_WINDOW,
) -> Search:
    """The last usable VT heartbeat at or before offset `at`, searched backwards in doubling windows.

    Reads only key, offset and headers, and only as far back as the heartbeat (never below `first_offset`).
    """
    if first_window < 1:
        raise ValueError(f"first_window must be positive, got {first_window}")
    search = Search(None)
    end = at + 1
    window = first_window
    hb_key = pa.scalar(keys.HEARTBEAT_KEY, pa.binary())
    while end > first_offset:
        start = max(first_offset, end - window)
        found: list[tuple[int, list | None]] = []
        search.reads += 1
        for batch in read(start, end, SEARCH_COLUMNS):
            search.records_read += batch.num_rows
            mask = pc.fill_null(pc.equal(batch.column("key"), hb_key), False)
            if not pc.any(mask).as_py():
                continue
            hits = batch.filter(mask)
            found.extend(
                zip(hits.column("offset").to_pylist(), hits.column("headers").to_pylist(), strict=True)
            )
        for offset, headers in reversed(found):
            if not start <= offset < end:  # a reader may hand back more than asked
                continue
            try:
                search.heartbeat = heartbeat_at(offset, headers)
                return search
            except UnusableHeartbeat as exc:
                search.skipped.append(SkippedHeartbeat(offset, str(exc)))
        end = start
        window = min(window * 2, max_window)
    return search


class Replay:
    """Feeds records to a PartitionValidator exactly as `div.batch.PartitionRun` does (undecodable records leave
    the state alone, and are counted: a state replayed over them may be incomplete) and, for a VT, tracks per
    region the highest RT offset the records fed so far reflect."""

    def __init__(
        self,
        validator: PartitionValidator,
        upstream: dict[int, int] | None = None,
        codec: E.EnvelopeCodec | None = None,
    ) -> None:
        self.validator = validator
        self.upstream: dict[int, int] = dict(upstream or {})
        self.codec = codec or E.EnvelopeCodec()
        self.records = 0
        self.undecodable = 0
        self.undecodable_offsets: list[int] = []  # the first MAX_LISTED of them
        self.findings: Counter = Counter()
        self.last_offset: int | None = None
        self.last_heartbeat_ms = -1

    def _reflect(self, region: int, offset: int) -> None:
        if region >= 0 and offset >= 0 and offset > self.upstream.get(region, -1):
            self.upstream[region] = offset

    def feed_record(
        self,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable | None = None,
        broker_ts_ms: int | None = None,
    ) -> list[Finding]:
        """Validate one VT record (in offset order); returns its DIV findings."""
        env, _ = decode_record(self.codec, key, value, headers)
        return self._feed(offset, key, value, headers, broker_ts_ms, env)

    def _feed(
        self,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable | None,
        broker_ts_ms: int | None,
        env: dict | None,
    ) -> list[Finding]:
        self.records += 1
        self.last_offset = offset
        if env is None:
            self._undecodable(offset)
            return []
        found = self.validator.process(offset, key, env, broker_ts_ms, len(value or b""))
        if found:
            self.findings.update(f.type for f in found)
        up = footer_source(env)
        if up is not None:
            self._reflect(*up)
        if key == keys.HEARTBEAT_KEY:
            self.last_heartbeat_ms = env["producerMetadata"]["messageTimestamp"]
            raw = header_value(headers, HBW_HEADER)
            if raw is not None:
                try:
                    for r, w in enumerate(decode_hbw(raw).high_watermarks):
                        self._reflect(r, int(w))
                except HeaderError:
                    pass  # a broken vector claims nothing
        return found

    def _undecodable(self, offset: int) -> None:
        self.undecodable += 1
        if len(self.undecodable_offsets) < MAX_LISTED:
            self.undecodable_offsets.append(offset)

    def feed(self, batch: pa.RecordBatch | pa.Table) -> list[Finding]:
        """Validate a batch of VT records (archive schema, offset order); returns their DIV findings."""
        out: list[Finding] = []
        for rec in iter_records(batch, self.codec):
            found = self._feed(rec.offset, rec.key, rec.value, rec.headers, rec.ms, rec.env)
            if found:
                out.extend(found)
        return out


@dataclass
class RtRegion:
    """The restored DIV state of one region's RT partition.

    `watermark`: hbw[region] of the restore point (None: unknown). `resume_offset`: the last RT offset the replica
    reflects (a leader consumes from resume_offset + 1; -1: nothing). `state_offset`: the RT offset `validator`'s
    state is at — `resume_offset` once the RT was replayed, the watermark when it was not (no RT source).
    """

    region: int
    validator: PartitionValidator
    watermark: int | None
    resume_offset: int
    state_offset: int | None
    replayed: int = 0
    replayed_from: int | None = None
    undecodable: int = 0
    undecodable_offsets: list[int] = field(default_factory=list)
    findings: Counter = field(default_factory=Counter)
    warning: str | None = None


@dataclass
class Restored:
    """The DIV state of a replica after VT offset `at` (and, per region, of the RTs at its resume offsets)."""

    at: int
    vt: PartitionValidator
    heartbeat: Heartbeat | None = None
    fallback_reason: str | None = None
    skipped: list[SkippedHeartbeat] = field(default_factory=list)
    search_records: int = 0
    search_reads: int = 0
    replay: Replay | None = None
    replayed_from: int | None = None
    rt: dict[int, RtRegion] = field(default_factory=dict)
    # One codec for every replay: a writer schema learnt from any `vtp` header (the restore point's included)
    # serves the VT and the RTs alike, as protocol versions are global.
    codec: E.EnvelopeCodec = field(default_factory=E.EnvelopeCodec)

    @property
    def source(self) -> str:
        """ "heartbeat" when restored from a heartbeat, "full_replay" when replayed from the first offset."""
        return FROM_HEARTBEAT if self.heartbeat is not None else FROM_START

    @property
    def upstream(self) -> dict[int, int]:
        """Per region, the last RT offset the VT up to `at` reflects (see the module docstring)."""
        return dict(self.replay.upstream) if self.replay is not None else {}

    @property
    def vt_replayed(self) -> int:
        return self.replay.records if self.replay is not None else 0

    # -- continuing ---------------------------------------------------------------------------------------
    def feed_vt(self, batch: pa.RecordBatch | pa.Table) -> list[Finding]:
        """Continue validating: VT records after `at`, in offset order. Returns their findings."""
        out = self._replay().feed(batch)
        if self.replay.last_offset is not None:
            self.at = max(self.at, self.replay.last_offset)
        return out

    def feed_vt_record(
        self,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable | None = None,
        broker_ts_ms: int | None = None,
    ) -> list[Finding]:
        """Continue validating one VT record after `at`. Returns its findings."""
        out = self._replay().feed_record(offset, key, value, headers, broker_ts_ms)
        self.at = max(self.at, offset)
        return out

    def _replay(self) -> Replay:
        if self.replay is None:
            self.replay = Replay(self.vt, _watermark_upstream(self.heartbeat), codec=self.codec)
        return self.replay

    def rt_region(self, region: int, config: ValidatorConfig | None = None) -> RtRegion:
        """The RT state of `region` as the restore point gives it (hbd at hbw[region]), created on first use."""
        entry = self.rt.get(region)
        if entry is None:
            v = PartitionValidator(is_realtime=True, config=config)
            hb = self.heartbeat
            mark = hb.watermark(region) if hb is not None else None
            if mark is not None:
                v.restore(hb.div_state.rt_producers.get(region, {}))
            entry = RtRegion(region, v, mark, mark if mark is not None else -1, mark)
            self.rt[region] = entry
        entry.resume_offset = max(entry.resume_offset, self.upstream.get(region, -1))
        return entry

    def feed_rt(self, region: int, batch: pa.RecordBatch | pa.Table) -> list[Finding]:
        """Advance region's RT state over RT records after its current state offset (offset order), e.g. a new
        leader catching up to its resume offset. Returns their (RT) findings."""
        entry = self.rt_region(region)
        replay = Replay(entry.validator, codec=self.codec)
        out = replay.feed(batch)
        entry.replayed += replay.records
        entry.undecodable += replay.undecodable
        entry.undecodable_offsets.extend(
            replay.undecodable_offsets[: MAX_LISTED - len(entry.undecodable_offsets)]
        )
        entry.findings.update(replay.findings)
        if replay.last_offset is not None:
            if entry.replayed_from is None:
                entry.replayed_from = int(batch.column("offset")[0].as_py())
            entry.state_offset = replay.last_offset
        return out

    # -- handing over -------------------------------------------------------------------------------------
    def vt_producer_states(self) -> dict[bytes, dict]:
        return self.vt.producer_states()

    def rt_producer_states(self) -> dict[int, dict[bytes, dict]]:
        return {r: e.validator.producer_states() for r, e in sorted(self.rt.items())}

    def take_over_args(
        self, n_regions: int
    ) -> tuple[dict[bytes, dict], dict[int, dict[bytes, dict]], list[int]]:
        """(VT states, RT states, RT offsets) for `heartbeat.HeartbeatLeader.take_over`: the new leader resumes
        RT[r] right after the offset its RT state is at (the resume offset once `restore_rt` replayed it)."""
        for r in range(n_regions):
            self.rt_region(r)
        marks = [-1] * n_regions
        for r, e in self.rt.items():
            if 0 <= r < n_regions and e.state_offset is not None:
                marks[r] = e.state_offset
        return self.vt_producer_states(), self.rt_producer_states(), marks

    def partition_state(self, *, last_update: int | None = None) -> dict:
        """Venice's PartitionState v24 record: offset `at`, the VT producer states, End of Push; plus, keyed by
        region id (tidegauge knows regions, not the broker URLs a Venice server maps them to), each region's RT
        producer states in `realtimeTopicProducerStates` and its resume offset in `upstreamOffsetMap`."""
        hb_ms = self.replay.last_heartbeat_ms if self.replay is not None else -1
        if hb_ms < 0 and self.heartbeat is not None and self.heartbeat.watermarks is not None:
            hb_ms = self.heartbeat.watermarks.emit_ts_ms
        return ps.build(
            self.at,
            self.vt_producer_states(),
            end_of_push=self.vt.end_of_push,
            last_update=last_update,
            realtime_producer_states={
                str(r): e.validator.producer_states() for r, e in sorted(self.rt.items())
            },
            upstream_offsets={
                str(r): e.resume_offset for r, e in sorted(self.rt.items()) if e.resume_offset >= 0
            },
            heartbeat_timestamp=hb_ms,
        )

    def to_json(self) -> dict:
        """The state for people and tools (the `state.json` of `tidegauge div restore`, docs/outputs.md)."""
        hb = self.heartbeat
        return {
            "vt_offset": self.at,
            "next_vt_offset": self.at + 1,
            "restored_from": self.source,
            "heartbeat_offset": hb.offset if hb is not None else None,
            "heartbeat_watermarks": list(hb.watermarks.high_watermarks)
            if hb is not None and hb.watermarks
            else None,
            "fallback_reason": self.fallback_reason,
            "skipped_heartbeats": [{"offset": s.offset, "reason": s.reason} for s in self.skipped],
            "end_of_push": self.vt.end_of_push,
            "eop_offset": self.vt.eop_offset,
            "vt_records_replayed": self.vt_replayed,
            "vt_replayed_from": self.replayed_from,
            "vt_replay_findings": dict(sorted(self.replay.findings.items())) if self.replay else {},
            "vt_producers": states_json(self.vt_producer_states()),
            "rt_producers": {
                str(r): states_json(e.validator.producer_states()) for r, e in sorted(self.rt.items())
            },
            "rt": {
                str(r): {
                    "watermark": e.watermark,
                    "resume_offset": e.resume_offset,
                    "state_offset": e.state_offset,
                    "records_replayed": e.replayed,
                    "replayed_from": e.replayed_from,
                    "findings": dict(sorted(e.findings.items())),
                    "warning": e.warning,
                }
                for r, e in sorted(self.rt.items())
            },
        }


def _watermark_upstream(hb: Heartbeat | None) -> dict[int, int]:
    if hb is None or hb.watermarks is None:
        return {}
    return {r: int(w) for r, w in enumerate(hb.watermarks.high_watermarks) if w >= 0}


def state_json(state: dict) -> dict:
    """One ProducerPartitionState as JSON: status and checksum type by name, checksum state in hex."""
    ctype = state["checksumType"]
    return {
        "segment": state["segmentNumber"],
        "sequence": state["messageSequenceNumber"],
        "status": STATUS_NAMES.get(state["segmentStatus"], str(state["segmentStatus"])),
        "registered": bool(state["isRegistered"]),
        "checksum_type": cks.NAMES.get(ctype, str(ctype)),
        "checksum_state": bytes(state.get("checksumState") or b"").hex(),
        "timestamp": state["messageTimestamp"],
    }


def states_json(states: Mapping[bytes, dict]) -> dict[str, dict]:
    """Producer states keyed by 32-hex GUID, sorted."""
    return {bytes(g).hex(): state_json(s) for g, s in sorted(states.items())}


# ------------------------------------------------------------------------------------------------ restoring


def from_heartbeat(
    offset: int, headers: Iterable | None, *, config: ValidatorConfig | None = None
) -> Restored:
    """The state right after the VT heartbeat at `offset`, from its headers: what a live follower that consumed
    it (or a new leader) loads. Raises UnusableHeartbeat. Continue with `feed_vt`/`feed_vt_record` from
    offset + 1; RT states are at the heartbeat's watermarks (`rt_region(r)`)."""
    hb = heartbeat_at(offset, headers)
    vt = PartitionValidator(config=config)
    _load(vt, hb)
    restored = Restored(offset, vt, hb)
    restored._replay()
    return restored


def _load(vt: PartitionValidator, hb: Heartbeat) -> None:
    # A heartbeat is DIV-exempt: the state just before it is the state right after it. It was written by a
    # leader consuming RTs, i.e. after End of Push (module docstring).
    vt.restore(hb.div_state.vt_producers, end_of_push=True)
    vt.eop_offset = None


def restore_vt(
    read: ReadRange,
    at: int,
    *,
    first_offset: int = 0,
    validator: PartitionValidator | None = None,
    config: ValidatorConfig | None = None,
    first_window: int = FIRST_WINDOW,
    codec: E.EnvelopeCodec | None = None,
) -> Restored:
    """The VT DIV state after offset `at`: the last usable heartbeat at or before it, advanced over the records
    after it up to `at`; without one, a full replay from `first_offset` (`fallback_reason` says why).

    `validator` (fresh, e.g. a PartitionRun's) receives the state; by default a new one with `config`. `codec`
    (e.g. the same PartitionRun's) decodes the replay and keeps the writer schemas it learns for the caller.
    """
    vt = validator if validator is not None else PartitionValidator(config=config)
    search = find_heartbeat(read, at, first_offset, first_window=first_window)
    restored = Restored(
        at,
        vt,
        search.heartbeat,
        skipped=search.skipped,
        search_records=search.records_read,
        search_reads=search.reads,
        codec=codec if codec is not None else E.EnvelopeCodec(),
    )
    if search.heartbeat is not None:
        _load(vt, search.heartbeat)
        _learn_writer_schema(restored.codec, read, search.heartbeat.offset)
        start = search.heartbeat.offset + 1
    else:
        if search.skipped:
            restored.fallback_reason = (
                f"no usable heartbeat at or before offset {at}: "
                f"{len(search.skipped)} unusable (last at {search.skipped[0].offset}: "
                f"{search.skipped[0].reason})"
            )
        else:
            restored.fallback_reason = f"no heartbeat with an hbd header at or before offset {at}"
        start = first_offset
    replay = restored._replay()
    if start <= at:
        restored.replayed_from = start
        for batch in read(start, at + 1, REPLAY_COLUMNS):
            replay.feed(_clip(batch, start, at + 1))
    return restored


def _learn_writer_schema(codec: E.EnvelopeCodec, read: ReadRange, offset: int) -> None:
    """Decode the heartbeat at `offset` once, for its `vtp` header: the replay after it starts mid-log, where a
    newer writer's records are readable only with the schema that header announces."""
    for batch in read(offset, offset + 1, ("offset", "key", "value", "headers")):
        for _ in iter_records(_clip(batch, offset, offset + 1), codec):
            pass  # decoding it is what teaches the codec; an undecodable heartbeat teaches nothing


def restore_rt(
    restored: Restored,
    region: int,
    read: ReadRange,
    *,
    first_offset: int = 0,
    config: ValidatorConfig | None = None,
) -> RtRegion:
    """Bring region's RT DIV state to its resume offset: the restore point's `hbd` state at hbw[region], advanced
    over RT[region] (hbw[region], resume]; from `first_offset` with an empty state when the restore point gives
    no watermark for the region (full replay, or a heartbeat without `hbw`)."""
    entry = restored.rt_region(region, config)
    start = first_offset if entry.watermark is None else entry.watermark + 1
    end = entry.resume_offset + 1
    if start < end:
        for batch in read(start, end, REPLAY_COLUMNS):
            restored.feed_rt(region, _clip(batch, start, end))
    if entry.resume_offset >= 0 and (entry.state_offset is None or entry.state_offset < entry.resume_offset):
        entry.warning = (
            f"RT of region {region} ends at offset {entry.state_offset} in the source, before the "
            f"resume offset {entry.resume_offset}: the RT state is at {entry.state_offset}"
        )
    elif entry.replayed_from is not None and entry.replayed_from > start:
        entry.warning = (
            f"RT of region {region} starts at offset {entry.replayed_from} in the source, after "
            f"{start}: records before it are gone (retention?), the RT state may be incomplete"
        )
    return entry


def _clip(batch: pa.RecordBatch, start: int, end: int) -> pa.RecordBatch:
    """The rows of `batch` with offsets in [start, end) (readers may hand back more than asked)."""
    offsets = batch.column("offset")
    if batch.num_rows == 0:
        return batch
    lo, hi = offsets[0].as_py(), offsets[-1].as_py()
    if lo >= start and hi < end:
        return batch
    mask = pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end))
    return batch.filter(mask)


class LastHeartbeat:
    """What a live follower keeps to be able to restore later: the last VT heartbeat with `hbd` it consumed."""

    __slots__ = ("offset", "headers")

    def __init__(self) -> None:
        self.offset: int | None = None
        self.headers: list | None = None

    def observe(self, offset: int, key: bytes | None, headers: Iterable | None) -> None:
        """Call for every consumed VT record (cheap: compares the key)."""
        if key == keys.HEARTBEAT_KEY and header_value(headers, HBD_HEADER) is not None:
            self.offset = offset
            self.headers = list(headers or ())

    def restore(self, *, config: ValidatorConfig | None = None) -> Restored:
        """The state right after that heartbeat (raises UnusableHeartbeat when none was seen or it is unusable)."""
        if self.offset is None:
            raise UnusableHeartbeat("no heartbeat with an hbd header was consumed")
        return from_heartbeat(self.offset, self.headers, config=config)
