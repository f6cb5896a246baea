"""The common VT envelope of a whole Arrow batch at once: numpy over the batch's buffers, no Python per record.

Why this exists: decoding an envelope into a dict, one record at a time (`div.envelope.EnvelopeCodec`), was most of
the time of every reader that walks a topic: Leap Frog's scan, `div validate` and the watch, which runs both. Almost
every record has one fixed shape, though: a data key, Venice's framing with protocol version 14 (ours), a Put or
Delete, and a leader's footer or none. Its Avro fields are a fixed sequence of varints and length-prefixed bytes, so
they can be read for all rows of a batch at once: each field is a handful of numpy operations over a vector of
per-row cursors.

`EnvelopeReader.read(keys, values, headers)` reads what it can and says, per row, whether it did (`Heads.read`):
the rows it read are exactly what the codec would decode into a Put or a Delete, field for field; every other row
(control messages, Updates, other protocol versions, any record with a `vtp` header and, once a `vtp` header
announced another schema for version 14, every later version-14 record, and anything that is not exactly the
expected shape: a truncated or corrupt body, an over-long varint, a non-ASCII host name, trailing bytes) is for the
codec, in order, so the rules stay stated once. Its users build on it: Leap Frog's columns
(`pipelines.leapfrog.vector_decode`) and DIV's fast lane (`div.batch.PartitionRun`). Their differential tests
(tests/pipelines/leapfrog/test_vector_decode.py, tests/div/test_div_fast_lane.py) check, on every kind of archive
the tests have and on fuzzed and damaged ones, that both ways give the same results.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import envelope as E
from . import keys as K

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
GUID_BYTES = 16


@dataclass
class Heads:
    """The envelope fields of a batch's rows, as numpy arrays of its length. Only the rows in `read` hold the
    envelope's values; the other entries are meaningless. Byte positions index `data`, the values' buffer."""

    data: np.ndarray  # uint8: the values' bytes
    key_data: np.ndarray  # uint8: the keys' bytes
    key_start: np.ndarray
    key_end: np.ndarray
    header: np.ndarray  # int64: each key's header byte, 255 for an empty or null key
    framed: np.ndarray  # bool: Venice's framing with version 14, not moved to the codec by a `vtp` header
    relearnt: (
        np.ndarray
    )  # bool: framed rows moved to the codec because a `vtp` header may teach another schema
    read: np.ndarray  # bool: a Put or a Delete under a data key, read here whole
    message_type: np.ndarray
    guid_start: np.ndarray  # the producer GUID's 16 bytes start here
    segment: np.ndarray
    sequence: np.ndarray
    message_timestamp: np.ndarray
    is_put: np.ndarray
    is_delete: np.ndarray
    value_start: np.ndarray  # a Put's putValue
    value_end: np.ndarray
    schema_id: np.ndarray
    rmd_version: np.ndarray
    rmd_start: np.ndarray
    rmd_end: np.ndarray
    footer: np.ndarray  # bool: a leader's footer (LeaderMetadata) follows
    upstream_offset: np.ndarray  # the footer's legacy upstreamOffset
    upstream_cluster: np.ndarray
    position_start: np.ndarray  # the footer's upstreamPubSubPosition
    position_end: np.ndarray

    def take(self, rows: np.ndarray) -> Heads:
        """The rows `rows` (indices), in that order: the same buffers, each row's fields moved with it (how a reader
        that reorders or leaves out records keeps what was read of them)."""
        return dataclasses.replace(self, **{f: getattr(self, f)[rows] for f in _PER_ROW})

    def slice(self, start: int, stop: int) -> Heads:
        return dataclasses.replace(self, **{f: getattr(self, f)[start:stop] for f in _PER_ROW})

    def guids(self, rows: np.ndarray) -> list[bytes | None]:
        """The producer GUID of each row in `rows` (a mask), as the codec gives it; None for the others."""
        at = np.minimum(self.guid_start[:, None] + np.arange(GUID_BYTES), len(self.data) - 1)
        block = self.data[at]
        validity = pa.array(rows).buffers()[1]
        return pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(GUID_BYTES), len(rows), [validity, pa.py_buffer(block.tobytes())], null_count=-1
        ).to_pylist()


_PER_ROW = tuple(f.name for f in dataclasses.fields(Heads) if f.name not in ("data", "key_data"))


def reads_as_new(learned: dict[int, Any]) -> bool:
    """Whether `read_envelopes` (a new codec's reading) is what a codec that learnt `learned` (its `learned()`)
    reads of the same records: unless it learnt another schema for version 14, by which it reads every v14
    record. A check handed shared envelopes uses them only then."""
    return E.CURRENT_VERSION not in learned


def read_envelopes(records: pa.Table | pa.RecordBatch) -> Heads:
    """The envelopes of a partition's records (archive columns, in offset order) as a new codec reads them: what a
    reader that runs several checks over the same records reads once and hands to each (the watch)."""
    names = records.schema.names
    return EnvelopeReader(E.EnvelopeCodec()).read(
        records.column("key"),
        records.column("value"),
        records.column("headers") if "headers" in names else None,
    )


def binary_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, start offsets, end offsets) of a binary or large_binary array: a view of only its own bytes (a batch
    sliced from a table shares the table's whole buffer), never a copy; at least one byte long, so that every
    clamped read (`Cursors`) has a byte to read."""
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


class Cursors:
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
    """Rows (of `rows`) whose bytes [start, end) hold a byte above 127: a string the codec must judge as UTF-8."""
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


def valid(arr: pa.Array, n: int) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(n, bool)
    return pc.is_valid(arr).to_numpy(zero_copy_only=False)


def _masked_bytes(r: Cursors, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A bytes field that only rows `present` have (Put's putValue); the others keep their cursors."""
    sub = Cursors(r.data, r.pos, r.end, r.ok & present)
    start, end = sub.bytes()
    r.ok = np.where(present, sub.ok, r.ok)
    r.pos = np.where(present, sub.pos, r.pos)
    return start, end


class EnvelopeReader:
    """Reads the common records of one partition's batches, in order (see the module docstring); one per codec, whose
    learnt schemas it respects: a codec that learnt another schema for version 14 leaves every version-14 record to
    the codec."""

    def __init__(self, codec: E.EnvelopeCodec) -> None:
        self.codec = codec
        # a vtp header announced another version-14 schema: v14 records are the codec's from then on
        self.v14_taught = E.CURRENT_VERSION in codec.learned()

    def read(self, key_col: pa.Array, value_col: pa.Array, headers: pa.Array | None) -> Heads:
        n = len(key_col)
        kdata, kstart, kend = binary_parts(key_col)
        klen = np.where(valid(key_col, n), kend - kstart, 0)
        header = np.where(klen > 0, kdata[np.minimum(kstart, len(kdata) - 1)], 255).astype(np.int64)
        data_key = header == K.HEADER_PUT_OR_DELETE

        vdata, vstart, vend = binary_parts(value_col)
        framed = valid(value_col, n) & (vend - vstart >= 3)
        first = np.minimum(vstart, len(vdata) - 1)
        framed &= (vdata[first] == E.MAGIC) & (
            vdata[np.minimum(first + 1, len(vdata) - 1)] == E.CURRENT_VERSION
        )
        relearnt = np.zeros(n, bool)
        vtp = _vtp_rows(headers, n)
        if vtp.any():
            # any v14 record's header teaches the codec, control messages' included (Start of Segment carries it)
            self._take_vtp(np.flatnonzero(vtp & framed), headers, framed, relearnt)
        if self.v14_taught:
            framed = np.zeros(n, bool)
        r = Cursors(vdata, vstart + 2, vend, data_key & framed & ~vtp)
        mtype = r.int()
        guid_start = r.pos
        r.skip(GUID_BYTES)
        segment, sequence, message_ts, _logical = r.int(), r.int(), r.long(), r.long()
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
        sub = Cursors(vdata, r.pos, vend, r.ok & footer)
        host_start, host_end = sub.bytes()
        legacy = sub.long()
        cluster = sub.int()
        blob_start, blob_end = sub.bytes()
        sub.long(), sub.long()
        sub.ok &= ~_nonascii(vdata, host_start, host_end, sub.ok)
        read = np.where(footer, sub.ok & (sub.pos == vend), r.ok & (r.pos == vend))
        return Heads(
            data=vdata,
            key_data=kdata,
            key_start=kstart,
            key_end=kend,
            header=header,
            framed=framed,
            relearnt=relearnt,
            read=read,
            message_type=mtype,
            guid_start=guid_start,
            segment=segment,
            sequence=sequence,
            message_timestamp=message_ts,
            is_put=is_put,
            is_delete=is_delete,
            value_start=value_start,
            value_end=value_end,
            schema_id=schema_id,
            rmd_version=rmd_version,
            rmd_start=rmd_start,
            rmd_end=rmd_end,
            footer=footer,
            upstream_offset=legacy,
            upstream_cluster=cluster,
            position_start=blob_start,
            position_end=blob_end,
        )

    def _take_vtp(
        self, rows: np.ndarray, headers: pa.Array, framed: np.ndarray, relearnt: np.ndarray
    ) -> None:
        """From the first version-14 record whose `vtp` may teach another schema on, every version-14 record of the
        partition goes to the codec (it will learn from that header, in order)."""
        from .heartbeat_headers import header_value

        if self.v14_taught or len(rows) == 0:
            return
        for i in rows:
            vtp = header_value(headers[int(i)].as_py(), "vtp")
            if vtp is not None and self.codec.may_relearn(E.CURRENT_VERSION, vtp):
                relearnt[int(i) :] |= framed[int(i) :]
                framed[int(i) :] = False
                self.v14_taught = True
                return
