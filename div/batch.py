"""Validating one topic partition fed as Arrow record batches: the one implementation every engine runs.

The single-process `div validate` and its Spark twin both hand each partition's records, in offset order and in
the archive schema (Spark's Kafka schema), to a `PartitionRun`. It decodes each value, runs DIV and then the
configured record validators, and turns every problem into an error row; a record that cannot be decoded is an
UNDECODABLE row and the run goes on. Record validators see every record, undecodable ones included (with no
envelope): an archive's offsets and timestamps can be checked whatever its values hold.

A run's results do not depend on how its records are cut into batches, so engines may batch as they like.

The fast lane: most records are a Put or a Delete of a known producer's next sequence number, in an open segment
whose checksum is ADHASH or none, and DIV's decision on them needs a handful of fields. `div.envelope_columns`
reads those fields for a whole batch with numpy, and such a record goes to the validator's `process_common` without
an envelope dict; every other record (and any the common case does not take) is decoded by the codec and takes the
full procedure, in order. Both ways decide alike: tests/div/test_div_fast_lane.py runs every archive the tests
have, damaged and fuzzed ones included, both ways. With record validators configured every record is decoded (they
are given its envelope).

Why `feed` keeps its own record loop rather than `div.records.iter_records`: it is the benchmarked hot path of
`div validate` (bench/bench_div_validate.py), and a generator step and a record object per record measured 3-5 %
slower. Its loop is iter_records' inlined, from the same parts: `timestamps_ms`, `div.records.key_problem` (the
key check and its reason) and the codec.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from . import envelope as E
from .archive import timestamps_ms
from .envelope_columns import EnvelopeReader, Heads
from .keys import KNOWN_HEADERS
from .records import key_problem
from .validator import (
    NOT_FINDINGS,
    UNDECODABLE,
    Finding,
    PartitionValidator,
    ValidatorConfig,
)
from .validators.base import Chain, PartitionContext, Record

ERROR_COLUMNS = [
    ("region", pa.int32()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("producer_guid", pa.string()),
    ("segment", pa.int32()),
    ("sequence", pa.int32()),
    ("type", pa.string()),
    ("fatal", pa.bool_()),
    ("detail", pa.string()),
]
ERROR_SCHEMA = pa.schema(ERROR_COLUMNS)


MAX_LISTED = 100  # undecodable offsets listed per partition in summaries; the counts are always whole


def is_realtime_topic(topic: str) -> bool:
    """RT topics: `<store>_rt`, `<store>_rt_v<N>`, and their `_sep` variants (Venice's Utils.isRealTimeTopic)."""
    base = topic[:-4] if topic.endswith("_sep") else topic
    if base.endswith("_rt"):
        return True
    head, _, tail = base.rpartition("_rt_v")
    return bool(head) and tail.isdigit()


@dataclass
class PartitionSummary:
    region: int
    topic: str
    partition: int
    records: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    eop_offset: int | None = None
    producers_tracked: int = 0
    findings: Counter = field(default_factory=Counter)
    fatal_findings: int = 0
    undecodable: int = 0
    undecodable_offsets: list[int] = field(default_factory=list)  # the first MAX_LISTED
    explained: int = 0  # gaps and mismatches that undecodable records in between can explain
    start_offset: int | None = None
    restored_from_heartbeat: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "topic": self.topic,
            "partition": self.partition,
            "records": self.records,
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
            "eop_offset": self.eop_offset,
            "producers_tracked": self.producers_tracked,
            "findings": dict(sorted(self.findings.items())),
            "fatal_findings": self.fatal_findings,
            "undecodable": self.undecodable,
            "undecodable_offsets": list(self.undecodable_offsets),
            "explained_by_undecodable": self.explained,
            "start": {"offset": self.start_offset, "restored_from_heartbeat": self.restored_from_heartbeat},
        }


class StopRun(Exception):
    """Raised by `feed` when `fail_fast` is set and a fatal finding was produced (at record `offset`)."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message)
        self.offset = offset


class PartitionRun:
    """DIV (and record validators) over one partition's records, batch by batch, in offset order."""

    def __init__(
        self,
        region: int,
        topic: str,
        partition: int,
        *,
        config: ValidatorConfig | None = None,
        codec: E.EnvelopeCodec | None = None,
        validator: PartitionValidator | None = None,
        record_validators: list | None = None,
        fail_fast: bool = False,
        vectorised: bool = True,
    ) -> None:
        self.region, self.topic, self.partition = region, topic, partition
        self.codec = codec or E.EnvelopeCodec()
        # the fast lane (module docstring); `vectorised=False` decodes every record (the reference it is tested
        # against)
        self.envelopes = EnvelopeReader(self.codec) if vectorised else None
        self.validator = validator or PartitionValidator(is_realtime=is_realtime_topic(topic), config=config)
        chain = (
            record_validators
            if isinstance(record_validators, Chain)
            else Chain(list(record_validators or []))
        )
        self.record_validators = chain
        if chain:
            lag = self.validator.config.min_compaction_lag_ms
            chain.reset(
                PartitionContext(
                    region,
                    topic,
                    partition,
                    realtime=self.validator.is_realtime,
                    compacted=lag is not None and lag >= 0 and not self.validator.is_realtime,
                )
            )
        self.fail_fast = fail_fast
        self.summary = PartitionSummary(region, topic, partition)
        self.rows: list[tuple] = []
        self.stopped: str | None = None  # set when fail_fast stopped the run

    def _row(self, f: Finding) -> tuple:
        guid = f.producer_guid.hex() if f.producer_guid else ""
        s = self.summary
        if f.type == UNDECODABLE:
            s.undecodable += 1
            if len(s.undecodable_offsets) < MAX_LISTED:
                s.undecodable_offsets.append(f.offset)
        elif f.type in NOT_FINDINGS:
            s.explained += 1
        else:
            s.findings[f.type] += 1
            if f.fatal:
                s.fatal_findings += 1
        return (
            self.region,
            self.topic,
            self.partition,
            f.offset,
            guid,
            f.segment,
            f.sequence,
            f.type,
            f.fatal,
            f.detail,
        )

    def feed(self, batch: pa.RecordBatch | pa.Table, envelopes: Heads | None = None) -> None:
        """Validate a batch of records (archive schema). Appends error rows to `self.rows`. `envelopes`: what
        `div.envelope_columns` read of the batch's rows already (a reader that ran before, over the same records in
        the same order, with a codec that had learnt nothing for version 14); read here when None."""
        n = batch.num_rows
        if n == 0:
            return
        # div.records.iter_records' loop, inlined: this is the benchmarked hot path, where a generator step per
        # record costs a few per cent. The parts are the shared ones: timestamps_ms, key_problem, the codec.
        cols = batch.schema.names
        key_col = batch.column(cols.index("key")).to_pylist()
        val_col = batch.column(cols.index("value")).to_pylist()
        off_col = batch.column(cols.index("offset")).to_pylist()
        ts_col = timestamps_ms(batch)
        hdr_col = batch.column(cols.index("headers")).to_pylist() if "headers" in cols else [None] * n
        s = self.summary
        if s.first_offset is None:
            s.first_offset = off_col[0]
            if s.start_offset is None:  # a run from the start of what the source holds (not restored)
                s.start_offset = off_col[0]
        s.records += n
        s.last_offset = off_col[-1]
        self.validator.records += n
        validator = self.validator
        process = validator.process
        decode = self.codec.decode
        rows = self.rows
        known = KNOWN_HEADERS
        undecodable = E.UndecodableError
        has_chain = bool(self.record_validators)
        lane = None
        if self.envelopes is not None and not has_chain and self._lane_may_take():
            lane = self._lane(batch, envelopes)
        if lane is None:
            common = fields = [None] * n
        else:
            common, fields, mv = lane
            process_common, process_rest = validator.process_common, validator.process_rest
        try:
            for key, value, offset, broker_ms, headers, is_common, f in zip(
                key_col, val_col, off_col, ts_col, hdr_col, common, fields, strict=True
            ):
                if is_common:
                    guid, segment, sequence, ts, mt, schema_id, a, b = f
                    put = mv[a:b] if b >= 0 else None
                    if process_common(
                        offset, key, guid, segment, sequence, ts, mt, schema_id, put, len(value)
                    ):
                        continue
                    # not the common case (a new segment, a gap, ...): the full procedure, on the codec's envelope
                elif not key or key[0] not in known:
                    reason = key_problem(key)
                    rows.append(self._undecodable(offset, reason))
                    if has_chain:
                        self._run_record_validators(offset, key, value, headers, None, broker_ms, reason)
                    continue
                try:
                    env = decode(value, headers)
                except undecodable as exc:
                    reason = str(exc)
                    rows.append(self._undecodable(offset, reason))
                    if has_chain:
                        self._run_record_validators(offset, key, value, headers, None, broker_ms, reason)
                    continue
                if is_common:
                    findings = process_rest(offset, key, env, broker_ms, len(value))
                else:
                    findings = process(offset, key, env, broker_ms, len(value))
                if findings:
                    for f in findings:
                        rows.append(self._row(f))
                        if f.fatal and self.fail_fast:
                            raise StopRun(f"fatal {f.type} at {self.topic}/{self.partition}@{offset}", offset)
                if has_chain:
                    self._run_record_validators(offset, key, value, headers, env, broker_ms, None)
        except StopRun as stop:
            # The records after the stopping one were not processed: the summary must not count them, so that
            # where a run stops does not depend on how its records were batched.
            i = off_col.index(stop.offset)
            unprocessed = n - i - 1
            s.records -= unprocessed
            validator.records -= unprocessed
            s.last_offset = off_col[i]
            s.eop_offset = validator.eop_offset
            raise
        s.eop_offset = validator.eop_offset

    def _lane_may_take(self) -> bool:
        """Whether the fast lane may take records of the next batch: some producer's segment is open for it, or no
        producer is tracked yet (the batch may start their segments). When every producer's segment began before
        the run (an RT read from where retention left it: their StartOfSegment is gone, so DIV tracks them
        unregistered) it can take none, and reading the batch for it would only add to each record's cost."""
        segments = self.validator.segments
        return not segments or any(seg.fast for seg in segments.values())

    def _lane(
        self, batch: pa.RecordBatch | pa.Table, heads: Heads | None
    ) -> tuple[list[bool], list, memoryview] | None:
        """The fast lane's columns of a batch: which rows `div.envelope_columns` read whole, each one's fields as
        `process_common` takes them (a Delete's putValue end is -1), and the values' buffer the positions index;
        None when it read none."""
        if heads is None:
            names = batch.schema.names
            heads = self.envelopes.read(
                batch.column(names.index("key")),
                batch.column(names.index("value")),
                batch.column(names.index("headers")) if "headers" in names else None,
            )
        if not heads.read.any():
            return None
        is_put = heads.is_put
        fields = zip(
            heads.guids(heads.read),
            heads.segment.tolist(),
            heads.sequence.tolist(),
            heads.message_timestamp.tolist(),
            heads.message_type.tolist(),
            heads.schema_id.tolist(),
            heads.value_start.tolist(),
            np.where(is_put, heads.value_end, -1).tolist(),
            strict=True,
        )
        return heads.read.tolist(), fields, memoryview(heads.data)

    def _undecodable(self, offset: int, detail: str) -> tuple:
        """A record no reader can decode: missing evidence (the run becomes partial), never a finding, and
        never a reason for --fail-fast to stop."""
        self.validator.note_undecodable(offset)
        return self._row(Finding(offset, None, -1, -1, UNDECODABLE, False, detail))

    def _run_record_validators(self, offset, key, value, headers, env, broker_ms, undecodable) -> None:
        record = Record(
            self.region, self.topic, self.partition, offset, key, value, headers, env, broker_ms, undecodable
        )
        for f in self.record_validators.run(record):
            self.rows.append(self._row(f))

    def finish(self) -> PartitionSummary:
        self.summary.producers_tracked = len(self.validator.segments)
        self.summary.eop_offset = self.validator.eop_offset
        return self.summary

    def table(self) -> pa.Table:
        return rows_to_table(self.rows)


def rows_to_table(rows: list[tuple]) -> pa.Table:
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in ERROR_COLUMNS]
    return pa.table({name: pa.array(col, type=t) for (name, t), col in zip(ERROR_COLUMNS, cols, strict=True)})
