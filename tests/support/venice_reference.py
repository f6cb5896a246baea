"""An independent Venice producer for tests: records built from Venice's own schema files with fastavro.

Why this exists: the DIV tests must not check our codec and writer against themselves. This module imports
nothing from `div`; it builds keys, envelopes and segment checksums straight from the reference notes
(`../shared/reference/venice-protocol-notes.md` §1–2) and Venice's schema files in
`../shared/reference/schemas/`, and it writes archives with pyarrow directly in Spark's Kafka schema. Tests feed
what it produces to the product and compare the product's answer with what Venice's rules say.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pathlib
import struct
import zlib

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMAS = pathlib.Path(__file__).resolve().parents[3] / "shared" / "reference" / "schemas"
NS = "com.linkedin.venice.kafka.protocol."

# messageType ints (not the payloadUnion branch order, venice-protocol-notes §1.3).
PUT, DELETE, CONTROL, UPDATE = 0, 1, 2, 3
# controlMessageType ints (venice-protocol-notes §0).
SOP, EOP, SOS, EOS, SOBR, SOIP, EOIP, TOPIC_SWITCH, VERSION_SWAP = range(9)
CONTROL_RECORDS = [
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
# checksum types (venice-protocol-notes §2.4)
NONE, MD5, ADLER32, CRC32, ADHASH = 0, 1, 2, 3, 4
EARLIEST_BLOB = bytes.fromhex("22010300")


def schema_json(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


_KME = None


def kme_schema():
    """Venice's KafkaMessageEnvelope v14, parsed by fastavro from the reference file."""
    global _KME
    if _KME is None:
        _KME = fastavro.parse_schema(schema_json("KafkaMessageEnvelope.v14.avsc"))
    return _KME


def type3_uuid(name: str) -> bytes:
    """Name-based (MD5) UUID, laid out as Venice's GUID (venice-protocol-notes §1.2)."""
    m = bytearray(hashlib.md5(name.encode()).digest())
    m[6] = (m[6] & 0x0F) | 0x30
    m[8] = (m[8] & 0x3F) | 0x80
    return bytes(m)


HB_GUID = type3_uuid("heartbeatControlMessage")
DOL_GUID = type3_uuid("declarationOfLeadershipControlMessage")


def control_key(guid: bytes, segment: int, sequence: int) -> bytes:
    return b"\x02" + guid + struct.pack(">ii", segment, sequence)


HB_KEY = control_key(HB_GUID, 0, 0)
DOL_KEY = control_key(DOL_GUID, 0, 0)


def encode_envelope(env: dict, version: int = 14, schema=None) -> bytes:
    """Magic 23, protocol version byte, Avro of `env` (record unions as (full name, dict) tuples)."""
    buf = io.BytesIO()
    buf.write(bytes([23, version & 0xFF]))
    fastavro.schemaless_writer(buf, schema or kme_schema(), env)
    return buf.getvalue()


def decode_envelope(value: bytes) -> dict:
    """Decode a v14 value with Venice's schema file (no resolution): for checking what our writer wrote."""
    assert value[0] == 23 and value[1] == 14, value[:2].hex()
    buf = io.BytesIO(value[2:])
    env = fastavro.schemaless_reader(buf, kme_schema(), None, return_record_name=True)
    assert buf.tell() == len(value) - 2, "trailing bytes after the envelope"
    return env


def default_footer(host: str) -> tuple[str, dict]:
    return (
        NS + "LeaderMetadata",
        {
            "hostName": host,
            "upstreamOffset": -1,
            "upstreamKafkaClusterId": -1,
            "upstreamPubSubPosition": EARLIEST_BLOB,
            "termId": -1,
            "upstreamMessageTimestamp": -1,
        },
    )


def control_payload(ctype: int, body: dict, debug_info: dict | None = None) -> tuple[str, dict]:
    return (
        NS + "ControlMessage",
        {
            "controlMessageType": ctype,
            "debugInfo": debug_info or {},
            "controlMessageUnion": (NS + CONTROL_RECORDS[ctype], body),
        },
    )


def envelope(
    message_type: int,
    guid: bytes,
    segment: int,
    sequence: int,
    ts: int,
    payload: tuple,
    logical_ts: int = -1,
    host: str = "ref-producer",
) -> dict:
    return {
        "messageType": message_type,
        "producerMetadata": {
            "producerGUID": guid,
            "segmentNumber": segment,
            "messageSequenceNumber": sequence,
            "messageTimestamp": ts,
            "logicalTimestamp": logical_ts,
        },
        "payloadUnion": payload,
        "leaderMetadataFooter": default_footer(host),
    }


class RunningChecksum:
    """The segment checksum of venice-protocol-notes §2.4, fed one byte string at a time."""

    def __init__(self, ctype: int) -> None:
        self.ctype = ctype
        self.sum = 0
        self.crc = 0
        self.adler = 1
        self.md5 = hashlib.md5()

    def feed(self, data: bytes) -> None:
        self.sum = (self.sum + zlib.crc32(data)) & 0xFFFFFFFFFFFFFFFF
        self.crc = zlib.crc32(data, self.crc)
        self.adler = zlib.adler32(data, self.adler)
        self.md5.update(data)

    def value(self) -> bytes:
        if self.ctype == ADHASH:
            return self.sum.to_bytes(8, "big")
        if self.ctype == CRC32:
            return self.crc.to_bytes(8, "big")
        if self.ctype == ADLER32:
            return self.adler.to_bytes(8, "big")
        if self.ctype == MD5:
            return self.md5.digest()
        return b""


def i32(n: int) -> bytes:
    return struct.pack(">i", n)


@dataclasses.dataclass
class Rec:
    """One Kafka record as a Venice producer sends it, plus what tests need to know about it."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    ts: int  # producer messageTimestamp; also the broker timestamp unless a test overrides it
    guid: bytes = b""
    segment: int = -1
    sequence: int = -1
    label: str = ""
    broker_ts: int | None = None

    def replace(self, **kw) -> Rec:
        return dataclasses.replace(self, **kw)


class RefProducer:
    """A Venice producer for one partition: SOS(0), data(1..), EOS(n) per segment, the checksum fed per notes
    §2.3. It never rolls by time; tests decide where segments end."""

    def __init__(
        self,
        guid: bytes,
        checksum_type: int = ADHASH,
        host: str = "ref-producer",
        start_ms: int = 0,
        send_vtp: bool = True,
    ) -> None:
        assert len(guid) == 16
        self.guid, self.ctype, self.host = guid, checksum_type, host
        self.clock = start_ms
        self.segment = -1
        self.seq = 0
        self.open = False
        self.cs: RunningChecksum | None = None
        self.send_vtp = send_vtp

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _rec(
        self, key: bytes, message_type: int, payload: tuple, seq: int, label: str, logical_ts: int = -1
    ) -> Rec:
        ts = self._tick()
        env = envelope(message_type, self.guid, self.segment, seq, ts, payload, logical_ts, self.host)
        headers = []
        if self.send_vtp and self.segment == 0 and seq == 0:
            headers.append(("vtp", (SCHEMAS / "KafkaMessageEnvelope.v14.avsc").read_bytes()))
        return Rec(key, encode_envelope(env), headers, ts, self.guid, self.segment, seq, label)

    def _ensure_open(self, out: list[Rec]) -> None:
        if self.open:
            return
        self.segment += 1
        self.seq = 0
        self.cs = RunningChecksum(self.ctype)
        self.cs.feed(i32(CONTROL))
        self.cs.feed(i32(SOS))
        out.append(
            self._rec(
                control_key(self.guid, self.segment, 0),
                CONTROL,
                control_payload(SOS, {"checksumType": self.ctype, "upcomingAggregates": []}),
                0,
                f"SOS{self.segment}",
            )
        )
        self.open = True

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def put(self, key: bytes, value: bytes, schema_id: int = 1, header: int = 0) -> list[Rec]:
        out: list[Rec] = []
        self._ensure_open(out)
        for f in (i32(PUT), key, i32(schema_id), value):
            self.cs.feed(f)
        payload = (
            NS + "Put",
            {
                "putValue": value,
                "schemaId": schema_id,
                "replicationMetadataVersionId": -1,
                "replicationMetadataPayload": b"",
            },
        )
        seq = self._next()
        out.append(self._rec(bytes([header]) + key, PUT, payload, seq, f"PUT{self.segment}.{seq}", -2))
        return out

    def delete(self, key: bytes) -> list[Rec]:
        out: list[Rec] = []
        self._ensure_open(out)
        for f in (i32(DELETE), key):
            self.cs.feed(f)
        payload = (
            NS + "Delete",
            {"schemaId": -1, "replicationMetadataVersionId": -1, "replicationMetadataPayload": b""},
        )
        seq = self._next()
        out.append(self._rec(b"\x00" + key, DELETE, payload, seq, f"DEL{self.segment}.{seq}", -2))
        return out

    def update(
        self, key: bytes, update_value: bytes, schema_id: int = 1, update_schema_id: int = 1
    ) -> list[Rec]:
        out: list[Rec] = []
        self._ensure_open(out)
        for f in (i32(UPDATE), key, i32(schema_id), i32(update_schema_id), update_value):
            self.cs.feed(f)
        payload = (
            NS + "Update",
            {"schemaId": schema_id, "updateSchemaId": update_schema_id, "updateValue": update_value},
        )
        seq = self._next()
        out.append(self._rec(b"\x04" + key, UPDATE, payload, seq, f"UPD{self.segment}.{seq}", -2))
        return out

    def control(self, ctype: int, body: dict) -> list[Rec]:
        out: list[Rec] = []
        self._ensure_open(out)
        self.cs.feed(i32(CONTROL))
        self.cs.feed(i32(ctype))
        seq = self._next()
        out.append(
            self._rec(
                control_key(self.guid, self.segment, seq),
                CONTROL,
                control_payload(ctype, body),
                seq,
                f"{CONTROL_RECORDS[ctype]}{self.segment}.{seq}",
            )
        )
        return out

    def start_of_push(self) -> list[Rec]:
        return self.control(
            SOP,
            {
                "sorted": False,
                "chunked": False,
                "compressionStrategy": 0,
                "compressionDictionary": None,
                "timestampPolicy": 0,
            },
        )

    def end_of_push(self) -> list[Rec]:
        return self.control(EOP, {})

    def end_segment(self, final: bool = False, checksum: bytes | None = None) -> list[Rec]:
        """EOS with the segment's checksum (or `checksum`, to forge a corrupt one)."""
        assert self.open
        seq = self._next()
        body = {
            "checksumValue": self.cs.value() if checksum is None else checksum,
            "computedAggregates": [],
            "finalSegment": final,
        }
        rec = self._rec(
            control_key(self.guid, self.segment, seq),
            CONTROL,
            control_payload(EOS, body),
            seq,
            f"EOS{self.segment}",
        )
        self.open = False
        return [rec]


def heartbeat(ts: int, host: str = "leader:1234") -> Rec:
    """A Venice heartbeat record (HB key, SOS body, seg 0 / seq 0, venice-protocol-notes §1.9)."""
    env = envelope(
        CONTROL,
        HB_GUID,
        0,
        0,
        ts,
        control_payload(SOS, {"checksumType": ADHASH, "upcomingAggregates": []}),
        -1,
        host,
    )
    return Rec(HB_KEY, encode_envelope(env), [("vtp", b"{}")], ts, HB_GUID, 0, 0, "HB")


def dol_stamp(ts: int, host: str = "leader:1234") -> Rec:
    """A Declaration-of-Leadership stamp: DoL key, seg 0 / seq 0 (venice-protocol-notes §2.6); its body is a StartOfSegment
    shape here, which DIV never looks at."""
    env = envelope(
        CONTROL,
        DOL_GUID,
        0,
        0,
        ts,
        control_payload(SOS, {"checksumType": ADHASH, "upcomingAggregates": []}),
        -1,
        host,
    )
    return Rec(DOL_KEY, encode_envelope(env), [], ts, DOL_GUID, 0, 0, "DOL")


# -- archives, written with pyarrow alone in Spark's Kafka source schema (docs/design.md, "Contracts") -------------
HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
SPARK_KAFKA_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", HEADERS_TYPE),
    ]
)


def write_archive(
    directory: str | os.PathLike, topic: str, partition: int, records: list[tuple[int, Rec]]
) -> None:
    """Write (offset, record) pairs of one partition as one Parquet file; the broker timestamp is
    `rec.broker_ts` when set, else the producer timestamp."""
    os.makedirs(directory, exist_ok=True)
    rows = {
        "key": [r.key for _, r in records],
        "value": [r.value for _, r in records],
        "topic": [topic] * len(records),
        "partition": [partition] * len(records),
        "offset": [o for o, _ in records],
        "timestamp": [(r.ts if r.broker_ts is None else r.broker_ts) * 1000 for _, r in records],
        "timestampType": [0] * len(records),
        "headers": [[{"key": k, "value": v} for k, v in r.headers] for _, r in records],
    }
    table = pa.table(
        {f.name: pa.array(rows[f.name], f.type) for f in SPARK_KAFKA_SCHEMA}, schema=SPARK_KAFKA_SCHEMA
    )
    pq.write_table(table, os.path.join(os.fspath(directory), f"{topic}-{partition}-ref.parquet"))


def flatten(*groups: list[Rec]) -> list[Rec]:
    out: list[Rec] = []
    for g in groups:
        out.extend(g)
    return out
