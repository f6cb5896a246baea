"""Hand-built version-topic partitions for the Leap Frog job's edge cases: chunked values, broken records, Kafka.

`generated` histories (tests/support/vt_fixtures.py) cover the comparison rules; this builder writes the records those
histories never contain, byte for byte as Venice does, so a test can say exactly what each offset holds:

- StartOfPush (optionally `chunked = true`), End of Push, VT heartbeats with an `hbw` vector;
- PUTs and DELETEs with a leader footer (upstream region, RT offset);
- in a chunked version (venice-protocol-notes §1.7), every data key followed by an Avro `ChunkedKeySuffix` — `02 00` for whole
  values and manifests — and a large value written as chunks (PUT, schemaId -10, chunk-suffixed keys, the
  default footer) followed by its manifest (PUT, schemaId -20, `ChunkedValueManifest` listing the chunk keys,
  the real footer); when a key's chunked value is replaced or deleted, DELETEs of the old chunk keys follow
  with the same footer as the new record;
- arbitrary raw records (bad magic, truncated Avro, missing footer).

The key suffix and the manifest are encoded here with fastavro from the schema files, not with the code under
test. Offsets are consecutive from 0, as a producer into an empty Kafka partition would get them.
"""

from __future__ import annotations

import io
import json
import pathlib
from dataclasses import dataclass, field

import fastavro
import xxhash

from div import envelope as E
from div import keys as K
from div.archive import ArchiveWriter
from div.heartbeat_headers import Watermarks, encode_hbw

SCHEMAS = pathlib.Path(__file__).resolve().parents[2] / "div" / "schemas"
CODEC = E.EnvelopeCodec("fastavro")
TS = 1_700_000_000_000
VALUE_SCHEMA_ID = 1


def _schema(name: str):
    return fastavro.parse_schema(json.loads((SCHEMAS / name).read_text(encoding="utf-8")))


_SUFFIX = _schema("ChunkedKeySuffix.avsc")
_MANIFEST = _schema("ChunkedValueManifest.avsc")


def _avro(schema, datum) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, datum)
    return buf.getvalue()


NON_CHUNK_SUFFIX = _avro(_SUFFIX, {"chunkId": None, "isChunk": False})
assert NON_CHUNK_SUFFIX == b"\x02\x00"


def chunk_suffix(guid: bytes, segment: int, sequence: int, index: int) -> bytes:
    return _avro(
        _SUFFIX,
        {
            "chunkId": {
                "producerGUID": guid,
                "segmentNumber": segment,
                "messageSequenceNumber": sequence,
                "chunkIndex": index,
            },
            "isChunk": True,
        },
    )


def value_hash(value: bytes) -> int:
    """The job's documented value hash (xxh3-64 of the value bytes, as a signed long), computed independently."""
    h = xxhash.xxh3_64_intdigest(value)
    return h - (1 << 64) if h >= 1 << 63 else h


@dataclass
class Record:
    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None


@dataclass
class RegionVt:
    """One region's VT partition, record by record. `chunked`: the version is chunked (keys carry suffixes)."""

    region: int
    partition: int = 0
    chunked: bool = False
    host: str = "leader"
    records: list[Record] = field(default_factory=list)
    _guid: bytes = b""
    _seq: int = 0
    _chunk_keys: dict[bytes, list[bytes]] = field(default_factory=dict)  # user key -> its current chunk keys

    def __post_init__(self) -> None:
        self._guid = bytes([0x40 + self.region]) + bytes(range(1, 16))

    @property
    def next_offset(self) -> int:
        return len(self.records)

    # -- low level ----------------------------------------------------------------------------------------
    def _env(self, message_type: int, payload, footer) -> tuple[dict, int]:
        seq = self._seq
        self._seq += 1
        return {
            "messageType": message_type,
            "producerMetadata": E.producer_metadata(self._guid, 0, seq, TS, -2),
            "payloadUnion": payload,
            "leaderMetadataFooter": footer,
        }, seq

    def raw(self, key: bytes, value: bytes | None, headers=None) -> int:
        """Append any bytes; returns the record's offset."""
        self.records.append(Record(key, value, headers))
        return len(self.records) - 1

    def _data(self, content: bytes, env: dict) -> int:
        return self.raw(K.data_key(content), CODEC.encode(env))

    def _control(self, ctype: int, body: dict) -> int:
        env, seq = self._env(2, E.control_message(ctype, body), E.default_footer(self.host))
        return self.raw(K.control_key(self._guid, 0, seq), CODEC.encode(env))

    def _content(self, user_key: bytes) -> bytes:
        return user_key + NON_CHUNK_SUFFIX if self.chunked else user_key

    # -- control messages ---------------------------------------------------------------------------------
    def start_of_push(self) -> int:
        return self._control(
            E.START_OF_PUSH,
            {
                "sorted": False,
                "chunked": self.chunked,
                "compressionStrategy": 0,
                "compressionDictionary": None,
                "timestampPolicy": 0,
            },
        )

    def end_of_push(self) -> int:
        return self._control(E.END_OF_PUSH, {})

    def version_swap(self, old_topic: str, new_topic: str) -> int:
        """The VersionSwap message that ends this version (Venice's fields, as the simulator writes them)."""
        return self._control(
            E.VERSION_SWAP,
            {
                "oldServingVersionTopic": old_topic,
                "newServingVersionTopic": new_topic,
                "localHighWatermarks": [],
                "localHighWatermarkPubSubPositions": [],
                "isRepush": True,
                "isLastVersionSwapMessageFromRealTimeTopic": False,
                "sourceRegion": "dc-0",
                "destinationRegion": "dc-0",
                "generationId": 1,
            },
        )

    def heartbeat(self, origin: int, origin_offset: int, vector: list[int]) -> int:
        """A VT heartbeat for RT heartbeat (origin, origin_offset) with `hbw` = vector."""
        env = {
            "messageType": 2,
            "producerMetadata": E.producer_metadata(K.HEARTBEAT_GUID, 0, 0, TS, -1),
            "payloadUnion": E.control_message(
                E.START_OF_SEGMENT, {"checksumType": 4, "upcomingAggregates": []}
            ),
            "leaderMetadataFooter": E.leader_footer(self.host, origin_offset, origin),
        }
        hbw = encode_hbw(Watermarks(origin, origin_offset, list(vector), self.host))
        return self.raw(K.HEARTBEAT_KEY, CODEC.encode(env), [("hbw", hbw)])

    # -- data ---------------------------------------------------------------------------------------------
    def _cleanup(self, user_key: bytes, footer) -> None:
        """DELETEs of the chunks the key's previous value was stored in (same footer as the new record)."""
        for ck in self._chunk_keys.pop(user_key, []):
            env, _ = self._env(
                1,
                (
                    E.DELETE,
                    {"schemaId": -1, "replicationMetadataVersionId": -1, "replicationMetadataPayload": b""},
                ),
                footer,
            )
            self._data(ck, env)

    def put(
        self, user_key: bytes, value: bytes, src: int, rt_offset: int, chunk_size: int | None = None
    ) -> int:
        """A PUT from RT[src] at rt_offset; with `chunk_size` (chunked versions only) the value is written as
        chunks of that size and a manifest. Returns the offset of the record that carries the value."""
        footer = E.leader_footer(self.host, rt_offset, src)
        if chunk_size is None:
            env, _ = self._env(
                0,
                (
                    E.PUT,
                    {
                        "putValue": value,
                        "schemaId": VALUE_SCHEMA_ID,
                        "replicationMetadataVersionId": -1,
                        "replicationMetadataPayload": b"",
                    },
                ),
                footer,
            )
            offset = self._data(self._content(user_key), env)
            if self.chunked:
                self._cleanup(user_key, footer)
            return offset
        assert self.chunked, "chunks exist only in chunked versions"
        first_seq = self._seq
        keys = []
        for i in range(0, len(value), chunk_size):
            ck = user_key + chunk_suffix(self._guid, 0, first_seq, i // chunk_size)
            env, _ = self._env(
                0,
                (
                    E.PUT,
                    {
                        "putValue": value[i : i + chunk_size],
                        "schemaId": -10,
                        "replicationMetadataVersionId": -1,
                        "replicationMetadataPayload": b"",
                    },
                ),
                E.default_footer(self.host),
            )
            self._data(ck, env)
            keys.append(ck)
        manifest = _avro(
            _MANIFEST, {"keysWithChunkIdSuffix": keys, "schemaId": VALUE_SCHEMA_ID, "size": len(value)}
        )
        env, _ = self._env(
            0,
            (
                E.PUT,
                {
                    "putValue": manifest,
                    "schemaId": -20,
                    "replicationMetadataVersionId": -1,
                    "replicationMetadataPayload": b"",
                },
            ),
            footer,
        )
        offset = self._data(self._content(user_key), env)
        self._cleanup(user_key, footer)
        self._chunk_keys[user_key] = keys
        return offset

    def delete(self, user_key: bytes, src: int, rt_offset: int) -> int:
        footer = E.leader_footer(self.host, rt_offset, src)
        env, _ = self._env(
            1,
            (
                E.DELETE,
                {"schemaId": -1, "replicationMetadataVersionId": -1, "replicationMetadataPayload": b""},
            ),
            footer,
        )
        offset = self._data(self._content(user_key), env)
        if self.chunked:
            self._cleanup(user_key, footer)
        return offset

    def chunk_keys(self) -> set[bytes]:
        """Every chunk key content this log holds (chunks and cleanup DELETEs)."""
        out = set()
        for r in self.records:
            head, content = r.key[0], r.key[1:]
            if head == K.HEADER_PUT_OR_DELETE and self.chunked and not content.endswith(NON_CHUNK_SUFFIX):
                out.add(content)
        return out


def write_archive(vts: list[RegionVt], directory, topic: str, first: int = 0) -> str:
    """Records of one region's partitions (offsets >= `first`) as an archive; returns the directory."""
    with ArchiveWriter(directory) as w:
        for vt in vts:
            for off, r in enumerate(vt.records):
                if off >= first:
                    w.append_record(topic, vt.partition, off, r.key, r.value, TS, 0, r.headers)
    return str(directory)


def produce(vts: list[RegionVt], bootstrap: str, topic: str, transactional_id: str | None = None) -> None:
    """Produce every record in order, one partition after the other; offsets come out as in the archive.

    With `transactional_id`, each partition's records are one committed transaction: the commit marker takes
    the offset after the last record, so the partition's end offset lies one beyond its last record (what
    compaction at the end of a log looks like to a reader)."""
    from confluent_kafka import Producer

    conf = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    if transactional_id:
        conf["transactional.id"] = transactional_id
    p = Producer(conf)
    if transactional_id:
        p.init_transactions(30)
    for vt in vts:
        if transactional_id:
            p.begin_transaction()
        for r in vt.records:
            p.produce(
                topic, key=r.key, value=r.value, partition=vt.partition, headers=r.headers, timestamp=TS
            )
        if transactional_id:
            p.commit_transaction(30)
        assert p.flush(30) == 0
