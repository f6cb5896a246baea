"""Writer schemas of every KafkaMessageEnvelope (KME) protocol version Venice ships, derived from our v14 copy.

Why this exists: byte 1 of a Venice value names the protocol version the writer used, and Avro binary data can
only be read with the writer's exact schema (resolved against our v14 reader schema). Venice ships versions
1..15. Instead of keeping fifteen near-identical schema files, we keep v14 (`schemas/KafkaMessageEnvelope.v14.avsc`)
and a delta table, written by us from reading Venice's schema history: `_DOWN[v]` lists what version `v` added
or changed compared with `v - 1`, expressed as the edits that turn the v`v` schema back into v`v-1`; `_UP[v]`
lists what a version newer than v14 adds. Version numbers we cannot build raise `UnknownProtocolVersion`; the
caller then falls back to the schema learnt from the `vtp` header (as Venice's KafkaValueSerializer does).

Things a reader of these schemas must know:
* `payloadUnion` had no `Update` branch before v7, so its branch *indices* differ (v1-v6: Put=0, Delete=1,
  ControlMessage=2). Avro resolves union branches by record name, so resolution against v14 is still correct.
* v9 named the RMD fields of Put/Delete `timestampMetadata*`; v10 renamed them `replicationMetadata*` without
  aliases, so (as in Venice) resolving v9 data yields the v14 defaults (-1 / empty) for those two fields.
* Before v9, Put's fields were in the order (schemaId, putValue); resolution matches fields by name.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import json
from dataclasses import dataclass
from typing import Any

import fastavro

READER_VERSION = 14
"""The protocol version of the schema file we keep; it is also the reader schema for every version."""

_V14_FILE = "KafkaMessageEnvelope.v14.avsc"


class UnknownProtocolVersion(LookupError):
    """Raised for a KME protocol version whose writer schema we cannot build."""

    def __init__(self, version: object) -> None:
        super().__init__(
            f"KafkaMessageEnvelope protocol version {version!r} is not one we can build "
            f"(known: {known_versions()}); learn its schema from the 'vtp' header instead"
        )
        self.version = version


# ---------------------------------------------------------------------------------------------------------------
# Edit operations. Each names records by their (unique) simple name: every named type in the KME is unique.


def _find_record(schema: Any, name: str) -> dict | None:
    if isinstance(schema, list):
        for branch in schema:
            found = _find_record(branch, name)
            if found is not None:
                return found
        return None
    if not isinstance(schema, dict):
        return None
    if schema.get("type") == "record" and schema.get("name") == name:
        return schema
    for field in schema.get("fields", ()):
        found = _find_record(field["type"], name)
        if found is not None:
            return found
    for key in ("items", "values"):
        if key in schema:
            found = _find_record(schema[key], name)
            if found is not None:
                return found
    return None


def _record(schema: dict, name: str) -> dict:
    found = _find_record(schema, name)
    if found is None:  # the delta table and the schema disagree: a bug in this module, not in the data
        raise RuntimeError(f"delta table refers to record {name!r}, which this schema does not contain")
    return found


def _field_index(record: dict, field: str) -> int:
    for i, f in enumerate(record["fields"]):
        if f["name"] == field:
            return i
    raise RuntimeError(f"delta table refers to field {record['name']}.{field}, which does not exist")


@dataclass(frozen=True)
class _RemoveField:
    record: str
    field: str

    def apply(self, schema: dict) -> None:
        rec = _record(schema, self.record)
        del rec["fields"][_field_index(rec, self.field)]


@dataclass(frozen=True)
class _AddField:
    record: str
    field: dict
    after: str | None = None  # None appends at the end

    def apply(self, schema: dict) -> None:
        rec = _record(schema, self.record)
        position = len(rec["fields"]) if self.after is None else _field_index(rec, self.after) + 1
        rec["fields"].insert(position, copy.deepcopy(self.field))


@dataclass(frozen=True)
class _RenameField:
    record: str
    old: str
    new: str

    def apply(self, schema: dict) -> None:
        rec = _record(schema, self.record)
        rec["fields"][_field_index(rec, self.old)]["name"] = self.new


@dataclass(frozen=True)
class _OrderFields:
    record: str
    order: tuple[str, ...]

    def apply(self, schema: dict) -> None:
        rec = _record(schema, self.record)
        if sorted(self.order) != sorted(f["name"] for f in rec["fields"]):
            raise RuntimeError(f"field order {self.order} does not list exactly the fields of {self.record}")
        rec["fields"] = [rec["fields"][_field_index(rec, name)] for name in self.order]


@dataclass(frozen=True)
class _RemoveBranch:
    record: str
    union_field: str
    branch: str

    def apply(self, schema: dict) -> None:
        rec = _record(schema, self.record)
        union = rec["fields"][_field_index(rec, self.union_field)]["type"]
        names = [b.get("name") if isinstance(b, dict) else b for b in union]
        if self.branch not in names:
            raise RuntimeError(f"union {self.record}.{self.union_field} has no branch {self.branch!r}")
        del union[names.index(self.branch)]


_Op = _RemoveField | _AddField | _RenameField | _OrderFields | _RemoveBranch

_KME = "KafkaMessageEnvelope"
_CMU = ("ControlMessage", "controlMessageUnion")
_PU = (_KME, "payloadUnion")

# ---------------------------------------------------------------------------------------------------------------
# The delta table. _DOWN[v]: edits turning the schema of version v into that of v - 1 (i.e. undoing what v added).

_DOWN: dict[int, tuple[_Op, ...]] = {
    # v14 added the leader's upstream message timestamp to the footer.
    14: (_RemoveField("LeaderMetadata", "upstreamMessageTimestamp"),),
    # v13 added region and generation information to VersionSwap.
    13: (
        _RemoveField("VersionSwap", "sourceRegion"),
        _RemoveField("VersionSwap", "destinationRegion"),
        _RemoveField("VersionSwap", "generationId"),
    ),
    # v12 added pub-sub positions (next to the numeric offsets) and the leader term id.
    12: (
        _RemoveField("VersionSwap", "localHighWatermarkPubSubPositions"),
        _RemoveField("LeaderMetadata", "upstreamPubSubPosition"),
        _RemoveField("LeaderMetadata", "termId"),
    ),
    # v11 added the VersionSwap control message (branch 8) and dropped two fields v10 still had: the deprecated
    # ProducerMetadata.upstreamOffset (superseded by LeaderMetadata.upstreamOffset) and the top-level
    # targetVersion used by incremental pushes.
    11: (
        _RemoveBranch(*_CMU, "VersionSwap"),
        _AddField(
            "ProducerMetadata",
            {
                "name": "upstreamOffset",
                "doc": "Deprecated: superseded by LeaderMetadata.upstreamOffset.",
                "type": "long",
                "default": -1,
            },
            after="messageTimestamp",
        ),
        _AddField(
            _KME,
            {
                "name": "targetVersion",
                "doc": "Incremental pushes only: the store's current version when the push started.",
                "type": "int",
                "default": -1,
            },
            after="producerMetadata",
        ),
    ),
    # v10 added the top-level targetVersion (removed again in v11) and renamed the RMD fields of Put and Delete
    # from timestampMetadata* to replicationMetadata*.
    10: (
        _RemoveField(_KME, "targetVersion"),
        _RenameField("Put", "replicationMetadataVersionId", "timestampMetadataVersionId"),
        _RenameField("Put", "replicationMetadataPayload", "timestampMetadataPayload"),
        _RenameField("Delete", "replicationMetadataVersionId", "timestampMetadataVersionId"),
        _RenameField("Delete", "replicationMetadataPayload", "timestampMetadataPayload"),
    ),
    # v9 added active/active support: the producer's logical timestamp, RMD fields on Put and Delete (Delete had
    # no fields before; Put's two original fields were swapped to putValue-first), SOP's timestampPolicy and
    # the footer's upstream cluster id.
    9: (
        _RemoveField("ProducerMetadata", "logicalTimestamp"),
        _RemoveField("Put", "timestampMetadataVersionId"),
        _RemoveField("Put", "timestampMetadataPayload"),
        _OrderFields("Put", ("schemaId", "putValue")),
        _RemoveField("Delete", "schemaId"),
        _RemoveField("Delete", "timestampMetadataVersionId"),
        _RemoveField("Delete", "timestampMetadataPayload"),
        _RemoveField("StartOfPush", "timestampPolicy"),
        _RemoveField("LeaderMetadata", "upstreamKafkaClusterId"),
    ),
    # v8 added the ZSTD dictionary to SOP and the leader metadata footer.
    8: (
        _RemoveField("StartOfPush", "compressionDictionary"),
        _RemoveField(_KME, "leaderMetadataFooter"),
    ),
    # v7 added leader/follower support: ProducerMetadata.upstreamOffset, the Update payload (inserted as
    # payloadUnion branch 1, shifting Delete and ControlMessage) and the TopicSwitch control message (branch 7).
    7: (
        _RemoveField("ProducerMetadata", "upstreamOffset"),
        _RemoveBranch(*_PU, "Update"),
        _RemoveBranch(*_CMU, "TopicSwitch"),
    ),
    # v6 added incremental-push start/end control messages (branches 5 and 6).
    6: (
        _RemoveBranch(*_CMU, "StartOfIncrementalPush"),
        _RemoveBranch(*_CMU, "EndOfIncrementalPush"),
    ),
    # v5 added SOP.compressionStrategy.
    5: (_RemoveField("StartOfPush", "compressionStrategy"),),
    # v4 added SOP.chunked.
    4: (_RemoveField("StartOfPush", "chunked"),),
    # v3 added the (since deprecated) StartOfBufferReplay control message (branch 4).
    3: (_RemoveBranch(*_CMU, "StartOfBufferReplay"),),
    # v2 added SOP.sorted (v1's StartOfPush has no fields).
    2: (_RemoveField("StartOfPush", "sorted"),),
}

# _UP[v]: edits turning version v - 1 into v, for versions newer than our v14 file.
_UP: dict[int, tuple[_Op, ...]] = {
    # v15 added a flag on EndOfSegment telling a new leader that the old one stepped down voluntarily. A v14
    # reader skips it (the writer's extra field is ignored by schema resolution).
    15: (
        _AddField(
            "EndOfSegment",
            {
                "name": "gracefulLeadershipHandoff",
                "doc": "True when a leader emits this EndOfSegment while voluntarily stepping down; "
                "LeaderMetadata.termId names the term being closed.",
                "type": "boolean",
                "default": False,
            },
        ),
    ),
}

_OLDEST = min(_DOWN) - 1
_NEWEST = max(_UP) if _UP else READER_VERSION


def known_versions() -> list[int]:
    """Every protocol version whose writer schema `writer_schema` can build, ascending."""
    return list(range(_OLDEST, _NEWEST + 1))


@functools.cache
def _v14_text() -> str:
    return (importlib.resources.files("div") / "schemas" / _V14_FILE).read_text(encoding="utf-8")


@functools.cache
def _build(version: int) -> str:
    schema = json.loads(_v14_text())
    if version < READER_VERSION:
        for step in range(READER_VERSION, version, -1):
            for op in _DOWN[step]:
                op.apply(schema)
    else:
        for step in range(READER_VERSION + 1, version + 1):
            for op in _UP[step]:
                op.apply(schema)
    # Cached as text so that no caller can mutate the cached structure.
    return json.dumps(schema)


def writer_schema(version: int) -> dict:
    """The JSON form of the KME writer schema for protocol `version` (a fresh structure the caller may modify)."""
    if isinstance(version, bool) or not isinstance(version, int) or not _OLDEST <= version <= _NEWEST:
        raise UnknownProtocolVersion(version)
    return json.loads(_build(version))


@functools.cache
def parsed_writer_schema(version: int) -> Any:
    """fastavro's parsed form of `writer_schema(version)`, cached; shared between callers, so do not modify it."""
    return fastavro.parse_schema(writer_schema(version))
