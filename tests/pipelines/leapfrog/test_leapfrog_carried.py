"""Reduce tasks reading their own carried records (pipelines.leapfrog.carried): the right files, the right rows,
merged into the input in its order."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.leapfrog.carried import (
    _SORT,
    CARRIED_SCHEMA,
    buckets_tag,
    file_buckets,
    merge_carried,
    read_carried,
    sortkeys,
)

STREAM = pa.schema(
    [
        ("bucket", pa.int32()),
        ("sortkey", pa.int64()),
        ("order", pa.int8()),
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("region", pa.int32()),
        ("offset", pa.int64()),
        ("value_hash", pa.int64()),
        ("src", pa.int32()),
        ("carry", pa.binary()),
    ]
)


def _carried(rows, settled=(), sortkey=None) -> pa.Table:
    """rows: (partition, key, region, offset, bucket); `settled`: the keys whose records are flagged settled;
    `sortkey(key)`: to give the rows sortkeys of a test's choosing (say, shared by many keys)."""
    p, k, r, o, b = zip(*rows, strict=True)
    carry = [bytes([4 if key in settled else 0]) + bytes(32) for key in k]
    part, key = pa.array(p, pa.int32()), pa.array(k, pa.binary())
    sk = sortkeys(part, key) if sortkey is None else pa.array([sortkey(x) for x in k], pa.int64())
    return pa.table(
        [
            part,
            key,
            pa.array(r, pa.int32()),
            pa.array(o, pa.int64()),
            pa.nulls(len(rows), pa.int64()),
            pa.array(carry),
            pa.array(b, pa.int32()),
            sk,
        ],
        schema=CARRIED_SCHEMA,
    )


@pytest.mark.spark
def test_sortkey_in_python_is_sparks(spark):
    from pipelines.leapfrog.rows import sortkey_column

    keys = [b"", b"k", bytes(range(256)), "ключ".encode()]
    df = spark.createDataFrame([(p, k) for p in (0, 7, 2**31 - 1) for k in keys], "partition int, key binary")
    got = [r[0] for r in df.select(sortkey_column()).collect()]
    table = pa.table(
        {
            "partition": pa.array([p for p in (0, 7, 2**31 - 1) for _ in keys], pa.int32()),
            "key": pa.array([k for _ in range(3) for k in keys], pa.binary()),
        }
    )
    assert sortkeys(table.column("partition").chunk(0), table.column("key").chunk(0)).to_pylist() == got


def test_each_task_reads_the_files_of_its_buckets_and_only_their_rows(tmp_path):
    rows = [(0, f"k{i}".encode(), i % 2, i, i % 4) for i in range(40)]
    files = {}
    for name, held in (("part-00001.parquet", [0, 2]), ("part-00003.parquet", [1, 3])):
        t = _carried([r for r in rows if r[4] in held])
        pq.write_table(t.replace_schema_metadata(buckets_tag(held)), tmp_path / name)
        files[name] = file_buckets(str(tmp_path / name))
    assert files == {"part-00001.parquet": [0, 2], "part-00003.parquet": [1, 3]}
    got = read_carried(str(tmp_path), files, {0, 2})
    assert sorted(got.column("offset").to_pylist()) == [r[3] for r in rows if r[4] in (0, 2)]
    # bucket layout changed: a task holding buckets of two files filters both
    got = read_carried(str(tmp_path), files, {2, 3})
    assert sorted(got.column("offset").to_pylist()) == [r[3] for r in rows if r[4] in (2, 3)]
    assert read_carried(str(tmp_path), files, {5}) is None
    # sorted as the reduce input is
    assert got.sort_by(_SORT).column("offset").to_pylist() == got.column("offset").to_pylist()
    untagged = tmp_path / "old.parquet"
    pq.write_table(_carried(rows[:1]), untagged)
    assert file_buckets(str(untagged)) is None


def test_a_state_written_before_sortkeys_were_kept_reads_the_same(tmp_path):
    rows = [(p, f"k{i}".encode(), i % 2, i, 0) for i in range(30) for p in (0, 3)]
    t = _carried(rows)
    (tmp_path / "new").mkdir()
    (tmp_path / "old").mkdir()
    pq.write_table(t.replace_schema_metadata(buckets_tag([0])), tmp_path / "new" / "part-00000.parquet")
    pq.write_table(
        t.drop_columns(["sortkey"]).replace_schema_metadata(buckets_tag([0])),
        tmp_path / "old" / "part-00000.parquet",
    )
    files = {"part-00000.parquet": [0]}
    new, old = (read_carried(str(tmp_path / d), files, {0}) for d in ("new", "old"))
    assert old.schema == new.schema == CARRIED_SCHEMA
    assert old.equals(new)


def _stream_batches(rows, sizes):
    """Sorted input rows (sortkey, key, region, offset) cut into batches of the given sizes, with marks."""
    t = pa.table(
        {
            "bucket": pa.array([0] * len(rows), pa.int32()),
            "sortkey": pa.array([r[0] for r in rows], pa.int64()),
            "order": pa.array([1] * len(rows), pa.int8()),
            "partition": pa.array([0] * len(rows), pa.int32()),
            "key": pa.array([r[1] for r in rows], pa.binary()),
            "region": pa.array([r[2] for r in rows], pa.int32()),
            "offset": pa.array([r[3] for r in rows], pa.int64()),
            "value_hash": pa.array([7] * len(rows), pa.int64()),
            "src": pa.array([0] * len(rows), pa.int32()),
            "carry": pa.nulls(len(rows), pa.binary()),
        },
        schema=STREAM,
    )
    out, pos = [], 0
    for s in [*sizes, len(rows)]:  # the last batch takes what the sizes left
        b = t.slice(pos, s).combine_chunks().to_batches()
        if b:
            out.append((b[0], np.full((b[0].num_rows, 2), 5, np.int64)))
        pos += s
    return out


@pytest.mark.parametrize("pass_untouched", [False, True])
@pytest.mark.parametrize("shared_sortkeys", [False, True], ids=["crc32", "collisions"])
def test_merged_stream_is_sorted_complete_and_keeps_marks(pass_untouched, shared_sortkeys):
    """...and with a place for them, the settled records of keys without new rows go there instead. With
    `shared_sortkeys` many keys share one sortkey (as keys whose crc32 collide do): the keys then decide."""
    rng = random.Random(3)

    def sortkey(k: bytes) -> int:
        return k[0] if shared_sortkeys else int(sortkeys(pa.array([0], pa.int32()), pa.array([k]))[0].as_py())

    for _ in range(50):
        keys = sorted({bytes([rng.randrange(6), rng.randrange(256)]) for _ in range(rng.randint(1, 30))})
        new = [(0, k) for k in keys if rng.random() < 0.6]
        old = [(0, k) for k in keys if rng.random() < 0.6]
        settled = {k for _, k in old if rng.random() < 0.5}
        new_rows = sorted(
            (sortkey(k), k, r, 100 + i) for i, (_, k) in enumerate(new) for r in (0, 1) if rng.random() < 0.8
        )
        carried = (
            _carried(
                [(0, k, r, i, 0) for i, (_, k) in enumerate(old) for r in (0, 1) if rng.random() < 0.8],
                settled,
                sortkey,
            )
            if old
            else None
        )
        if carried is not None and carried.num_rows == 0:
            carried = None
        if carried is not None:
            carried = carried.sort_by(_SORT)
        sizes = [rng.randint(0, 5) for _ in range(len(new_rows) + 1)]
        pairs = _stream_batches(new_rows, sizes)
        passed = []
        out = list(merge_carried(iter(pairs), carried, STREAM, 2, passed.append if pass_untouched else None))
        merged = pa.Table.from_batches([b for b, _ in out], schema=STREAM) if out else STREAM.empty_table()
        order = [(r["sortkey"], r["key"], r["region"], r["offset"]) for r in merged.to_pylist()]
        assert order == sorted(order)
        old_rows = carried.to_pylist() if carried is not None else []
        with_new = {r[1] for r in new_rows}
        untouched = [
            r for r in old_rows if pass_untouched and r["key"] in settled and r["key"] not in with_new
        ]
        got = pa.Table.from_batches(passed, CARRIED_SCHEMA).to_pylist() if passed else []
        if shared_sortkeys:  # a settled row whose sortkey a new row of its batch shares joins the stream
            assert all(r in untouched for r in got)
        else:
            assert sorted(got, key=repr) == sorted(untouched, key=repr)
        assert merged.num_rows == len(new_rows) + len(old_rows) - len(got)
        marks = np.concatenate([m for _, m in out]) if out else np.zeros((0, 2))
        is_carried = ~merged.column("carry").is_null().to_numpy(zero_copy_only=False)
        assert (marks[is_carried] == 0).all() and (marks[~is_carried] == 5).all()
        assert (merged.column("src").to_numpy(zero_copy_only=False)[is_carried] == -1).all()
