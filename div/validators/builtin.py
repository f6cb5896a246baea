"""Built-in record validators: Kafka's own log checks, for the places where an archive can break them.

A broker enforces these when records are appended; an archive (or a copy of a topic made by another tool) is
not a broker and can hold records that break them. Configure them as `builtin:<name>` (see
div.validators.base and docs/validators.md):

- `offsets_increasing`: offsets strictly increase within a partition (Kafka's "out of order offsets").
- `timestamp_drift`: a record's timestamp is within `max_drift_ms` of the previous record's (the archive's
  stand-in for the broker clock that `log.message.timestamp.{before,after}.max.ms` compares with).
- `key_present`: records of compacted topics have a key (Kafka rejects keyless records there).
- `schema_ids`: value schema ids are in an allowed set (a registry check, the way a schema-validating broker does).
"""

from __future__ import annotations

import re
from typing import Any

from .. import envelope as E
from .. import keys
from ..records import (  # on PUTs of chunked values: they name no value schema
    CHUNK_SCHEMA_ID,
    MANIFEST_SCHEMA_ID,
)
from .base import PartitionContext, Record, RecordValidator


def _non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer (milliseconds), got {value!r}")
    return value


class OffsetsIncreasing(RecordValidator):
    """Rejects a record whose offset is not above the previous record's in the same partition."""

    name = "offsets_increasing"

    def __init__(self) -> None:
        self._prev: int | None = None

    def reset(self, context: PartitionContext) -> None:
        self._prev = None

    def validate(self, record: Record) -> str | None:
        prev, self._prev = self._prev, record.offset
        if prev is None or record.offset > prev:
            return None
        if record.offset == prev:
            return f"offset {record.offset} appears twice in a row"
        return f"offset {record.offset} follows offset {prev}: offsets must increase within a partition"


class TimestampDrift(RecordValidator):
    """Rejects a record whose timestamp differs from the previous record's by more than the allowed drift.

    Params: `max_drift_ms` (default one hour, KIP-937's default for timestamps ahead of the broker),
    `max_ahead_ms` (a separate limit for jumps forward; default = max_drift_ms; -1 = unlimited, for quiet topics
    whose records may be hours apart), `timestamp` ("broker", the Kafka record timestamp, or "producer", the
    envelope's messageTimestamp). Records without that timestamp are skipped. A record is compared with its
    predecessor whether or not that one was rejected, so one wild timestamp gives two rows: it and its successor.
    """

    name = "timestamp_drift"

    def __init__(
        self, max_drift_ms: int = 3_600_000, max_ahead_ms: int | None = None, timestamp: str = "broker"
    ) -> None:
        self.max_behind = _non_negative_int("max_drift_ms", max_drift_ms)
        if max_ahead_ms is None:
            self.max_ahead: int | None = self.max_behind
        elif max_ahead_ms == -1:
            self.max_ahead = None
        else:
            self.max_ahead = _non_negative_int("max_ahead_ms", max_ahead_ms)
        if timestamp not in ("broker", "producer"):
            raise ValueError(f"timestamp must be 'broker' or 'producer', got {timestamp!r}")
        self.use_broker = timestamp == "broker"
        self._prev: tuple[int, int] | None = None  # (offset, timestamp)

    def reset(self, context: PartitionContext) -> None:
        self._prev = None

    def validate(self, record: Record) -> str | None:
        ts = record.timestamp_ms if self.use_broker else record.producer_timestamp_ms
        if ts is None or ts < 0:
            return None
        prev, self._prev = self._prev, (record.offset, ts)
        if prev is None:
            return None
        prev_offset, prev_ts = prev
        delta = ts - prev_ts
        which = "timestamp" if self.use_broker else "producer timestamp"
        if delta < -self.max_behind:
            return (
                f"{which} {ts} is {-delta} ms before that of the previous record (offset {prev_offset}, "
                f"{prev_ts}); allowed drift {self.max_behind} ms"
            )
        if self.max_ahead is not None and delta > self.max_ahead:
            return (
                f"{which} {ts} is {delta} ms after that of the previous record (offset {prev_offset}, "
                f"{prev_ts}); allowed drift {self.max_ahead} ms"
            )
        return None


class KeyPresent(RecordValidator):
    """Rejects keyless records on compacted topics.

    Which topics: those named in `topics` or matching the regex `pattern` (full match); with neither, the
    topics the job treats as compacted (a min.compaction.lag.ms applies: --min-compaction-lag-ms, or a live
    topic whose cleanup.policy is compact).
    """

    name = "key_present"

    def __init__(self, topics: list[str] | str | None = None, pattern: str | None = None) -> None:
        if isinstance(topics, str):
            topics = [t.strip() for t in topics.split(",") if t.strip()]
        self.topics = frozenset(topics or ())
        try:
            self.pattern = re.compile(pattern) if pattern else None
        except re.error as exc:
            raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from None
        self._topic: str | None = None
        self._applies = False

    def _decide(self, topic: str, compacted: bool) -> bool:
        if not self.topics and self.pattern is None:
            return compacted
        return topic in self.topics or (
            self.pattern is not None and self.pattern.fullmatch(topic) is not None
        )

    def reset(self, context: PartitionContext) -> None:
        self._topic = context.topic
        self._applies = self._decide(context.topic, context.compacted)

    def validate(self, record: Record) -> str | None:
        if record.topic != self._topic:  # used without reset(): nothing says the topic is compacted
            self._topic = record.topic
            self._applies = self._decide(record.topic, False)
        if self._applies and record.key is None:
            return f"record without a key on compacted topic {record.topic} (Kafka rejects keyless records there)"
        return None


class SchemaIds(RecordValidator):
    """Rejects data records whose value schema id is not allowed.

    Params: `allowed` (ints and "lo-hi" ranges, as a list or a comma string: `[1, 2, "5-7"]` or "1,2,5-7");
    `chunks` (default true: also allow Venice's chunk and manifest ids -10 and -20). Checked: PUT and UPDATE
    `schemaId`, and DELETE `schemaId` unless it is -1 (a delete without one). Control messages, Global-RT-DIV
    records (key header 8, whose schemaId is a protocol version) and undecodable records are not checked.
    """

    name = "schema_ids"

    def __init__(self, allowed: list | str | int | None = None, chunks: bool = True) -> None:
        if allowed is None:
            raise ValueError("allowed (the value schema ids to accept) is required")
        items = (
            allowed.split(",")
            if isinstance(allowed, str)
            else allowed
            if isinstance(allowed, list)
            else [allowed]
        )
        self.ids: set[int] = set()
        self.ranges: list[tuple[int, int]] = []
        for item in items:
            self._add(item)
        if chunks:
            self.ids |= {CHUNK_SCHEMA_ID, MANIFEST_SCHEMA_ID}
        shown = sorted(str(i) for i in self.ids) + [f"{lo}-{hi}" for lo, hi in self.ranges]
        self._shown = "{" + ", ".join(shown) + "}"

    def _add(self, item: Any) -> None:
        if isinstance(item, int) and not isinstance(item, bool):
            self.ids.add(item)
            return
        text = str(item).strip()
        m = re.fullmatch(r"(-?\d+)\s*-\s*(-?\d+)", text)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise ValueError(f"allowed range {text!r} is empty")
            self.ranges.append((lo, hi))
        elif re.fullmatch(r"-?\d+", text):
            self.ids.add(int(text))
        else:
            raise ValueError(f"allowed entry {item!r} is neither a schema id nor a lo-hi range")

    def _ok(self, sid: int) -> bool:
        return sid in self.ids or any(lo <= sid <= hi for lo, hi in self.ranges)

    def validate(self, record: Record) -> str | None:
        env = record.envelope
        if env is None or (record.key and record.key[0] == keys.HEADER_GLOBAL_RT_DIV):
            return None
        name, body = env["payloadUnion"]
        if name == E.CONTROL:
            return None
        sid = body["schemaId"]
        if name == E.DELETE and sid == -1:
            return None
        if self._ok(sid):
            return None
        return f"value schema id {sid} of a {E.PAYLOAD_KIND[name]} is not allowed (allowed: {self._shown})"


BUILTINS: dict[str, type] = {
    cls.name: cls for cls in (OffsetsIncreasing, TimestampDrift, KeyPresent, SchemaIds)
}
