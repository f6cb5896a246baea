"""The live simulator (`tidegauge simulate --live`): the same simulation paced by the wall clock, with faults at set
times written to truth.json as they happen, stopped cleanly by SIGTERM or by its duration.

One live run as a subprocess (3 regions x 2 partitions, 20 writes/s per region, one fault of each kind a
second or so apart, stopped with SIGTERM once the last outage is over) is shared by the module: what it prints,
what truth.json said while it ran, the archives it left — read back and checked without the simulator's own
bookkeeping —, and Leap Frog (Spark) on them. Then a short in-process run stopped by its duration, and the new
rules alone (fault specs, placement at set times and across chunks, isolation windows, the command line).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from div import archive
from div import envelope as E
from div.records import Kind, kind
from heartbeat import decode_hbw
from pipelines.cli import main
from sim import SimConfig
from sim import run as simulate
from sim.config import ConfigError, TimedFault, parse_fault_spec
from sim.faults import PlanState, _neighbours, plan_faults
from sim.leader import LeaderFaults
from sim.traffic import PUT, KeySpace, build_schedule

OUTAGES = ("silent", "isolated", "failover", "broker")
FAULTS = "silent@1.5+3,dropped@2,poisoned@2.5,isolated@3+3,failover@4,broker@5+1"
DEADLINE_S = 240  # only against a run that hangs; nothing below asserts how long anything took


# ---------------------------------------------------------------------------------------- the shared live run
def _wait(proc: subprocess.Popen, err: Path, what: str, done, deadline: float):
    while True:
        value = done()
        if value:
            return value
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            tail = err.read_text(errors="replace")[-3000:] if err.exists() else ""
            pytest.fail(f"the live run {'exited' if proc.returncode is not None else 'hung'} {what}:\n{tail}")
        time.sleep(0.1)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet (it is replaced atomically)
        return None


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Run `tidegauge simulate --live` until every fault has happened and every outage is over, watching
    truth.json meanwhile; then SIGTERM it."""
    root = tmp_path_factory.mktemp("live")
    out, err = root / "out", root / "stderr.txt"
    argv = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "simulate",
        "--live",
        "--out",
        str(out),
        "--seed",
        "3",
        "--partitions",
        "2",
        "--rate",
        "20",
        "--heartbeat-ms",
        "500",
        "--faults",
        FAULTS,
    ]
    deadline = time.monotonic() + DEADLINE_S
    with open(err, "w") as err_file:
        proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, stderr=err_file, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    _wait(
        proc,
        err,
        "before printing its clusters",
        lambda: sum(x.startswith("dc-") and "kafka://" in x for x in lines) == 3,
        deadline,
    )
    snapshots: list[dict] = []  # truth.json each time it changed while the run went on

    def all_happened():
        truth = _read_json(out / "truth.json")
        if truth is not None and (not snapshots or truth != snapshots[-1]):
            snapshots.append(truth)
        faults = (truth or {}).get("faults", [])
        over = all(f["end_at"] is not None for f in faults if f["kind"] in OUTAGES)
        return len(faults) == 6 and over

    _wait(proc, err, "before every fault had happened", all_happened, deadline)
    running = _read_json(out / "live.json")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    reader.join(10)
    return {
        "out": out,
        "code": proc.returncode,
        "stdout": lines,
        "stderr": err.read_text(),
        "snapshots": snapshots,
        "running": running,
        "truth": json.loads((out / "truth.json").read_text()),
        "summary": json.loads((out / "summary.json").read_text()),
    }


def records(arch: Path, topic: str, partition: int) -> list[dict]:
    """One partition of an archive, decoded: offset, Kafka timestamp (ms), kind, envelope, headers."""
    codec = E.EnvelopeCodec()
    out = []
    for b in archive.iter_partition(str(arch), topic, partition):
        cols = b.to_pydict()
        stamps = b.column("timestamp").cast("int64").to_pylist()
        for off, key, value, headers, ts in zip(
            cols["offset"], cols["key"], cols["value"], cols["headers"], stamps, strict=True
        ):
            hdr = {h["key"]: h["value"] for h in headers or []}
            env = codec.decode(value, list(hdr.items()) or None)
            out.append({"offset": off, "ts": ts // 1000, "kind": kind(key, env), "env": env, "headers": hdr})
    return out


def footer(rec: dict) -> tuple[int, int] | None:
    f = rec["env"]["leaderMetadataFooter"]
    return None if f is None else (f[1]["upstreamKafkaClusterId"], f[1]["upstreamOffset"])


def fault(live, kind_: str) -> dict:
    (f,) = [f for f in live["truth"]["faults"] if f["kind"] == kind_]
    return f


pytestmark = [pytest.mark.kafka]


# ---------------------------------------------------------------------------------------- what it says
@pytest.mark.slow
def test_prints_each_regions_kafka_uri_and_topics_and_writes_live_json(live):
    lines = [x.split() for x in live["stdout"] if x.startswith("dc-") and "kafka://" in x]
    assert [x[0] for x in lines] == ["dc-0", "dc-1", "dc-2"]
    assert all(
        x[1].startswith("kafka://127.0.0.1:") and x[2:] == ["sim_store_rt", "sim_store_v1"] for x in lines
    )
    running, final = live["running"], json.loads((live["out"] / "live.json").read_text())
    assert running["state"] == "running" and final["state"] == "stopped"
    assert [r["uri"] for r in running["regions"]] == [x[1] for x in lines]
    assert running["heartbeat_every_ms"] == 500 and running["vt_topic"] == "sim_store_v1"
    assert final["stopped_at"] >= final["started_at"] == running["started_at"]


@pytest.mark.slow
def test_truth_lists_each_fault_as_it_happens_with_its_wall_clock_time(live):
    truth, snaps = live["truth"], live["snapshots"]
    kinds = sorted(f["kind"] for f in truth["faults"])
    assert kinds == sorted(["silent", "dropped", "poisoned", "isolated", "failover", "broker"])
    assert truth["faults_shortfall"] == {}
    start, stop = truth["live"]["started_at"], truth["live"]["stopped_at"]
    for f in truth["faults"]:
        assert start <= f["at"] <= stop and f["at"] >= f["time_ms"]  # wall clock: not before it was due
        if f["kind"] in OUTAGES:
            assert f["at"] <= f["end_at"] <= stop and f["time_ms"] < f["end_ms"]
        assert set(f["expect"]) == {"leapfrog", "div"}
    # Written as they happened: from no fault at the start to all of them before the stop, only ever appended
    # to (how many steps in between the test saw depends on how often it got to look).
    ids = [[f["id"] for f in s["faults"]] for s in snaps]
    assert ids[0] == [] and len(ids[-1]) == 6 and snaps[-1]["live"]["stopped_at"] is None
    for before, after in zip(ids, ids[1:], strict=False):
        assert after[: len(before)] == before
    final_at = {f["id"]: f["at"] for f in truth["faults"]}
    assert all(f["at"] == final_at[f["id"]] for s in snaps for f in s["faults"])
    order = sorted(truth["faults"], key=lambda f: f["time_ms"])
    assert [f["id"] for f in order] == sorted(final_at, key=final_at.get)
    assert snaps[0]["run"]["end_offsets"] is None and truth["run"]["end_offsets"]


# ---------------------------------------------------------------------------------------- what it did
@pytest.mark.slow
def test_the_silent_leader_writes_no_heartbeat_while_its_data_keeps_flowing(live):
    f = fault(live, "silent")
    x, q, t0, t1 = f["region"], f["partition"], f["time_ms"], f["end_ms"]
    run, arch = live["truth"]["run"], live["out"] / "archive"
    rt = records(arch / f"dc-{x}", run["rt_topic"], q)
    beats = [r["ts"] for r in rt if r["kind"] is Kind.HEARTBEAT]
    assert [t for t in beats if t0 <= t < t1] == []
    assert min(beats) < t0 and max(beats) >= t1  # it heartbeat before and after
    assert sum(r["kind"] is Kind.PUT and t0 <= r["ts"] < t1 for r in rt) > 5  # its writes went on
    other = records(arch / f"dc-{x}", run["rt_topic"], 1 - q)
    assert (
        sum(r["kind"] is Kind.HEARTBEAT and t0 <= r["ts"] < t1 for r in other) >= 3
    )  # its neighbour did not stop
    for y in range(run["regions"]):  # no VT has a heartbeat that comes from it meanwhile
        vt = records(arch / f"dc-{y}", run["vt_topic"], q)
        from_x = [r["ts"] for r in vt if r["kind"] is Kind.HEARTBEAT and footer(r)[0] == x]
        assert from_x and [t for t in from_x if t0 <= t < t1] == []


@pytest.mark.slow
def test_the_isolated_region_holds_the_others_writes_back_then_catches_up(live):
    f = fault(live, "isolated")
    y, t0, t1 = f["region"], f["time_ms"], f["end_ms"]
    run = live["truth"]["run"]
    held_back = local = 0
    for q in range(run["partitions"]):
        vt = records(live["out"] / "archive" / f"dc-{y}", run["vt_topic"], q)
        data = [
            (r["ts"], footer(r)[0]) for r in vt if r["kind"] in (Kind.PUT, Kind.DELETE) and footer(r)[0] >= 0
        ]
        assert [t for t, src in data if src != y and t0 <= t < t1] == []  # nothing replicated meanwhile
        held_back += sum(
            src != y and t == t1 for t, src in data
        )  # what arrived meanwhile, applied at the end
        local += sum(src == y and t0 <= t < t1 for t, src in data)  # its own writes still applied
        marks = [
            decode_hbw(r["headers"]["hbw"]).high_watermarks
            for r in vt
            if r["kind"] is Kind.HEARTBEAT and t0 < r["ts"] < t1
        ]
        assert len(marks) >= 2
        for r in range(run["regions"]):
            if r != y:
                assert len({m[r] for m in marks}) == 1  # its high-water marks of the others froze
    assert held_back > 0 and local > 0


@pytest.mark.slow
def test_the_failed_leader_is_succeeded_and_both_terms_heartbeat(live):
    f = fault(live, "failover")
    run = live["truth"]["run"]
    vt = records(live["out"] / "archive" / f"dc-{f['region']}", run["vt_topic"], f["partition"])
    terms = {decode_hbw(r["headers"]["hbw"]).term_id for r in vt if r["kind"] is Kind.HEARTBEAT}
    assert terms == {1, 2}
    assert f["detail"]["new_leader"]["term"] == 2


@pytest.mark.slow
def test_sigterm_stops_it_cleanly_with_complete_archives(live, tmp_path):
    from pipelines.core.sources import SourceSpec
    from pipelines.div.validate import ValidateOptions, run_local

    assert live["code"] == 0, live["stderr"][-3000:]
    assert "SIGTERM: stopping cleanly" in live["stderr"]
    truth, run = live["truth"], live["truth"]["run"]
    assert truth["live"]["stopped_by"] == "stop requested" and live["summary"]["archive"]["complete"]
    for x in range(run["regions"]):
        arch = live["out"] / "archive" / f"dc-{x}"
        got = {
            f"{i.topic}[{i.partition}]": (i.first_offset, i.last_offset, i.records)
            for i in archive.describe(arch)
        }
        ends = run["end_offsets"][str(x)]
        assert got == {tp: (0, end - 1, end) for tp, end in ends.items()}  # every offset, once
        for q in range(run["partitions"]):
            rt = records(arch, run["rt_topic"], q)
            last_by_producer = {}
            for r in rt:
                if r["kind"] is not Kind.HEARTBEAT:
                    last_by_producer[r["env"]["producerMetadata"]["producerGUID"]] = r["kind"]
            assert set(last_by_producer.values()) == {Kind.END_OF_SEGMENT}  # producers closed their segments
            vt = records(arch, run["vt_topic"], q)
            assert vt[-1]["kind"] is Kind.END_OF_SEGMENT  # the leader stepped down
            covered = np.max(
                [decode_hbw(r["headers"]["hbw"]).high_watermarks for r in vt if r["kind"] is Kind.HEARTBEAT],
                axis=0,
            )
            assert covered.tolist() == [
                run["end_offsets"][str(r)][f"{run['rt_topic']}[{q}]"] - 1 for r in range(3)
            ]
    sources = [SourceSpec(x, str(live["out"] / "archive" / f"dc-{x}")) for x in range(run["regions"])]
    code = run_local(ValidateOptions(sources=sources, out=str(tmp_path / "div"), now_ms=run["end_ms"]))
    expected = [e for f in truth["faults"] for e in f["expect"]["div"]]
    summary = json.loads((tmp_path / "div" / "summary.json").read_text())
    assert expected == [] and code == 0 and summary["verdict"] == "clean"


@pytest.mark.slow
@pytest.mark.spark
def test_leapfrog_on_the_archives_finds_exactly_the_dropped_and_poisoned_writes(live, spark, tmp_path):
    from pipelines.core.sources import SourceSpec
    from pipelines.demo.job import read_leapfrog_findings
    from pipelines.leapfrog.job import LeapfrogOptions
    from pipelines.leapfrog.job import run as leapfrog

    run = live["truth"]["run"]
    sources = [SourceSpec(x, str(live["out"] / "archive" / f"dc-{x}")) for x in range(run["regions"])]
    opts = LeapfrogOptions(
        store=run["store"], version=run["version"], sources=sources, out=str(tmp_path / "lf")
    )
    code = leapfrog(opts, spark=spark)
    expected = {
        (e["type"], e["region_a"], e["region_b"], e["partition"], e["key"])
        for f in live["truth"]["faults"]
        for e in f["expect"]["leapfrog"]
    }
    by_kind = defaultdict(set)
    for f in live["truth"]["faults"]:
        by_kind[f["kind"]] |= {e["key"] for e in f["expect"]["leapfrog"]}
    assert (
        by_kind["dropped"]
        and by_kind["poisoned"]
        and set(by_kind)
        == {
            "dropped",
            "poisoned",
            "silent",
            "isolated",
            "failover",
            "broker",
        }
    )
    assert read_leapfrog_findings(tmp_path / "lf") == expected
    assert code == 1


# ---------------------------------------------------------------------------------------- a run with a duration
@pytest.mark.slow
def test_a_live_run_stops_by_itself_after_its_duration(tmp_path):
    ready: list[dict] = []
    cfg = SimConfig(
        out=str(tmp_path / "out"),
        live=True,
        duration_s=3.0,
        regions=2,
        partitions=1,
        keys=500,
        batch_records=50,
        write_rate=[15.0],
        heartbeat_every_ms=500,
        faults={"dropped": 1, "compaction": 1},
        workers="inline",
        progress=False,
    )
    result = simulate(cfg, on_ready=ready.append)
    truth, live_info = result.truth, result.summary["live"]
    assert [r["uri"].startswith("kafka://") for r in ready[0]["regions"]] == [True, True]
    assert live_info["stopped_by"] == "duration" and truth["faults_shortfall"] == {}
    assert sorted(f["kind"] for f in truth["faults"]) == ["compaction", "dropped"]
    dropped = next(f for f in truth["faults"] if f["kind"] == "dropped")
    span_ms = 3000
    assert (
        0.15 * span_ms <= dropped["time_ms"] - truth["run"]["start_ms"] < 0.7 * span_ms
    )  # the count's window
    assert dropped["expect"]["leapfrog"] and dropped["vt_offsets"]
    assert truth["run"]["records"] == sum(r["writes"] for r in truth["regions"]) > 0
    assert json.loads((tmp_path / "out" / "live.json").read_text())["state"] == "stopped"


def test_lingering_clusters_serve_every_record_until_told_to_stop(tmp_path):
    """With `linger_s`, a run stopped by its duration keeps its clusters up once the archives and truth.json are
    final, so a watch can read to the end; a stop request ends the linger."""
    from confluent_kafka import Consumer, TopicPartition

    out = tmp_path / "out"
    stop = threading.Event()
    cfg = SimConfig(
        out=str(out),
        live=True,
        duration_s=2.0,
        linger_s=120.0,
        regions=2,
        partitions=1,
        keys=300,
        batch_records=30,
        write_rate=[10.0],
        heartbeat_every_ms=500,
        workers="inline",
        progress=False,
    )
    seen: dict = {}

    def read_while_lingering() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                info = json.loads((out / "live.json").read_text())
            except (OSError, ValueError):
                info = {}
            if info.get("state") == "stopped" and info.get("clusters_up"):
                for r in info["regions"]:
                    c = Consumer({"bootstrap.servers": r["uri"].removeprefix("kafka://"), "group.id": "t"})
                    try:
                        seen[r["region"]] = c.get_watermark_offsets(TopicPartition(cfg.vt_topic, 0), 10)[1]
                    finally:
                        c.close()
                break
            time.sleep(0.2)
        stop.set()

    reader = threading.Thread(target=read_while_lingering)
    reader.start()
    t0 = time.monotonic()
    result = simulate(cfg, stop=stop)
    reader.join()
    assert time.monotonic() - t0 < 100, "the stop request did not end the linger"
    ends = result.truth["run"]["end_offsets"]
    assert seen == {x: ends[str(x)][f"{cfg.vt_topic}[0]"] for x in range(2)}
    assert json.loads((out / "live.json").read_text())["clusters_up"] is False


# ---------------------------------------------------------------------------------------- the rules alone
def test_fault_specs_take_counts_and_set_times():
    counts, timed = parse_fault_spec("dropped=2, poisoned@12,silent@30+20,poisoned@40")
    assert counts == {"dropped": 2}
    assert timed == [
        TimedFault("poisoned", 12.0),
        TimedFault("silent", 30.0, 20.0),
        TimedFault("poisoned", 40.0),
    ]
    assert str(timed[1]) == "silent@30+20"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("dropped@soon", "expected KIND@SECONDS"),
        ("dropped@5+3", "only failover, broker, silent, isolated last a while"),
        ("compaction@5", "after the run"),
        ("silent@-1", "must not be negative"),
        ("meteor@5", "unknown fault kind 'meteor'"),
    ],
)
def test_bad_timed_faults_name_the_item(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_fault_spec(spec)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"live": True, "faults": {"dropped": 1}}, "give their times instead"),
        ({"duration_s": 5.0}, "for live runs only"),
        ({"live": True, "duration_s": 5.0, "fault_times": [TimedFault("broker", 6)]}, "after the run's end"),
        ({"live": True, "live_step_ms": 1}, "live_step_ms"),
        ({"linger_s": 5.0}, "for live runs only"),
        ({"faults": {"dropped": 1}, "fault_times": [TimedFault("dropped", 5)]}, "also given as a count"),
    ],
)
def test_live_settings_are_checked(change, message):
    with pytest.raises(ConfigError, match=message):
        SimConfig(**change).validate()
    SimConfig(
        live=True, faults={"compaction": 1}
    ).validate()  # done to the archives at the end: no time needed


def test_cli_live_flags_are_checked_and_taught(tmp_path, capsys):
    assert main(["simulate", "--out", str(tmp_path / "a"), "--duration", "5"]) == 2
    assert "--duration is for live runs" in capsys.readouterr().err
    assert main(["simulate", "--out", str(tmp_path / "b"), "--live", "--records", "10"]) == 2
    assert "--records" in capsys.readouterr().err
    assert main(["simulate", "--out", str(tmp_path / "c"), "--live", "--faults", "dropped=1"]) == 2
    assert "dropped@30" in capsys.readouterr().err
    assert not any((tmp_path / n).exists() for n in "abc")
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    out = capsys.readouterr().out
    for word in ("--live", "--duration", "SIGTERM", "kafka://", "live.json", "silent@", "isolated", "end_at"):
        assert word in out


def test_an_isolation_holds_other_regions_records_until_it_ends():
    lf = LeaderFaults(isolated=[[1000, None]])
    assert lf.arrival(999) == 999 and lf.cut(900) == 900 and lf.cut(5000) == 1000  # still going: held back
    lf.isolated[0][1] = 3000
    assert lf.arrival(1000) == 3000 and lf.arrival(2999) == 3000 and lf.arrival(3000) == 3000
    assert lf.cut(2500) == 1000 and lf.cut(3000) == 1000 and lf.cut(3001) == 3001


def _cfg(**kw) -> SimConfig:
    base = dict(records=6000, keys=3000, partitions=2, batch_records=300, write_rate=[500.0])
    base.update(kw)
    return SimConfig(**base).validate()


def test_timed_faults_go_to_the_first_suitable_write_and_outages_to_their_time():
    cfg = _cfg(
        fault_times=[
            TimedFault("dropped", 1.0),
            TimedFault("poisoned", 1.5),
            TimedFault("gap", 0.5),
            TimedFault("silent", 0.8, 0.5),
            TimedFault("isolated", 0.9),
            TimedFault("failover", 1.0, 0.2),
        ],
        outage_ms=300,
    )
    ks = KeySpace.build(cfg.keys, cfg.partitions)
    s = build_schedule(cfg, ks, np.random.default_rng(1))
    plan = plan_faults(cfg, s, ks.keys, np.random.default_rng(2))
    assert plan.shortfall == {} and sorted(plan.injected()) == sorted(tf.kind for tf in cfg.fault_times)
    at = {tf.kind: s.start_ms + int(tf.at_s * 1000) for tf in cfg.fault_times}
    _, nxt = _neighbours(s.key)
    for f in plan.faults:
        if f.kind == "gap":  # any write will do: the first one at its time
            assert f.write == int(np.searchsorted(s.time_ms, at["gap"]))
        elif f.write is not None:  # the last write of its key (nothing heals it), a PUT, not before its time
            assert f.time_ms >= at[f.kind] and s.op[f.write] == PUT and nxt[f.write] == -1
        else:
            assert f.time_ms == at[f.kind]
    ends = {f.kind: f.end_ms - f.time_ms for f in plan.faults if f.kind in OUTAGES}
    assert ends == {"silent": 500, "isolated": 300, "failover": 200}
    silent, failover = plan.of("silent")[0], plan.of("failover")[0]
    isolated = plan.of("isolated")[0]
    assert (silent.region, silent.partition) != (failover.region, failover.partition)
    assert isolated.region != silent.region and failover.region != isolated.region  # each visible on its own


def test_counted_outages_end_before_a_planned_run_does():
    cfg = _cfg(faults={"silent": 2, "isolated": 1}, outage_ms=10**7)
    ks = KeySpace.build(cfg.keys, cfg.partitions)
    s = build_schedule(cfg, ks, np.random.default_rng(1))
    plan = plan_faults(cfg, s, ks.keys, np.random.default_rng(2))
    assert plan.injected() == {"silent": 2, "isolated": 1}
    assert all(s.start_ms < f.time_ms < f.end_ms <= s.end_ms for f in plan.faults)


def test_chunks_of_a_live_schedule_keep_the_placement_rules():
    """A dropped write's key is never written again in later chunks, and a later chunk knows the keys' history
    (whether the dropping regions held an online value of the key before)."""
    cfg = _cfg(live=True)
    ks = KeySpace.build(cfg.keys, cfg.partitions)
    state = PlanState.fresh(cfg.keys)
    first = build_schedule(cfg, ks, np.random.default_rng(1))
    plan = plan_faults(
        cfg,
        first,
        ks.keys,
        np.random.default_rng(2),
        counted={},
        timed=[TimedFault("dropped", 2.0)],
        state=state,
    )
    (dropped,) = plan.faults
    key_id = int(first.key[dropped.write])
    assert state.retired == {key_id}
    second = build_schedule(cfg.with_(start_ms=first.end_ms + 1), ks, np.random.default_rng(3)).without_keys(
        state.retired
    )
    assert key_id not in set(second.key.tolist()) and len(second) > 0
    plan_faults(
        cfg,
        second,
        ks.keys,
        np.random.default_rng(4),
        counted={},
        timed=[TimedFault("dropped", 0.0)],
        origin_ms=second.start_ms,
        plan=plan,
        state=state,
        base=len(first),
        carry=True,
    )
    later = plan.faults[1]
    assert later.id == 2 and later.write >= len(first)
    local = later.write - len(first)
    key2 = int(second.key[local])
    earlier = bool((first.key == key2).any() or (second.key[:local] == key2).any())
    assert later.detail["key_had_online_value_before"] == earlier
