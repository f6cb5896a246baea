"""`tidegauge lag` (its LagMonitor alone: tests/heartbeat/test_lag_monitor.py): a quiet region keeps a small time lag and no offset lag (heartbeats still
arrive); a stuck region shows a large time lag and an offset lag."""

from __future__ import annotations

import heapq
import json
import random
import uuid

import pyarrow.parquet as pq
import pytest
from heartbeat_fixtures import FakeProducer, LoopResult, RtIn, feed_one

from div import keys
from div.archive import ArchiveWriter
from div.writer import SegmentWriter
from heartbeat import HeartbeatLeader
from heartbeat.records import rt_heartbeat
from pipelines.cli import main

NOW = 1_750_000_000_000
STORE = "s"
VT, RT = f"{STORE}_v1", f"{STORE}_rt"


def _stream(entries) -> list[RtIn]:
    """entries: ("data", n) → n PUTs of one producer; ("hb", ts) → an RT heartbeat with origin time ts."""
    now = [
        NOW - 3_600_000
    ]  # data records carry the time of the heartbeat before them: RT times never go back
    w = SegmentWriter(b"P" * 16, host_name="p", clock=lambda: now[0], max_segment_age_ms=-1)
    out: list[RtIn] = []
    for kind, arg in entries:
        if kind == "hb":
            now[0] = arg
            rec = rt_heartbeat("leader", arg)
            out.append(RtIn(len(out), rec.key, rec.value, list(rec.headers), arg))
        else:
            for i in range(arg):
                for rec in w.put(0, b"k%d" % (len(out) + i), b"v"):
                    out.append(RtIn(len(out), rec.key, rec.value, list(rec.headers), now[0]))
    return out


def scenario() -> list[list[RtIn]]:
    return [
        _stream([("data", 20), ("hb", NOW - 60_000), ("data", 30), ("hb", NOW - 2_000)]),  # busy, up to date
        _stream([("hb", NOW - 240_000 + 60_000 * i) for i in range(4)] + [("hb", NOW - 1_500)]),  # quiet
        _stream([("data", 30), ("hb", NOW - 1_200_000), ("data", 120), ("hb", NOW - 300_000), ("data", 50)]),
    ]


def build_vt(streams, region: int, stop: dict[int, int]) -> FakeProducer:
    """A leader of `region` consumes every RT (RT[r] only up to offset stop[r]) and writes its VT."""
    clock = [NOW - 3_600_000]
    fake = FakeProducer(clock=lambda: clock[0])
    leader = HeartbeatLeader(
        fake,
        vt_topic=VT,
        rt_topic=RT,
        partition=0,
        region=region,
        n_regions=3,
        host=f"leader-{region}",
        interval_ms=0,
        clock=lambda: clock[0],
    )
    rng = random.Random(region)
    result = LoopResult(positions=[0, 0, 0])
    # Feed in RT-time order (each region in offset order), as a leader consuming live would; VT time follows.
    per_region = [
        [(x.broker_ts, r, x) for x in s if x.offset <= stop.get(r, 10**9)] for r, s in enumerate(streams)
    ]
    for ts, r, x in heapq.merge(*per_region, key=lambda e: (e[0], e[1])):
        clock[0] = max(clock[0], ts + 200)
        feed_one(leader, r, x, rng, result)
        leader.poll()
    leader.close()
    return fake


def write_archive(path, topic: str, records) -> None:
    with ArchiveWriter(path) as w:
        for offset, key, value, headers, ts in records:
            w.append_record(topic, 0, offset, key, value, ts, 0, headers)


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    root = tmp_path_factory.mktemp("lag")
    streams = scenario()
    vt0 = build_vt(streams, 0, {2: 40})  # region 0 is stuck on RT[2] after offset 40
    vt1 = build_vt(streams, 1, {})
    write_archive(root / "vt-0", VT, vt0.records(VT))
    write_archive(root / "vt-1", VT, vt1.records(VT))
    for r, s in enumerate(streams):
        write_archive(root / f"rt-{r}", RT, [(x.offset, x.key, x.value, x.headers, x.broker_ts) for x in s])
    return root, streams, vt0, vt1


def _rows(out) -> dict[tuple[int, int, int], dict]:
    rows = pq.read_table(out / "lag").to_pylist()
    return {(r["vt_region"], r["partition"], r["source_region"]): r for r in rows}


def test_quiet_region_small_lag_and_stuck_region_large_lag(archives, tmp_path, capsys):
    root, streams, vt0, vt1 = archives
    out = tmp_path / "out"
    args = [
        "lag",
        "--source",
        f"0={root / 'vt-0'}",
        "--source",
        f"1={root / 'vt-1'}",
        "--now-ms",
        str(NOW),
        "--out",
        str(out),
    ]
    for r in range(3):
        args += ["--rt-source", f"{r}={root / f'rt-{r}'}"]
    assert main(args) == 0
    rows = _rows(out)
    assert len(rows) == 2 * 3
    quiet = rows[(0, 0, 1)]
    assert quiet["time_lag_ms"] == 1_500 and quiet["watermark"] == 4
    assert quiet["rt_end_offset"] == 5 and quiet["offset_lag"] == 0 and quiet["heartbeats"] == 5
    stuck = rows[(0, 0, 2)]
    assert stuck["time_lag_ms"] == 1_200_000 and stuck["heartbeats"] == 1
    assert stuck["watermark"] == 40 and stuck["rt_end_offset"] == len(streams[2])
    assert stuck["offset_lag"] == len(streams[2]) - 41 > 100
    busy = rows[(0, 0, 0)]
    assert busy["time_lag_ms"] == 2_000 and busy["offset_lag"] == 0
    caught_up = rows[(1, 0, 2)]  # region 1's leader read all of RT[2]
    assert caught_up["time_lag_ms"] == 300_000 and caught_up["offset_lag"] == 0
    assert rows[(1, 0, 1)]["last_heartbeat_origin_ms"] == NOW - 1_500

    hbs = pq.read_table(out / "heartbeats").to_pylist()
    n_vt_hb = sum(1 for m in vt0.records(VT) if keys.is_heartbeat_key(m[1]))
    assert len([h for h in hbs if h["vt_region"] == 0]) == n_vt_hb == 5 + 2 + 1
    assert all(h["delay_ms"] == h["vt_timestamp_ms"] - h["origin_ms"] >= 0 for h in hbs)
    assert all(len(h["watermarks"]) == 3 for h in hbs)
    assert pq.read_table(out / "lag").schema.field("vt_region").type == "int32"

    summary = json.loads((out / "lag.json").read_text())
    assert summary["job"] == "lag" and summary["now_ms"] == NOW and summary["exit_code"] == 0
    assert {(r["vt_region"], r["source_region"]): r["offset_lag"] for r in summary["lag"]}[(0, 2)] == stuck[
        "offset_lag"
    ]
    printed = capsys.readouterr().out
    assert "20.0 min" in printed and "1.5 s" in printed

    from pipelines.report.inputs import load_lag  # the report reads what we wrote

    loaded = load_lag(out)
    assert loaded.now_ms == NOW and len(loaded.lag) == 6


def test_without_rt_sources_offset_lag_is_unknown_but_time_lag_is_not(archives, tmp_path):
    root, *_ = archives
    out = tmp_path / "out"
    assert (
        main(
            [
                "lag",
                "--source",
                f"0={root / 'vt-0'}",
                "--store",
                STORE,
                "--version",
                "1",
                "--now-ms",
                str(NOW),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = _rows(out)
    assert rows[(0, 0, 1)]["offset_lag"] is None and rows[(0, 0, 1)]["rt_end_offset"] is None
    assert rows[(0, 0, 2)]["time_lag_ms"] == 1_200_000


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "no source"),
        (["--source", "zero=somewhere"], "ID=URI"),
        (["--source", "0=/nonexistent/archive"], "no such archive"),
        (["--source", "0={vt0}", "--store", "other", "--version", "1"], "no topic 'other_v1'"),
        (["--source", "0={vt0}", "--store", "other"], "no version topic other_v"),
        (["--source", "0={vt0}", "--rt-source", "1=x", "--rt-source", "1=y"], "given twice"),
    ],
)
def test_bad_input_exits_2_naming_it(archives, capsys, extra, message):
    root, *_ = archives
    args = ["lag", *[a.format(vt0=root / "vt-0") for a in extra]]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_several_stores_need_a_choice(tmp_path, capsys):
    recs = [(0, b"\x00k", b"x", [], NOW)]
    write_archive(tmp_path / "a", "one_v1", recs)
    write_archive(tmp_path / "a", "two_v3", recs)
    assert main(["lag", "--source", f"0={tmp_path / 'a'}"]) == 2
    assert "one_v1, two_v3" in capsys.readouterr().err


@pytest.mark.kafka
def test_lag_on_a_live_cluster_reads_rt_ends_from_the_same_cluster(embedded_kafka, tmp_path):
    from confluent_kafka import Producer

    store = f"lag{uuid.uuid4().hex[:6]}"
    streams = scenario()
    vt = build_vt(streams, 0, {2: 40})
    embedded_kafka.create_topic(f"{store}_v1", 1)
    embedded_kafka.create_topic(f"{store}_rt", 1)
    p = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers})
    for _, key, value, headers, ts in vt.records(VT):
        p.produce(f"{store}_v1", value=value, key=key, partition=0, headers=headers, timestamp=ts)
    for x in streams[0]:  # this cluster holds region 0's RT
        p.produce(
            f"{store}_rt", value=x.value, key=x.key, partition=0, headers=x.headers, timestamp=x.broker_ts
        )
    assert p.flush(30) == 0
    out = tmp_path / "out"
    no_rt = tmp_path / "no-rt"  # an archive without the RT topic (the output may not be inside it)
    no_rt.mkdir()
    assert (
        main(
            [
                "lag",
                "--source",
                f"0={embedded_kafka.uri}",
                "--store",
                store,
                "--version",
                "1",
                "--rt-source",
                f"2={no_rt}",
                "--now-ms",
                str(NOW),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = _rows(out)
    assert rows[(0, 0, 0)]["rt_end_offset"] == len(streams[0]) and rows[(0, 0, 0)]["offset_lag"] == 0
    assert rows[(0, 0, 1)]["time_lag_ms"] == 1_500
    assert rows[(0, 0, 2)]["rt_end_offset"] is None  # no_rt holds no RT topic


def test_lag_counts_a_record_without_a_venice_key_as_undecodable(tmp_path):
    # Issue 17: lag decoded every value whatever its key, so a VT record whose key was lost (damage kind key_null)
    # was read as evidence. Every reader now goes through div.records, which checks the key first: the record is
    # undecodable, and the run partial.
    from vt_builder import TS, RegionVt

    from pipelines.core.evidence import PartitionEvidence
    from pipelines.core.sources import open_source, parse_source
    from pipelines.lag.job import monitor_partition

    vt = RegionVt(region=0)
    vt.put(b"k", b"v", src=1, rt_offset=5)
    vt.heartbeat(origin=0, origin_offset=3, vector=[3, 5])
    with ArchiveWriter(tmp_path) as w:
        for off, r in enumerate(vt.records):
            w.append_record("s_v1", 0, off, None if off == 0 else r.key, r.value, TS, 0, r.headers)
    ev = PartitionEvidence(0, "s_v1", 0, 0, len(vt.records))
    mon = monitor_partition(open_source(parse_source(f"0={tmp_path}")), "s_v1", 0, 2, ev)
    assert ev.undecodable == 1 and mon.records == 1
