"""Leap Frog's decode of the common VT record with numpy over whole Arrow batches, no Python per record.

Why this exists: Leap Frog's scan spent most of a record's time in a Python loop (`VtDecoder._decode_rows`): turning
Arrow columns into lists, one Avro decode call, dict lookups, a footer and an RMD payload read per record. Almost
every VT record has one fixed shape, though: a data key, Venice's framing with protocol version 14 (ours), a Put or
Delete, a leader's footer, a value-level RMD with an empty checkpoint vector. Its Avro fields are a fixed sequence of
varints and length-prefixed bytes, so they can be read for all rows of a batch at once: each field is a handful of
numpy operations over a vector of per-row cursors.

`plan(batch)` reads what it can and says, per row, whether it did. The rows it did not (`Columns.slow`) are those
the reference decoder must see: control keys (heartbeats, Start of Push), manifests, Updates, other protocol
versions, any record with a `vtp` header and, once a `vtp` header announced another schema for version 14, every
later version-14 record; RMD payloads with a checkpoint vector; and anything that is not exactly the expected
shape (a truncated or corrupt body, an over-long varint, a non-ASCII host name, trailing bytes). Those rows are
decoded by `VtDecoder`'s own loop, in order, so the rules stay stated once (`div.records.kind`,
`div.records.footer_source`, `div.positions.offset_with_fallback`); tests/pipelines/leapfrog/
test_vector_decode.py checks both give the same columns, row for row, on every kind of archive the tests have and
on fuzzed and damaged ones.

Only the value hash is still one call per Put (xxh3 on a slice of the batch's buffer, no copy): no vectorised
xxh3 exists here, and the hashes are kept in Leap Frog's state across runs, so the function cannot change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from div import envelope as E
from div import keys as K
from div import positions as P
from div.records import Kind, data_kinds
from leapfrog.vectorized import inside

_PUT, _DELETE, _CHUNK, _MANIFEST = int(Kind.PUT), int(Kind.DELETE), int(Kind.CHUNK), int(Kind.MANIFEST)
_UNDECODABLE, _OTHER = int(Kind.UNDECODABLE), int(Kind.OTHER)
_LONG_MAX = (1 << 63) - 1
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1


@dataclass
class Columns:
    """The decoded columns of a batch's rows, as numpy arrays of its length; `slow` marks the rows not decoded here
    (their other entries are meaningless)."""

    slow: np.ndarray  # bool
    kind: np.ndarray  # int8
    key: pa.Array  # binary: the key without its header byte, null where it has none
    value_hash: np.ndarray  # int64
    has_hash: np.ndarray
    deleted: np.ndarray  # int8: -1 null, 0, 1
    src: np.ndarray  # int64 (int32 values)
    src_offset: np.ndarray  # int64
    has_src: np.ndarray
    chunk_payload: pa.Array  # binary, null except on chunks


def _binary_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, start offsets, end offsets) of a binary or large_binary array: a view of only its own bytes (a batch
    sliced from a table shares the table's whole buffer), never a copy; at least one byte long, so that every
    clamped read (`_Reader`) has a byte to read."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    bufs = arr.buffers()
    off_type = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.frombuffer(bufs[1], off_type, n + 1, arr.offset * np.dtype(off_type).itemsize).astype(
        np.int64
    )
    first, last = int(offsets[0]), int(offsets[-1])
    if bufs[2] is None or last == first:
        data = np.zeros(1, np.uint8)
    else:
        data = np.frombuffer(bufs[2], np.uint8, last - first, first)
    offsets -= first
    return data, offsets[:-1], offsets[1:]


class _Reader:
    """Cursors into one buffer, one per row, advanced field by field; a row whose field is malformed or runs past
        its end is dropped from `ok`. Every read is clamped to the buffer: a cursor past the end reads its last byte, and
    its row is dropped for being past its end."""

    def __init__(self, data: np.ndarray, pos: np.ndarray, end: np.ndarray, ok: np.ndarray) -> None:
        self.data, self.pos, self.end, self.ok = data, pos, end, ok
        self.limit = len(data) - 1

    def _varint(self) -> np.ndarray:
        """The zig-zag varint at every cursor, as int64; at most 10 bytes, the 10th at most 1 (a Java long).

        Byte by byte over the rows still reading: most fields are one byte, so most rows stop after the first."""
        data = self.data
        pos = np.minimum(self.pos, self.limit)
        b = data[pos]
        z = (b & 0x7F).astype(np.uint64)
        length = np.ones(len(pos), np.int64)
        going = np.flatnonzero(b & 0x80)
        for k in range(1, 10):
            if len(going) == 0:
                break
            b = data[np.minimum(pos[going] + k, self.limit)]
            z[going] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * k)
            length[going] = k + 1
            if k == 9:
                self.ok[going[b > 1]] = False  # a tenth byte above 1 overflows a long; above 127, too long
            going = going[(b & 0x80) != 0]
        self.pos = self.pos + length
        self.ok &= self.pos <= self.end
        return ((z >> np.uint64(1)).astype(np.int64)) ^ -((z & np.uint64(1)).astype(np.int64))

    def long(self) -> np.ndarray:
        return self._varint()

    def int(self) -> np.ndarray:
        v = self._varint()
        self.ok &= (v >= _INT_MIN) & (v <= _INT_MAX)
        return v

    def skip(self, n: int) -> None:
        self.pos = self.pos + n
        self.ok &= self.pos <= self.end

    def bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of a length-prefixed bytes field."""
        length = self._varint()
        self.ok &= length >= 0
        length = np.where(self.ok, length, 0)
        start = self.pos
        self.pos = start + length
        self.ok &= self.pos <= self.end
        return start, self.pos


def _nonascii(data: np.ndarray, start: np.ndarray, end: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Rows (of `rows`) whose bytes [start, end) hold a byte above 127: a string the reference decoder must judge
    as UTF-8."""
    lengths = np.where(rows, end - start, 0)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    idx = np.repeat(start - offsets[:-1], lengths) + np.arange(int(offsets[-1]))
    high = np.concatenate([[0], np.cumsum(data[idx] >= 0x80, dtype=np.int64)])
    return high[offsets[1:]] > high[offsets[:-1]]


def _vtp_rows(headers: pa.Array | None, n: int) -> np.ndarray:
    """Rows with a `vtp` header."""
    if headers is None or headers.null_count == n:
        return np.zeros(n, bool)
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    flat = pc.list_flatten(headers)
    if len(flat) == 0:
        return np.zeros(n, bool)
    parents = pc.list_parent_indices(headers).to_numpy()
    is_vtp = pc.fill_null(pc.equal(flat.field("key"), "vtp"), False).to_numpy(zero_copy_only=False)
    out = np.zeros(n, bool)
    out[parents[is_vtp]] = True
    return out


class VectorDecoder:
    """Reads the common records of a task's batches (see the module docstring); one per task, like the codec
    whose learnt schemas it respects."""

    def __init__(self, codec: E.EnvelopeCodec) -> None:
        self.codec = codec
        # a vtp header announced another version-14 schema: v14 records are the reference's from then on
        self.v14_taught = False

    def plan(self, key_col: pa.Array, value_col: pa.Array, headers: pa.Array | None) -> Columns:
        n = len(key_col)
        kdata, kstart, kend = _binary_parts(key_col)
        key_valid = _valid(key_col, n)
        klen = np.where(key_valid, kend - kstart, 0)
        header = np.where(klen > 0, kdata[np.minimum(kstart, len(kdata) - 1)], 255).astype(np.int64)
        data_key = header == K.HEADER_PUT_OR_DELETE
        unknown = (klen > 0) & ~np.isin(header, sorted(K.KNOWN_HEADERS))

        slow = np.zeros(n, bool)
        kind = np.full(n, _OTHER, np.int8)
        kind[(klen == 0) | unknown] = _UNDECODABLE
        slow |= header == K.HEADER_CONTROL_MESSAGE

        vdata, vstart, vend = _binary_parts(value_col)
        value_valid = _valid(value_col, n)
        framed = value_valid & (vend - vstart >= 3)
        first = np.minimum(vstart, len(vdata) - 1)
        framed &= (vdata[first] == E.MAGIC) & (
            vdata[np.minimum(first + 1, len(vdata) - 1)] == E.CURRENT_VERSION
        )
        vtp = _vtp_rows(headers, n)
        if vtp.any():
            # any v14 record's header teaches the codec, control messages' included (Start of Segment carries it)
            self._take_vtp(np.flatnonzero(vtp & framed), headers, framed, slow)
        if self.v14_taught:
            framed[:] = False
        r = _Reader(vdata, vstart + 2, vend, data_key & framed & ~vtp & ~slow)
        mtype = r.int()
        r.skip(16)  # producerGUID
        r.int(), r.int(), r.long(), r.long()  # segment, sequence, messageTimestamp, logicalTimestamp
        branch = r.long()
        is_put = (branch == 0) & np.isin(mtype, (0, 4))
        is_delete = (branch == 2) & (mtype == 1)
        r.ok &= is_put | is_delete
        # Put: putValue, schemaId; Delete: schemaId. Then both: replicationMetadataVersionId, -Payload
        value_start, value_end = _masked_bytes(r, is_put)
        schema_id = r.int()
        rmd_version = r.int()
        rmd_start, rmd_end = r.bytes()
        has_footer = r.long()
        r.ok &= (has_footer == 0) | (has_footer == 1)
        footer = has_footer == 1
        # LeaderMetadata: hostName, upstreamOffset, upstreamKafkaClusterId, upstreamPubSubPosition, termId,
        # upstreamMessageTimestamp; a row without one has only its cursor compared with the end below
        sub = _Reader(vdata, r.pos, vend, r.ok & footer)
        host_start, host_end = sub.bytes()
        legacy = sub.long()
        cluster = sub.int()
        blob_start, blob_end = sub.bytes()
        sub.long(), sub.long()
        sub.ok &= ~_nonascii(vdata, host_start, host_end, sub.ok)
        ok = np.where(footer, sub.ok & (sub.pos == vend), r.ok & (r.pos == vend))

        data_kind = data_kinds(is_put, is_delete, schema_id)  # the rule of div.records.kind, for many
        chunk = data_kind == _CHUNK
        ok &= data_kind != _MANIFEST  # the loop reads its chunk keys
        placed = ok & footer & ~chunk
        src_offset, blob_ok = _src_offsets(vdata, blob_start, blob_end, legacy)
        empty_vector = _empty_rmd_vector(vdata, rmd_start, rmd_end)
        ok &= ~placed | (blob_ok & ((rmd_version < 1) | empty_vector))

        slow |= data_key & ~ok
        fast_data = data_key & ok
        kind[fast_data] = data_kind[fast_data]
        puts = fast_data & (data_kind == _PUT)
        value_hash = np.zeros(n, np.int64)
        value_hash[puts] = _hashes(vdata, value_start[puts], value_end[puts])
        deleted = np.full(n, -1, np.int8)
        deleted[puts] = 0
        deleted[fast_data & (data_kind == _DELETE)] = 1
        has_src = fast_data & footer & ~chunk
        chunks = fast_data & chunk
        return Columns(
            slow=slow,
            kind=kind,
            key=_gather(kdata, kstart + 1, kend, fast_data),
            value_hash=value_hash,
            has_hash=puts,
            deleted=deleted,
            src=np.where(has_src, cluster, 0),
            src_offset=np.where(has_src, src_offset, 0),
            has_src=has_src,
            chunk_payload=_gather(vdata, value_start, value_end, chunks),
        )

    def _take_vtp(self, rows: np.ndarray, headers: pa.Array, framed: np.ndarray, slow: np.ndarray) -> None:
        """From the first version-14 record whose `vtp` may teach another schema on, every version-14 record of the
        task goes to the reference decoder (it will learn from that header, in order)."""
        from div.heartbeat_headers import header_value

        if self.v14_taught or len(rows) == 0:
            return
        for i in rows:
            vtp = header_value(headers[int(i)].as_py(), "vtp")
            if vtp is not None and self.codec.may_relearn(E.CURRENT_VERSION, vtp):
                slow[int(i) :] |= framed[int(i) :]
                framed[int(i) :] = False
                self.v14_taught = True
                return


def _valid(arr: pa.Array, n: int) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(n, bool)
    return pc.is_valid(arr).to_numpy(zero_copy_only=False)


def _masked_bytes(r: _Reader, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A bytes field that only rows `present` have (Put's putValue); the others keep their cursors."""
    sub = _Reader(r.data, r.pos, r.end, r.ok & present)
    start, end = sub.bytes()
    r.ok = np.where(present, sub.ok, r.ok)
    r.pos = np.where(present, sub.pos, r.pos)
    return start, end


def _src_offsets(
    data: np.ndarray, start: np.ndarray, end: np.ndarray, legacy: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`positions.offset_with_fallback(blob, legacy)` of each row's blob, and whether this reading is sure of it (the
    reference reads the other rows): an empty or unframed blob gives the long; a framed one whose varints end inside
    it gives its offset by Venice's rule (EARLIEST and LATEST always, a Kafka offset when at least the long)."""
    size = end - start
    first = np.minimum(start, len(data) - 1)
    framed = (
        (size >= 4) & (data[first] == P.MAGIC) & (data[np.minimum(first + 1, len(data) - 1)] == P.VERSION)
    )
    r = _Reader(data, start + 2, end, framed.copy())
    type_id = r.long()
    raw_start, raw_end = r.bytes()
    off = _Reader(data, raw_start, raw_end, r.ok & (type_id == P.TYPE_KAFKA_OFFSET))
    kafka = off.long()
    kafka_ok = off.ok & (off.pos == raw_end) & (kafka >= -1)
    decoded = np.where(type_id == P.TYPE_EARLIEST, -1, np.where(type_id == P.TYPE_LATEST, _LONG_MAX, kafka))
    special = r.ok & np.isin(type_id, (P.TYPE_EARLIEST, P.TYPE_LATEST))
    use = special | (kafka_ok & (decoded >= legacy))
    out = np.where(use, decoded, legacy)
    # sure: no blob, not a blob (the long), a clean parse, or a framed blob of another type (the long)
    other_type = r.ok & ~np.isin(type_id, (P.TYPE_EARLIEST, P.TYPE_LATEST, P.TYPE_KAFKA_OFFSET))
    sure = (size == 0) | ~framed | special | kafka_ok | other_type
    return out, sure


def _empty_rmd_vector(data: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Payloads that are exactly a value-level timestamp and an empty checkpoint vector (`00 <long> 00`), whose
    vector the reference reads as None; an empty payload is None too."""
    empty = end == start
    first = np.minimum(start, len(data) - 1)
    r = _Reader(data, start + 1, end, (end - start >= 3) & (data[first] == 0))
    r.long()
    last = np.minimum(np.maximum(end - 1, 0), len(data) - 1)
    return empty | (r.ok & (r.pos == end - 1) & (data[last] == 0))


def _hashes(data: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """`decode.value_hash` of each slice: xxh3-64 as a signed long."""
    mv = memoryview(data)
    h = xxhash.xxh3_64_intdigest
    out = np.fromiter(
        (h(mv[s:e]) for s, e in zip(start.tolist(), end.tolist(), strict=True)), np.uint64, len(start)
    )
    return out.view(np.int64)


def _gather(data: np.ndarray, start: np.ndarray, end: np.ndarray, rows: np.ndarray) -> pa.Array:
    """A binary array of the batch's length: the slice [start, end) at `rows`, null elsewhere."""
    n = len(rows)
    if not rows.any():
        return pa.nulls(n, pa.binary())
    lengths = np.where(rows, end - start, 0)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    # each slice lies inside its own row's bytes, so they are apart and in buffer order: a mask keeps them (an
    # index of every byte took 24 bytes per byte at its peak, over a GiB for one partition's chunk payloads)
    body = data[inside(data.size, start[rows], end[rows])]
    validity = pa.array(rows).buffers()[1]
    return pa.Array.from_buffers(
        pa.binary(), n, [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(body)], null_count=-1
    )
