"""The incremental Leap Frog job when retention deletes Kafka records it never read (issue 32's evidence rule).

Region 0's version topic is on a real broker, region 1's is an archive. Run 1 (`--state`) reads the first part of
each region's records; the rest are then produced, and DeleteRecords removes, in one partition, offsets from run
1's last offset + 1 onwards: records no run has read. Run 2 resumes from the state: that region partition's split
starts at an offset no longer held, so it is a read error (`source.split_batches` reads with `from_start=True`).
The partition is listed in `failed_partitions` with the reader's "no longer held" text and the verdict is partial
(exit 3; the histories have no faults, so no finding outranks it), while every other partition is judged as the
same two runs judge it with region 0 as archives and nothing deleted.

Run 3, after the partial one: a failed region partition is left out of the next state (no row, no carried
records), as after any read error, so that run reads it from the first offset held, as a first run would read a
log whose head is gone: a mid-stream scan (`scan_start` says so) and a clean verdict. The loss is reported by the
run that met it; later runs judge what the log still holds (docs/outputs.md, `failed_partitions`).
"""

from __future__ import annotations

import json
import uuid

import pyarrow.parquet as pq
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from leapfrog_histories import generated
from vt_builder import RegionVt, produce
from vt_fixtures import record_of

from div.archive import ArchiveWriter
from leapfrog.reference import DataEntry
from pipelines.core.sources import SourceSpec
from pipelines.leapfrog.job import LeapfrogOptions, run

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 5
TS = 1_700_000_000_000
DELETED = 3  # offsets deleted past run 1's last one in the trimmed partition


def _histories():
    """2-region histories without faults (one per partition) whose region-0 offsets run from 0 without holes, as
    a producer into an empty partition gives them: every finding would be false, so findings outrank nothing
    and a failed partition makes the verdict partial. The first (the partition retention cuts) has data records
    among the offsets deleted."""
    out = [
        h
        for h in generated(60, regions=(2, 2))
        if h.mix.name == "clean"
        and h.n_regions == 2
        and all(h.start_heartbeat[x] is None for x in (0, 1))
        and [e.vt_offset for e in h.vt[0]] == list(range(len(h.vt[0])))
        and len(h.vt[0]) >= 10
    ]
    cut = [
        h for h in out if any(isinstance(e, DataEntry) for e in h.vt[0][_cut(h) + 1 : _cut(h) + 1 + DELETED])
    ]
    return cut[:1] + [h for h in out if h is not cut[0]][: PARTITIONS - 1]


def _cut(h) -> int:
    """Region 0's last offset run 1 reads."""
    return len(h.vt[0]) // 3


def _write_archive(histories, region: int, directory, topic: str, keep=lambda p, off: True) -> str:
    """`region`'s records of each history (history i is partition i) that `keep(partition, offset)` selects."""
    with ArchiveWriter(directory) as w:
        for p, h in enumerate(histories):
            for e in h.vt[region]:
                if keep(p, e.vt_offset):
                    key, value, headers = record_of(e, 2, region)
                    w.append_record(topic, p, e.vt_offset, key, value, TS, 0, headers)
    return str(directory)


def _produce(histories, bootstrap: str, topic: str, keep) -> None:
    """Region 0's records that `keep(partition, offset)` selects, in offset order, onto the broker."""
    vts = []
    for p, h in enumerate(histories):
        vt = RegionVt(0, partition=p)
        for e in h.vt[0]:
            if keep(p, e.vt_offset):
                vt.raw(*record_of(e, 2, 0))
        vts.append(vt)
    produce(vts, bootstrap, topic)


def _run(spark, store: str, sources: dict[int, str], out, state=None):
    code = run(
        LeapfrogOptions(
            store=store,
            version=1,
            out=str(out),
            state_dir=str(state) if state is not None else None,
            sources=[SourceSpec(x, u) for x, u in sources.items()],
        ),
        spark=spark,
    )
    summary = json.loads((out / "summary.json").read_text())
    return code, summary, pq.read_table(out / "inconsistencies").to_pylist()


def _judged(summary: dict, skip: int) -> tuple[list, list]:
    """by_pair and by_region of every partition but `skip`, without what a Kafka read and an archive's differ in."""
    pairs = [r for r in summary["by_pair"] if r["partition"] != skip]
    regions = [
        {k: v for k, v in r.items() if k not in ("latest_records_kept", "compacted_ranges")}
        for r in summary["by_region"]
        if r["partition"] != skip
    ]
    return pairs, regions


def test_records_deleted_before_an_incremental_run_read_them_make_it_partial(spark, tmp_path, real_kafka):
    histories = _histories()
    assert len(histories) == PARTITIONS
    store = f"trim{uuid.uuid4().hex[:8]}"
    topic = f"{store}_v1"
    bootstrap = real_kafka.bootstrap_servers
    kafka = f"kafka://{bootstrap}"
    ends = {p: len(h.vt[0]) for p, h in enumerate(histories)}  # region 0's end offsets
    cut0 = {p: _cut(h) for p, h in enumerate(histories)}  # run 1 reads region 0 up to these
    cut1 = {p: max(e.vt_offset for e in h.vt[1]) // 3 for p, h in enumerate(histories)}  # and region 1
    trimmed = 0
    deleted_below = cut0[trimmed] + 1 + DELETED  # the new low watermark: run 1 never read what lies below it
    assert deleted_below < ends[trimmed]
    first1 = _write_archive(histories, 1, tmp_path / "day1-1", topic, lambda p, off: off <= cut1[p])
    all1 = _write_archive(histories, 1, tmp_path / "all-1", topic)

    # the same two incremental runs with region 0 as archives, nothing deleted: what every partition but the
    # trimmed one must look like
    first0 = _write_archive(histories, 0, tmp_path / "day1-0", topic, lambda p, off: off <= cut0[p])
    all0 = _write_archive(histories, 0, tmp_path / "all-0", topic)
    control = tmp_path / "control-state"
    code, summary, found = _run(spark, store, {0: first0, 1: first1}, tmp_path / "control-1", control)
    assert (code, summary["verdict"], found) == (0, "clean", [])
    code, control2, found = _run(spark, store, {0: all0, 1: all1}, tmp_path / "control-2", control)
    assert (code, control2["verdict"], found) == (0, "clean", [])
    assert control2["totals"]["comparable_pairs"] > 0

    # run 1: the first part of each region's records
    real_kafka.create_topics({topic: PARTITIONS})
    _produce(histories, bootstrap, topic, lambda p, off: off <= cut0[p])
    state = tmp_path / "state"
    code1, sum1, found1 = _run(spark, store, {0: kafka, 1: first1}, tmp_path / "out-1", state)
    assert (code1, sum1["verdict"], sum1["failed_partitions"], found1) == (0, "clean", [], [])
    last = {r["partition"]: r["last_offset"] for r in sum1["by_region"] if r["region"] == 0}
    assert last == cut0

    # the rest, then DeleteRecords in one partition up to past run 1's last offset there
    _produce(histories, bootstrap, topic, lambda p, off: off > cut0[p])
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deletions = admin.delete_records([TopicPartition(topic, trimmed, deleted_below)], request_timeout=30)
    for fut in deletions.values():
        assert fut.result(30).low_watermark == deleted_below

    # run 2: the trimmed region partition is a read error, the others are judged as the control judged them
    code2, sum2, found2 = _run(spark, store, {0: kafka, 1: all1}, tmp_path / "out-2", state)
    assert (code2, sum2["exit_code"], sum2["verdict"], found2) == (3, 3, "partial", [])
    failed = sum2["failed_partitions"]
    assert [(f["region"], f["partition"]) for f in failed] == [(0, trimmed)]
    error = failed[0]["error"]
    assert error.startswith(f"region 0 partition {trimmed}: {topic}[{trimmed}] on {bootstrap}: ")
    assert (
        f"offsets {cut0[trimmed] + 1} to {ends[trimmed] - 1} were planned but offset {cut0[trimmed] + 1} "
        "is no longer held" in error
    )
    assert f"the partition now holds offsets {deleted_below} to {ends[trimmed] - 1}" in error
    evidence = {(e["region"], e["partition"]): e for e in sum2["evidence"]["by_partition"]}
    assert evidence[(0, trimmed)]["error"] == error
    assert evidence[(0, trimmed)]["planned_offsets"] == [cut0[trimmed] + 1, ends[trimmed]]
    assert all(e["error"] is None for k, e in evidence.items() if k != (0, trimmed))
    judged = {(r["region"], r["partition"]): r for r in sum2["by_region"]}
    assert (0, trimmed) not in judged and (1, trimmed) in judged
    for p in range(PARTITIONS):
        if p != trimmed:
            assert judged[(0, p)]["scan_start"] == "state"
            assert (judged[(0, p)]["first_offset"], judged[(0, p)]["last_offset"]) == (
                cut0[p] + 1,
                ends[p] - 1,
            )
    assert _judged(sum2, trimmed) == _judged(control2, trimmed)

    # run 3: the failed region partition starts over from the first offset held, as a first run would
    code3, sum3, found3 = _run(spark, store, {0: kafka, 1: all1}, tmp_path / "out-3", state)
    assert (code3, sum3["verdict"], sum3["failed_partitions"], found3) == (0, "clean", [], [])
    evidence = {(e["region"], e["partition"]): e for e in sum3["evidence"]["by_partition"]}
    assert evidence[(0, trimmed)]["planned_offsets"] == [deleted_below, ends[trimmed]]
    assert evidence[(0, trimmed)]["error"] is None
    judged = {(r["region"], r["partition"]): r for r in sum3["by_region"]}
    assert judged[(0, trimmed)]["scan_start"] in ("heartbeat", "first_record")
    assert judged[(0, trimmed)]["first_offset"] >= deleted_below
