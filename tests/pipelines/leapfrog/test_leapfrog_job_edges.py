"""The Leap Frog job on what goes wrong: broken records, missing partitions, bad sources and flags, damaged files.

The contract (docs/design.md, docs/outputs.md): undecodable records and records without a usable region are counted
with their offsets in summary.json and never stop the job; a partition that cannot be processed in some region
is listed in `failed_partitions` and the job exits 3 with the rest written; a source that cannot be read or a
bad flag exits 2 with a message naming it. A crash is never an answer: its exit code (1) would read as
"divergence found".
"""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
from leapfrog_run import run_leapfrog
from vt_builder import CODEC, TS, RegionVt, write_archive

from div import envelope as E
from div import keys as K
from pipelines.cli import main

STORE, TOPIC = "edge", "edge_v1"


def _run(spark, dirs, out, mode="heartbeat"):
    code = run_leapfrog(spark, STORE, dirs, out, mode=mode)
    summary = json.loads((out / "summary.json").read_text())
    return code, summary, pq.read_table(out / "inconsistencies").to_pylist()


def _clean_log(x: int, partition: int = 0, chunked: bool = False) -> RegionVt:
    """Two regions that agree: a, b from region 0, c from region 1, then heartbeats covering everything."""
    vt = RegionVt(x, partition=partition, chunked=chunked)
    vt.start_of_push()
    vt.end_of_push()
    vt.put(b"a", b"1", 0, 10)
    vt.put(b"c", b"3", 1, 20)
    return vt


def _close(vt: RegionVt) -> None:
    vt.put(b"b", b"2", 0, 11)
    vt.heartbeat(0, 12, [12, 21])
    vt.heartbeat(1, 21, [12, 21])


def _envelope(footer) -> bytes:
    return CODEC.encode(
        {
            "messageType": 0,
            "producerMetadata": E.producer_metadata(bytes(16), 0, 7, TS, -2),
            "payloadUnion": (
                E.PUT,
                {
                    "putValue": b"v",
                    "schemaId": 1,
                    "replicationMetadataVersionId": -1,
                    "replicationMetadataPayload": b"",
                },
            ),
            "leaderMetadataFooter": footer,
        }
    )


# ------------------------------------------------------------------------------------------- broken records
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("chunked", [False, True], ids=["fused", "two-phase"])
def test_broken_records_are_counted_with_their_offsets(spark, tmp_path, chunked):
    good = _envelope(E.leader_footer("leader", 5, 0))
    logs = {}
    broken = {}
    for x in (0, 1):
        vt = _clean_log(x, chunked=chunked)
        if x == 1:
            suffix = b"\x02\x00" if chunked else b""
            broken = {
                "bad_magic": vt.raw(K.data_key(b"m" + suffix), b"\x16" + good[1:]),
                "truncated": vt.raw(K.data_key(b"t" + suffix), good[: len(good) // 2]),
                "unknown_key_header": vt.raw(b"\x07xyz", good),
                "garbage_control": vt.raw(K.control_key(bytes(16), 0, 99), b"\x17\x0e\xff\xff"),
                "region_9": vt.put(b"o", b"x", 9, 5),
                "no_footer": vt.raw(K.data_key(b"n" + suffix), _envelope(None)),
                "heartbeat_from_region_7": vt.heartbeat(7, 3, [12, 21]),
            }
        _close(vt)
        logs[x] = vt
    dirs = {x: write_archive([vt], tmp_path / f"dc-{x}", TOPIC) for x, vt in logs.items()}
    code, summary, found = _run(spark, dirs, tmp_path / "out")
    # nothing found, over evidence that is not whole: partial, never clean
    assert found == [] and code == 3 and summary["verdict"] == "partial"
    facts = {r["region"]: r for r in summary["by_region"]}
    assert facts[1]["unverified_keys"] == 2  # m and t: readable keys, unreadable values
    undecodable = [broken[k] for k in ("bad_magic", "truncated", "unknown_key_header", "garbage_control")]
    out_of_range = [broken[k] for k in ("region_9", "no_footer", "heartbeat_from_region_7")]
    assert facts[1]["undecodable_offsets"] == undecodable and facts[1]["undecodable"] == len(undecodable)
    assert facts[1]["out_of_range_offsets"] == out_of_range and facts[1]["out_of_range"] == len(out_of_range)
    assert facts[0]["undecodable"] == facts[0]["out_of_range"] == 0
    assert summary["totals"]["undecodable"] == len(undecodable)
    assert summary["totals"]["out_of_range"] == len(out_of_range)
    # the good records around them are compared as usual
    (pair,) = summary["by_pair"]
    assert pair["keys"] == 3 and pair["pending_keys"] == 0 and pair["comparable_pairs"] > 0
    assert facts[1]["records"] == facts[0]["records"] == 3


# ---------------------------------------------------------------------------------------- failed partitions
@pytest.mark.spark
@pytest.mark.slow
def test_partition_in_one_region_only_fails_it_and_keeps_the_rest(spark, tmp_path):
    logs = {0: [_clean_log(0, 0), _clean_log(0, 1)], 1: [_clean_log(1, 0)]}
    for vts in logs.values():
        for vt in vts:
            _close(vt)
    logs[0][1].put(b"only-here", b"!", 0, 13)  # would be MISSING in region 1 if partition 1 were compared
    dirs = {x: write_archive(vts, tmp_path / f"dc-{x}", TOPIC) for x, vts in logs.items()}
    code, summary, found = _run(spark, dirs, tmp_path / "out")
    assert code == 3
    assert summary["exit_code"] == 3
    assert [(f["region"], f["partition"]) for f in summary["failed_partitions"]] == [(1, 1)]
    assert "1" in summary["failed_partitions"][0]["error"]
    assert found == []
    by_pair = {e["partition"]: e for e in summary["by_pair"]}
    assert by_pair[0]["keys"] == 3 and by_pair[0]["comparable_pairs"] > 0
    assert by_pair.get(1, {"keys": 0})["keys"] == 0


def _truncate(path: str) -> None:
    """Cut a Parquet file in half: its footer is gone."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def _damage_row_group(path: str) -> None:
    """Overwrite the `value` column's pages of row group 0; the footer stays readable."""
    col = pq.ParquetFile(path).metadata.row_group(0)
    value = next(col.column(i) for i in range(col.num_columns) if col.column(i).path_in_schema == "value")
    with open(path, "r+b") as f:
        f.seek(value.data_page_offset)
        f.write(b"\xab" * value.total_compressed_size)


def _two_partitions(tmp_path) -> dict[int, str]:
    logs = {x: [_clean_log(x, 0), _clean_log(x, 1)] for x in (0, 1)}
    for vts in logs.values():
        for vt in vts:
            _close(vt)
    return {x: write_archive(vts, tmp_path / f"dc-{x}", TOPIC) for x, vts in logs.items()}


def _file_of(directory: str, partition: int) -> str:
    (name,) = [n for n in os.listdir(directory) if n.startswith(f"{TOPIC}+{partition:05d}+")]
    return os.path.join(directory, name)


@pytest.mark.spark
@pytest.mark.slow
def test_damaged_row_group_fails_that_partition_only(spark, tmp_path):
    """A file whose footer reads but whose data does not: that region's partition is reported failed (exit 3)
    and every other partition is compared and written."""
    dirs = _two_partitions(tmp_path)
    _damage_row_group(_file_of(dirs[1], 1))
    code, summary, found = _run(spark, dirs, tmp_path / "out")
    assert code == 3
    assert [(f["region"], f["partition"]) for f in summary["failed_partitions"]] == [(1, 1)]
    assert found == []
    assert {(r["region"], r["partition"]) for r in summary["by_region"]} == {(0, 0), (0, 1), (1, 0)}
    by_pair = {e["partition"]: e for e in summary["by_pair"]}
    assert by_pair[0]["keys"] == 3 and by_pair[0]["comparable_pairs"] > 0


def test_truncated_archive_file_is_unreadable_input(tmp_path, capsys):
    """A file without a footer cannot be indexed, so the archive cannot be planned: exit 2 naming the file
    (div.archive indexes a whole directory; attributing the file to its partition would need it to skip and
    report unreadable files)."""
    dirs = _two_partitions(tmp_path)
    bad = _file_of(dirs[1], 1)
    _truncate(bad)
    code = main(
        [
            "leapfrog",
            "--store",
            STORE,
            "--version",
            "1",
            "--source",
            f"0={dirs[0]}",
            "--source",
            f"1={dirs[1]}",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert bad in err and "1=" in err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------- usage: exit 2
def _cli(tmp_path, *extra: str, sources=None) -> int:
    argv = ["leapfrog", "--store", STORE, "--version", "1", "--out", str(tmp_path / "out")]
    for s in sources or []:
        argv += ["--source", s]
    return main(argv + list(extra))


@pytest.fixture
def archives(tmp_path):
    logs = {x: _clean_log(x) for x in (0, 1, 2)}
    for vt in logs.values():
        _close(vt)
    return {x: write_archive([vt], tmp_path / f"dc-{x}", TOPIC) for x, vt in logs.items()}


def test_missing_archive_exits_2_naming_it(tmp_path, archives, capsys):
    missing = str(tmp_path / "no-such-archive")
    assert _cli(tmp_path, sources=[f"0={archives[0]}", f"1={missing}"]) == 2
    err = capsys.readouterr().err
    assert missing in err and "1=" in err
    assert not (tmp_path / "out").exists()


def test_archive_without_the_topic_exits_2_naming_it(tmp_path, archives, capsys):
    other = write_archive([_clean_log(0)], tmp_path / "other", "another_v1")
    assert _cli(tmp_path, sources=[f"0={archives[0]}", f"1={other}"]) == 2
    err = capsys.readouterr().err
    assert other in err and "edge_v1" in err and "another_v1" in err


@pytest.mark.kafka
def test_unreachable_kafka_exits_2_naming_it(tmp_path, archives, capsys):
    assert _cli(tmp_path, sources=[f"0={archives[0]}", "1=kafka://127.0.0.1:1"]) == 2
    assert "kafka://127.0.0.1:1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "pairs, says",
    [
        ("0-0", "itself"),
        ("0-9", "region 9"),
        ("garbage", "garbage"),
        ("0-1,1", "'1'"),
        ("0-1-2", "0-1-2"),
        ("a-b", "a-b"),
    ],
)
def test_bad_pairs_exit_2(tmp_path, archives, capsys, pairs, says):
    code = _cli(tmp_path, "--pairs", pairs, sources=[f"{x}={d}" for x, d in archives.items()])
    assert code == 2
    err = capsys.readouterr().err
    assert "--pairs" in err and says in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ a liveness limit (pure rule)
def _compaction_logs(compacted: bool):
    """EOP at 0; both regions apply y (from region 1), x twice and z (from region 0); region 0 applies k from its
    own RT, region 1 drops it; heartbeats in both cover everything. Compaction may have removed x's first copy
    (offset 2) in region 1: a superseded record of another key."""
    from leapfrog.reference import DataEntry as D
    from leapfrog.reference import FromEndOfPush, RegionLog
    from leapfrog.reference import HeartbeatEntry as H
    from leapfrog.reference import OtherEntry as O

    r0 = [
        D(1, b"y", 21, 1, 8),
        D(2, b"x", 11, 0, 1),
        D(3, b"x", 12, 0, 2),
        D(4, b"k", 13, 0, 3),
        D(5, b"z", 14, 0, 4),
        H(6, (4, 9), 0, 4),
        H(7, (4, 9), 1, 9),
    ]
    r1 = [
        D(1, b"y", 21, 1, 8),
        D(2, b"x", 11, 0, 1),
        D(3, b"x", 12, 0, 2),
        O(4),
        D(5, b"z", 14, 0, 4),
        H(6, (4, 9), 0, 4),
        H(7, (4, 9), 1, 9),
    ]
    if compacted:
        r1 = [e for e in r1 if e.vt_offset != 2]
    return {0: RegionLog(r0, FromEndOfPush(0)), 1: RegionLog(r1, FromEndOfPush(0))}


def test_dropped_write_is_missing_without_compaction_and_in_footer_mode():
    from leapfrog.reference import check_partition

    for mode, compacted in (("heartbeat", False), ("footer", False), ("footer", True)):
        res = check_partition(_compaction_logs(compacted), mode=mode, n_regions=2)
        assert [(f.type, f.key) for f in res.findings] == [("MISSING_IN_B", b"k")], (mode, compacted)


def test_compaction_of_another_key_does_not_hide_a_missing_key():
    from leapfrog.reference import check_partition

    res = check_partition(_compaction_logs(compacted=True), mode="heartbeat", n_regions=2)
    assert [(f.type, f.key) for f in res.findings] == [("MISSING_IN_B", b"k")]


def _raced_logs(latest_kept: bool):
    """Both regions apply x=11 then x=12 (from region 0). Region 1's x=12 at offset 3 was removed while the scan
    read — compaction used a record of x written after the scan's end — so region 1 shows x=11 as x's last record
    with a gap after it. Only a log that does not keep every key's latest record can look like this."""
    from leapfrog.reference import DataEntry as D
    from leapfrog.reference import FromEndOfPush, RegionLog
    from leapfrog.reference import HeartbeatEntry as H

    r0 = [D(1, b"x", 11, 0, 1), D(2, b"x", 12, 0, 2), H(3, (2, -1), 0, 3)]
    r1 = [D(1, b"x", 11, 0, 1), H(4, (2, -1), 0, 3)]  # offsets 2..3 gone
    return {0: RegionLog(r0, FromEndOfPush(0)), 1: RegionLog(r1, FromEndOfPush(0), latest_kept=latest_kept)}


def test_a_log_that_may_lack_a_latest_record_freezes_marks_at_its_gaps():
    from leapfrog.reference import check_partition

    # under the premise the job would report region 1's x=11 against x=12: exactly why a log that cannot
    # promise it (leapfrog.reference.entries.RegionLog.latest_kept) is judged by the mark before its first gap
    assert [f.type for f in check_partition(_raced_logs(True), n_regions=2).findings] == ["VALUE_MISMATCH"]
    res = check_partition(_raced_logs(False), n_regions=2)
    assert res.findings == [] and res.pair_counters[(0, 1)].pending_keys == 1
    # and the dropped write behind another key's compaction is then not provable either (safe over live)
    logs = _compaction_logs(compacted=True)
    logs[1] = type(logs[1])(logs[1].entries, logs[1].start, latest_kept=False)
    assert check_partition(logs, mode="heartbeat", n_regions=2).findings == []
