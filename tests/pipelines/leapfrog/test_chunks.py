"""The chunk rules (`pipelines.leapfrog.chunks`) give the same values in the batch job and in the watch.

Both sides call `chunks.resolve` and `chunks.manifest_hash`; what differs is how a manifest's chunk rows are found:
a Spark join across the run (`job._prepare`) against the chunks at hand in a micro-batch and its state
(`leapfrog_step._values_of_chunked`). The same scan rows, with the cases a join decides — a chunk missing, a
manifest naming none, two rows under one chunk key, a chunk after its manifest, a chunk of another region, a
cleanup DELETE, a Put under a chunk key — must give the same value rows.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from leapfrog.plan import RegionPartition
from pipelines.leapfrog import chunks as C
from pipelines.leapfrog import decode as V
from pipelines.leapfrog.job import _prepare
from pipelines.leapfrog.scan import SCAN_DDL, SCAN_SCHEMA
from pipelines.watch.leapfrog_step import _values_of_chunked

S = C.VALUE_SUFFIX


def _ck(user: bytes, i: int) -> bytes:
    return user + bytes([0, i, 1])  # any suffix but `02 00`


# (region, offset, kind, key, value hash, chunk keys, payload)
ROWS = [
    (0, 1, V.CHUNK, _ck(b"a", 0), None, None, b"val"),
    (0, 2, V.CHUNK, _ck(b"a", 1), None, None, b"ue-1"),
    (0, 3, V.MANIFEST, b"a" + S, None, [_ck(b"a", 0), _ck(b"a", 1)], None),  # whole
    (0, 4, V.MANIFEST, b"m" + S, None, [_ck(b"m", 0)], None),  # its chunk is missing
    (0, 5, V.MANIFEST, b"e" + S, None, [], None),  # names none
    (0, 6, V.CHUNK, _ck(b"d", 0), None, None, b"y"),
    (0, 7, V.CHUNK, _ck(b"d", 0), None, None, b"x"),  # a second row under the same chunk key
    (0, 8, V.MANIFEST, b"d" + S, None, [_ck(b"d", 0)], None),
    (0, 9, V.MANIFEST, b"l" + S, None, [_ck(b"l", 0)], None),
    (0, 10, V.CHUNK, _ck(b"l", 0), None, None, b"late"),  # after its manifest
    (0, 11, V.DELETE, _ck(b"a", 0), None, None, None),  # cleanup of an old value's chunks
    (0, 12, V.DELETE, b"a" + S, None, None, None),
    (0, 13, V.PUT, b"s" + S, 42, None, None),
    (0, 14, V.PUT, _ck(b"s", 0), 43, None, None),  # a Put under a chunk key: not a value
    (0, 15, V.MANIFEST, b"a" + bytes([0, 0]), None, [_ck(b"a", 1)], None),  # a manifest under a chunk key
    (1, 1, V.MANIFEST, b"a" + S, None, [_ck(b"a", 0), _ck(b"a", 1)], None),  # region 0's chunks
    (1, 2, V.CHUNK, _ck(b"b", 0), None, None, b"bee"),
    (1, 3, V.MANIFEST, b"b" + S, None, [_ck(b"b", 0)], None),
]


def _scan_rows() -> pa.Table:
    cols = list(zip(*ROWS, strict=True))
    m = len(ROWS)
    data = {
        "order": pa.array([1] * m, pa.int8()),
        "split": pa.array(cols[0], pa.int32()),
        "seg": pa.array([0] * m, pa.int8()),
        "region": pa.array(cols[0], pa.int32()),
        "partition": pa.array([0] * m, pa.int32()),
        "offset": pa.array(cols[1], pa.int64()),
        "kind": pa.array(cols[2], pa.int8()),
        "key": pa.array(cols[3], pa.binary()),
        "value_hash": pa.array(cols[4], pa.int64()),
        "src": pa.array([0] * m, pa.int32()),
        "src_offset": pa.array(cols[1], pa.int64()),
        "chunk_keys": pa.array(cols[5], pa.list_(pa.binary())),
        "payload": pa.array(cols[6], pa.binary()),
    }
    return pa.table({f.name: data.get(f.name, pa.nulls(m, f.type)) for f in SCAN_SCHEMA}, SCAN_SCHEMA)


def _facts() -> dict:
    facts = {}
    for region in (0, 1):
        rp = RegionPartition(region, 0)
        rp.chunked, rp.start_after = True, 0
        facts[(region, 0)] = rp
    return facts


def _named(t: pa.Table) -> list[tuple]:
    cols = ("region", "offset", "kind", "key", "value_hash")
    return sorted(zip(*(t.column(c).to_pylist() for c in cols), strict=True))


def test_manifest_hash_is_the_values_hash_and_none_when_a_chunk_is_missing():
    assert C.manifest_hash([(1, b"ue-1"), (0, b"val")]) == V.value_hash(b"value-1")
    assert C.manifest_hash(
        C.manifest_parts([b"k0", b"k1"], {b"k1": [b"ue-1"], b"k0": [b"val"]})
    ) == V.value_hash(b"value-1")
    assert C.manifest_hash(C.manifest_parts([b"k0", b"k1"], {b"k0": [b"val"]})) is None
    assert C.manifest_hash([]) is None


@pytest.mark.spark
def test_the_batch_job_and_the_watch_make_the_same_values_of_the_same_rows(spark):
    rows = _scan_rows()
    batch = _prepare(spark.createDataFrame(rows, SCAN_DDL), _facts()).toArrow()
    scanned = {x: rows.filter(pa.array([r == x for r in rows.column("region").to_pylist()])) for x in (0, 1)}
    watch, held = _values_of_chunked(scanned, None, _facts(), 0)
    assert _named(pa.concat_tables([watch[0], watch[1]])) == _named(batch)
    expected = [
        (0, 3, V.PUT, b"a", V.value_hash(b"value-1")),
        (0, 8, V.PUT, b"d", V.chunked_value_hash([b"x", b"y"])),  # as a join gives two rows under one key
        (0, 9, V.PUT, b"l", V.value_hash(b"late")),
        (0, 12, V.DELETE, b"a", None),
        (0, 13, V.PUT, b"s", 42),
        (1, 3, V.PUT, b"b", V.value_hash(b"bee")),
    ]
    assert _named(batch) == expected
    # what the watch holds for the next micro-batch: chunks no manifest used and no DELETE cleaned up
    assert held is None


def test_chunks_wait_for_their_manifest_in_a_later_micro_batch():
    rows = _scan_rows().filter(pa.array([r == 1 for r in _scan_rows().column("region").to_pylist()]))
    first, second = rows.slice(0, 2), rows.slice(2)  # the chunk, then its manifest
    out, held = _values_of_chunked({1: first}, None, _facts(), 0)
    assert out[1].num_rows == 0 and held.column("key").to_pylist() == [_ck(b"b", 0)]
    resumed = {k: RegionPartition(1, 0, start_kind="state", start_after=2) for k in [(1, 0)]}
    out, held = _values_of_chunked({1: second}, held, resumed, 0)
    assert _named(out[1]) == [(1, 3, V.PUT, b"b", V.value_hash(b"bee"))]
    assert held is None
