"""A Kafka range that retention cut after it was planned, on a real broker (issue 32's evidence rule).

A job plans each range from the watermarks, then reads it in a task. If retention (or DeleteRecords) removes the
range's first offsets in between, a reader that starts at the first offset still held reads a shorter range as
if it were whole. Leap Frog's scan reads with `from_start=True`: the range is a read error, which makes the
region partition's verdict partial, never a silent skip. A range that starts at the first offset held (the
plan's normal case), and the default reading, still read as before.
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from div import archive, kafka_log
from div.kafka_log import RangeTrimmedError
from pipelines.leapfrog.source import READ_ERROR_OFFSET, VtSplit, split_batches

N = 200
TRIMMED_BELOW = 60


@pytest.fixture(scope="module")
def trimmed(real_kafka) -> tuple[str, str]:
    """(bootstrap, topic): one partition of N records whose offsets below TRIMMED_BELOW were deleted."""
    topic = f"trim-{uuid.uuid4().hex[:8]}"
    real_kafka.create_topics({topic: 1})
    bootstrap = real_kafka.bootstrap_servers
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 0})
    for i in range(N):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=0)
    assert p.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    for fut in admin.delete_records([TopicPartition(topic, 0, TRIMMED_BELOW)], request_timeout=30).values():
        fut.result(30)
    return bootstrap, topic


def _offsets(batches) -> list[int]:
    return pa.Table.from_batches(list(batches)).column("offset").to_pylist()


def test_a_range_cut_by_retention_is_an_error_when_read_from_its_start(trimmed):
    bootstrap, topic = trimmed
    # the default reading starts at the first offset held, as auto.offset.reset=earliest does
    assert _offsets(kafka_log.iter_partition(bootstrap, None, topic, 0, 0, N)) == list(
        range(TRIMMED_BELOW, N)
    )
    with pytest.raises(RangeTrimmedError) as e:
        list(kafka_log.iter_partition(bootstrap, None, topic, 0, 10, 100, from_start=True))
    msg = str(e.value)
    assert f"{topic}[0] on {bootstrap}" in msg
    assert "offsets 10 to 99 were planned but offset 10 is no longer held" in msg
    assert f"now holds offsets {TRIMMED_BELOW} to {N - 1}" in msg
    # a caller's own auto.offset.reset does not turn the check off
    with pytest.raises(RangeTrimmedError):
        list(
            kafka_log.iter_partition(
                bootstrap, {"auto.offset.reset": "earliest"}, topic, 0, 0, N, from_start=True
            )
        )


def test_a_range_from_the_first_offset_held_reads_whole(trimmed):
    bootstrap, topic = trimmed
    got = _offsets(kafka_log.iter_partition(bootstrap, None, topic, 0, TRIMMED_BELOW, N, from_start=True))
    assert got == list(range(TRIMMED_BELOW, N))
    got = _offsets(kafka_log.iter_partition(bootstrap, None, topic, 0, 150, 170, from_start=True))
    assert got == list(range(150, 170))


def test_leapfrog_scan_turns_a_trimmed_split_into_its_read_error_row(trimmed):
    bootstrap, topic = trimmed
    split = VtSplit(3, 1, f"kafka://{bootstrap}", 0, 0, N)
    out = pa.Table.from_batches(list(split_batches(split, topic, {})))
    assert out.num_rows == 1 and out.column("offset").to_pylist() == [READ_ERROR_OFFSET]
    assert out.column("split").to_pylist() == [3] and out.column("region").to_pylist() == [1]
    text = out.column("value")[0].as_py().decode()
    assert text.startswith("region 1 partition 0: ") and "offset 0 is no longer held" in text
    whole = VtSplit(0, 1, f"kafka://{bootstrap}", 0, TRIMMED_BELOW, N)
    assert _offsets(split_batches(whole, topic, {})) == list(range(TRIMMED_BELOW, N))


def test_an_incremental_plan_keeps_a_start_that_retention_passed(trimmed, tmp_path):
    """The previous run read up to offset 9; retention then deleted up to TRIMMED_BELOW - 1, unread. The next
    plan starts at 10 all the same, so the read fails and the verdict is partial; an archive starts at its first
    record, whose head may be compacted away."""
    from pipelines.leapfrog.source import plan

    bootstrap, topic = trimmed
    splits = plan({0: f"kafka://{bootstrap}"}, topic, None, {(0, 0): 10})
    assert [(s.start, s.end) for s in splits] == [(10, N)]
    assert _offsets(split_batches(splits[0], topic, {})) == [READ_ERROR_OFFSET]
    assert [(s.start, s.end) for s in plan({0: f"kafka://{bootstrap}"}, topic)] == [(TRIMMED_BELOW, N)]
    assert [(s.start, s.end) for s in plan({0: f"kafka://{bootstrap}"}, topic, None, {(0, 0): 150})] == [
        (150, N)
    ]
    whole = pa.Table.from_batches(list(kafka_log.iter_partition(bootstrap, None, topic, 0, 0, N)))
    with archive.ArchiveWriter(tmp_path / "dc") as w:
        w.append(whole)
    where = str(tmp_path / "dc")
    assert [(s.start, s.end) for s in plan({0: where}, topic, None, {(0, 0): 10})] == [(TRIMMED_BELOW, N)]
