"""`tidegauge repair apply` against a real Apache Kafka broker (the session's `real_kafka`).

A plan (written as `repair plan` writes it: plan/ Parquet and summary.json) with PUTs, a DELETE and an undecidable
row is applied into `<store>_rt`. Read back, the topic holds valid Venice RT records (`div validate` finds
nothing), one data record per planned write, in the plan's partition, carrying the plan's key, value and logical
timestamp under one new producer GUID. Applying the plan again adds records under another GUID whose conflict
resolution (Venice's rule, `leapfrog.repair.dcr_apply`) changes nothing a region holds once the first apply was
taken. `--dry-run` prints the writes and produces nothing."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from repair_plans import write_plan

from div import envelope as E
from div.records import Kind, iter_records
from leapfrog.repair import DELETE, PUT, Record, dcr_apply
from pipelines.cli import main
from pipelines.core.sources import SourceSpec, open_source

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 3


def _rows() -> list[dict]:
    def row(p, key, op, value, ts, fix, cause, src=(1, 17)):
        return {
            "partition": p,
            "key": key,
            "op": op,
            "value": value,
            "logical_ts": ts,
            "source_region": src[0] if op != "NONE" else None,
            "source_offset": src[1] if op != "NONE" else None,
            "regions_to_fix": fix,
            "cause": cause,
        }

    return [
        row(0, b"\x10key-a", "PUT", b"value-a" * 10, 1_700_000_001_000, [0], "missed"),
        row(0, b"\x10key-d", "PUT", b"value-d", 1_700_000_001_500, [2], "poisoned"),
        row(2, b"\x10key-b", "DELETE", None, 1_700_000_002_000, [1], "lost_delete"),
        row(1, b"\x10key-c", "NONE", None, None, [], "undecidable"),
    ]


@pytest.fixture
def store(real_kafka):
    name = f"repair_{uuid.uuid4().hex[:8]}"
    real_kafka.create_topics({f"{name}_rt": PARTITIONS})
    return name


def _read(real_kafka, topic: str) -> list:
    """Every record of the topic (div.records.Record), partition by partition."""
    source = open_source(SourceSpec(0, real_kafka.uri))
    codec = E.EnvelopeCodec()
    out = []
    try:
        for p in range(PARTITIONS):
            first, end = source.bounds(topic, p)
            if end > first:
                for batch in source.iter_partition(topic, p, start=first, end=end):
                    out.extend(iter_records(batch, codec))
    finally:
        getattr(source, "close", lambda: None)()
    return out


def _apply(plan, real_kafka, *extra: str) -> int:
    return main(
        ["repair", "apply", "--plan", str(plan), "--kafka", f"1={real_kafka.bootstrap_servers}", *extra]
    )


def _data(records) -> list:
    return [r for r in records if r.kind in (Kind.PUT, Kind.DELETE)]


def _as_write(r) -> Record:
    pm = r.env["producerMetadata"]
    body = r.env["payloadUnion"][1]
    if r.kind is Kind.PUT:
        return Record(PUT, body["putValue"], pm["logicalTimestamp"])
    return Record(DELETE, None, pm["logicalTimestamp"])


def test_dry_run_prints_and_produces_nothing(real_kafka, store, tmp_path, capsys):
    write_plan(tmp_path / "plan", store, _rows())
    assert _apply(tmp_path / "plan", real_kafka, "--dry-run") == 0
    printed = capsys.readouterr().out
    for key in (b"\x10key-a", b"\x10key-b", b"\x10key-d"):
        assert key.hex() in printed
    assert b"\x10key-c".hex() not in printed  # op NONE: skipped
    assert "1 rows without a write skipped" in printed
    assert _read(real_kafka, f"{store}_rt") == []


def test_apply_writes_valid_rt_records_with_the_plans_timestamps(real_kafka, store, tmp_path):
    rows = _rows()
    write_plan(tmp_path / "plan", store, rows)
    assert _apply(tmp_path / "plan", real_kafka, "--out", str(tmp_path / "applied")) == 0
    records = _read(real_kafka, f"{store}_rt")
    data = _data(records)
    planned = {(r["partition"], r["key"]): r for r in rows if r["op"] != "NONE"}
    assert len(data) == len(planned), "one record per planned write, none for NONE"
    guids = {bytes(r.env["producerMetadata"]["producerGUID"]) for r in records}
    assert len(guids) == 1, "one new producer GUID"
    for r in data:
        want = planned[(r.partition, r.key[1:])]  # the Kafka key is Venice's header byte + the user key
        got = _as_write(r)
        assert (got.op, got.logical_ts) == (want["op"], want["logical_ts"])
        if got.op == PUT:
            assert got.value == want["value"]
    summary = json.loads((tmp_path / "applied" / "summary.json").read_text())
    assert (summary["writes"], summary["skipped_no_write"], summary["writes_acknowledged"]) == (3, 1, 3)
    assert summary["job"] == "repair apply" and summary["exit_code"] == 0
    # valid Venice RT records: DIV finds nothing
    out = tmp_path / "div"
    code = main(
        ["div", "validate", "--source", f"0={real_kafka.uri}", "--topic", f"{store}_rt", "--out", str(out)]
    )
    div = json.loads((out / "summary.json").read_text())
    assert code == 0, div
    assert div["findings"] == 0, div


def test_applying_twice_changes_nothing_a_region_holds(real_kafka, store, tmp_path):
    rows = _rows()
    write_plan(tmp_path / "plan", store, rows)
    assert _apply(tmp_path / "plan", real_kafka) == 0
    assert _apply(tmp_path / "plan", real_kafka) == 0
    data = _data(_read(real_kafka, f"{store}_rt"))
    assert len({bytes(r.env["producerMetadata"]["producerGUID"]) for r in data}) == 2, "a new GUID per run"
    by_key: dict = {}
    for r in data:
        by_key.setdefault(r.key[1:], []).append(_as_write(r))
    for row in rows:
        if row["op"] == "NONE":
            assert row["key"] not in by_key
            continue
        first, second = by_key[row["key"]]
        # a region that missed the write, one holding an older write, one holding a newer write
        for stored in (
            None,
            Record(PUT, b"older", row["logical_ts"] - 1),
            Record(PUT, b"newer", row["logical_ts"] + 1),
        ):
            once = dcr_apply(stored, first)
            twice = dcr_apply(once, second)
            assert twice.content == once.content and twice.logical_ts == once.logical_ts
        assert dcr_apply(Record(PUT, b"newer", row["logical_ts"] + 1), first).value == b"newer"
        # the ablation: re-emitted with the current time instead of the winner's, it overwrites a newer write
        now = Record(first.op, first.value, int(time.time() * 1000))
        assert dcr_apply(Record(PUT, b"newer", row["logical_ts"] + 1), now).content != (PUT, b"newer")


def test_usage_errors_write_nothing(real_kafka, store, tmp_path, capsys):
    write_plan(tmp_path / "plan", store, _rows())
    write_plan(tmp_path / "other", "no_such_store", _rows())
    assert _apply(tmp_path / "other", real_kafka) == 2  # a plan against a cluster without its store's RT
    assert _apply(tmp_path / "plan", real_kafka, "--rate", "0") == 2
    assert main(["repair", "apply", "--plan", str(tmp_path / "plan"), "--kafka", "x"]) == 2
    assert main(["repair", "apply", "--plan", str(tmp_path), "--kafka", "1=h:1"]) == 2  # not a plan
    big = _rows()[:1]
    big[0]["value"] = b"x" * (950 * 1024)
    write_plan(tmp_path / "big", store, big)
    capsys.readouterr()
    # over VeniceWriter's limit: refused, as a Venice online producer refuses it (no chunks into an RT)
    assert _apply(tmp_path / "big", real_kafka) == 2
    err = capsys.readouterr().err
    assert "972800-byte limit" in err and "does not chunk into the RT" in err, err
    assert _read(real_kafka, f"{store}_rt") == []
