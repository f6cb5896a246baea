"""Pluggable record validators: checks that `div validate` runs after DIV on every record of a partition.

DIV judges producers (segments, sequences, checksums). Some problems are about the log itself or about what a
team expects of its store: offsets that go backwards, timestamps that jump, keyless records on a compacted topic,
values written with a schema nobody registered. Those are record validators: small classes named in configuration
as `module:Class` (or `builtin:<name>` for the ones in `div.validators.builtin`), run in order on every record.

Each sees a `Record` (topic, partition, offset, key, value, headers, decoded envelope or None when the value could
not be decoded, broker timestamp) and returns a rejection reason or None. A rejection is one row in the job's
errors table with `type` = `VALIDATOR:<name>` and the reason in `detail`: one row per culprit record, the way
KIP-467 reports the records that broke a batch instead of failing the whole batch. A validator that raises is
reported the same way ("validator raised ...") and the job goes on. Validator rows are never `fatal`.

How to write one: docs/validators.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import envelope as E
from ..validator import Finding

VALIDATOR_PREFIX = "VALIDATOR:"
# A validator that raises on every record would otherwise add one row per record (millions): after this many
# raises in one partition it is switched off for the rest of that partition, and a row says so.
MAX_RAISES_PER_PARTITION = 100


class ValidatorSpecError(ValueError):
    """A `validators:` entry or `--validator` value that cannot be turned into a validator (bad usage)."""


@dataclass(frozen=True)
class PartitionContext:
    """What a validator is told before a partition's first record."""

    region: int
    topic: str
    partition: int
    realtime: bool = False  # an RT topic (no End of Push; DIV faults are warnings)
    compacted: bool = False  # the job treats the topic as compacted (a min.compaction.lag.ms applies)


class Record:
    """One Kafka record as a validator sees it. Read-only by convention; build no state on it."""

    __slots__ = (
        "region",
        "topic",
        "partition",
        "offset",
        "key",
        "value",
        "headers",
        "envelope",
        "timestamp_ms",
        "undecodable",
    )

    def __init__(
        self,
        region: int,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: list | None,
        envelope: dict | None,
        timestamp_ms: int | None,
        undecodable: str | None = None,
    ) -> None:
        self.region = region
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key  # the Kafka key: Venice's header byte + key content; None for a keyless record
        self.value = value
        self.headers = headers  # [{"key": str, "value": bytes}, ...] or None
        self.envelope = envelope  # the decoded KafkaMessageEnvelope (div.envelope's dict shape), or None
        self.timestamp_ms = timestamp_ms  # the broker's record timestamp (epoch ms), None when absent
        self.undecodable = undecodable  # why the record could not be decoded (then envelope is None)

    @property
    def key_content(self) -> bytes | None:
        """The key without Venice's header byte."""
        return self.key[1:] if self.key else None

    def header(self, name: str) -> bytes | None:
        """The value of the first Kafka header called `name`."""
        for h in self.headers or ():
            if h["key"] == name:
                return h["value"]
        return None

    @property
    def payload_kind(self) -> str | None:
        """'PUT', 'UPDATE', 'DELETE', 'CONTROL', or None when undecodable."""
        return None if self.envelope is None else E.payload_kind(self.envelope)

    @property
    def producer_timestamp_ms(self) -> int | None:
        return None if self.envelope is None else self.envelope["producerMetadata"]["messageTimestamp"]

    def __repr__(self) -> str:
        return f"Record({self.topic}/{self.partition}@{self.offset})"


class RecordValidator:
    """Base class of record validators (subclassing is optional: any class with `validate` works).

    Configuration entries become keyword arguments of the constructor, so declare the parameters there; an
    unknown parameter is a usage error naming the entry. `name` is what rows say after `VALIDATOR:` (default:
    the class's `name` attribute, else the class name; a config entry's `name:` overrides it).
    """

    name: str = ""

    def reset(self, context: PartitionContext) -> None:
        """Called before each partition's first record: clear per-partition state here."""

    def validate(self, record: Record) -> str | None:
        """Return why the record is rejected, or None to accept it."""
        raise NotImplementedError


class Chain(list):
    """The configured validators, in order, with the per-partition bookkeeping of raises."""

    def __init__(self, validators: list | None = None) -> None:
        super().__init__(validators or [])
        self._raises = [0] * len(self)
        self._names = [validator_name(v) for v in self]

    def reset(self, context: PartitionContext) -> None:
        self._raises = [0] * len(self)
        self._names = [validator_name(v) for v in self]
        for v in self:
            reset = getattr(v, "reset", None)
            if reset is not None:
                reset(context)

    def run(self, record: Record) -> list[Finding]:
        """Run every validator on one record; one Finding per rejection (or raise), never fatal."""
        out: list[Finding] = []
        for i, v in enumerate(self):
            if self._raises[i] >= MAX_RAISES_PER_PARTITION:
                continue
            try:
                reason = v.validate(record)
            except Exception as exc:  # a broken validator must not stop the job
                raised = self._raises[i] = self._raises[i] + 1
                detail = f"validator raised {type(exc).__name__}: {exc}"
                if raised >= MAX_RAISES_PER_PARTITION:
                    detail += (
                        f" (raised {raised} times in this partition: not run on the rest of "
                        f"{record.topic}/{record.partition})"
                    )
                out.append(_finding(record, self._names[i], detail))
                continue
            if reason is not None and reason is not False:
                out.append(_finding(record, self._names[i], str(reason)))
        return out


def _finding(record: Record, name: str, detail: str) -> Finding:
    env = record.envelope
    if env is not None:
        pm = env["producerMetadata"]
        return Finding(
            record.offset,
            pm["producerGUID"],
            pm["segmentNumber"],
            pm["messageSequenceNumber"],
            VALIDATOR_PREFIX + name,
            False,
            detail,
        )
    return Finding(record.offset, None, -1, -1, VALIDATOR_PREFIX + name, False, detail)


def validator_name(v: Any) -> str:
    return getattr(v, "name", "") or type(v).__name__


def run_chain(chain: Chain | list, record: Record) -> list[Finding]:
    """Run `chain` on one record (a plain list is wrapped; its raise counts then last one call)."""
    if not isinstance(chain, Chain):
        chain = Chain(chain)
    return chain.run(record)
