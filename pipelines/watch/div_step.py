"""One micro-batch of continuous DIV for one topic partition: `div validate`'s own run, resumed where it stopped.

`div validate` feeds each partition's records, in offset order, to one `div.batch.PartitionRun` (DIV, then the
configured record validators); a run's findings do not depend on how its records are cut into batches. The watch
gets a partition's records one micro-batch at a time, in another process each time, so between two micro-batches
the run lives in a state store as one bytes value (`DivPartitionState`), and a micro-batch is: resume the run from
it, feed the new records, save it again. There is no rule here: the decisions are `PartitionValidator`'s and the
record validators', and the state is theirs, whole, so a resumed run judges the next record exactly as the
uninterrupted one would (tests/pipelines/watch/test_div_step.py cuts partitions at every offset).

The state reuses div's encodings: Venice's PartitionState v24 for the checkpointed offset, End of Push and producer
states, as a replica's checkpoint holds them (`div.partition_state`); beside it, as JSON, what a running validator
knows and Venice does not checkpoint (`PartitionValidator.run_state`) and the writer schemas the run's codec learnt
from `vtp` headers (`EnvelopeCodec.learned`: a newer writer announces its schema only on a producer's first record);
and the record validators as they stand (a pickle: they are arbitrary classes whose only common form is the object).
The whole is framed and checked like `div.checkpoint`'s files. Its size grows with producers, with learnt schemas and
with the offsets of undecodable records (a later gap may be explained by them), never with the records read.

Offsets: a micro-batch continues where the last one stopped. Records at or before the last offset validated were
judged already (a range read again) and are left out, as repeated offsets are; a gap in offsets is whatever it is
inside one `div validate` run (DIV judges sequence numbers, not offsets, and compaction tolerance applies as
configured). Compaction tolerance compares record times with "now": `div validate` fixes it once per run, and a
watch should pass each micro-batch's own (`now_ms`, e.g. its trigger time), so that a micro-batch run again after a
restart decides as it did the first time.

A finding belongs to the micro-batch of the record that raised it, so each is emitted once; `finding_id` names it
the same way in every run (region, topic, partition, offset, type and its rank among that record's rows of that
type), so a sink can drop what a micro-batch run again after a restart appends a second time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import struct
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from div import archive
from div import envelope as E
from div import partition_state as ps
from div.batch import ERROR_COLUMNS, PartitionRun, is_realtime_topic
from div.checkpoint import CorruptCheckpointError, frame, unframe
from div.envelope_columns import Heads, reads_as_new
from div.validator import PartitionValidator, ValidatorConfig
from div.validators.registry import build_chain

# the archive columns a step reads (any order of rows; the stream gives them with `region`, topic and partition)
RECORD_COLUMNS = ["key", "value", "offset", "timestamp", "headers"]
FINDING_COLUMNS = [*ERROR_COLUMNS, ("finding_id", pa.string())]
FINDING_SCHEMA = pa.schema(FINDING_COLUMNS)
_MAGIC = b"TGDV"
_VERSION = 1
_LEN = struct.Struct(">I")


@dataclass
class DivPartitionState:
    """One partition's DIV run between two micro-batches (what a state store keeps, as `to_bytes`)."""

    offset: int = -1  # the last offset validated; -1: none yet
    # Venice's ProducerPartitionState records by producer GUID
    producer_states: dict[bytes, dict] = field(default_factory=dict)
    end_of_push: bool = False
    validator: dict[str, Any] | None = None  # PartitionValidator.run_state(); None: nothing validated yet
    learned: dict[int, Any] = field(default_factory=dict)  # the codec's schemas from vtp headers, by version
    record_validators: bytes = b""  # the record-validator chain, pickled; empty when none is configured
    last_update: int = -1  # broker time (ms) of the last record validated: PartitionState.lastUpdate

    def to_bytes(self) -> bytes:
        """One self-contained, checked value: Venice's PartitionState v24 record, the validator's run state and
        the learnt schemas (JSON), and the record validators, each length-prefixed, under div.checkpoint's
        length/CRC32 trailer."""
        venice = ps.encode(
            ps.build(
                self.offset,
                self.producer_states,
                end_of_push=self.end_of_push,
                last_update=self.last_update,
            )
        )
        rest = {"validator": self.validator, "learned": {str(v): s for v, s in self.learned.items()}}
        run = json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()
        parts = [venice, run, self.record_validators]
        return frame(_MAGIC + bytes([_VERSION]) + b"".join(_LEN.pack(len(p)) + p for p in parts))

    @classmethod
    def from_bytes(cls, data: bytes) -> DivPartitionState:
        """Raises CorruptCheckpointError for bytes that are torn, damaged or not such a state."""
        payload = unframe(data, "watch DIV state")
        if payload[:4] != _MAGIC or payload[4:5] != bytes([_VERSION]):
            raise CorruptCheckpointError(f"not a watch DIV state of version {_VERSION} ({payload[:5]!r})")
        parts, at = [], 5
        while at < len(payload):
            (n,) = _LEN.unpack_from(payload, at)
            parts.append(payload[at + 4 : at + 4 + n])
            at += 4 + n
        if len(parts) != 3 or at != len(payload):
            raise CorruptCheckpointError("watch DIV state: its parts do not add up")
        try:
            venice = ps.decode(parts[0])
            producer_states = ps.producer_states(venice)
        except ps.PartitionStateError as exc:
            raise CorruptCheckpointError(f"watch DIV state: {exc}") from None
        rest = json.loads(parts[1])
        return cls(
            offset=venice["offset"],
            producer_states=producer_states,
            end_of_push=venice["endOfPush"],
            validator=rest["validator"],
            learned={int(v): s for v, s in rest["learned"].items()},
            record_validators=parts[2],
            last_update=venice["lastUpdate"],
        )


@dataclass
class DivCounts:
    """What one micro-batch of one partition read and found (div validate's summary counts, per micro-batch)."""

    records: int = 0  # validated (new) records
    undecodable: int = 0
    explained: int = 0  # gaps and mismatches undecodable records in between can explain (not findings)
    findings: dict[str, int] = field(default_factory=dict)  # by type, VALIDATOR:<name> included
    fatal: int = 0
    producers: int = 0  # producers tracked after this micro-batch
    skipped: int = 0  # records at or before the last offset already validated, or repeated: left out


@dataclass
class DivStepResult:
    state: DivPartitionState
    findings: pa.Table  # FINDING_SCHEMA: div validate's errors rows of this micro-batch, plus finding_id
    counts: DivCounts


class DivStep:
    """`div validate` (DIV, then the record validators; never --fail-fast) over one partition's micro-batches.

    `config` is the validators' tolerances, `topic_configs` those of particular (region, topic)s, as `div validate`
    plans them (a VT's min.compaction.lag.ms read from its source; RT topics are told by name); `record_validators`
    the configuration entries `div validate` takes (`div.validators.registry.build_chain`).
    """

    def __init__(
        self,
        config: ValidatorConfig | None = None,
        *,
        topic_configs: Mapping[tuple[int, str], ValidatorConfig] | None = None,
        record_validators: list | None = None,
    ) -> None:
        self.config = config or ValidatorConfig()
        self.topic_configs = dict(topic_configs or {})
        self.record_validators = list(record_validators or [])
        build_chain(self.record_validators)  # a bad entry fails here, before any record
        # idle codecs by what they have learnt: a new codec compiles its decoders on first use (a millisecond or
        # so), far more than a small micro-batch costs; one is used by one call at a time
        self._codecs: dict[str, list[E.EnvelopeCodec]] = {}

    def config_for(self, region: int, topic: str) -> ValidatorConfig:
        return self.topic_configs.get((region, topic), self.config)

    def __call__(
        self,
        region: int,
        topic: str,
        partition: int,
        records: pa.Table | pa.RecordBatch,
        state: DivPartitionState | None = None,
        *,
        now_ms: int | None = None,
        envelopes: Heads | None = None,
    ) -> DivStepResult:
        """Validate one micro-batch's new records of (region, topic, partition): archive columns (`RECORD_COLUMNS`;
        headers may be absent), rows in any order. `state`: what the previous micro-batch returned (None: the
        partition's first). `now_ms`: the time compaction tolerance compares with (default: the config's).
        `envelopes`: `div.envelope_columns.read_envelopes` of `records` (in offset order), when a reader before
        this step read them (the watch reads each record once for Leap Frog and DIV)."""
        config = self.config_for(region, topic)
        if now_ms is not None:
            config = dataclasses.replace(config, now_ms=now_ms)
        last = state.offset if state is not None else -1
        fresh, skipped, picked = _new_records(records, last)
        learned = state.learned if state is not None else {}
        codec = self._codec(learned)
        run = self._resume(region, topic, partition, config, state, codec)
        if not reads_as_new(learned):
            envelopes = None  # read with a new codec, they are not what this partition's codec reads
        if envelopes is not None and picked is not None:
            envelopes = envelopes.take(picked)
        if fresh.num_rows:
            run.feed(fresh, envelopes)
        run.finish()
        learned = codec.learned()
        self._codecs.setdefault(_learned_key(learned), []).append(codec)
        s = run.summary
        counts = DivCounts(
            records=s.records,
            undecodable=s.undecodable,
            explained=s.explained,
            findings=dict(sorted(s.findings.items())),
            fatal=s.fatal_findings,
            producers=s.producers_tracked,
            skipped=skipped,
        )
        if fresh.num_rows:
            ts = archive.timestamps_ms(fresh.slice(fresh.num_rows - 1))[0]
            last, last_update = int(fresh.column("offset")[-1].as_py()), -1 if ts is None else ts
        else:
            last_update = state.last_update if state is not None else -1
        v, chain = run.validator, run.record_validators
        new_state = DivPartitionState(
            offset=last,
            producer_states=v.producer_states(),
            end_of_push=v.end_of_push,
            validator=v.run_state(),
            learned=learned,
            record_validators=pickle.dumps(chain, protocol=5) if chain else b"",
            last_update=last_update,
        )
        return DivStepResult(new_state, _with_ids(run.table()), counts)

    def _resume(
        self,
        region: int,
        topic: str,
        partition: int,
        config: ValidatorConfig,
        state: DivPartitionState | None,
        codec: E.EnvelopeCodec,
    ) -> PartitionRun:
        """The partition's run as the last micro-batch left it, or a new one (what `div validate` starts)."""
        validator = PartitionValidator(is_realtime=is_realtime_topic(topic), config=config)
        carried = None
        if state is not None and state.validator is not None:
            validator.resume(state.producer_states, state.end_of_push, state.validator)
            if state.record_validators:
                carried = pickle.loads(state.record_validators)
        run = PartitionRun(
            region,
            topic,
            partition,
            config=config,
            codec=codec,
            validator=validator,
            record_validators=None if carried is not None else build_chain(self.record_validators),
        )
        if carried is not None:
            # mid-partition: the chain goes on as it stands (PartitionRun resets the chain it is given)
            run.record_validators = carried
        return run

    def _codec(self, learned: dict[int, Any]) -> E.EnvelopeCodec:
        """A codec that knows what the partition's codec had learnt from `vtp` headers, and nothing else."""
        idle = self._codecs.get(_learned_key(learned))
        if idle:
            return idle.pop()
        return E.EnvelopeCodec.knowing(learned)


def _learned_key(learned: dict[int, Any]) -> str:
    return json.dumps(sorted(learned.items()), sort_keys=True) if learned else ""


def _new_records(records: pa.Table | pa.RecordBatch, last: int) -> tuple[pa.Table, int, np.ndarray | None]:
    """The records after offset `last`, in offset order, each offset once (as div validate's readers give them),
    in the archive's types; how many were left out; and which rows they are (None: all, in their order)."""
    table = archive.conform(records, RECORD_COLUMNS)
    n = table.num_rows
    if n == 0:
        return table, 0, None
    offsets = table.column("offset").to_numpy(zero_copy_only=False)
    order = np.argsort(offsets, kind="stable")
    ordered = offsets[order]
    keep = ordered > last
    keep[1:] &= ordered[1:] != ordered[:-1]
    picked = order[keep]
    if picked.size == n and (picked == np.arange(n)).all():
        return table, 0, None
    return table.take(pa.array(picked)), n - int(picked.size), picked


def finding_id(region: int, topic: str, partition: int, offset: int, type_: str, rank: int = 0) -> str:
    """The id of a finding wherever and however often it is computed: 32 hex digits. `rank` tells apart rows of
    one record with the same type (two record validators of one name)."""
    text = f"{region}\x00{topic}\x00{partition}\x00{offset}\x00{type_}\x00{rank}"
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _with_ids(table: pa.Table) -> pa.Table:
    seen: Counter = Counter()
    ids = []
    names = ("region", "topic", "partition", "offset", "type")
    for region, topic, partition, offset, type_ in zip(
        *(table.column(c).to_pylist() for c in names), strict=True
    ):
        rank = seen[(offset, type_)]
        seen[(offset, type_)] += 1
        ids.append(finding_id(region, topic, partition, offset, type_, rank))
    return table.append_column(FINDING_SCHEMA.field("finding_id"), pa.array(ids, pa.string()))
