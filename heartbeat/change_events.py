"""Change events from VT records: what a change-capture client receives, built once for every reader.

`heartbeat.changes` decides *which* records a client must see (the rule); this module turns those records into
the events the client applies: the user key without Venice's key header (and, in a chunked version, without its
chunk suffix), PUT or DELETE, the value (a chunked value's chunks put back together), the write's logical
timestamp and its coordinate. The consumer API (`heartbeat.change_reader`), `tidegauge changes` and the watch all
feed `PartitionChanges` with archive-schema Arrow batches (what `div.kafka_log` and the archives give), so they
deliver the same events and count the same duplicates.

- The logical timestamp is the one Venice's conflict resolution compares: the value-level timestamp of the
  record's replication metadata (RMD) when it carries one; otherwise (no RMD, or per-field timestamps, which need
  the value schema) the producer's `logicalTimestamp` when set, else its `messageTimestamp`.
- A chunked value: its chunks precede its manifest in the VT (one leader writes them in order). Chunks wait until
  the manifest that names them; any other change drops the waiting ones (a dead leader's unfinished value, which
  its successor writes again). While chunks wait, `state()` is the state *before* the first of them, so a reader
  that stops there reads them again when it resumes and misses no value.
- A record that cannot become an event is never delivered and never a crash: it is a `Problem` (its partition,
  offset and why). That covers undecodable records and damaged `hbw` headers (the rule's UNDECODABLE), a change
  after End of Push that names no coordinate (NO_COORDINATE), a manifest whose chunks are not all there, and an
  Update (a VT written by a Venice leader holds the resolved Put instead; a client cannot apply a partial update).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from div import envelope as E
from div import keys
from div.avro_bits import read_long
from div.records import Kind, footer_source, iter_records, manifest_chunk_keys

from .changes import (
    DELIVERED,
    ChangeFilter,
    CutStart,
    Item,
    LogId,
    PartitionState,
    Phase,
    Role,
    Verdict,
    item,
    log_digest,
)

CHANGES_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("vt_offset", pa.int64()),
        ("key", pa.binary()),
        ("op", pa.string()),
        ("value", pa.binary()),
        ("logical_ts", pa.int64()),
        ("upstream_region", pa.int32()),
        ("upstream_offset", pa.int64()),
    ]
)
"""One row per delivered change: `tidegauge changes`' Parquet contract (upstream_* null for bulk-load records)."""

PUT, DELETE = "PUT", "DELETE"


class ChangeEvent(NamedTuple):
    """One delivered change. `upstream_region`/`upstream_offset` are its coordinate (the RT write it came from),
    None for the bulk load's records. `schema_id` is the value schema the value was written with (None for a
    DELETE): a client needs it to decode the value."""

    partition: int
    vt_offset: int
    key: bytes
    op: str
    value: bytes | None
    logical_ts: int
    upstream_region: int | None
    upstream_offset: int | None
    schema_id: int | None = None


# the per-record loop's constants, as module globals (an Enum member lookup costs several times a global's)
_PUT, _DELETE, _MANIFEST, _CHUNK, _START_OF_PUSH, _END_OF_PUSH = (
    Kind.PUT,
    Kind.DELETE,
    Kind.MANIFEST,
    Kind.CHUNK,
    Kind.START_OF_PUSH,
    Kind.END_OF_PUSH,
)
_CHANGE, _NEW = int(Role.CHANGE), Verdict.NEW
_VERSION_SWAP = Kind.VERSION_SWAP
_NO_CHUNKS: dict[bytes, bytes] = {}
_Item = Item
_new_event = partial(tuple.__new__, ChangeEvent)  # without NamedTuple's Python-level constructor


def _change_item(offset: int, source: tuple[int, int]) -> Item:
    return tuple.__new__(Item, (offset, _CHANGE, source[0], source[1], None))


class Problem(NamedTuple):
    """A record that could not become an event: counted and reported, never delivered."""

    partition: int
    offset: int
    reason: str
    topic: str | None = None


def events_table(events: list[ChangeEvent]) -> pa.Table:
    """Events as a table of `CHANGES_SCHEMA` (schema_id is not part of the contract)."""
    cols = list(zip(*events, strict=True)) if events else [()] * len(ChangeEvent._fields)
    return pa.Table.from_arrays(
        [pa.array(cols[i], type=f.type) for i, f in enumerate(CHANGES_SCHEMA)], schema=CHANGES_SCHEMA
    )


def logical_timestamp(body: dict, producer_metadata: dict) -> int:
    """The write's logical timestamp (module docstring): RMD value-level timestamp, else the producer's."""
    rmd = body.get("replicationMetadataPayload")
    if rmd and rmd[0] == 0:  # timestamp union branch 0: one long for the whole value
        try:
            return read_long(rmd, 1)[0]
        except (IndexError, ValueError):
            pass  # damaged RMD: the producer's timestamp still orders the write
    lts = producer_metadata.get("logicalTimestamp", -1)
    return lts if lts is not None and lts >= 0 else producer_metadata.get("messageTimestamp", -1)


class PartitionChanges:
    """The change stream of one VT partition: `feed` it the partition's records in VT order (archive-schema
    Arrow batches, any slicing); it returns the events to deliver. `state()` is what to store to resume,
    `counts` the rule's verdicts, `problems` the records that could not become events (since construction)."""

    def __init__(
        self,
        partition: int,
        state: PartitionState,
        codec: E.EnvelopeCodec | None = None,
        chunks: Mapping[bytes, bytes] | None = None,
    ) -> None:
        """`chunks`: for a reader that never reads a record twice (a stream: the watch), the chunks still
        waiting (`waiting_chunks`) when it kept `state(hold=False)`; others resume from `state()` and read the
        chunks again."""
        self.partition = partition
        self.codec = codec or E.EnvelopeCodec()
        self.filter = ChangeFilter(state)
        self.chunked = state.chunked
        self.ended = state.ended  # the version's VersionSwap has been read: its end
        self.push_started = False  # this stream read the version's StartOfPush (so `chunked` is known)
        # the VT this stream reads (`LogId`): learnt from the first record after End of Push, or, for a state
        # online without one (written before format 2, or right at End of Push), from the first record read
        self.log_id = state.log_id
        self._eop: int | None = (
            state.position - 1 if state.log_id is None and state.phase is Phase.ONLINE else None
        )
        self._eop_producer: bytes | None = None  # End of Push's producer (the push job): not the region's
        self.problems: list[Problem] = []
        self.already_read = 0  # records before the state's position (a re-read range): skipped
        self._chunks: dict[bytes, bytes] = dict(
            chunks or {}
        )  # chunk key content → payload, awaiting a manifest
        self._held: PartitionState | None = None  # the state before the first waiting chunk

    @property
    def counts(self) -> dict[Verdict, int]:
        return self.filter.counts

    @property
    def position(self) -> int:
        """The next VT position this stream expects."""
        return self.filter.position

    @property
    def waiting_chunks(self) -> dict[bytes, bytes]:
        """Chunks read whose manifest has not come yet (chunk key content → payload)."""
        return dict(self._chunks)

    def state(self, hold: bool = True) -> PartitionState:
        """The state to resume from: after the last record fed, or (`hold`) before chunks still waiting for a
        manifest, so that a reader that reads on from it reads them again. A stream that never reads a record
        twice keeps `state(hold=False)` and `waiting_chunks` instead."""
        if hold and self._held is not None:
            return self._held
        return replace(self.filter.state(), chunked=self.chunked, ended=self.ended, log_id=self.log_id)

    def feed(self, batch: pa.RecordBatch | pa.Table) -> list[ChangeEvent]:
        return list(self.iter_events(batch))

    def iter_events(self, batch: pa.RecordBatch | pa.Table) -> Iterator[ChangeEvent]:
        """`feed`, one event at a time. A contract the consumer API keeps its state by: while the generator is
        suspended at an event, `state()` is the state right after that event's record."""
        f = self.filter
        step = f.step
        for rec in iter_records(batch, self.codec):
            offset = rec.offset
            if offset < f.position:
                self.already_read += 1
                continue
            kind = rec.kind
            if self._eop is not None and offset > self._eop and _producer(rec) != self._eop_producer:
                self.log_id, self._eop = LogId(offset, log_digest(rec.key, rec.value)), None
            if (kind is _PUT or kind is _DELETE) and not self.chunked:
                # the common record, read here rather than through `item` (the same reading: footer_source),
                # because this loop runs once per record
                source = footer_source(rec.env)
                it = _change_item(offset, source) if source is not None else _Item(offset, _CHANGE)
            else:
                if kind is _START_OF_PUSH:
                    self.chunked = bool(E.control_body(rec.env).get("chunked"))
                    self.push_started = True
                elif kind is _VERSION_SWAP:
                    self.ended = True
                elif kind is _END_OF_PUSH and self.log_id is None:
                    self._eop, self._eop_producer = offset, _producer(rec)
                elif kind is _CHUNK:
                    if self._held is None:
                        self._held = replace(
                            f.state(), chunked=self.chunked, ended=self.ended, log_id=self.log_id
                        )
                    self._chunks[rec.key[1:]] = rec.env["payloadUnion"][1]["putValue"]
                it = item(rec, chunked=self.chunked, kind=kind)
            verdict = step(it)
            if (
                it.role == _CHANGE
            ):  # a change, delivered or not: chunks waiting before it are its own or orphans
                if self._chunks or self._held is not None:
                    chunks, self._chunks, self._held = self._chunks, {}, None
                else:
                    chunks = _NO_CHUNKS
                if verdict in DELIVERED:
                    event = self._event(rec, kind, verdict, it, chunks)
                    if event is not None:
                        yield event
                elif verdict is Verdict.NO_COORDINATE:
                    self._problem(
                        rec,
                        "a change after End of Push whose leader footer names no region of the "
                        "store or no RT position: its coordinate is unknown",
                    )
            elif verdict is Verdict.UNDECODABLE:
                self._problem(rec, rec.error or "heartbeat's hbw header cannot be decoded")

    def _problem(self, rec, reason: str) -> None:
        self.problems.append(Problem(self.partition, rec.offset, reason, rec.topic))

    def _event(self, rec, kind: Kind, verdict: Verdict, it, chunks: dict[bytes, bytes]) -> ChangeEvent | None:
        env = rec.env
        body = env["payloadUnion"][1]
        content = rec.key[1:]
        if self.chunked:
            content = keys.strip_non_chunk_suffix(content)
        if kind is _PUT:
            op, value, schema_id = PUT, body["putValue"], body["schemaId"]
        elif kind is _DELETE:
            op, value, schema_id = DELETE, None, None
        elif kind is _MANIFEST:
            named = manifest_chunk_keys(body["putValue"])
            parts = None if named is None else [chunks.get(k) for k in named[0]]
            if parts is None or not parts or any(p is None for p in parts):
                self._problem(
                    rec,
                    "a chunked value's manifest whose chunks are not all before it (or that "
                    "cannot be decoded): the value cannot be put together",
                )
                return None
            op, value, schema_id = PUT, b"".join(parts), named[1]
        else:
            self._problem(
                rec,
                "an Update in a version topic: a client cannot apply a partial update (a Venice "
                "leader writes the resolved value as a Put)",
            )
            return None
        new = verdict is _NEW
        return _new_event(
            (
                self.partition,
                rec.offset,
                content,
                op,
                value,
                logical_timestamp(body, env["producerMetadata"]),
                it.region if new else None,
                it.rt_position if new else None,
                schema_id,
            )
        )


class CutSeeker:
    """Where a reader resuming at a consistent cut starts in one VT partition (`heartbeat.changes.from_cut`'s fold),
    over archive-schema batches as they come. `feed` it the partition's batches from the version's first record;
    once `found`, `feed` has returned the records from the start on (the batch it found it in, and earlier ones
    when chunks waiting for their change lie before it) and `state()` is the state to read them with
    (`PartitionChanges(partition, seeker.state())`). Before that, `state()` is a state to resume the seek from.
    Nothing is delivered while seeking: the records folded over hold no change above the cut."""

    def __init__(
        self, partition: int, cut: tuple[int, ...], n_regions: int, codec: E.EnvelopeCodec | None = None
    ):
        self.partition = partition
        self.codec = codec or E.EnvelopeCodec()
        self.fold = CutStart(cut, n_regions)
        self.chunked = False
        self.ended = False
        self.log_id: LogId | None = None
        self.records = 0  # records folded over
        self._eop: int | None = None
        self._eop_producer: bytes | None = None
        self._held: list[pa.RecordBatch] = []  # batches from the first part waiting for its change

    @property
    def found(self) -> bool:
        return self.fold.found

    @property
    def counts(self) -> dict[Verdict, int]:
        return self.fold.counts

    def state(self) -> PartitionState:
        return replace(self.fold.state(), chunked=self.chunked, ended=self.ended, log_id=self.log_id)

    def feed(self, batch: pa.RecordBatch | pa.Table) -> list[pa.RecordBatch]:
        """Fold `batch`; [] while the start is not found, else the records from the start on (then stop feeding:
        they and every later record are the reader's)."""
        if self.found:
            raise ValueError("the start is found already: read on with PartitionChanges(state())")
        batches = batch.to_batches() if isinstance(batch, pa.Table) else [batch]
        for b in batches:
            if b.num_rows == 0:
                continue
            for rec in iter_records(b, self.codec):
                offset = rec.offset
                if offset < self.fold.position:
                    continue
                kind = rec.kind
                if self._eop is not None and offset > self._eop and _producer(rec) != self._eop_producer:
                    self.log_id, self._eop = LogId(offset, log_digest(rec.key, rec.value)), None
                if kind is _START_OF_PUSH:
                    self.chunked = bool(E.control_body(rec.env).get("chunked"))
                elif kind is _END_OF_PUSH and self.log_id is None:
                    self._eop, self._eop_producer = offset, _producer(rec)
                elif kind is _VERSION_SWAP:
                    self.ended = True
                self.records += 1
                if self.fold.step(item(rec, chunked=self.chunked, kind=kind)):
                    self.records -= 1
                    start = self.fold.state().position
                    return [r for r in (_from(h, start) for h in [*self._held, b]) if r.num_rows]
            self._held.append(b)
            first_waiting = self.fold.state().position
            self._held = [h for h in self._held if _last_offset(h) >= first_waiting]
        return []


def _producer(rec) -> bytes | None:
    """The GUID of the producer that wrote a record (None: undecodable)."""
    return rec.env["producerMetadata"]["producerGUID"] if rec.env is not None else None


def _last_offset(batch: pa.RecordBatch) -> int:
    return int(batch.column("offset")[-1].as_py())


def _from(batch: pa.RecordBatch, start: int) -> pa.RecordBatch:
    """The rows of `batch` at VT offset `start` or later."""
    return batch.filter(pc.greater_equal(batch.column("offset"), start))
