"""Derived KafkaMessageEnvelope writer schemas: they parse, v14 is our file, and old data resolves to v14."""

from __future__ import annotations

import io
import json
import pathlib

import fastavro
import pytest
from fastavro.schema import to_parsing_canonical_form

from div import envelope_versions as ev

NS = "com.linkedin.venice.kafka.protocol."
OUR_V14 = pathlib.Path(ev.__file__).parent / "schemas" / "KafkaMessageEnvelope.v14.avsc"
SHARED_V14 = pathlib.Path("/work/shared/reference/schemas/KafkaMessageEnvelope.v14.avsc")
OLDER = [v for v in ev.known_versions() if v != ev.READER_VERSION]
GUID = bytes(range(16))
# controlMessageType numbering; the controlMessageUnion branch order must follow it in every version.
CONTROL_BRANCHES = [
    "StartOfPush",
    "EndOfPush",
    "StartOfSegment",
    "EndOfSegment",
    "StartOfBufferReplay",
    "StartOfIncrementalPush",
    "EndOfIncrementalPush",
    "TopicSwitch",
    "VersionSwap",
]


def _pcf(schema) -> str:
    return to_parsing_canonical_form(fastavro.parse_schema(schema))


def _fields(schema: dict, record: str) -> list[str]:
    found = ev._find_record(schema, record)
    return [] if found is None else [f["name"] for f in found["fields"]]


def _union(schema: dict, record: str, field: str) -> list[str]:
    rec = ev._find_record(schema, record)
    union = next(f["type"] for f in rec["fields"] if f["name"] == field)
    return [b["name"] if isinstance(b, dict) else b for b in union]


def _resolve(version: int, datum: dict) -> dict:
    """Write `datum` with the writer schema of `version`, read it back through resolution to the v14 reader."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, ev.parsed_writer_schema(version), datum)
    return fastavro.schemaless_reader(
        io.BytesIO(buf.getvalue()),
        ev.parsed_writer_schema(version),
        ev.parsed_writer_schema(14),
        return_record_name=True,
    )


def _as_bytes(value) -> bytes:
    # fastavro hands out a reader-side `bytes` default as the JSON string from the schema ('' here), where Java
    # Avro gives empty bytes; both mean "empty".
    return value.encode("latin-1") if isinstance(value, str) else value


def _envelope(version: int, message_type: int, payload: tuple[str, dict]) -> dict:
    """A datum for `version` that fills every field the version has (so nothing is left to writer defaults)."""
    schema = ev.writer_schema(version)
    producer = {
        "producerGUID": GUID,
        "segmentNumber": 3,
        "messageSequenceNumber": 7,
        "messageTimestamp": 1_700_000_000_000,
    }
    pm_fields = _fields(schema, "ProducerMetadata")
    if "upstreamOffset" in pm_fields:
        producer["upstreamOffset"] = 99
    if "logicalTimestamp" in pm_fields:
        producer["logicalTimestamp"] = 42
    datum = {
        "messageType": message_type,
        "producerMetadata": producer,
        "payloadUnion": (NS + payload[0], payload[1]),
    }
    top = [f["name"] for f in schema["fields"]]
    if "targetVersion" in top:
        datum["targetVersion"] = 5
    if "leaderMetadataFooter" in top:
        lm = {"hostName": "leader:1", "upstreamOffset": 100}
        for name, value in (
            ("upstreamKafkaClusterId", 2),
            ("upstreamPubSubPosition", b"\x22\x01\x00\x02\xc8\x01"),
            ("termId", 8),
            ("upstreamMessageTimestamp", 1_699_999_999_000),
        ):
            if name in _fields(schema, "LeaderMetadata"):
                lm[name] = value
        datum["leaderMetadataFooter"] = (NS + "LeaderMetadata", lm)
    return datum


def _put(version: int) -> tuple[str, dict]:
    fields = _fields(ev.writer_schema(version), "Put")
    put = {"putValue": b"value", "schemaId": 1}
    for prefix in ("timestampMetadata", "replicationMetadata"):
        if prefix + "VersionId" in fields:
            put[prefix + "VersionId"] = 1
            put[prefix + "Payload"] = b"\x00\x0a\x00"
    return "Put", put


def _delete(version: int) -> tuple[str, dict]:
    fields = _fields(ev.writer_schema(version), "Delete")
    delete = {}
    if "schemaId" in fields:
        delete["schemaId"] = 1
    for prefix in ("timestampMetadata", "replicationMetadata"):
        if prefix + "VersionId" in fields:
            delete[prefix + "VersionId"] = 1
            delete[prefix + "Payload"] = b"\x00\x0a\x00"
    return "Delete", delete


# ---------------------------------------------------------------------------------------------------------------


def test_known_versions_are_one_to_fifteen():
    assert ev.known_versions() == list(range(1, 16))


@pytest.mark.parametrize("version", list(range(1, 16)))
def test_every_known_version_parses_and_is_distinct_from_its_predecessor(version):
    parsed = ev.parsed_writer_schema(version)
    assert parsed["name"] == NS + "KafkaMessageEnvelope"
    if version > 1:
        assert _pcf(ev.writer_schema(version)) != _pcf(ev.writer_schema(version - 1))


def test_v14_is_our_file_and_the_reference_file():
    derived = ev.writer_schema(14)
    ours = json.loads(OUR_V14.read_text(encoding="utf-8"))
    assert derived == ours
    assert _pcf(derived).encode() == _pcf(ours).encode()
    if SHARED_V14.exists():
        assert _pcf(derived).encode() == _pcf(json.loads(SHARED_V14.read_text(encoding="utf-8"))).encode()
        assert derived == json.loads(SHARED_V14.read_text(encoding="utf-8"))


@pytest.mark.parametrize("bad", [0, -1, 16, 23, True, "14", 14.0, None])
def test_unbuildable_versions_raise_and_name_the_version(bad):
    with pytest.raises(ev.UnknownProtocolVersion) as info:
        ev.writer_schema(bad)
    assert repr(bad) in str(info.value)
    assert info.value.version == bad


def test_writer_schema_returns_a_fresh_structure():
    first = ev.writer_schema(9)
    first["fields"].clear()
    assert ev.writer_schema(9)["fields"]


def test_payload_union_branch_order():
    for version in ev.known_versions():
        names = _union(ev.writer_schema(version), "KafkaMessageEnvelope", "payloadUnion")
        expected = (
            ["Put", "Update", "Delete", "ControlMessage"]
            if version >= 7
            else ["Put", "Delete", "ControlMessage"]
        )
        assert names == expected, version
    # On the wire the branch index follows producerMetadata: v14 Delete is branch 2, v1 Delete branch 1.
    for version, index in ((14, 2), (1, 1)):
        datum = _envelope(version, 1, _delete(version))
        head_schema = ev.writer_schema(version)
        head_schema["fields"] = head_schema["fields"][:2]  # messageType, producerMetadata
        head, full = io.BytesIO(), io.BytesIO()
        fastavro.schemaless_writer(head, fastavro.parse_schema(head_schema), datum)
        fastavro.schemaless_writer(full, ev.parsed_writer_schema(version), datum)
        assert full.getvalue().startswith(head.getvalue())
        assert full.getvalue()[len(head.getvalue())] == index * 2  # zig-zag varint of the branch index


def test_control_message_branches_only_ever_grow_at_the_end():
    for version in ev.known_versions():
        names = _union(ev.writer_schema(version), "ControlMessage", "controlMessageUnion")
        assert names == CONTROL_BRANCHES[: len(names)], version
    assert len(_union(ev.writer_schema(14), "ControlMessage", "controlMessageUnion")) == 9


def test_field_history_spot_checks():
    # Facts from Venice's schema files that the delta table must reproduce.
    assert _fields(ev.writer_schema(1), "Put") == ["schemaId", "putValue"]
    assert _fields(ev.writer_schema(8), "Put") == ["schemaId", "putValue"]
    assert _fields(ev.writer_schema(9), "Put") == [
        "putValue",
        "schemaId",
        "timestampMetadataVersionId",
        "timestampMetadataPayload",
    ]
    assert _fields(ev.writer_schema(1), "StartOfPush") == []
    assert _fields(ev.writer_schema(10), "ProducerMetadata") == [
        "producerGUID",
        "segmentNumber",
        "messageSequenceNumber",
        "messageTimestamp",
        "upstreamOffset",
        "logicalTimestamp",
    ]
    assert [f["name"] for f in ev.writer_schema(10)["fields"]] == [
        "messageType",
        "producerMetadata",
        "targetVersion",
        "payloadUnion",
        "leaderMetadataFooter",
    ]
    for version in (9, 11):  # targetVersion lived in v10 only
        assert [f["name"] for f in ev.writer_schema(version)["fields"]] == [
            "messageType",
            "producerMetadata",
            "payloadUnion",
            "leaderMetadataFooter",
        ]
    assert [f["name"] for f in ev.writer_schema(7)["fields"]] == [
        "messageType",
        "producerMetadata",
        "payloadUnion",
    ]
    assert _fields(ev.writer_schema(8), "LeaderMetadata") == ["hostName", "upstreamOffset"]
    assert _fields(ev.writer_schema(12), "VersionSwap")[2:4] == [
        "localHighWatermarks",
        "localHighWatermarkPubSubPositions",
    ]
    assert _fields(ev.writer_schema(15), "EndOfSegment")[-1] == "gracefulLeadershipHandoff"


@pytest.mark.parametrize("version", OLDER)
def test_old_put_resolves_to_v14_with_defaults(version):
    got = _resolve(version, _envelope(version, 0, _put(version)))
    pm = got["producerMetadata"]
    assert (pm["producerGUID"], pm["segmentNumber"], pm["messageSequenceNumber"]) == (GUID, 3, 7)
    assert pm["messageTimestamp"] == 1_700_000_000_000
    assert pm["logicalTimestamp"] == (42 if version >= 9 else -1)
    assert "upstreamOffset" not in pm and "targetVersion" not in got
    name, put = got["payloadUnion"]
    assert name == NS + "Put"
    assert (put["putValue"], put["schemaId"]) == (b"value", 1)
    # v9 called these timestampMetadata*; with no alias in v10+, resolution falls back to the defaults.
    carried = version >= 10
    assert put["replicationMetadataVersionId"] == (1 if carried else -1)
    assert _as_bytes(put["replicationMetadataPayload"]) == (b"\x00\x0a\x00" if carried else b"")

    footer = got["leaderMetadataFooter"]
    if version < 8:
        assert footer is None
        return
    name, lm = footer
    assert name == NS + "LeaderMetadata"
    assert (lm["hostName"], lm["upstreamOffset"]) == ("leader:1", 100)
    assert lm["upstreamKafkaClusterId"] == (2 if version >= 9 else -1)
    assert _as_bytes(lm["upstreamPubSubPosition"]) == (b"\x22\x01\x00\x02\xc8\x01" if version >= 12 else b"")
    assert lm["termId"] == (8 if version >= 12 else -1)
    assert lm["upstreamMessageTimestamp"] == (1_699_999_999_000 if version >= 14 else -1)


@pytest.mark.parametrize("version", OLDER)
def test_old_delete_resolves_to_v14_with_defaults(version):
    name, delete = _resolve(version, _envelope(version, 1, _delete(version)))["payloadUnion"]
    assert name == NS + "Delete"
    assert delete["schemaId"] == (1 if version >= 9 else -1)
    assert delete["replicationMetadataVersionId"] == (1 if version >= 10 else -1)
    assert _as_bytes(delete["replicationMetadataPayload"]) == (b"\x00\x0a\x00" if version >= 10 else b"")


@pytest.mark.parametrize("version", [v for v in OLDER if v >= 7])
def test_old_update_resolves(version):
    update = {"schemaId": 1, "updateSchemaId": 2, "updateValue": b"u"}
    assert _resolve(version, _envelope(version, 3, ("Update", update)))["payloadUnion"] == (
        NS + "Update",
        update,
    )


@pytest.mark.parametrize("version", OLDER)
def test_old_start_of_push_gets_v14_defaults(version):
    schema = ev.writer_schema(version)
    sop_fields = _fields(schema, "StartOfPush")
    written = {
        "sorted": True,
        "chunked": True,
        "compressionStrategy": 2,
        "compressionDictionary": b"dict",
        "timestampPolicy": 1,
    }
    sop = {k: v for k, v in written.items() if k in sop_fields}
    cm = {
        "controlMessageType": 0,
        "debugInfo": {"host": "h"},
        "controlMessageUnion": (NS + "StartOfPush", sop),
    }
    name, got = _resolve(version, _envelope(version, 2, ("ControlMessage", cm)))["payloadUnion"]
    assert name == NS + "ControlMessage"
    assert got["debugInfo"] == {"host": "h"}
    assert got["controlMessageUnion"][0] == NS + "StartOfPush"
    defaults = {
        "sorted": False,
        "chunked": False,
        "compressionStrategy": 0,
        "compressionDictionary": None,
        "timestampPolicy": 0,
    }
    expected = {k: (written[k] if k in sop_fields else defaults[k]) for k in defaults}
    assert got["controlMessageUnion"][1] == expected
    assert len(sop_fields) == {1: 0, 2: 1, 3: 1, 4: 2, 5: 3, 6: 3, 7: 3, 8: 4}.get(version, 5)


@pytest.mark.parametrize("version", [11, 12, 13])
def test_old_version_swap_gets_v14_defaults(version):
    vs = {
        "oldServingVersionTopic": "s_v1",
        "newServingVersionTopic": "s_v2",
        "localHighWatermarks": [5, 6],
        "isRepush": True,
        "isLastVersionSwapMessageFromRealTimeTopic": True,
    }
    if version >= 12:
        vs["localHighWatermarkPubSubPositions"] = [b"\x22\x01"]
    if version >= 13:
        vs.update(sourceRegion="a", destinationRegion="b", generationId=9)
    cm = {"controlMessageType": 8, "debugInfo": {}, "controlMessageUnion": (NS + "VersionSwap", vs)}
    _, got = _resolve(version, _envelope(version, 2, ("ControlMessage", cm)))["payloadUnion"]
    name, swap = got["controlMessageUnion"]
    assert name == NS + "VersionSwap"
    assert swap["localHighWatermarks"] == [5, 6] and swap["isRepush"] is True
    assert swap["localHighWatermarkPubSubPositions"] == ([b"\x22\x01"] if version >= 12 else [])
    assert (swap["sourceRegion"], swap["destinationRegion"], swap["generationId"]) == (
        ("a", "b", 9) if version >= 13 else ("", "", -1)
    )


def test_v15_end_of_segment_resolves_to_v14_dropping_the_new_flag():
    eos = {
        "checksumValue": b"\x01\x02",
        "computedAggregates": [1],
        "finalSegment": False,
        "gracefulLeadershipHandoff": True,
    }
    cm = {"controlMessageType": 3, "debugInfo": {}, "controlMessageUnion": (NS + "EndOfSegment", eos)}
    got = _resolve(15, _envelope(15, 2, ("ControlMessage", cm)))
    name, seg = got["payloadUnion"][1]["controlMessageUnion"]
    assert name == NS + "EndOfSegment"
    assert seg == {"checksumValue": b"\x01\x02", "computedAggregates": [1], "finalSegment": False}
    assert got["leaderMetadataFooter"][1]["termId"] == 8
