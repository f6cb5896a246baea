"""RMD schema generation, value-level encoding and checkpoint-vector decoding (div.rmd)."""

from __future__ import annotations

import io

import fastavro
import pytest

from div import rmd

USER = {
    "type": "record",
    "name": "User",
    "namespace": "example.avro",
    "fields": [
        {"name": "id", "type": "string", "default": ""},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
        {"name": "scores", "type": {"type": "map", "values": "int"}, "default": {}},
        {"name": "aliases", "type": ["null", {"type": "array", "items": "string"}], "default": None},
        {
            "name": "points",
            "type": {
                "type": "array",
                "items": {"type": "record", "name": "Pt", "fields": [{"name": "x", "type": "int"}]},
            },
            "default": [],
        },
        {"name": "maybe", "type": ["null", "int"], "default": None},
    ],
}


def _field(schema: dict, name: str) -> dict:
    return next(f for f in schema["fields"] if f["name"] == name)


def test_value_level_schema_matches_venice_for_string_values():
    schema = rmd.rmd_schema('"string"')
    assert (schema["name"], schema["namespace"]) == ("string_MetadataRecord", "com.linkedin.venice")
    assert [(f["name"], f["type"], f["default"]) for f in schema["fields"]] == [
        ("timestamp", ["long"], 0),
        ("replication_checkpoint_vector", {"type": "array", "items": "long"}, []),
    ]
    assert rmd.rmd_schema("bytes")["name"] == "bytes_MetadataRecord"
    assert rmd.rmd_schema({"type": "map", "values": "int"})["name"] == "map_MetadataRecord"
    assert rmd.rmd_schema(["null", "string"])["name"] == "union_MetadataRecord"


@pytest.mark.parametrize(
    ("timestamp", "vector", "expected_hex"),
    [
        (0, [], "000000"),  # branch 0, ts 0, empty array: what Venice writes today
        (5, [1, 2], "000a04020400"),
        (1_700_000_000_000, [123456789, -1], "0080a0abfef962" + "04" + "aab4de75" + "01" + "00"),
    ],
)
def test_encode_value_level_rmd_exact_bytes(timestamp, vector, expected_hex):
    payload = rmd.encode_value_level_rmd(timestamp, vector)
    assert payload.hex() == expected_hex
    assert rmd.decode_rmd_vector(payload) == vector
    assert rmd.decode_rmd_vector(payload, "bytes") == vector
    assert rmd.decode_rmd(payload)["timestamp"] == timestamp


def test_value_level_rmd_also_decodes_with_a_record_value_schema():
    payload = rmd.encode_value_level_rmd(77, [10, 0, 30])
    assert rmd.decode_rmd_vector(payload, USER) == [10, 0, 30]
    assert rmd.decode_rmd(payload, USER)["timestamp"] == 77


def test_record_rmd_schema_follows_venice_rules():
    schema = rmd.rmd_schema(USER)
    assert (schema["name"], schema["namespace"]) == ("User_MetadataRecord", "example.avro")
    ts = _field(schema, "timestamp")
    assert ts["default"] == 0 and ts["type"][0] == "long"
    per_field = ts["type"][1]
    assert (per_field["name"], per_field["namespace"]) == ("User", "example.avro")
    assert [f["name"] for f in per_field["fields"]] == ["id", "tags", "scores", "aliases", "points", "maybe"]
    assert _field(per_field, "id")["type"] == "long" and _field(per_field, "id")["default"] == 0
    assert _field(per_field, "maybe")["type"] == "long"  # a nullable int is not a collection
    tags = _field(per_field, "tags")["type"]
    assert tags["name"] == "array_CollectionMetadata_0"
    assert [f["name"] for f in tags["fields"]] == [
        "topLevelFieldTimestamp",
        "topLevelColoID",
        "putOnlyPartLength",
        "activeElementsTimestamps",
        "deletedElementsIdentities",
        "deletedElementsTimestamps",
    ]
    assert [f["default"] for f in tags["fields"]] == [0, -1, 0, [], [], []]
    assert _field(tags, "deletedElementsIdentities")["type"] == {"type": "array", "items": "string"}
    scores = _field(per_field, "scores")["type"]
    assert scores["name"] == "map_CollectionMetadata_1"
    assert _field(scores, "deletedElementsIdentities")["type"]["items"] == "string"  # map keys
    # [null, array<string>] is the same collection as `tags`, so it shares that record (no new number).
    assert _field(per_field, "aliases")["type"] == "example.avro.array_CollectionMetadata_0"
    points = _field(per_field, "points")["type"]
    assert points["name"] == "array_CollectionMetadata_2"
    assert _field(points, "deletedElementsIdentities")["type"]["items"]["name"] == "example.avro.Pt"
    assert _field(schema, "replication_checkpoint_vector")["default"] == []
    fastavro.parse_schema(schema)


def test_per_field_rmd_round_trip_with_map_and_array_fields():
    schema = fastavro.parse_schema(rmd.rmd_schema(USER))
    collection = {
        "topLevelFieldTimestamp": 5,
        "topLevelColoID": 1,
        "putOnlyPartLength": 2,
        "activeElementsTimestamps": [6, 7],
        "deletedElementsIdentities": ["gone"],
        "deletedElementsTimestamps": [8],
    }
    per_field = {
        "id": 11,
        "tags": collection,
        "scores": {**collection, "deletedElementsIdentities": ["k"]},
        "aliases": {**collection, "topLevelColoID": -1},
        "points": {**collection, "deletedElementsIdentities": [{"x": 3}]},
        "maybe": 12,
    }
    buf = io.BytesIO()
    fastavro.schemaless_writer(
        buf,
        schema,
        {"timestamp": ("example.avro.User", per_field), "replication_checkpoint_vector": [100, -1, 250]},
    )
    payload = buf.getvalue()
    assert payload[0] == 0x02  # timestamp union branch 1: per-field timestamps
    assert rmd.decode_rmd_vector(payload, USER) == [100, -1, 250]
    decoded = rmd.decode_rmd(payload, USER)["timestamp"]
    assert decoded["scores"]["deletedElementsIdentities"] == ["k"]
    assert decoded["points"]["deletedElementsIdentities"] == [{"x": 3}]
    # The same bytes cannot be read without the record value schema.
    with pytest.raises(rmd.RmdDecodeError, match="per-field"):
        rmd.decode_rmd_vector(payload)


def test_value_schema_as_json_text_is_accepted():
    import json

    payload = rmd.encode_value_level_rmd(1, [4])
    assert rmd.decode_rmd_vector(payload, json.dumps(USER)) == [4]


def test_decode_rejects_bad_payloads():
    with pytest.raises(rmd.RmdDecodeError, match="empty"):
        rmd.decode_rmd_vector(b"")
    with pytest.raises(rmd.RmdDecodeError, match="trailing"):
        rmd.decode_rmd_vector(rmd.encode_value_level_rmd(1, [2]) + b"\x00")
    with pytest.raises(rmd.RmdDecodeError):
        rmd.decode_rmd_vector(b"\x00\x0a\x04\x02")  # array cut short


def test_encode_rejects_non_integers():
    with pytest.raises(TypeError, match="1.5"):
        rmd.encode_value_level_rmd(1, [1.5])
    with pytest.raises(TypeError, match="timestamp"):
        rmd.encode_value_level_rmd("5", [])
