"""`tidegauge cut` as a user runs it, on a small simulation (three regions, two partitions, no faults): the exact
cut against the RT timestamps read back here, each region's snapshot with --rt against the DCR fold of the RT
writes at or below the cut (decoded here from the archive), the rows a heartbeat-aligned snapshot marks exact
against the same truth, the Spark engine and kafka:// sources giving the same cut.json and snapshot, a region
behind (exit 1, named), and the bad inputs (exit 2, nothing written).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from small_sim import small_sim

from div import archive
from div.envelope import EnvelopeCodec
from div.records import Kind, iter_records
from heartbeat.change_events import logical_timestamp
from heartbeat.cuts import Cut
from leapfrog.repair import Record, dcr_apply
from pipelines.cli import main

N = 3


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    s = small_sim(tmp_path_factory.mktemp("sim"), regions=N)
    s.rt_topic = f"{s.store}_rt"
    # T: the middle of the run, from the RT's own timestamps
    ts = [
        int(t)
        for r in range(N)
        for p in (0, 1)
        for b in archive.iter_partition(s.archives[r], s.rt_topic, p, columns=["timestamp"])
        for t in pc.divide(b.column("timestamp").cast(pa.int64()), 1000).to_pylist()
    ]
    s.at_ms = (min(ts) + max(ts)) // 2
    return s


def cut(*argv) -> int:
    return main(["cut", *map(str, argv)])


def sources(sim, flag="--source", regions=range(N)) -> list[str]:
    return [a for r in regions for a in (flag, f"{r}={sim.archives[r]}")]


def truth(sim, given: dict[int, dict[int, int]] | None = None) -> tuple[dict, dict[int, dict[bytes, tuple]]]:
    """Read here, independently of the job: C per partition and region (the highest RT offset whose timestamp is
    <= T; or `given`) and per partition each key's state at it: Venice's DCR fold of its bulk-load record and of
    the RT writes at or below C."""
    codec = EnvelopeCodec()
    cuts: dict[int, dict[int, int]] = {}
    states: dict[int, dict[bytes, tuple]] = {}
    for p in (0, 1):
        cuts[p] = {}
        state = bulk_load(sim, p)
        for r in range(N):
            table = pa.Table.from_batches(list(archive.iter_partition(sim.archives[r], sim.rt_topic, p)))
            ms = pc.divide(table.column("timestamp").cast(pa.int64()), 1000).to_pylist()
            offsets = table.column("offset").to_pylist()
            c = max((o for o, t in zip(offsets, ms, strict=True) if t <= sim.at_ms), default=-1)
            if given is not None:
                c = given[p][r]
            cuts[p][r] = c
            for rec in iter_records(table.filter(pc.less_equal(table.column("offset"), c)), codec):
                if rec.kind in (Kind.PUT, Kind.DELETE):
                    state[rec.key[1:]] = dcr_apply(state.get(rec.key[1:]), write(rec))
        states[p] = {k: (w.op, w.value if w.op == "PUT" else None) for k, w in state.items()}
    return cuts, states


def write(rec) -> Record:
    body = rec.env["payloadUnion"][1]
    op = "PUT" if rec.kind is Kind.PUT else "DELETE"
    return Record(op, body.get("putValue"), logical_timestamp(body, rec.env["producerMetadata"]))


def bulk_load(sim, p: int) -> dict[bytes, Record]:
    """Partition p's bulk-load records (before End of Push; the same in every region)."""
    out: dict[bytes, Record] = {}
    for b in archive.iter_partition(sim.archives[0], sim.topic, p):
        for rec in iter_records(b, EnvelopeCodec()):
            if rec.kind is Kind.END_OF_PUSH:
                return out
            if rec.kind in (Kind.PUT, Kind.DELETE):
                out[rec.key[1:]] = write(rec)
    return out


def snapshot_rows(out: Path) -> dict[tuple[int, bytes], dict]:
    files = sorted((out / "snapshot").glob("*.parquet"))
    return {(r["partition"], r["key"]): r for f in files for r in pq.read_table(f).to_pylist()}


def content(r) -> tuple:
    return (r["op"], r["value"] if r["op"] == "PUT" else None)


@pytest.fixture(scope="module")
def exact_run(sim, tmp_path_factory):
    out = tmp_path_factory.mktemp("exact") / "cut"
    code = cut(*sources(sim), *sources(sim, "--rt"), "--at", sim.at_ms, "--snapshot", 1, "--out", out)
    return code, out


def test_the_exact_cut_is_the_last_rt_offset_at_or_before_t_and_the_snapshot_the_dcr_fold(
    sim, exact_run, capsys
):
    code, out = exact_run
    assert code == 0
    c = Cut.from_json((out / "cut.json").read_text())
    cuts, states = truth(sim)
    assert c.source == "rt" and c.at_ms == sim.at_ms
    assert {p: dict(cp.rt) for p, cp in c.partitions.items()} == cuts
    assert all(
        0 < cuts[p][r] for p in cuts for r in cuts[p]
    )  # T lies inside every RT: the check is not empty
    for cp in c.partitions.values():
        for pos in cp.regions.values():
            assert pos.ceil is not None and (pos.floor or -1) < pos.ceil
    rows = snapshot_rows(out)
    for p in (0, 1):
        assert {k: content(r) for (q, k), r in rows.items() if q == p} == states[p]
    assert all(r["exact"] for r in rows.values())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rt_method"] == {str(r): "read" for r in range(N)}
    assert summary["snapshot"]["rows"] == len(rows) and summary["exit_code"] == 0
    # the keys a write above the cut touched before ceil were resolved from the RT (the VT alone cannot tell)
    assert 0 < summary["snapshot"]["resolved_from_rt"] < len(rows)
    assert summary["snapshot"]["rt_records_read"] <= sum(cuts[p][r] + 1 for p in cuts for r in cuts[p])


def test_two_regions_snapshots_at_an_exact_cut_are_equal_and_heartbeat_aligned_exact_rows_are_true(
    sim, exact_run, tmp_path
):
    _, exact_out = exact_run
    region_1 = {k: content(r) for k, r in snapshot_rows(exact_out).items()}
    other = tmp_path / "region2"
    assert cut(*sources(sim), *sources(sim, "--rt"), "--at", sim.at_ms, "--snapshot", 2, "--out", other) == 0
    assert {k: content(r) for k, r in snapshot_rows(other).items()} == region_1

    aligned = tmp_path / "aligned"
    assert cut(*sources(sim), "--at", sim.at_ms, "--snapshot", 1, "--out", aligned) == 0
    c = Cut.from_json((aligned / "cut.json").read_text())
    exact_cut = Cut.from_json((exact_out / "cut.json").read_text())
    assert c.source == "heartbeats"
    for p, cp in c.partitions.items():
        assert all(cp.rt[r] <= exact_cut.partitions[p].rt[r] for r in range(N))  # never beyond the exact one
    # the aligned snapshot is of its own, earlier cut: its exact rows are the state at that C
    _, states = truth(sim, {p: dict(cp.rt) for p, cp in c.partitions.items()})
    rows = snapshot_rows(aligned)
    for p in (0, 1):
        assert set(states[p]) <= {k for q, k in rows if q == p}
        assert all(content(r) == states[p][k] for (q, k), r in rows.items() if q == p and r["exact"])
    assert sum(r["exact"] for r in rows.values()) > len(rows) // 2


@pytest.mark.spark
@pytest.mark.slow
def test_the_spark_engine_writes_the_same_cut_and_snapshot(sim, spark, tmp_path):
    # two regions' VTs and every RT (the cut stays exact): every kind of task, fewer of them
    argv = [*sources(sim, regions=(0, 1)), *sources(sim, "--rt"), "--at", sim.at_ms, "--snapshot", 1]
    assert cut(*argv, "--out", tmp_path / "local") == 0
    assert cut(*argv, "--engine", "spark", "--out", tmp_path / "spark") == 0
    local, on_spark = (json.loads((tmp_path / d / "cut.json").read_text()) for d in ("local", "spark"))
    assert on_spark == local and len(local["partitions"]) == 2
    assert snapshot_rows(tmp_path / "spark") == snapshot_rows(tmp_path / "local") != {}
    assert json.loads((tmp_path / "spark" / "summary.json").read_text())["engine"] == "spark"


def test_a_region_behind_the_cut_is_named_and_its_partition_left_out(sim, tmp_path, caplog):
    # region 2's VT of partition 0 stops half-way: at a late T it has no heartbeat covering the cut there
    behind = tmp_path / "dc-2-half"
    behind.mkdir()
    for p in (0, 1):
        t = pa.Table.from_batches(list(archive.iter_partition(sim.archives[2], sim.topic, p)))
        if p == 0:
            t = t.slice(0, t.num_rows // 2)
        pq.write_table(t, behind / f"part-{p}.parquet")
    out = tmp_path / "out"
    argv = [*sources(sim, regions=(0, 1)), "--source", f"2={behind}", "--at", sim.at_ms + 10**6]
    assert cut(*argv, "--snapshot", 2, "--out", out) == 1
    err = caplog.text
    assert "region 2 is behind the cut" in err and f"{sim.topic}[0]" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["snapshot"]["partitions_left_out"] == [0]
    assert {"partition": 0, "region": 2} in summary["behind"]
    assert {q for q, _ in snapshot_rows(out)} == {1}
    c = Cut.from_json((out / "cut.json").read_text())
    assert c.partitions[0].regions[2].ceil is None and c.partitions[1].regions[2].ceil is not None


@pytest.mark.parametrize(
    "at, extra, says",
    [
        ("2026-11-29T00:00:00", [], "has no zone"),
        ("yesterday", [], "is not a time"),
        ("1764374400000", ["--rt", "0=RT0"], "but not for region(s) 1, 2"),
        ("1764374400000", ["--store", "other", "--version", "1"], "no topic 'other_v1'"),
        ("1764374400000", ["--snapshot", "7"], "--snapshot 7: no --source"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message_and_writes_nothing(sim, tmp_path, capsys, at, extra, says):
    extra = [a.replace("RT0", sim.archives[0]) for a in extra]
    out = tmp_path / "out"
    assert cut(*sources(sim), "--at", at, *extra, "--out", out) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not out.exists()


def test_an_empty_source_is_named_when_the_store_version_is_inferred(sim, tmp_path, capsys):
    # the other sources name the store version; the empty one cannot place the cut, and must not pass unseen
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    argv = ["--source", f"0={tmp_path / 'empty'}", *sources(sim, regions=(1, 2)), "--at", sim.at_ms]
    assert cut(*argv, "--out", out) == 2
    err = capsys.readouterr().err
    assert f"--source 0={tmp_path / 'empty'} has no topic {sim.topic!r}" in err
    assert not out.exists()


def renamed_archive(sim, region: int, directory: Path, stores: list[str]) -> Path:
    """Region's VT and RT archived under other store names (what the same region's topics would be in a cluster
    holding several stores)."""
    directory.mkdir()
    for store in stores:
        for topic in (sim.topic, sim.rt_topic):
            name = store + topic.removeprefix(sim.store)
            for p in (0, 1):
                t = pa.Table.from_batches(list(archive.iter_partition(sim.archives[region], topic, p)))
                t = t.set_column(t.schema.get_field_index("topic"), "topic", pa.array([name] * t.num_rows))
                pq.write_table(t, directory / f"{name}-{p}.parquet")
    return directory


@pytest.mark.kafka_real
def test_kafka_sources_give_the_archives_cut_and_snapshot(sim, exact_run, real_kafka, tmp_path):
    """Region 1's VT and RT copied into a real broker (CreateTime, the archive's timestamps kept): the same
    cut.json and snapshot as from the archives, C read from the RT's timestamps. A LogAppendTime RT is answered
    by the broker's time index instead, and summary.json says so."""
    from kafka_copy import produce_archive

    store = "cutk" + tmp_path.name[-6:].replace("_", "").lower()
    kafka = f"kafka://{real_kafka.bootstrap_servers}"
    stamped = f"{store}x_rt"  # another store's RT, whose records the broker stamps (LogAppendTime)
    real_kafka.create_topics(
        {f"{store}_v1": 2, f"{store}_rt": 2, f"{store}x_v1": 2, stamped: 2},
        configs={stamped: {"message.timestamp.type": "LogAppendTime"}},
    )
    for src, dst in ((sim.topic, f"{store}_v1"), (sim.rt_topic, f"{store}_rt"), (sim.topic, f"{store}x_v1")):
        produce_archive(real_kafka.bootstrap_servers, sim.archives[1], src, dst, (0, 1), keep_timestamps=True)
    produce_archive(real_kafka.bootstrap_servers, sim.archives[1], sim.rt_topic, stamped, (0, 1))
    others = {r: renamed_archive(sim, r, tmp_path / f"dc-{r}", [store, f"{store}x"]) for r in (0, 2)}
    args = [a for r, d in others.items() for a in ("--source", f"{r}={d}", "--rt", f"{r}={d}")]
    args += ["--source", f"1={kafka}", "--rt", f"1={kafka}"]

    _, archive_out = exact_run
    out = tmp_path / "kafka"
    assert cut(*args, "--store", store, "--version", 1, "--at", sim.at_ms, "--snapshot", 1, "--out", out) == 0
    got = json.loads((out / "cut.json").read_text())
    assert got["partitions"] == json.loads((archive_out / "cut.json").read_text())["partitions"]
    assert snapshot_rows(out) == snapshot_rows(archive_out)
    assert json.loads((out / "summary.json").read_text())["rt_method"]["1"] == "read"

    # every record of the stamped RT was written before now: at now, C is each partition's last offset there
    now = int(time.time() * 1000)
    out = tmp_path / "stamped"
    assert cut(*args, "--store", f"{store}x", "--version", 1, "--at", now, "--out", out) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rt_method"] == {"0": "read", "1": "offsets_for_times", "2": "read"}
    c = Cut.from_json((out / "cut.json").read_text())
    ends = {
        p: sum(1 for b in archive.iter_partition(sim.archives[1], sim.rt_topic, p) for _ in range(b.num_rows))
        for p in (0, 1)
    }
    assert {p: cp.rt[1] for p, cp in c.partitions.items()} == {p: n - 1 for p, n in ends.items()}
    before = tmp_path / "before"
    assert cut(*args, "--store", f"{store}x", "--version", 1, "--at", now - 3_600_000, "--out", before) == 0
    assert {p: cp.rt[1] for p, cp in Cut.from_json((before / "cut.json").read_text()).partitions.items()} == {
        0: -1,
        1: -1,
    }


def test_undecodable_rt_writes_of_undecided_keys_make_the_run_partial(sim, tmp_path, caplog):
    """Region 0's RT of partition 0 with every value cut short: the undecided keys' writes there cannot be read,
    so their resolution is not sure: exit 3, the RT offsets counted in summary.json; the rest is written."""
    damaged = tmp_path / "dc-0"
    damaged.mkdir()
    for topic in (sim.topic, sim.rt_topic):
        for p in (0, 1):
            t = pa.Table.from_batches(list(archive.iter_partition(sim.archives[0], topic, p)))
            if topic == sim.rt_topic and p == 0:
                t = t.set_column(
                    t.schema.get_field_index("value"), "value", pc.binary_slice(t["value"], 0, 3)
                )
            pq.write_table(t, damaged / f"{topic}-{p}.parquet")
    out = tmp_path / "out"
    argv = ["--source", f"0={damaged}", "--rt", f"0={damaged}", *sources(sim, regions=(1, 2))]
    assert cut(*argv, *sources(sim, "--rt", (1, 2)), "--at", sim.at_ms, "--snapshot", 1, "--out", out) == 3
    summary = json.loads((out / "summary.json").read_text())
    bad = [e for e in summary["evidence"]["by_partition"] if e["topic"] == sim.rt_topic and e["undecodable"]]
    assert [(e["region"], e["partition"]) for e in bad] == [(0, 0)] and bad[0]["undecodable_offsets"]
    assert summary["verdict"] == "partial" and summary["snapshot"]["rows"] > 0
