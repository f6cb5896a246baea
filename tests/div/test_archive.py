"""The archive contract: round trips, file layout, atomic writes, and foreign archives read in offset order."""

from __future__ import annotations

import datetime as dt
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from archive_samples import BIG_HEADER, make_records, read_all

from div import archive
from div.archive import KAFKA_ARROW_SCHEMA, ArchiveError, ArchiveWriter, PartitionInfo


def test_schema_is_sparks_kafka_schema():
    assert KAFKA_ARROW_SCHEMA.names == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert KAFKA_ARROW_SCHEMA.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert KAFKA_ARROW_SCHEMA.field("partition").type == pa.int32()
    assert KAFKA_ARROW_SCHEMA.field("headers").type.value_type == pa.struct(
        [("key", pa.string()), ("value", pa.binary())]
    )


def test_round_trip_with_headers_nulls_and_timestamps(tmp_path):
    records = make_records("s_v1", 3, range(100))
    with ArchiveWriter(tmp_path) as w:
        for r in records:
            w.append_record(*r)
    table = read_all(tmp_path, "s_v1", 3)
    assert table.schema.equals(KAFKA_ARROW_SCHEMA)
    rows = table.to_pylist()
    assert [r["offset"] for r in rows] == list(range(100))
    for r, (topic, part, off, key, value, ts_ms, ts_type, headers) in zip(rows, records, strict=True):
        assert (r["topic"], r["partition"], r["offset"], r["key"], r["value"], r["timestampType"]) == (
            topic,
            part,
            off,
            key,
            value,
            ts_type,
        )
        assert r["timestamp"] == dt.datetime.fromtimestamp(ts_ms / 1000, dt.UTC)
        if headers is None:
            assert r["headers"] is None
        else:
            assert [(h["key"], h["value"]) for h in r["headers"]] == headers
    assert rows[0]["headers"][0]["value"] == BIG_HEADER and len(BIG_HEADER) >= 17 * 1024
    assert archive.describe(tmp_path) == [PartitionInfo("s_v1", 3, 0, 99, 100)]
    assert archive.topics(tmp_path) == ["s_v1"]


def test_files_sort_by_topic_partition_first_offset_and_hold_one_partition(tmp_path):
    w = ArchiveWriter(tmp_path, row_group_size=7)
    # Interleave topics and partitions in one batch, flush several times: several files per partition.
    for lo in (0, 40, 80):
        recs = []
        for t in ("b_rt", "a", "a-x", "a.b"):
            for p in (10, 2):
                recs += make_records(t, p, range(lo, lo + 40))
        random.Random(lo).shuffle(recs)
        recs.sort(key=lambda r: (r[0], r[1], r[2]))  # per-partition order kept; partitions interleaved below
        recs = recs[::2] + recs[1::2]
        w.append(archive.records_to_batch(recs))
        w.flush()
    w.close()
    names = sorted(os.listdir(tmp_path))
    keys = []
    for n in names:
        t = pq.read_table(tmp_path / n)
        assert (
            len(set(t.column("topic").to_pylist())) == 1 and len(set(t.column("partition").to_pylist())) == 1
        )
        offs = t.column("offset").to_pylist()
        assert offs == sorted(offs) and len(set(offs)) == len(offs)
        assert n == archive.file_name(t.column("topic")[0].as_py(), t.column("partition")[0].as_py(), offs[0])
        keys.append((t.column("topic")[0].as_py(), t.column("partition")[0].as_py(), offs[0]))
    assert keys == sorted(keys), "a directory listing must sort by (topic, partition, first offset)"
    assert len(names) == 4 * 2 * 3
    info = {(i.topic, i.partition): i for i in archive.describe(tmp_path)}
    assert info[("a.b", 10)] == PartitionInfo("a.b", 10, 0, 119, 120)
    table = read_all(tmp_path, "a.b", 10, batch_size=50)
    assert table.column("offset").to_pylist() == list(range(120))
    assert [b.num_rows for b in archive.iter_partition(tmp_path, "a.b", 10, batch_size=50)] == [50, 50, 20]


def test_start_end_and_column_projection(tmp_path):
    with ArchiveWriter(tmp_path, row_group_size=16) as w:
        for lo in range(0, 200, 50):
            w.append(archive.records_to_batch(make_records("t", 0, range(lo, lo + 50))))
            w.flush()
    t = read_all(tmp_path, "t", 0, start=37, end=163, columns=["offset", "value"])
    assert t.column_names == ["offset", "value"]
    assert t.column("offset").to_pylist() == list(range(37, 163))
    assert read_all(tmp_path, "t", 0, start=500).num_rows == 0
    assert read_all(tmp_path, "t", 1).num_rows == 0
    with pytest.raises(ValueError, match="nope"):
        list(archive.iter_partition(tmp_path, "t", 0, columns=["nope"]))


def test_writer_sorts_out_of_order_appends(tmp_path):
    recs = make_records("t", 0, range(30))
    with ArchiveWriter(tmp_path) as w:
        w.append(archive.records_to_batch(recs[20:]))
        w.append(archive.records_to_batch(recs[:20]))
    assert read_all(tmp_path, "t", 0).column("offset").to_pylist() == list(range(30))
    assert os.listdir(tmp_path) == [archive.file_name("t", 0, 0)]


def test_writer_splits_large_buffers_into_files(tmp_path):
    with ArchiveWriter(tmp_path, file_rows=100, row_group_size=32) as w:
        for o in range(250):
            w.append_record("t", 1, o, b"k", b"v", 1, 0, None)
    # Records are buffered in row groups of 32; a file is cut once a partition holds >= 100 rows.
    assert sorted(os.listdir(tmp_path)) == [archive.file_name("t", 1, o) for o in (0, 128)]
    assert read_all(tmp_path, "t", 1).column("offset").to_pylist() == list(range(250))
    md = pq.ParquetFile(tmp_path / sorted(os.listdir(tmp_path))[0]).metadata
    assert md.num_row_groups >= 2


def test_writer_refuses_to_overwrite_and_hidden_topics(tmp_path):
    with ArchiveWriter(tmp_path) as w:
        w.append_record("t", 0, 5, b"k", b"v")
    w2 = ArchiveWriter(tmp_path)
    w2.append_record("t", 0, 5, b"k", b"v")
    with pytest.raises(ArchiveError, match=r"already exists"):
        w2.flush()
    with pytest.raises(ArchiveError, match="_schemas"):
        w2.append_record("_schemas", 0, 0, b"k", b"v")
    with pytest.raises(ArchiveError, match="closed"):
        w.append_record("t", 0, 6, b"k", b"v")


def test_crash_between_write_and_rename_leaves_nothing_visible(tmp_path, monkeypatch):
    with ArchiveWriter(tmp_path) as w:
        w.append(archive.records_to_batch(make_records("t", 0, range(10))))
    good = set(os.listdir(tmp_path))

    class Crash(BaseException):
        pass

    def crash(src, dst):
        raise Crash()

    w = ArchiveWriter(tmp_path)
    w.append(archive.records_to_batch(make_records("t", 0, range(10, 20))))
    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(Crash):
        w.flush()
    monkeypatch.undo()
    assert set(os.listdir(tmp_path)) == good  # the temporary file is gone, no final name appeared
    # A process killed at that moment leaves its temporary file behind: readers must not see it.
    full = tmp_path / sorted(good)[0]
    (tmp_path / f".{archive.file_name('t', 0, 10)}.dead.tmp").write_bytes(full.read_bytes()[:100])
    (tmp_path / "_SUCCESS").write_bytes(b"")
    assert archive.describe(tmp_path) == [PartitionInfo("t", 0, 0, 9, 10)]
    assert read_all(tmp_path, "t", 0).num_rows == 10


def test_missing_and_unreadable_archives_name_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ArchiveError, match=str(missing)):
        archive.describe(missing)
    with pytest.raises(ArchiveError, match=str(missing)):
        list(archive.iter_partition(missing, "t", 0))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "t+00000+00000000000000000000.parquet").write_bytes(b"PAR1 not really parquet")
    with pytest.raises(ArchiveError, match="t\\+00000\\+00000000000000000000.parquet"):
        archive.describe(bad)
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table({"x": [1]}), other / "x.parquet")
    with pytest.raises(ArchiveError, match="x.parquet.*'topic'"):
        archive.topics(other)


def _foreign_table(records: list[tuple], with_headers: bool) -> pa.Table:
    """The same records as another writer might store them: int64 partition, naive ns timestamps,
    large_binary values, a list item named 'item', optionally no headers column."""
    b = archive.records_to_batch(records)
    cols = {
        "key": b.column("key"),
        "value": b.column("value").cast(pa.large_binary()),
        "topic": b.column("topic"),
        "partition": b.column("partition").cast(pa.int64()),
        "offset": b.column("offset"),
        "timestamp": b.column("timestamp").cast(pa.timestamp("ns", tz="UTC")).cast(pa.timestamp("ns")),
        "timestampType": b.column("timestampType"),
    }
    if with_headers:
        cols["headers"] = b.column("headers").cast(pa.list_(archive.HEADER_TYPE))
    return pa.table(cols)


@pytest.mark.parametrize("with_headers", [True, False])
def test_foreign_archive_mixed_unsorted_duplicated(tmp_path, with_headers):
    rng = random.Random(7)
    expected = {
        (t, p): make_records(t, p, range(0, 300, 1 if p else 2)) for t in ("x", "y") for p in (0, 1, 2)
    }
    everything = [r for recs in expected.values() for r in recs]
    dupes = rng.sample(everything, 50)  # the same records archived twice
    rows = everything + dupes
    rng.shuffle(rows)
    third = len(rows) // 3
    for i, chunk in enumerate((rows[:third], rows[third : 2 * third], rows[2 * third :])):
        pq.write_table(
            _foreign_table(chunk, with_headers),
            tmp_path / f"part-{i:05d}-abc.snappy.parquet",
            row_group_size=97,
        )
    # One of our own files overlapping the foreign ones.
    with ArchiveWriter(tmp_path) as w:
        w.append(archive.records_to_batch(expected[("y", 1)][100:150]))
    assert archive.topics(tmp_path) == ["x", "y"]
    info = {(i.topic, i.partition): i for i in archive.describe(tmp_path)}
    for (t, p), recs in expected.items():
        assert info[(t, p)] == PartitionInfo(t, p, recs[0][2], recs[-1][2], len(recs))
        table = read_all(tmp_path, t, p, batch_size=64)
        assert table.schema.equals(KAFKA_ARROW_SCHEMA)
        want = archive.records_to_batch(recs).to_pylist()
        if not with_headers:
            for r in want:
                r["headers"] = None
        assert table.to_pylist() == want
    sub = read_all(tmp_path, "x", 0, start=101, end=201, columns=["offset"])
    assert sub.column("offset").to_pylist() == list(range(102, 201, 2))


def test_split_by_partition_keeps_order_within_partitions():
    recs = make_records("a", 0, range(5)) + make_records("b", 0, range(3)) + make_records("a", 1, range(4))
    recs = [recs[i] for i in (0, 5, 8, 1, 6, 9, 2, 7, 10, 3, 11, 4)]
    parts = dict(archive.split_by_partition(archive.records_to_batch(recs)))
    assert sorted(parts) == [("a", 0), ("a", 1), ("b", 0)]
    assert parts[("a", 0)].column("offset").to_pylist() == [0, 1, 2, 3, 4]
    assert parts[("a", 1)].column("offset").to_pylist() == [0, 1, 2, 3]
    assert archive.split_by_partition(archive.empty_batch()) == []


def test_broker_times_come_back_in_milliseconds_one_way():
    # Issue 17: readers turned the archive's microseconds into milliseconds two ways (Arrow division, `// 1000`);
    # div.archive.timestamps_ms is the one conversion every reader uses.
    import pyarrow as pa

    from div.archive import timestamps_ms

    us = [1_700_000_000_123_456, None, 0]
    batch = pa.RecordBatch.from_arrays([pa.array(us, pa.timestamp("us", tz="UTC"))], ["timestamp"])
    assert timestamps_ms(batch) == [1_700_000_000_123, None, 0]
    assert timestamps_ms(pa.Table.from_batches([batch])) == [1_700_000_000_123, None, 0]


def _payload_bytes(batch: pa.RecordBatch) -> int:
    return sum(
        len(v or b"") + len(k or b"")
        for k, v in zip(batch.column("key").to_pylist(), batch.column("value").to_pylist(), strict=True)
    )


def test_batches_are_bounded_by_bytes_as_well_as_rows(tmp_path, monkeypatch):
    # Chunked values are about 1 MiB a record: 65,536 rows of them made one batch of gigabytes, which killed the
    # Spark job's JVM. Scaled down here: a 256 KiB limit and values of 10-40 KiB, one of them above the limit.
    limit = 256 << 10
    monkeypatch.setattr(archive, "MAX_BATCH_BYTES", limit)
    rng = random.Random(5)
    sizes = [rng.randrange(10 << 10, 40 << 10) for _ in range(120)]
    sizes[57] = 600 << 10
    with ArchiveWriter(tmp_path, row_group_size=16) as w:
        for o, size in enumerate(sizes):
            w.append_record("vt", 0, o, b"k%d" % o, None if o % 11 == 0 else bytes(size))
            if o % 25 == 24:
                w.flush()
    batches = list(archive.iter_partition(tmp_path, "vt", 0))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(120))
    assert len(batches) > 10
    for b in batches:
        assert _payload_bytes(b) <= limit or b.num_rows == 1
    big = [b for b in batches if 57 in b.column("offset").to_pylist()]
    assert big[0].num_rows == 1
    # the row limit still holds with the byte limit
    assert max(b.num_rows for b in archive.iter_partition(tmp_path, "vt", 0, batch_size=3)) == 3


def test_bounded_batches_keeps_every_row_in_order():
    rng = random.Random(9)
    for _ in range(50):
        n = rng.randrange(0, 40)
        values = [None if rng.random() < 0.2 else bytes(rng.randrange(0, 300)) for _ in range(n)]
        table = pa.table({"value": pa.array(values, pa.binary()), "offset": pa.array(range(n), pa.int64())})
        max_rows, max_bytes = rng.randrange(1, 10), rng.randrange(1, 1000)
        out = list(archive.bounded_batches(table, max_rows, max_bytes))
        assert pa.Table.from_batches(out, schema=table.schema).equals(table)
        for b in out:
            sized = sum(len(v or b"") + 4 + 8 for v in b.column("value").to_pylist())
            assert b.num_rows <= max_rows and (sized <= max_bytes or b.num_rows == 1)
