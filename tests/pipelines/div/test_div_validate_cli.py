"""`tidegauge div validate` as a user runs it: outputs per docs/outputs.md, exit codes, flags, and a live
Kafka cluster (the embedded mock) giving exactly what the archive of the same records gives."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import venice_reference as ref
from test_div_acceptance import SCENARIOS, T0

from div.batch import PartitionRun
from pipelines.cli import build_parser, main

ERRORS_SCHEMA = [
    ("region", pa.int32()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("producer_guid", pa.string()),
    ("segment", pa.int32()),
    ("sequence", pa.int32()),
    ("type", pa.string()),
    ("fatal", pa.bool_()),
    ("detail", pa.string()),
]
SUMMARY_FIELDS = {
    "job",
    "tidegauge_version",
    "started_at",
    "elapsed_s",
    "exit_code",
    "sources",
    "engine",
    "records_read",
    "findings",
    "fatal_findings",
    "findings_by_type",
    "producers_tracked",
    "partitions",
    "failed_partitions",
    "verdict",
    "evidence",
    "undecodable_records",
    "explained_by_undecodable",
}
PARTITION_FIELDS = {
    "region",
    "topic",
    "partition",
    "records",
    "first_offset",
    "last_offset",
    "eop_offset",
    "producers_tracked",
    "findings",
    "fatal_findings",
    "start",
    "undecodable",
    "undecodable_offsets",
    "explained_by_undecodable",
}
GUID_A = ref.type3_uuid("cli-a")


def _clean_log() -> list[tuple[int, ref.Rec]]:
    p = ref.RefProducer(ref.type3_uuid("cli-push"), start_ms=T0)
    a = ref.RefProducer(GUID_A, start_ms=T0 + 10)
    recs = ref.flatten(
        p.start_of_push(),
        p.put(b"k", b"v"),
        p.end_of_push(),
        p.end_segment(final=True),
        a.put(b"x", b"1"),
        [ref.heartbeat(T0 + 20)],
        a.end_segment(),
    )
    return list(enumerate(recs))


def _gap_log(before_eop: bool) -> list[tuple[int, ref.Rec]]:
    """A push job and one producer that loses a record, before or after End of Push."""
    p = ref.RefProducer(ref.type3_uuid("cli-push"), start_ms=T0)
    a = ref.RefProducer(GUID_A, start_ms=T0 + 10)
    first = a.put(b"x", b"1")
    a.put(b"x", b"lost")
    faulty = first + a.put(b"x", b"3") + a.end_segment()
    head = p.start_of_push()
    tail = p.end_of_push() + p.end_segment(final=True)
    recs = head + faulty + tail if before_eop else head + tail + faulty
    return list(enumerate(recs))


def _validate(src, out, *extra) -> tuple[int, pa.Table, dict]:
    code = main(["div", "validate", "--source", f"0={src}", "--out", str(out), *extra])
    return code, pq.read_table(out / "errors"), json.loads((out / "summary.json").read_text())


# -- outputs -------------------------------------------------------------------------------------------------------


def test_clean_archive_exits_zero_with_an_empty_errors_dataset_of_the_exact_schema(tmp_path):
    ref.write_archive(tmp_path / "arc", "s_v1", 0, _clean_log())
    code, errors, summary = _validate(tmp_path / "arc", tmp_path / "out")
    assert code == 0
    assert [(f.name, f.type) for f in errors.schema] == ERRORS_SCHEMA
    assert errors.num_rows == 0
    assert summary["exit_code"] == 0 and summary["findings"] == 0 and summary["findings_by_type"] == {}


def test_summary_fields_follow_the_output_contract(tmp_path):
    ref.write_archive(tmp_path / "arc", "s_v1", 0, _gap_log(before_eop=True))
    ref.write_archive(tmp_path / "arc", "s_v1", 1, _clean_log())
    code, errors, summary = _validate(tmp_path / "arc", tmp_path / "out")
    assert code == 1
    assert [(f.name, f.type) for f in errors.schema] == ERRORS_SCHEMA
    assert SUMMARY_FIELDS <= set(summary)
    assert summary["job"] == "div validate" and summary["engine"] == "local"
    assert summary["exit_code"] == 1
    assert summary["sources"] == {"0": str(tmp_path / "arc")}
    assert dt.datetime.fromisoformat(summary["started_at"]).tzinfo is not None
    assert isinstance(summary["elapsed_s"], (int, float)) and summary["elapsed_s"] >= 0
    assert isinstance(summary["tidegauge_version"], str) and summary["tidegauge_version"]
    assert summary["records_read"] == len(_gap_log(True)) + len(_clean_log())
    assert summary["findings_by_type"] == {"CORRUPT": 1, "MISSING": 1}
    assert summary["findings"] == 2 and summary["fatal_findings"] == 2
    assert summary["producers_tracked"] == 4
    assert summary["failed_partitions"] == []
    parts = sorted(summary["partitions"], key=lambda p: p["partition"])
    assert [set(p) for p in parts] == [PARTITION_FIELDS, PARTITION_FIELDS]
    p0 = parts[0]
    assert (
        p0["region"],
        p0["topic"],
        p0["partition"],
        p0["records"],
        p0["first_offset"],
        p0["last_offset"],
    ) == (0, "s_v1", 0, 8, 0, 7)
    assert p0["eop_offset"] == 6 and p0["producers_tracked"] == 2
    assert p0["findings"] == {"CORRUPT": 1, "MISSING": 1} and p0["fatal_findings"] == 2
    assert set(p0["start"]) == {"offset", "restored_from_heartbeat"}
    assert p0["start"]["restored_from_heartbeat"] is None
    rows = errors.to_pylist()
    assert [
        (r["offset"], r["type"], r["fatal"], r["producer_guid"], r["segment"], r["sequence"]) for r in rows
    ] == [(4, "MISSING", True, GUID_A.hex(), 0, 3), (5, "CORRUPT", True, GUID_A.hex(), 0, 4)]
    assert all(r["detail"] for r in rows)


def test_summary_start_offset_is_where_the_run_started(tmp_path):
    ref.write_archive(tmp_path / "arc", "s_v1", 0, _clean_log())
    _, _, summary = _validate(tmp_path / "arc", tmp_path / "out")
    assert summary["partitions"][0]["start"]["offset"] == 0


def test_findings_after_end_of_push_are_warnings_exit_zero(tmp_path):
    ref.write_archive(tmp_path / "arc", "s_v1", 0, _gap_log(before_eop=False))
    code, errors, summary = _validate(tmp_path / "arc", tmp_path / "out")
    assert code == 0
    assert [(r["type"], r["fatal"]) for r in errors.to_pylist()] == [("MISSING", False), ("CORRUPT", False)]
    assert summary["fatal_findings"] == 0 and summary["findings"] == 2


def test_real_time_topics_are_never_fatal(tmp_path):
    ref.write_archive(tmp_path / "arc", "s_rt", 0, _gap_log(before_eop=True))
    code, errors, summary = _validate(tmp_path / "arc", tmp_path / "out")
    assert code == 0
    assert [(r["type"], r["fatal"]) for r in errors.to_pylist()] == [("MISSING", False), ("CORRUPT", False)]
    assert summary["partitions"][0]["eop_offset"] is None


def test_rerun_replaces_the_output_directory(tmp_path):
    ref.write_archive(tmp_path / "arc", "s_v1", 0, _gap_log(before_eop=True))
    ref.write_archive(tmp_path / "clean", "s_v1", 0, _clean_log())
    assert _validate(tmp_path / "arc", tmp_path / "out")[0] == 1
    code, errors, summary = _validate(tmp_path / "clean", tmp_path / "out")
    assert code == 0 and errors.num_rows == 0 and summary["findings"] == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".tidegauge", "errors", "summary.json"]


# -- exit code 2 ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--source", "0=/no/such/archive"], "no such archive"),
        (["--source", "zero=/tmp"], "ID=URI"),
        (["--source", "/tmp"], "ID=URI"),
        (["--source", "0=ARCHIVE", "--source", "0=ARCHIVE"], "twice"),
        ([], "no source"),
        (["--source", "0=ARCHIVE", "--topic", "nope_v1"], "nope_v1"),
        (["--source", "0=kafka://"], "0=kafka://"),
    ],
)
def test_bad_usage_and_unreadable_sources_exit_two(tmp_path, capsys, argv, message):
    ref.write_archive(tmp_path / "arc", "s_v1", 0, _clean_log())
    argv = [a.replace("ARCHIVE", str(tmp_path / "arc")) for a in argv]
    code = main(["div", "validate", "--out", str(tmp_path / "out"), *argv])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_missing_out_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["div", "validate", "--source", "0=/tmp"])
    assert info.value.code == 2
    assert "--out" in capsys.readouterr().err


# -- flags ---------------------------------------------------------------------------------------------------------


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["div", "validate", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["div"]
    validate = next(a for a in sub._actions if a.dest == "div_command").choices["validate"]
    flags = [s for a in validate._actions for s in a.option_strings]
    assert len(flags) >= 12
    for flag in flags:
        assert flag in text, flag
    for action in validate._actions:
        assert action.help and len(action.help) > 15, action.option_strings
    for word in (
        "UNREGISTERED_PRODUCER",
        "MISSING",
        "CORRUPT",
        "DUPLICATE",
        "DATA_AFTER_SEGMENT_END",
        "UNDECODABLE",
        "errors/",
        "summary.json",
        "Exit codes",
        "End of Push",
        "kafka://",
    ):
        assert word in text, word


def test_fail_fast_stops_at_the_first_fatal_finding(tmp_path):
    log = _gap_log(before_eop=True)
    ref.write_archive(tmp_path / "arc", "s_v1", 0, log)
    ref.write_archive(tmp_path / "arc", "s_v1", 1, _gap_log(before_eop=True))
    code, errors, summary = _validate(tmp_path / "arc", tmp_path / "out", "--fail-fast")
    assert code == 1
    assert [(r["partition"], r["offset"], r["type"], r["fatal"]) for r in errors.to_pylist()] == [
        (0, 4, "MISSING", True)
    ]
    assert summary["records_read"] == 5  # offsets 0..4 of partition 0, nothing after the stop
    assert [p["partition"] for p in summary["partitions"]] == [0]
    full = _validate(tmp_path / "arc", tmp_path / "full")
    assert full[1].num_rows == 4 and full[2]["records_read"] == 2 * len(log)


def test_fail_fast_ignores_warnings(tmp_path):
    ref.write_archive(tmp_path / "arc", "s_v1", 0, _gap_log(before_eop=False))
    code, errors, summary = _validate(tmp_path / "arc", tmp_path / "out", "--fail-fast")
    assert code == 0 and errors.num_rows == 2 and summary["records_read"] == len(_gap_log(False))


def test_now_and_min_compaction_lag_decide_tolerance(tmp_path):
    log = _gap_log(before_eop=True)  # producer timestamps ≈ T0 are also the broker timestamps
    ref.write_archive(tmp_path / "arc", "s_v1", 0, log)
    strict = _validate(tmp_path / "arc", tmp_path / "a", "--now-ms", str(T0 + 10**9))
    assert strict[0] == 1 and strict[1].num_rows == 2  # --now-ms alone tolerates nothing
    young = _validate(
        tmp_path / "arc", tmp_path / "b", "--now-ms", str(T0 + 1000), "--min-compaction-lag-ms", "60000"
    )
    assert young[0] == 1 and young[1].num_rows == 2  # the records are too young to have been compacted
    old = _validate(
        tmp_path / "arc", tmp_path / "c", "--now-ms", str(T0 + 60_100), "--min-compaction-lag-ms", "60000"
    )
    assert old[0] == 0 and old[1].num_rows == 0


def test_max_age_flag(tmp_path):
    p = ref.RefProducer(ref.type3_uuid("cli-push"), start_ms=T0)
    a = ref.RefProducer(GUID_A, start_ms=T0 + 10)
    b = ref.RefProducer(ref.type3_uuid("cli-b"), start_ms=T0 + 10**6)
    log = list(
        enumerate(
            ref.flatten(
                a.put(b"x", b"1"),
                p.start_of_push(),
                b.put(b"y", b"1"),
                b.control(ref.SOIP, {"version": "1"}),
                a.put(b"x", b"2"),
            )
        )
    )
    ref.write_archive(tmp_path / "arc", "s_v1", 0, log)
    assert _validate(tmp_path / "arc", tmp_path / "a")[1].num_rows == 0
    code, errors, summary = _validate(tmp_path / "arc", tmp_path / "b", "--max-age-ms", "1000")
    assert code == 1
    assert [(r["offset"], r["type"]) for r in errors.to_pylist()] == [(7, "UNREGISTERED_PRODUCER")]
    assert summary["producers_tracked"] == 2  # the push job expired at the checkpoint too


# -- batching does not change the answer ---------------------------------------------------------------------------


def _batch(records: list[tuple[int, ref.Rec]], topic: str, partition: int) -> pa.Table:
    rows = [
        {
            "key": r.key,
            "value": r.value,
            "topic": topic,
            "partition": partition,
            "offset": o,
            "timestamp": r.ts * 1000,
            "timestampType": 0,
            "headers": [{"key": k, "value": v} for k, v in r.headers],
        }
        for o, r in records
    ]
    return pa.Table.from_pylist(rows, schema=ref.SPARK_KAFKA_SCHEMA)


@pytest.mark.parametrize("partition", sorted(SCENARIOS))
def test_rows_do_not_depend_on_batch_boundaries(partition):
    _, log, _ = SCENARIOS[partition]
    table = _batch(log.records, "accept_v1", partition)
    results = []
    for size in (1, 2, 7, table.num_rows):
        run = PartitionRun(0, "accept_v1", partition)
        for b in table.to_batches(max_chunksize=size):
            run.feed(b)
        summary = run.finish().to_json()
        results.append((run.rows, summary))
    assert all(r == results[0] for r in results[1:])
    assert results[0][1]["records"] == len(log.records)


# -- a live cluster ------------------------------------------------------------------------------------------------


@pytest.mark.kafka
def test_kafka_source_gives_the_same_output_as_the_archive(embedded_kafka, tmp_path):
    from confluent_kafka import Producer

    topic = f"kafka_v{uuid.uuid4().int % 10**6}"
    partitions = sorted(SCENARIOS)
    embedded_kafka.create_topic(topic, len(partitions))
    producer = Producer(
        {"bootstrap.servers": embedded_kafka.bootstrap_servers, "linger.ms": 5, "enable.idempotence": False}
    )
    for partition in partitions:
        _, log, _ = SCENARIOS[partition]
        for _, r in log.records:
            producer.produce(
                topic,
                key=r.key,
                value=r.value,
                partition=partition,
                timestamp=r.ts,
                headers=r.headers or None,
            )
        ref.write_archive(tmp_path / "archive", topic, partition, log.records)
    assert producer.flush(30) == 0
    k_code, k_errors, k_summary = _validate(embedded_kafka.uri, tmp_path / "from-kafka", "--topic", topic)
    a_code, a_errors, a_summary = _validate(tmp_path / "archive", tmp_path / "from-archive", "--topic", topic)
    assert k_code == a_code == 1
    assert k_errors.num_rows == sum(len(e) for _, _, e in SCENARIOS.values())
    assert k_errors.to_pylist() == a_errors.to_pylist()
    assert k_errors.schema == a_errors.schema
    for volatile in ("started_at", "elapsed_s", "sources"):
        k_summary.pop(volatile), a_summary.pop(volatile)
    # only an archive knows exactly how many records it planned (Kafka offsets may have compaction holes)
    assert a_summary["evidence"]["planned_records"] == a_summary["records_read"]
    for s in (k_summary, a_summary):
        s["evidence"].pop("planned_records")
        for e in s["evidence"]["by_partition"]:
            e.pop("planned_records")
    assert k_summary == a_summary
