"""The streaming source of `tidegauge watch`: every record once across triggers and restarts, in offset order
within a partition, within the read limit; unreachable sources reported and skipped, unreadable ranges fatal to
the micro-batch; Kafka settings never shown."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from div import archive
from div.archive import ArchiveWriter
from pipelines.core import stream_source
from pipelines.core.stream_source import (
    SCHEMA,
    StreamRange,
    StreamReadError,
    StreamSplit,
    TidegaugeStreamReader,
    _Options,
    fair_shares,
    offset_key,
    parse_offset_key,
    read_status,
    read_stream,
)

VT, RT = "store_v1", "store_rt"


def _write(directory, topic: str, partition: int, offsets) -> set[tuple]:
    """Archive records at `offsets` (one new file, as ArchiveWriter adds them); what a reader should see."""
    with ArchiveWriter(directory) as w:
        for o in offsets:
            w.append_record(
                topic, partition, o, b"k%d" % o, b"v%d" % o, 1_700_000_000_000 + o, 0, [("h", b"x")]
            )
    return {(topic, partition, o) for o in offsets}


def _in_region(region: int, records: set[tuple]) -> set[tuple]:
    return {(region, *r) for r in records}


def _reader(sources: dict, topics=(VT, RT), **options) -> TidegaugeStreamReader:
    opts = {"sources": json.dumps({str(k): str(v) for k, v in sources.items()}), "topics": ",".join(topics)}
    opts.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in options.items()})
    return TidegaugeStreamReader(_Options(opts))


def _read_all(reader: TidegaugeStreamReader, start: dict, end: dict) -> list[tuple]:
    return [
        row for split in reader.partitions(start, end) for batch in reader.read(split) for row in _rows(batch)
    ]


def _rows(data: pa.Table | pa.RecordBatch) -> list[tuple]:
    return [tuple(r.values()) for r in data.select(["region", "topic", "partition", "offset"]).to_pylist()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------ no Spark


def test_offset_keys_round_trip_and_bad_ones_are_named():
    assert offset_key(2, VT, 7) == "2/store_v1/7"
    assert parse_offset_key("2/store_v1/7") == (2, VT, 7)
    for bad in ("2/store_v1", "x/t/1", "1//2", "1/t/2/3"):
        with pytest.raises(ValueError, match=bad):
            parse_offset_key(bad)


def test_fair_shares_never_exceed_the_budget_and_leave_no_partition_behind():
    assert fair_shares({"a": 2, "b": 100, "c": 100}, 10) == {"a": 2, "b": 4, "c": 4}
    assert fair_shares({"a": 0, "b": 3}, 10) == {"a": 0, "b": 3}
    assert sum(fair_shares({"a": 5, "b": 5, "c": 5}, 4).values()) == 4
    # More partitions than budget, every one fed at the same rate: each is read within a few triggers.
    backlog = dict.fromkeys("abcdef", 0)
    last_read = dict.fromkeys(backlog, 0)
    for trigger in range(1, 40):
        for k in backlog:
            backlog[k] += 1
        shares = fair_shares(backlog, 4)
        assert sum(shares.values()) <= 4
        for k, n in shares.items():
            assert n <= backlog[k]
            backlog[k] -= n
            if n:
                last_read[k] = trigger
        assert all(trigger - t <= 3 for t in last_read.values()), (trigger, last_read)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"topics": VT}, "'sources'"),
        ({"sources": "{}", "topics": VT}, "'sources' names no source"),
        ({"sources": '{"x": "/a"}', "topics": VT}, "region 'x'"),
        ({"sources": '{"0": "/a"}'}, "'topics'"),
        ({"sources": '{"0": "/a"}', "topics": "a/b"}, "'a/b'"),
        ({"sources": '{"0": "/a"}', "topics": VT, "starting": "soon"}, "'starting'"),
        ({"sources": '{"0": "/a"}', "topics": VT, "starting": '{"0/t/1": -3}'}, "0/t/1"),
        ({"sources": '{"0": "/a"}', "topics": VT, "starting": '{"0/t": 5}'}, "0/t"),
        ({"sources": '{"0": "/a"}', "topics": VT, "max_records_per_trigger": "0"}, "max_records_per_trigger"),
        ({"sources": '{"0": "/a"}', "topics": VT, "max_records_per_split": "x"}, "max_records_per_split"),
        ({"sources": '{"0": "/a"}', "topics": VT, "min_records_per_task": "0"}, "min_records_per_task"),
        ({"sources": '{"0": "/a"}', "topics": VT, "plan_timeout_s": "-1"}, "plan_timeout_s"),
        ({"sources": '{"0": "/a"}', "topics": VT, "packed": "yes"}, "'packed'"),
    ],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        _Options(options)


def test_a_bad_kafka_setting_option_never_echoes_its_text():
    secret = "s3cr3t-" + uuid.uuid4().hex
    for text in (
        '{"0": {"sasl.password": "' + secret + '"',
        '{"0": "' + secret + '"}',
        '{"' + secret + '": {}}',
    ):
        with pytest.raises(ValueError, match="kafka_secret_conf") as e:
            _Options({"sources": '{"0": "/a"}', "topics": VT, "kafka_secret_conf": text})
        assert secret not in str(e.value)


def test_a_growing_archive_is_followed_and_new_partitions_start_at_their_first_offset(tmp_path):
    dc0, dc1 = tmp_path / "dc-0", tmp_path / "dc-1"
    first = _in_region(0, _write(dc0, VT, 0, range(5)) | _write(dc0, RT, 0, range(3)))
    first |= _in_region(1, _write(dc1, VT, 0, range(10, 14)))
    reader = _reader({0: dc0, 1: dc1})
    start = reader.initialOffset()
    assert start == {"0/store_rt/0": 0, "0/store_v1/0": 0, "1/store_v1/0": 10}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"0/store_rt/0": 3, "0/store_v1/0": 5, "1/store_v1/0": 14}
    rows = _read_all(reader, start, end)
    assert set(rows) == first and len(rows) == len(first)
    # Nothing new: the same offsets, so Spark runs no batch.
    assert reader.latestOffset(end, ReadAllAvailable()) == end
    later = _in_region(0, _write(dc0, VT, 0, range(5, 9)))
    # A partition seen for the first time is put in the checkpoint at its first offset before it is read.
    _write(dc1, VT, 1, range(20, 22))
    end2 = reader.latestOffset(end, ReadAllAvailable())
    assert end2 == {**end, "0/store_v1/0": 9, "1/store_v1/1": 20}
    assert set(_read_all(reader, end, end2)) == later
    end3 = reader.latestOffset(end2, ReadAllAvailable())
    assert end3 == {**end2, "1/store_v1/1": 22}
    assert _read_all(reader, end2, end3) == [(1, VT, 1, 20), (1, VT, 1, 21)]


def test_starting_latest_and_explicit_offsets(tmp_path):
    _write(tmp_path / "dc-0", VT, 0, range(10))
    _write(tmp_path / "dc-0", VT, 1, range(4))
    sources = {0: tmp_path / "dc-0"}
    assert _reader(sources, starting="latest").initialOffset() == {"0/store_v1/0": 10, "0/store_v1/1": 4}
    explicit = {"0/store_v1/0": 7, "0/store_v1/1": -1, "0/store_rt/0": 3}
    assert _reader(sources, starting=explicit).initialOffset() == {
        "0/store_rt/0": 3,
        "0/store_v1/0": 7,
        "0/store_v1/1": 4,
    }


def test_reads_yield_the_archive_records_with_the_region_in_the_spark_schema(tmp_path):
    _write(tmp_path, VT, 3, range(100, 130))
    reader = _reader({4: tmp_path}, max_records_per_split="12", min_records_per_task="1")
    splits = reader.partitions({"4/store_v1/3": 105}, {"4/store_v1/3": 130})
    assert [[(r.start, r.end) for r in s.ranges] for s in splits] == [
        [(105, 117)],
        [(117, 129)],
        [(129, 130)],
    ]
    batches = [b for s in splits for b in reader.read(s)]
    assert all(b.schema.names == SCHEMA.fieldNames() for b in batches)
    got = pa.Table.from_batches(batches)
    want = pa.Table.from_batches(list(archive.iter_partition(tmp_path, VT, 3, 105, 130)))
    assert got.column("region").to_pylist() == [4] * 25
    assert got.column("topic").to_pylist() == [VT] * 25
    for name in ("partition", "offset", "key", "value", "headers", "timestamp"):
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name


def test_small_ranges_are_read_together_and_large_ones_alone(tmp_path):
    """A task reads consecutive ranges until it holds min_records_per_task offsets; a range that large is a task
    of its own. What the tasks read together is exactly what one task per range reads, each range in order."""
    sizes = {0: 3, 1: 4, 2: 40, 3: 2, 4: 5, 5: 1}
    for p, n in sizes.items():
        _write(tmp_path, VT, p, range(n))
    end = {f"0/{VT}/{p}": n for p, n in sizes.items()}
    start = dict.fromkeys(end, 0)
    splits = _reader({0: tmp_path}, topics=(VT,), min_records_per_task="6").partitions(start, end)
    assert [[r.partition for r in s.ranges] for s in splits] == [[0, 1], [2], [3, 4], [5]]
    one_each = _reader({0: tmp_path}, topics=(VT,), min_records_per_task="1")
    assert len(one_each.partitions(start, end)) == len(sizes)
    grouped = _reader({0: tmp_path}, topics=(VT,), min_records_per_task="6")
    assert _read_all(grouped, start, end) == _read_all(one_each, start, end)
    assert len(_read_all(grouped, start, end)) == sum(sizes.values())
    # the default: a micro-batch of a few records a partition is one task
    assert len(_reader({0: tmp_path}, topics=(VT,)).partitions(start, end)) == 1


def test_packed_rows_hold_the_same_records_in_batches_of_at_most_pack_records(tmp_path, monkeypatch):
    monkeypatch.setattr(stream_source, "PACK_RECORDS", 7)
    _write(tmp_path, VT, 3, range(100, 130))
    _write(tmp_path, RT, 0, range(0, 3))
    reader = _reader({4: tmp_path}, max_records_per_split="12", packed="true", min_records_per_task="1")
    end = {"4/store_v1/3": 130, "4/store_rt/0": 3}
    splits = reader.partitions({"4/store_v1/3": 105, "4/store_rt/0": 0}, end)
    rows = pa.Table.from_batches([b for s in splits for b in reader.read(s)])
    assert rows.schema.names == stream_source.PACKED_SCHEMA.fieldNames()
    # the RT's 3 records, then the VT's splits of 12, 12 and 1 records: a split of 12 gives packed rows of 7 and 5
    assert [stream_source.unpack([b]).num_rows for b in rows.column("records").to_pylist()] == [
        3,
        7,
        5,
        7,
        5,
        1,
    ]
    vt = rows.filter(pc.equal(rows.column("topic"), VT))
    assert set(vt.column("region").to_pylist()) == {4} and set(vt.column("partition").to_pylist()) == {3}
    got = stream_source.unpack(vt.column("records").to_pylist())
    want = pa.Table.from_batches(list(archive.iter_partition(tmp_path, VT, 3, 105, 130)))
    for name in ("offset", "key", "value", "headers", "timestamp"):
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    assert stream_source.unpack([]) is None
    # and at most PACK_BYTES of keys and values a row, at least one record each: a key and a value here are 4
    # bytes each (b"k105", b"v105"), so 3 records fit in 30 bytes; the split of 12 is read as batches of 7 and 5
    monkeypatch.setattr(stream_source, "PACK_BYTES", 30)
    rows = pa.Table.from_batches(list(reader.read(splits[1])))
    assert [stream_source.unpack([b]).num_rows for b in rows.column("records").to_pylist()] == [3, 3, 1, 3, 2]
    monkeypatch.setattr(stream_source, "PACK_BYTES", 1)
    rows = pa.Table.from_batches(list(reader.read(splits[1])))
    assert rows.num_rows == 12
    got = stream_source.unpack(rows.column("records").to_pylist())
    assert got.column("offset").to_pylist() == list(range(105, 117))


def test_the_read_limit_is_shared_over_partitions_and_reaches_the_end(tmp_path):
    records = (
        _write(tmp_path, VT, 0, range(50))
        | _write(tmp_path, VT, 1, range(3))
        | _write(tmp_path, RT, 0, range(9))
    )
    reader = _reader({0: tmp_path}, max_records_per_trigger="7")
    assert reader.getDefaultReadLimit() == ReadMaxRows(7)
    start, seen = reader.initialOffset(), []
    while (end := reader.latestOffset(start, ReadMaxRows(7))) != start:
        batch = _read_all(reader, start, end)
        assert 0 < len(batch) <= 7
        seen += batch
        start = end
    assert sorted(seen) == sorted(_in_region(0, records))
    # Spark asks for everything (Trigger.Once, or a query without the limit): the limit does not apply.
    assert reader.latestOffset(reader.initialOffset(), ReadAllAvailable()) == start


def test_available_now_stops_at_what_was_there_when_it_started(tmp_path):
    _write(tmp_path, VT, 0, range(10))
    reader = _reader({0: tmp_path})
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    _write(tmp_path, VT, 0, range(10, 15))
    _write(tmp_path, VT, 1, range(3))  # a partition that appears after the target was fixed
    end = reader.latestOffset(start, ReadMaxRows(4))
    assert end == {"0/store_v1/0": 4}
    while (nxt := reader.latestOffset(end, ReadMaxRows(4))) != end:
        end = nxt
    assert end == {"0/store_v1/0": 10}


def test_an_unreachable_source_keeps_its_offsets_is_reported_once_and_comes_back(tmp_path, caplog):
    dc0, dc1 = tmp_path / "dc-0", tmp_path / "dc-1"
    _write(dc0, VT, 0, range(4))
    status = tmp_path / "state" / "source-status.json"
    reader = _reader({0: dc0, 1: dc1}, status_file=str(status))
    caplog.set_level(logging.INFO, logger=stream_source.__name__)
    start = reader.initialOffset()
    assert start == {"0/store_v1/0": 0}
    assert list(reader.unreachable()) == [1] and "no such archive directory" in reader.unreachable()[1]
    end = start
    for _ in range(3):
        end = reader.latestOffset(end, ReadAllAvailable())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"source 1={dc1}" in warnings[0]
    s = read_status(status)
    assert s["sources"]["1"]["up"] is False and s["sources"]["1"]["down_since_ms"] > 0
    assert s["sources"]["0"] == {"uri": str(dc0), "up": True, "down_since_ms": None, "error": None}
    # Region 0 goes away after it was read: its offsets stay where they were.
    os.rename(dc0, tmp_path / "away")
    _write(dc1, VT, 0, range(2))
    end2 = reader.latestOffset(end, ReadAllAvailable())
    assert end2 == {"0/store_v1/0": 4, "1/store_v1/0": 0}
    assert list(reader.unreachable()) == [0]
    os.rename(tmp_path / "away", dc0)
    _write(dc0, VT, 0, range(4, 6))
    end3 = reader.latestOffset(end2, ReadAllAvailable())
    assert end3 == {"0/store_v1/0": 6, "1/store_v1/0": 2}
    assert reader.unreachable() == {} and all(v["up"] for v in read_status(status)["sources"].values())
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        sum("cannot be read;" in m for m in messages) == 2 and sum("read again" in m for m in messages) == 2
    )


def test_records_deleted_before_they_were_read_stop_the_query_naming_them(tmp_path):
    """Reading on from the log's new start would hand the rules a hole they take for compaction (a live run
    whose watch fell behind the embedded cluster's retention reported missing records and divergences)."""
    from pipelines.core.stream_source import RecordsLostError

    _write(tmp_path, VT, 0, range(5))
    _write(tmp_path, VT, 0, range(5, 10))
    _write(tmp_path, VT, 1, range(3))
    reader = _reader({0: tmp_path})
    start = reader.initialOffset()
    [first_file] = [p for p in tmp_path.iterdir() if p.name.endswith("+00000+00000000000000000000.parquet")]
    first_file.unlink()
    with pytest.raises(RecordsLostError, match=r"0/store_v1/0 offsets 0 to 4\. .*new\s+--checkpoint") as e:
        reader.latestOffset(start, ReadAllAvailable())
    assert "0/store_v1/1" not in str(e.value)
    assert RecordsLostError.MARKER in str(e.value)
    # a new checkpoint starts where the log starts now
    assert _reader({0: tmp_path}).initialOffset() == {"0/store_v1/0": 5, "0/store_v1/1": 0}


def test_a_range_that_cannot_be_read_raises_and_names_itself(tmp_path):
    _write(tmp_path, VT, 2, range(20))
    reader = _reader({3: tmp_path}, kafka_secret_conf={"3": {"sasl.password": "unused"}})
    [split] = reader.partitions({"3/store_v1/2": 0}, {"3/store_v1/2": 20})
    [path] = [p for p in tmp_path.iterdir() if p.suffix == ".parquet"]
    _damage(path)
    with pytest.raises(StreamReadError, match=r"region 3 store_v1\[2\] offsets 0 to 19") as e:
        list(reader.read(split))
    assert "re-run from the checkpoint" in str(e.value)


@pytest.mark.kafka
def test_kafka_errors_never_show_the_settings(tmp_path, caplog):
    secret = "hunter2-" + uuid.uuid4().hex
    conf = {"0": {"sasl.password": secret, "sasl.username": "u", "security.protocol": "not-a-protocol"}}
    reader = _reader(
        {0: f"kafka://127.0.0.1:{_free_port()}"},
        kafka_secret_conf=conf,
        status_file=str(tmp_path / "status.json"),
        plan_timeout_s="1",
    )
    caplog.set_level(logging.INFO)
    assert reader.initialOffset() == {}
    split = StreamSplit([StreamRange(0, reader.options.sources[0], VT, 0, 0, 5)])
    with pytest.raises(StreamReadError) as e:
        list(reader.read(split))
    assert "security.protocol" in str(e.value)
    for text in (str(e.value), caplog.text, (tmp_path / "status.json").read_text(), repr(split)):
        assert secret not in text


def _damage(path) -> None:
    """Overwrite the start of the first column chunk, keeping the footer: planning still sees the file, reading
    its rows fails."""
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(b"\xff" * 64)


# --------------------------------------------------------------------------------------------- Spark


class Sink:
    """A foreachBatch sink that keeps every attempt of every batch: one Parquet file per attempt, the rows in
    the order the batch held them. `fail_once`: batch ids that raise after writing, the first time only."""

    def __init__(self, directory) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.fail_once: set[int] = set()

    def __call__(self, df, batch_id: int) -> None:
        rows = df.select("region", "topic", "partition", "offset").collect()
        table = pa.table(
            {
                "batch_id": pa.array([batch_id] * len(rows), pa.int64()),
                "region": pa.array([r[0] for r in rows], pa.int32()),
                "topic": pa.array([r[1] for r in rows], pa.string()),
                "partition": pa.array([r[2] for r in rows], pa.int32()),
                "offset": pa.array([r[3] for r in rows], pa.int64()),
            }
        )
        pq.write_table(table, os.path.join(self.directory, f"batch-{batch_id:05d}-{time.time_ns()}.parquet"))
        if batch_id in self.fail_once:
            self.fail_once.discard(batch_id)
            raise RuntimeError(f"the sink fails batch {batch_id} once")

    def attempts(self) -> dict[int, list[list[tuple]]]:
        out: dict[int, list[list[tuple]]] = defaultdict(list)
        for name in sorted(os.listdir(self.directory)):  # attempts of a batch id sort by time
            t = pq.read_table(os.path.join(self.directory, name))
            out[int(name.split("-")[1])].append(_rows(t))
        return dict(out)

    def records(self) -> list[tuple]:
        return [r for _, tries in sorted(self.attempts().items()) for r in tries[0]]


def _check_exactly_once(sink: Sink, expected: set[tuple]) -> dict[int, list[list[tuple]]]:
    """Every expected record in exactly one batch; a re-run batch holds what its first attempt held; within a
    batch each partition's records come in offset order."""
    attempts = sink.attempts()
    for batch_id, tries in attempts.items():
        for rows in tries[1:]:
            assert sorted(rows) == sorted(tries[0]), f"batch {batch_id} was re-run with other offsets"
        by_partition = defaultdict(list)
        for region, topic, partition, offset in tries[0]:
            by_partition[(region, topic, partition)].append(offset)
        for where, offsets in by_partition.items():
            assert offsets == sorted(set(offsets)), f"batch {batch_id} {where} out of order: {offsets}"
    got = sink.records()
    assert len(got) == len(set(got)), "a record was read twice"
    assert set(got) == expected
    return attempts


def _run_available_now(df, sink: Sink, checkpoint) -> None:
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    q.trigger(availableNow=True).start().awaitTermination()


@pytest.mark.spark
@pytest.mark.slow
def test_growing_archives_of_two_regions_are_read_exactly_once_across_runs(spark, tmp_path):
    dc0, dc1 = tmp_path / "dc-0", tmp_path / "dc-1"
    expected = _in_region(
        0, _write(dc0, VT, 0, range(30)) | _write(dc0, VT, 1, range(12)) | _write(dc0, RT, 0, range(8))
    )
    expected |= _in_region(1, _write(dc1, VT, 0, range(100, 125)))
    sink = Sink(tmp_path / "sink")
    checkpoint = f"file://{tmp_path}/checkpoint"  # a file:// URI works as Spark's checkpoint location
    df = read_stream(spark, {0: str(dc0), 1: str(dc1)}, [VT, RT], max_records_per_split=10)
    _run_available_now(df, sink, checkpoint)
    _check_exactly_once(sink, expected)
    first_batches = len(sink.attempts())
    # More records, a partition region 1 did not have, and the RT topic in region 1.
    expected |= _in_region(0, _write(dc0, VT, 0, range(30, 41)))
    expected |= _in_region(1, _write(dc1, VT, 1, range(7)) | _write(dc1, RT, 0, range(5, 9)))
    _run_available_now(df, sink, checkpoint)
    attempts = _check_exactly_once(sink, expected)
    assert len(attempts) > first_batches
    assert os.path.isdir(tmp_path / "checkpoint" / "offsets")


@pytest.mark.spark
@pytest.mark.slow
def test_a_batch_that_fails_is_re_run_with_the_same_offsets(spark, tmp_path):
    dc0, dc1 = tmp_path / "dc-0", tmp_path / "dc-1"
    expected = _in_region(0, _write(dc0, VT, 0, range(40)) | _write(dc0, VT, 1, range(25)))
    expected |= _in_region(1, _write(dc1, VT, 0, range(33)))
    sink = Sink(tmp_path / "sink")
    sink.fail_once = {1}
    df = read_stream(spark, {0: str(dc0), 1: str(dc1)}, VT, max_records_per_trigger=20)
    with pytest.raises(Exception, match="fails batch 1 once"):
        _run_available_now(df, sink, tmp_path / "checkpoint")
    assert sorted(sink.attempts()) == [0, 1]
    expected |= _in_region(1, _write(dc1, VT, 0, range(33, 40)))  # arrives while the query is down
    _run_available_now(df, sink, tmp_path / "checkpoint")
    attempts = _check_exactly_once(sink, expected)
    assert len(attempts[1]) == 2 and len(attempts[1][0]) == 20
    assert all(len(tries) == 1 for b, tries in attempts.items() if b != 1)


@pytest.mark.spark
@pytest.mark.slow
def test_an_unreadable_range_fails_the_batch_which_is_re_run_after_a_restart(spark, tmp_path):
    dc0 = tmp_path / "dc-0"
    expected = _in_region(0, _write(dc0, VT, 0, range(10)) | _write(dc0, VT, 0, range(10, 20)))
    [second] = [p for p in dc0.iterdir() if p.name.endswith("10.parquet")]
    intact = second.read_bytes()
    sink = Sink(tmp_path / "sink")
    df = read_stream(spark, {0: str(dc0)}, VT, max_records_per_trigger=10)

    def damage_after_the_first_batch(batch, batch_id):
        sink(batch, batch_id)
        if batch_id == 0:
            _damage(second)

    q = df.writeStream.foreachBatch(damage_after_the_first_batch)
    q = q.option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True)
    with pytest.raises(Exception, match=r"region 0 store_v1\[0\] offsets 10 to 19 .* cannot be read"):
        q.start().awaitTermination()
    assert sorted(sink.attempts()) == [0]
    second.write_bytes(intact)
    _run_available_now(df, sink, tmp_path / "checkpoint")
    attempts = _check_exactly_once(sink, expected)
    assert [len(attempts[b][0]) for b in sorted(attempts)] == [10, 10]


@pytest.mark.spark
@pytest.mark.slow
def test_max_records_per_trigger_caps_every_batch(spark, tmp_path):
    expected = _in_region(
        0, _write(tmp_path / "a", VT, 0, range(23)) | _write(tmp_path / "a", VT, 1, range(4))
    )
    expected |= _in_region(1, _write(tmp_path / "b", VT, 0, range(9)))
    sink = Sink(tmp_path / "sink")
    df = read_stream(spark, {0: str(tmp_path / "a"), 1: str(tmp_path / "b")}, VT, max_records_per_trigger=6)
    _run_available_now(df, sink, tmp_path / "checkpoint")
    attempts = _check_exactly_once(sink, expected)
    sizes = [len(tries[0]) for _, tries in sorted(attempts.items())]
    assert max(sizes) <= 6 and len(sizes) >= 6, sizes


# --------------------------------------------------------------------------------------------- Kafka


class _Feed:
    """Produces records and knows the offsets they get: the mock cluster numbers each partition from 0."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.next: dict[tuple[str, int], int] = defaultdict(int)

    def send(self, topic: str, counts: dict[int, int]) -> set[tuple]:
        sent = set()
        for partition, n in counts.items():
            for _ in range(n):
                offset = self.next[(topic, partition)]
                self.next[(topic, partition)] += 1
                self.producer.produce(
                    topic,
                    key=b"k%d" % offset,
                    value=b"v%d" % offset,
                    partition=partition,
                    headers=[("h", b"x")],
                )
                sent.add((topic, partition, offset))
        assert self.producer.flush(30) == 0
        return sent


def _wait_for(sink: Sink, n: int, query, timeout_s: float = 180.0) -> None:
    """Wait until the sink holds `n` records (not a timed assertion: the limit only stops a hung test)."""
    deadline = time.monotonic() + timeout_s
    while len(sink.records()) < n:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"{len(sink.records())} of {n} records after {timeout_s} s"
        time.sleep(0.2)


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
def test_live_topics_are_read_exactly_once_and_a_dead_source_does_not_stop_the_query(
    spark, embedded_kafka, tmp_path, capsys
):
    from sim.embedded_kafka import EmbeddedKafka

    store = f"s{uuid.uuid4().hex[:8]}"
    vt, rt = f"{store}_v1", f"{store}_rt"
    secret = "s3cr3t-" + uuid.uuid4().hex
    dead = f"kafka://127.0.0.1:{_free_port()}"
    with EmbeddedKafka() as other:
        embedded_kafka.create_topic(vt, 3)  # partition 2 gets its first records later
        embedded_kafka.create_topic(rt, 1)
        other.create_topic(vt, 2)
        feed0, feed1 = _Feed(embedded_kafka.bootstrap_servers), _Feed(other.bootstrap_servers)
        status = tmp_path / "status.json"
        df = read_stream(
            spark,
            {0: embedded_kafka.uri, 1: other.uri, 2: dead},
            [vt, rt],
            kafka_conf={0: {"sasl.username": "u", "sasl.password": secret}, 2: {"sasl.password": secret}},
            status_file=status,
            plan_timeout_s=1.0,
        )
        df.explain(extended=True)
        plan = capsys.readouterr().out
        assert "kafka_secret_conf=*********(redacted)" in plan and secret not in plan

        sink = Sink(tmp_path / "sink")
        expected = _in_region(0, feed0.send(vt, {0: 50, 1: 20}) | feed0.send(rt, {0: 5}))
        expected |= _in_region(1, feed1.send(vt, {0: 30, 1: 1}))
        checkpoint = tmp_path / "checkpoint"
        query = (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        try:
            _wait_for(sink, len(expected), query)
            # Produced between triggers of the running query, with the first records of partition 2.
            expected |= _in_region(0, feed0.send(vt, {0: 10, 2: 15}))
            expected |= _in_region(1, feed1.send(vt, {1: 8}))
            _wait_for(sink, len(expected), query)
            progress = json.dumps(query.lastProgress, default=str)
        finally:
            query.stop()
        assert secret not in progress
        s = read_status(status)
        assert [s["sources"][r]["up"] for r in ("0", "1", "2")] == [True, True, False]
        assert s["sources"]["2"]["uri"] == dead and secret not in json.dumps(s)
        # Stopped (perhaps in the middle of a batch), more produced, then a restart from the same checkpoint.
        expected |= _in_region(1, feed1.send(vt, {0: 12}))
        _run_available_now(df, sink, checkpoint)
        _check_exactly_once(sink, expected)
        assert {r[:3] for r in sink.records()} >= {(0, vt, 2), (0, rt, 0), (1, vt, 1)}


@pytest.mark.spark
def test_a_query_failing_on_its_options_never_shows_the_kafka_settings(spark, tmp_path):
    secret = "s3cr3t-" + uuid.uuid4().hex
    df = (
        spark.readStream.format(stream_source.SHORT_NAME)
        .option("sources", json.dumps({"0": str(tmp_path)}))
        .option("topics", VT)
        .option("kafka_secret_conf", '{"0": {"sasl.password": "' + secret + '"')
    )
    stream_source.register(spark)
    with pytest.raises(Exception, match="kafka_secret_conf") as e:
        df.load().writeStream.format("noop").option(
            "checkpointLocation", str(tmp_path / "ck")
        ).start().awaitTermination()
    assert secret not in str(e.value)


@pytest.mark.spark
@pytest.mark.slow
def test_records_deleted_before_a_query_read_them_fail_it_naming_them(spark, tmp_path):
    from pipelines.core.stream_source import RecordsLostError

    _write(tmp_path / "dc-0", VT, 0, range(5))
    sink = Sink(tmp_path / "sink")
    df = read_stream(spark, {0: str(tmp_path / "dc-0")}, [VT])
    _run_available_now(df, sink, tmp_path / "checkpoint")
    _write(tmp_path / "dc-0", VT, 0, range(5, 10))
    _write(tmp_path / "dc-0", VT, 0, range(10, 15))
    for p in (tmp_path / "dc-0").iterdir():  # retention: the log now starts at 10, 5 to 9 were never read
        if p.name.endswith(("+00000000000000000000.parquet", "+00000000000000000005.parquet")):
            p.unlink()
    with pytest.raises(Exception) as e:  # noqa: PT011 - Spark wraps the source's error in its own
        _run_available_now(df, sink, tmp_path / "checkpoint")
    assert RecordsLostError.MARKER in str(e.value) and "0/store_v1/0 offsets 5 to 9" in str(e.value)
    assert sorted(r[3] for r in sink.records()) == list(range(5))  # nothing after the hole was handed on
