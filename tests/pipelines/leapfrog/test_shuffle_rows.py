"""The fused job's narrow shuffle rows give the key stages back exactly what the scan and the state hold."""

import numpy as np
import pyarrow as pa
import pytest

from pipelines.leapfrog import rows as R
from pipelines.leapfrog.carried import sortkeys
from pipelines.leapfrog.state import pack_carry_array, unpack_carry_array


def _data(n: int, m: int, rmd: bool, seed: int = 0) -> tuple[dict, pa.RecordBatch]:
    rng = np.random.default_rng(seed)
    cols = {
        "seg": rng.integers(-1, 3, m).astype(np.int8),
        "key": pa.array([rng.bytes(int(k)) for k in rng.integers(0, 12, m)], pa.binary()),
        "offset": rng.integers(0, 2**40, m),
        "value_hash": pa.array(
            rng.integers(-(2**63), 2**63 - 1, m, dtype=np.int64), mask=rng.random(m) < 0.3
        ),
        "src": pa.array(rng.integers(0, n, m).astype(np.int32)),
        "src_offset": pa.array(rng.integers(-1, 2**50, m)),
        "hw": rng.integers(-1, 2**50, (m, n)),
        "rmd": (
            pa.array(
                [
                    None if rng.random() < 0.2 else list(rng.integers(-1, 99, int(rng.integers(0, 4))))
                    for _ in range(m)
                ],
                pa.list_(pa.int64()),
            )
            if rmd
            else None
        ),
    }
    batch = R.data_batch(
        n,
        7,
        2,
        11,
        cols["seg"],
        cols["key"],
        cols["offset"],
        cols["value_hash"],
        cols["src"],
        cols["src_offset"],
        cols["hw"],
        cols["rmd"],
    )
    return cols, batch


def _as_shuffled(batch: pa.RecordBatch, bucket: int = 3) -> pa.RecordBatch:
    """What `keyed` adds in Spark: the bucket and the sort key (tested equal to Spark's in test_leapfrog_carried)."""
    sortkey = sortkeys(batch.column("partition"), batch.column("key").fill_null(b""))
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(batch.num_rows, bucket, np.int32)),
            sortkey,
            batch.column("key"),
            batch.column("region"),
            batch.column("offset"),
            batch.column("rec"),
        ],
        names=R.SHUFFLE_COLUMNS,
    )


@pytest.mark.parametrize("n,rmd", [(2, False), (3, True), (5, False)])
def test_data_rows_round_trip(n, rmd):
    cols, batch = _data(n, 200, rmd)
    assert batch.schema == R.SCAN_SCHEMA
    out = R.unpack(_as_shuffled(batch), n, rmd)
    assert out.schema == R.unpacked_schema(n, rmd)
    assert out.column("partition").to_pylist() == [7] * 200
    assert out.column("region").to_pylist() == [2] * 200
    assert out.column("split").to_pylist() == [11] * 200
    assert out.column("seg").to_pylist() == cols["seg"].tolist()
    assert out.column("key").to_pylist() == cols["key"].to_pylist()
    assert out.column("offset").to_pylist() == cols["offset"].tolist()
    assert out.column("value_hash").to_pylist() == cols["value_hash"].to_pylist()  # nulls (tombstones) kept
    assert out.column("src").to_pylist() == cols["src"].to_pylist()
    assert out.column("src_offset").to_pylist() == cols["src_offset"].to_pylist()
    assert (R.unpack_marks(out.column("hw"), n) == cols["hw"]).all()
    assert out.column("carry").null_count == 200
    if rmd:
        assert out.column("rmd").to_pylist() == cols["rmd"].to_pylist()


def test_slices_and_mixed_carried_rows():
    """Batches Spark hands over may be slices, and in the union path data and carried rows interleave."""
    n = 3
    cols, data = _data(n, 50, False, seed=1)
    rng = np.random.default_rng(2)
    m = 40
    carry = pack_carry_array(
        rng.random(m) < 0.5,
        rng.random(m) < 0.5,
        rng.integers(-1, 99, (m, n)),
        rng.integers(-1, 99, (m, n)),
        rng.random(m) < 0.5,
    )
    state = pa.RecordBatch.from_pydict(
        {
            "partition": pa.array(np.full(m, 7, np.int32)),
            "key": pa.array([rng.bytes(5) for _ in range(m)]),
            "region": pa.array(np.full(m, 1, np.int32)),
            "offset": pa.array(rng.integers(0, 999, m)),
            "value_hash": pa.array(rng.integers(0, 99, m), mask=rng.random(m) < 0.5),
            "carry": carry,
            "bucket": pa.array(np.full(m, 4, np.int32)),
        }
    )
    carried = next(R.carried_batches(n)(iter([state])))
    both = pa.Table.from_batches([data, carried]).combine_chunks().to_batches()[0]
    shuffled = _as_shuffled(both).slice(30, 50)  # 20 data rows, then 30 carried rows
    out = R.unpack(shuffled, n, False)
    assert out.column("carry").null_count == 20
    assert out.column("value_hash").to_pylist() == (
        cols["value_hash"].to_pylist()[30:] + state.column("value_hash").to_pylist()[:30]
    )
    assert out.column("split").to_pylist() == [11] * 20 + [-1] * 30
    got = unpack_carry_array(out.column("carry").slice(20), n)
    want = unpack_carry_array(carry.slice(0, 30), n)
    for g, w in zip(got, want, strict=True):
        assert (g == w).all()


def test_summaries_come_once_per_bucket_and_first():
    summary = {"split": 4, "region": 1, "partition": 9, "segments": []}
    rows = R.summary_batch(summary, 5)
    assert rows.column("bucket").to_pylist() == list(R.bucket_labels(5))
    assert rows.column("key").null_count == 5
    # the reduce task of bucket 2 receives its copy first (keyed() gives it sortkey -1), then its data rows
    _, data = _data(2, 3, False)
    mine = pa.Table.from_batches([rows.slice(2, 1), data]).combine_chunks().to_batches()[0]
    batch = _as_shuffled(mine)
    batch = batch.set_column(1, "sortkey", pa.array([-1] + batch.column("sortkey").to_pylist()[1:]))
    found, buckets, k = R.summaries(batch)
    assert (found, buckets, k) == ([summary], {3}, 1)  # _as_shuffled labels every row bucket 3
    assert R.unpack(batch.slice(k), 2, False).num_rows == 3


@pytest.mark.spark
def test_bucket_labels_put_each_bucket_in_its_own_shuffle_partition(spark):
    """Spark places a shuffled row by the Murmur3 hash of its bucket column: the labels are chosen so that bucket
    i lands in partition i (the Python hash is Spark's)."""
    from pyspark.sql import functions as F

    values = list(range(-50, 50)) + [2**31 - 1, -(2**31)]
    got = spark.createDataFrame([(v,) for v in values], "v int").select(F.hash("v")).collect()
    assert [r[0] for r in got] == [R._murmur3_int(v) for v in values]
    for buckets in (1, 2, 8, 13):
        labels = R.bucket_labels(buckets)
        df = spark.createDataFrame([(i, v) for i, v in enumerate(labels)], "i int, bucket int")
        placed = df.repartition(buckets, "bucket").select("i", F.spark_partition_id().alias("p")).collect()
        assert sorted((r["i"], r["p"]) for r in placed) == [(i, i) for i in range(buckets)]


def test_large_binary_from_spark_unpacks_alike():
    """Spark sends large_binary columns when spark.sql.execution.arrow.useLargeVarTypes is on."""
    _, batch = _data(2, 30, False, seed=4)
    shuffled = _as_shuffled(batch)
    large = pa.RecordBatch.from_arrays(
        [c.cast(pa.large_binary()) if pa.types.is_binary(c.type) else c for c in shuffled.columns],
        names=shuffled.schema.names,
    )
    assert R.unpack(large.slice(5), 2, False).to_pylist() == R.unpack(shuffled.slice(5), 2, False).to_pylist()
