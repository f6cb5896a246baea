"""The one record loop: Venice records of an archive-schema Arrow batch, decoded and classified once.

Every reader (DIV validate and restore, the lag monitor, Leap Frog's decoder and probes, the demo, the simulated
follower, the heartbeat leader) needs the same few things from a record: its offset, key, headers, broker time in
milliseconds, the decoded envelope or why it could not be decoded, what kind of record it is and, for a
leader-written record, the RT position it came from. Each used to take these from the batch's columns in a loop of
its own; they now share this module, so a record is undecodable, a heartbeat or a chunk for all of them alike.

- `iter_records(batch, codec)` yields a `Record` per row of a batch in the archive's layout
  (`div.archive.KAFKA_ARROW_SCHEMA`, or a subset of its columns). The two benchmarked hot paths, `div validate`
  (`div.batch`) and Leap Frog's decoder, keep loops of their own built from the same parts (`decode_record`'s
  key check, `kind`, `footer_source`, `div.archive.timestamps_ms`): a generator step per record costs them a few
  per cent.
- `Kind` defines the kinds once; `kind(key, env)` classifies a record once, the way Venice does
  (`MessageType.valueOf` on the envelope, the key header, the heartbeat key, the chunking schema ids), and
  `message_type(env)` gives the envelope's own type alone.
- `footer_source(env)` reads a leader footer's (region, RT offset) with Venice's position fallback.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterable, Iterator
from enum import IntEnum
from functools import partial
from itertools import repeat
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from . import envelope as E
from . import keys
from .archive import timestamps_ms
from .positions import offset_with_fallback

# Value schema ids Venice reserves for chunked values (AvroProtocolDefinition.CHUNK / CHUNKED_VALUE_MANIFEST).
CHUNK_SCHEMA_ID, MANIFEST_SCHEMA_ID = -10, -20


class Kind(IntEnum):
    """What a record is. Stable small integers: Leap Frog's decoder stores them as an int8 column.

    PUT, DELETE, UPDATE and CONTROL are also Venice's `MessageType`s (`message_type`); the control kinds are the
    `controlMessageType`s, CONTROL standing for one this version does not name. OTHER is a record no reader acts
    on: `kind` gives it to a decodable record whose key header and payload disagree (e.g. a Put under a control
    key), and Leap Frog's decoder to the keys it leaves undecoded (UPDATE and Global-RT-DIV headers).
    """

    PUT = 0
    DELETE = 1
    UPDATE = 2
    CONTROL = 3
    START_OF_PUSH = 4
    END_OF_PUSH = 5
    START_OF_SEGMENT = 6
    END_OF_SEGMENT = 7
    START_OF_BUFFER_REPLAY = 8
    START_OF_INCREMENTAL_PUSH = 9
    END_OF_INCREMENTAL_PUSH = 10
    TOPIC_SWITCH = 11
    VERSION_SWAP = 12
    HEARTBEAT = 13
    CHUNK = 14
    MANIFEST = 15
    GLOBAL_RT_DIV = 16
    OTHER = 17
    UNDECODABLE = 18


# controlMessageType → Kind; the order is Venice's ControlMessageType numbering (div.envelope.START_OF_PUSH, ...)
_CONTROL_KINDS = (
    Kind.START_OF_PUSH,
    Kind.END_OF_PUSH,
    Kind.START_OF_SEGMENT,
    Kind.END_OF_SEGMENT,
    Kind.START_OF_BUFFER_REPLAY,
    Kind.START_OF_INCREMENTAL_PUSH,
    Kind.END_OF_INCREMENTAL_PUSH,
    Kind.TOPIC_SWITCH,
    Kind.VERSION_SWAP,
)
CONTROL_KINDS = frozenset((Kind.CONTROL, Kind.HEARTBEAT, *_CONTROL_KINDS))
# the payload branch → MessageType, from the names div.envelope gives the branches
_MESSAGE_TYPE = {branch: Kind[name] for branch, name in E.PAYLOAD_KIND.items()}


def message_type(env: dict) -> Kind:
    """Kind.PUT, DELETE, UPDATE or CONTROL: the envelope's own type (its payload branch), whatever the key says."""
    return _MESSAGE_TYPE[env["payloadUnion"][0]]


def kind(key: bytes | None, env: dict | None) -> Kind:
    """The one classification of a record (`env` None: it could not be decoded).

    The key header says what the record is meant to be (Global-RT-DIV records are Puts told apart only by header
    byte 8), the heartbeat key marks heartbeats, the payload says which data or control message it is, and a Put
    with a chunking schema id is a chunk or a manifest.
    """
    # Leap Frog's decoder calls this once per record: constants are module globals, not attribute lookups on
    # Kind or modules (an Enum member lookup costs several times a global's).
    if env is None or not key:
        return _UNDECODABLE
    if key == _HEARTBEAT_KEY:
        return _HEARTBEAT
    name, body = env["payloadUnion"]
    header = key[0]
    if header == _DATA_HEADER:
        if name == _PUT_BRANCH:
            sid = body["schemaId"]
            return _CHUNK if sid == CHUNK_SCHEMA_ID else _MANIFEST if sid == MANIFEST_SCHEMA_ID else _PUT
        return _DELETE if name == _DELETE_BRANCH else _OTHER
    if header == _CONTROL_HEADER:
        if name != _CONTROL_BRANCH:
            return _OTHER
        ctype = body["controlMessageType"]
        return _CONTROL_KINDS[ctype] if 0 <= ctype < len(_CONTROL_KINDS) else _CONTROL
    if header == _UPDATE_HEADER:
        return _UPDATE if name == _UPDATE_BRANCH else _OTHER
    if header == _GLOBAL_RT_DIV_HEADER:
        return _GLOBAL_RT_DIV
    return _UNDECODABLE


def data_kinds(is_put, is_delete, schema_id):
    """`kind` of records under a data key, for numpy arrays of many at once: the same rule for readers that never
    build an envelope (Leap Frog's vectorised decode). `is_put`/`is_delete`: the payload branch; `schema_id`:
    the Put's. tests/pipelines/leapfrog/test_vector_decode.py checks it against `kind` on every payload."""
    import numpy as np

    out = np.full(len(is_put), int(_OTHER), np.int8)
    out[is_delete] = int(_DELETE)
    out[is_put] = int(_PUT)
    out[is_put & (schema_id == CHUNK_SCHEMA_ID)] = int(_CHUNK)
    out[is_put & (schema_id == MANIFEST_SCHEMA_ID)] = int(_MANIFEST)
    return out


_PUT_BRANCH, _DELETE_BRANCH, _UPDATE_BRANCH, _CONTROL_BRANCH = E.PUT, E.DELETE, E.UPDATE, E.CONTROL
_HEARTBEAT_KEY = keys.HEARTBEAT_KEY
_PUT, _DELETE, _UPDATE, _CONTROL, _OTHER = Kind.PUT, Kind.DELETE, Kind.UPDATE, Kind.CONTROL, Kind.OTHER
_HEARTBEAT, _CHUNK, _MANIFEST, _GLOBAL_RT_DIV = Kind.HEARTBEAT, Kind.CHUNK, Kind.MANIFEST, Kind.GLOBAL_RT_DIV
_UNDECODABLE = Kind.UNDECODABLE
_DATA_HEADER, _CONTROL_HEADER = keys.HEADER_PUT_OR_DELETE, keys.HEADER_CONTROL_MESSAGE
_UPDATE_HEADER, _GLOBAL_RT_DIV_HEADER = keys.HEADER_UPDATE, keys.HEADER_GLOBAL_RT_DIV


def footer_source(env: dict) -> tuple[int, int] | None:
    """(upstream cluster id, upstream RT offset) of a leader-written record, or None without a footer.

    The one reading of a footer's position: the pub-sub position blob, falling back to the legacy
    `upstreamOffset` long exactly as Venice's `deserializePositionWithOffsetFallback` does
    (`positions.offset_with_fallback`). Every reader goes through here, so none reads the raw long alone.
    """
    f = E.footer(env)
    if f is None:
        return None
    return (
        f.get("upstreamKafkaClusterId", -1),
        offset_with_fallback(f.get("upstreamPubSubPosition") or b"", f.get("upstreamOffset", -1)),
    )


@functools.cache
def _manifest_schema():
    import fastavro

    from . import schemas

    return fastavro.parse_schema(schemas.load_json("ChunkedValueManifest.avsc"))


def manifest_chunk_keys(value: bytes) -> tuple[list[bytes], int] | None:
    """What a chunked value's `ChunkedValueManifest` (a Put with schema id -20) names: its chunk keys (key content
    with their chunk suffixes, in order) and the whole value's schema id; None when the bytes are no manifest.
    The one reading of a manifest, for Leap Frog's decoder and change capture alike."""
    import fastavro

    try:
        manifest = fastavro.schemaless_reader(io.BytesIO(value), _manifest_schema(), None)
        return [bytes(k) for k in manifest["keysWithChunkIdSuffix"]], int(manifest["schemaId"])
    except Exception:  # fastavro raises assorted errors on damaged bytes
        return None


def key_problem(key: bytes | None) -> str | None:
    """Why `key` is not a Venice key (empty, or an unknown header byte), or None when it is one."""
    if key and key[0] in keys.KNOWN_HEADERS:
        return None
    try:
        keys.split_key(key)
    except keys.KeyError_ as exc:
        return str(exc)
    return "bad key"


def decode_record(
    codec: E.EnvelopeCodec, key: bytes | None, value: bytes | None, headers: Iterable | None
) -> tuple[dict | None, str | None]:
    """(envelope, None), or (None, why) for a record that is not a Venice record: its key is checked first (a
    value under a key no Venice reader accepts is not decoded), then its value. Never raises UndecodableError."""
    problem = key_problem(key)
    if problem is not None:
        return None, problem
    try:
        return codec.decode(value, headers), None
    except E.UndecodableError as exc:
        return None, str(exc)


class Record(NamedTuple):
    """One record of a batch. `env` is the decoded envelope, or None with the reason in `error`; `ms` the broker
    time in epoch milliseconds (None when the batch has no timestamp column); `topic` and `partition` are None
    when the batch does not carry them."""

    offset: int | None
    key: bytes | None
    value: bytes | None
    headers: list | None
    ms: int | None
    env: dict | None
    error: str | None
    topic: str | None
    partition: int | None

    @property
    def kind(self) -> Kind:
        return kind(self.key, self.env)


def _column(batch: pa.RecordBatch | pa.Table, names: list[str], name: str, n: int) -> Iterable:
    return batch.column(names.index(name)).to_pylist() if name in names else repeat(None, n)


def _constant_or_column(batch: pa.RecordBatch | pa.Table, names: list[str], name: str, n: int) -> Iterable:
    """topic and partition: one value for a whole batch of a partition, so not materialized row by row then."""
    if name not in names:
        return repeat(None, n)
    col = batch.column(names.index(name))
    first = col[0]
    if first.is_valid and col.null_count == 0 and pc.all(pc.equal(col, first)).as_py():
        return repeat(first.as_py(), n)
    return col.to_pylist()


def iter_records(batch: pa.RecordBatch | pa.Table, codec: E.EnvelopeCodec) -> Iterator[Record]:
    """The records of an archive-schema batch (any subset of its columns), in batch order, each decoded with
    `codec` (one per thread or task: it learns writer schemas from `vtp` headers, in record order). A record
    that cannot be decoded comes with its reason, never as an exception."""
    n = batch.num_rows
    if n == 0:
        return
    names = batch.schema.names
    key_col = _column(batch, names, "key", n)
    val_col = _column(batch, names, "value", n)
    off_col = _column(batch, names, "offset", n)
    hdr_col = _column(batch, names, "headers", n)
    ts_col = timestamps_ms(batch) if "timestamp" in names else repeat(None, n)
    topic_col = _constant_or_column(batch, names, "topic", n)
    part_col = _constant_or_column(batch, names, "partition", n)
    record = _as_record
    for key, value, offset, ms, headers, topic, partition in zip(
        key_col, val_col, off_col, ts_col, hdr_col, topic_col, part_col, strict=True
    ):
        env, error = decode_record(codec, key, value, headers)
        yield record((offset, key, value, headers, ms, env, error, topic, partition))


# a Record from a tuple without NamedTuple's Python-level constructor
_as_record = partial(tuple.__new__, Record)
