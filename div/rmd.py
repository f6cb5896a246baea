"""Replication metadata (RMD) of active/active stores: its schema, value-level encoding, and the checkpoint vector.

Why this exists: `Put.replicationMetadataPayload` / `Delete.replicationMetadataPayload` carry raw Avro (no
prefix) of a record Venice *generates* from the store's value schema (RMD protocol version 1; Venice's RmdSchemaGenerator), so
there is no schema file to load. Field 1 of that record, `replication_checkpoint_vector`, is the per-record
offset vector older Leap Frog logic compared; Venice writes it empty today but older data may still hold it.

Shape of the generated record `<name>_MetadataRecord` (namespace: the value record's, else `com.linkedin.venice`):
  0. `timestamp`: union of `long` (one timestamp for the whole value) and, only when the value schema is a
     RECORD, a per-field record with the value record's name and namespace. Default 0. For non-record values the
     union has the single branch `long`, so even a value-level timestamp is preceded by a branch index byte.
  1. `replication_checkpoint_vector`: array<long>, default [].
In the per-field record each value field becomes a `long` (default 0), except map/array fields (also as the
non-null side of a two-branch nullable union), which become `<map|array>_CollectionMetadata_<n>` records; fields
whose collection schemas are identical share one such record, and `n` counts distinct ones in field order.
"""

from __future__ import annotations

import copy
import functools
import io
import json
from collections.abc import Sequence
from typing import Any

import fastavro
from fastavro.schema import to_parsing_canonical_form

from .avro_bits import write_long

RMD_PROTOCOL_VERSION = 1
"""The only RMD protocol version Venice has (`Put/Delete.replicationMetadataVersionId`)."""

TIMESTAMP_FIELD = "timestamp"
VECTOR_FIELD = "replication_checkpoint_vector"

_NON_RECORD_NAMESPACE = "com.linkedin.venice"
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAMED = frozenset({"record", "error", "enum", "fixed"})

ValueSchema = dict | list | str | None
"""A value schema: parsed JSON (dict/list/primitive name), or its JSON text; None means "not a record"."""


class RmdDecodeError(ValueError):
    """An RMD payload that cannot be decoded with the schema derived from the given value schema."""


# ---------------------------------------------------------------------------------------------------------------
# Named-type bookkeeping: value schemas may define a type once and refer to it by name later. The RMD schema reuses
# array element types (for deleted-element tombstones), so definitions must be re-emitted where first used.


def _fullname(name: str, namespace: str | None) -> str:
    if "." in name or not namespace:
        return name
    return f"{namespace}.{name}"


def _split(fullname: str) -> tuple[str, str]:
    namespace, _, name = fullname.rpartition(".")
    return name, namespace


def _normalize(schema: Any, namespace: str | None, named: dict[str, Any]) -> Any:
    """Rewrite `schema` so that every named type carries its full name and no namespace key.

    Definitions are collected in `named`; references become full-name strings.
    """
    if isinstance(schema, list):
        return [_normalize(branch, namespace, named) for branch in schema]
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return schema
        full = _fullname(schema, namespace)
        if (
            full not in named and schema in named
        ):  # a null-namespace type referred to from a namespaced record
            full = schema
        if full not in named:
            raise ValueError(f"value schema refers to undefined type {schema!r}")
        return full
    if not isinstance(schema, dict):
        raise ValueError(f"value schema contains {schema!r}, which is not an Avro schema")
    kind = schema.get("type")
    if kind in _NAMED:
        full = _fullname(schema["name"], schema.get("namespace", namespace))
        own_namespace = _split(full)[1] or None
        out = {k: v for k, v in schema.items() if k not in ("namespace", "doc", "aliases")}
        out["name"] = full
        named[full] = out  # registered before the fields so that recursive references resolve
        if kind in ("record", "error"):
            out["fields"] = [
                {
                    **{k: v for k, v in f.items() if k not in ("doc", "aliases")},
                    "type": _normalize(f["type"], own_namespace, named),
                }
                for f in schema["fields"]
            ]
        return out
    if kind == "array":
        return {**schema, "items": _normalize(schema["items"], namespace, named)}
    if kind == "map":
        return {**schema, "values": _normalize(schema["values"], namespace, named)}
    if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind not in _PRIMITIVES):
        return _normalize(kind, namespace, named)  # {"type": <schema>} wrapper
    return schema


def _standalone(schema: Any, named: dict[str, Any], emitted: set[str]) -> Any:
    """`schema` with each named type defined at its first appearance (per `emitted`) and referenced after that."""
    if isinstance(schema, list):
        return [_standalone(branch, named, emitted) for branch in schema]
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return schema
        if schema in emitted:
            return schema
        return _standalone(named[schema], named, emitted)
    kind = schema.get("type")
    if kind in _NAMED:
        if schema["name"] in emitted:
            return schema["name"]
        emitted.add(schema["name"])
        out = dict(schema)
        if "." not in schema["name"]:
            out["namespace"] = ""  # keep a null-namespace type from inheriting the enclosing namespace
        if kind in ("record", "error"):
            out["fields"] = [{**f, "type": _standalone(f["type"], named, emitted)} for f in schema["fields"]]
        return out
    if kind == "array":
        return {**schema, "items": _standalone(schema["items"], named, emitted)}
    if kind == "map":
        return {**schema, "values": _standalone(schema["values"], named, emitted)}
    return schema


# ---------------------------------------------------------------------------------------------------------------
# Schema generation


def _collection_record(name: str, namespace: str, deleted_items: Any) -> dict:
    return {
        "type": "record",
        "name": name,
        "namespace": namespace,
        "doc": "Per-element conflict-resolution state of one collection field.",
        "fields": [
            {
                "name": "topLevelFieldTimestamp",
                "type": "long",
                "default": 0,
                "doc": "When the whole collection was last set.",
            },
            {
                "name": "topLevelColoID",
                "type": "int",
                "default": -1,
                "doc": "Region of the last applied whole-collection update.",
            },
            {
                "name": "putOnlyPartLength",
                "type": "int",
                "default": 0,
                "doc": "Length of the leading part of the collection that only full puts wrote.",
            },
            {
                "name": "activeElementsTimestamps",
                "type": {"type": "array", "items": "long"},
                "default": [],
                "doc": "One timestamp per live element, parallel to the collection.",
            },
            {
                "name": "deletedElementsIdentities",
                "type": {"type": "array", "items": deleted_items},
                "default": [],
                "doc": "Tombstones: deleted elements (map keys for maps).",
            },
            {
                "name": "deletedElementsTimestamps",
                "type": {"type": "array", "items": "long"},
                "default": [],
                "doc": "One timestamp per tombstone.",
            },
        ],
    }


_COLLECTION_DEFAULT = {
    "topLevelFieldTimestamp": 0,
    "topLevelColoID": -1,
    "putOnlyPartLength": 0,
    "activeElementsTimestamps": [],
    "deletedElementsIdentities": [],
    "deletedElementsTimestamps": [],
}


def _per_field_record(value: dict, named: dict[str, Any]) -> dict:
    namespace = _split(value["name"])[1]
    emitted: set[str] = set()
    collections: dict[str, dict] = {}  # parsing canonical form of a collection schema -> its metadata record

    def collection_type(field_type: Any) -> Any:
        if isinstance(field_type, str) and field_type not in _PRIMITIVES:
            field_type = named[field_type]
        if isinstance(field_type, list):
            others = [b for b in field_type if b != "null"]
            # Only a two-branch union with null looks through to its other side (Venice's "nullable pair").
            if len(field_type) == 2 and len(others) == 1:
                return collection_type(others[0])
            return "long"
        if not isinstance(field_type, dict) or field_type.get("type") not in ("array", "map"):
            return "long"
        kind = field_type["type"]
        key = to_parsing_canonical_form(_standalone(field_type, named, set()))
        if key in collections:
            return collections[key]
        items = "string" if kind == "map" else _standalone(field_type["items"], named, emitted)
        record = _collection_record(f"{kind}_CollectionMetadata_{len(collections)}", namespace, items)
        collections[key] = record
        return record

    fields = []
    for f in value["fields"]:
        meta_type = collection_type(f["type"])
        default = 0 if meta_type == "long" else copy.deepcopy(_COLLECTION_DEFAULT)
        # A collection record shared with an earlier field is defined there and referred to by name here.
        if isinstance(meta_type, dict) and any(meta_type is fld["type"] for fld in fields):
            meta_type = _fullname(meta_type["name"], namespace)
        fields.append(
            {
                "name": f["name"],
                "type": meta_type,
                "default": default,
                "doc": f"When {f['name']} was last updated.",
            }
        )
    name, _ = _split(value["name"])
    return {"type": "record", "name": name, "namespace": namespace, "fields": fields}


def _coerce(value_schema: ValueSchema) -> Any:
    if isinstance(value_schema, str) and value_schema not in _PRIMITIVES:
        try:
            return json.loads(value_schema)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"value schema {value_schema[:80]!r} is neither JSON nor a primitive type name"
            ) from exc
    return value_schema


def _value_type_name(schema: Any) -> str:
    """What Avro's Schema.getName() returns, which Venice uses to name the RMD record of a non-record value."""
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, str):
        return schema
    kind = schema.get("type")
    if kind in ("enum", "fixed"):
        return _split(_fullname(schema["name"], schema.get("namespace")))[0]
    if isinstance(kind, (dict, list)):
        return _value_type_name(kind)
    return kind


def _is_record(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") in ("record", "error")


def _generate(value_schema: Any) -> dict:
    if value_schema is not None and _is_record(value_schema):
        named: dict[str, Any] = {}
        value = _normalize(value_schema, None, named)
        name, namespace = _split(value["name"])
        timestamp_type: list[Any] = ["long", _per_field_record(value, named)]
    else:
        name = "bytes" if value_schema is None else _value_type_name(value_schema)
        namespace = _NON_RECORD_NAMESPACE
        timestamp_type = ["long"]
    record: dict[str, Any] = {"type": "record", "name": f"{name}_MetadataRecord"}
    if namespace:
        record["namespace"] = namespace
    record["fields"] = [
        {
            "name": TIMESTAMP_FIELD,
            "type": timestamp_type,
            "default": 0,
            "doc": "When the whole value was last updated, or (second branch) when each field was.",
        },
        {
            "name": VECTOR_FIELD,
            "type": {"type": "array", "items": "long"},
            "default": [],
            "doc": "Per region, the upstream offset of the last write that touched this record (legacy).",
        },
    ]
    return record


@functools.lru_cache(maxsize=256)
def _cached(value_schema_json: str) -> tuple[str, Any]:
    schema = _generate(json.loads(value_schema_json))
    return json.dumps(schema), fastavro.parse_schema(schema)


def _key(value_schema: ValueSchema) -> str:
    return json.dumps(_coerce(value_schema), sort_keys=True)


def rmd_schema(value_schema: ValueSchema = None) -> dict:
    """The RMD (protocol v1) schema Venice generates for `value_schema`, as fresh JSON.

    None stands for any non-record value schema; the name then reads `bytes_MetadataRecord`, which does not
    change the binary layout.
    """
    return json.loads(_cached(_key(value_schema))[0])


def encode_value_level_rmd(timestamp: int, vector: Sequence[int]) -> bytes:
    """Avro bytes of an RMD holding one value-level `timestamp` and the checkpoint `vector`.

    The layout is the same for every value schema (record or not): timestamp union branch 0, then the array.
    """
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise TypeError(f"RMD timestamp must be an int, got {timestamp!r}")
    bad = [v for v in vector if isinstance(v, bool) or not isinstance(v, int)]
    if bad:
        raise TypeError(f"replication checkpoint vector must hold ints, got {bad[0]!r} in {list(vector)!r}")
    # Written by hand (the layout is fixed: timestamp union branch 0, then the array of longs); a leader writes
    # one per record. tests/div/test_hand_encoders.py pins it to fastavro's bytes.
    if not vector:
        return b"\x00" + write_long(timestamp) + b"\x00"
    return b"".join(
        [b"\x00", write_long(timestamp), write_long(len(vector)), *map(write_long, vector), b"\x00"]
    )


def encode_value_level_rmd_reference(timestamp: int, vector: Sequence[int]) -> bytes:
    """`encode_value_level_rmd` through fastavro and the generated schema: the reference its tests compare with."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(
        buf, _cached(_key(None))[1], {TIMESTAMP_FIELD: timestamp, VECTOR_FIELD: list(vector)}
    )
    return buf.getvalue()


def decode_rmd(payload: bytes, value_schema: ValueSchema = None) -> dict:
    """The decoded RMD record: `timestamp` (an int, or a dict of per-field timestamps) and the vector.

    `value_schema` is needed only when the payload holds per-field timestamps (RECORD values).
    """
    data = bytes(payload)
    if not data:
        raise RmdDecodeError("RMD payload is empty (the record carries no replication metadata)")
    coerced = _coerce(value_schema)
    if data[0] != 0 and not (coerced is not None and _is_record(coerced)):
        # Union branch 1 (byte 0x02) is the per-field record, which only a RECORD value schema can describe.
        raise RmdDecodeError(
            f"RMD payload starts with timestamp branch byte 0x{data[0]:02x} (per-field timestamps); "
            f"decoding it needs the RECORD value schema, got {value_schema!r}"
        )
    parsed = _cached(_key(coerced))[1]
    stream = io.BytesIO(data)
    try:
        record = fastavro.schemaless_reader(stream, parsed, None)
    except Exception as exc:  # fastavro raises assorted errors on truncated or mismatched data
        raise RmdDecodeError(
            f"RMD payload {data[:32].hex()}... does not decode with the derived schema: {exc}"
        ) from exc
    if stream.tell() != len(data):
        raise RmdDecodeError(
            f"RMD payload has {len(data) - stream.tell()} trailing byte(s) after the record; "
            f"the value schema probably does not match (payload {data[:32].hex()})"
        )
    return record


def decode_rmd_vector(payload: bytes, value_schema: ValueSchema = None) -> list[int]:
    """`replication_checkpoint_vector` of an RMD payload (index = region/cluster id, value = RT offset)."""
    return list(decode_rmd(payload, value_schema)[VECTOR_FIELD])
