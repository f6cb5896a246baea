"""Leap Frog's decode of the common VT record with numpy over whole Arrow batches, no Python per record.

Why this exists: Leap Frog's scan spent most of a record's time in a Python loop (`VtDecoder._decode_rows`): turning
Arrow columns into lists, one Avro decode call, dict lookups, a footer and an RMD payload read per record. The
envelope of the common VT record is read for the whole batch at once by `div.envelope_columns` (DIV's fast lane
reads the same); this module turns what it read into Leap Frog's columns: the record kind, the value's hash, the
footer's source region and position, and chunk payloads.

`plan(batch)` reads what it can and says, per row, whether it did. The rows it did not (`Columns.slow`) are those
the reference decoder must see: control keys (heartbeats, Start of Push), manifests, Updates, other protocol
versions, any record with a `vtp` header and, once a `vtp` header announced another schema for version 14, every
later version-14 record; RMD payloads with a checkpoint vector; and anything that is not exactly the expected
shape (a truncated or corrupt body, an over-long varint, a non-ASCII host name, trailing bytes). Those rows are
decoded by `VtDecoder`'s own loop, in order, so the rules stay stated once (`div.records.kind`,
`div.records.footer_source`, `div.positions.offset_with_fallback`); tests/pipelines/leapfrog/
test_vector_decode.py checks both give the same columns, row for row, on every kind of archive the tests have and
on fuzzed and damaged ones.

The value hash is xxh3 of each Put's value, kept in Leap Frog's state across runs, so the function cannot change;
`pipelines.leapfrog.xxh3` computes it for the whole batch with numpy (the same values as the `xxhash` binding).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from div import envelope as E
from div import keys as K
from div import positions as P
from div.envelope_columns import Cursors, EnvelopeReader, Heads
from div.records import Kind, data_kinds
from leapfrog.vectorized import inside
from pipelines.leapfrog import xxh3

_PUT, _DELETE, _CHUNK, _MANIFEST = int(Kind.PUT), int(Kind.DELETE), int(Kind.CHUNK), int(Kind.MANIFEST)
_UNDECODABLE, _OTHER = int(Kind.UNDECODABLE), int(Kind.OTHER)
_LONG_MAX = (1 << 63) - 1


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


class VectorDecoder:
    """Reads the common records of a task's batches (see the module docstring); one per task, like the codec
    whose learnt schemas it respects."""

    def __init__(self, codec: E.EnvelopeCodec) -> None:
        self.envelopes = EnvelopeReader(codec)

    def plan(self, key_col: pa.Array, value_col: pa.Array, headers: pa.Array | None) -> Columns:
        return self.columns(self.envelopes.read(key_col, value_col, headers))

    def columns(self, h: Heads) -> Columns:
        """Leap Frog's columns of envelopes read (`div.envelope_columns`): the same batch's."""
        n = len(h.header)
        header = h.header
        data_key = header == K.HEADER_PUT_OR_DELETE
        unknown = (header != 255) & ~np.isin(header, sorted(K.KNOWN_HEADERS))
        slow = (header == K.HEADER_CONTROL_MESSAGE) | h.relearnt
        kind = np.full(n, _OTHER, np.int8)
        kind[(header == 255) | unknown] = _UNDECODABLE

        data_kind = data_kinds(h.is_put, h.is_delete, h.schema_id)  # the rule of div.records.kind, for many
        chunk = data_kind == _CHUNK
        ok = h.read & (data_kind != _MANIFEST)  # the loop reads its chunk keys
        placed = ok & h.footer & ~chunk
        vdata = h.data
        src_offset, blob_ok = _src_offsets(vdata, h.position_start, h.position_end, h.upstream_offset)
        empty_vector = _empty_rmd_vector(vdata, h.rmd_start, h.rmd_end)
        ok &= ~placed | (blob_ok & ((h.rmd_version < 1) | empty_vector))

        slow |= data_key & ~ok
        fast_data = data_key & ok
        kind[fast_data] = data_kind[fast_data]
        puts = fast_data & (data_kind == _PUT)
        value_hash = np.zeros(n, np.int64)
        value_hash[puts] = _hashes(vdata, h.value_start[puts], h.value_end[puts])
        deleted = np.full(n, -1, np.int8)
        deleted[puts] = 0
        deleted[fast_data & (data_kind == _DELETE)] = 1
        has_src = fast_data & h.footer & ~chunk
        chunks = fast_data & chunk
        return Columns(
            slow=slow,
            kind=kind,
            key=_gather(h.key_data, h.key_start + 1, h.key_end, fast_data),
            value_hash=value_hash,
            has_hash=puts,
            deleted=deleted,
            src=np.where(has_src, h.upstream_cluster, 0),
            src_offset=np.where(has_src, src_offset, 0),
            has_src=has_src,
            chunk_payload=_gather(vdata, h.value_start, h.value_end, chunks),
        )


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
    r = Cursors(data, start + 2, end, framed.copy())
    type_id = r.long()
    raw_start, raw_end = r.bytes()
    off = Cursors(data, raw_start, raw_end, r.ok & (type_id == P.TYPE_KAFKA_OFFSET))
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
    r = Cursors(data, start + 1, end, (end - start >= 3) & (data[first] == 0))
    r.long()
    last = np.minimum(np.maximum(end - 1, 0), len(data) - 1)
    return empty | (r.ok & (r.pos == end - 1) & (data[last] == 0))


def _hashes(data: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """`decode.value_hash` of each slice: xxh3-64 as a signed long."""
    return xxh3.hashes(data, start, end).view(np.int64)


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
