"""A version swap in a live run (`tidegauge simulate --live --faults swap@S,...`), on the mock cluster.

One live run of 20 s (3 regions x 2 partitions) with a failover before the swap, `swap@8`, a failover going on when
the VersionSwap is due (it waits for the successor) and one after it (of version 2's leaders), shared by the module:
what it printed, what truth.json and live.json said while it ran, and its archives read with the change-capture
rule (heartbeat/changes.py, through tests/support/change_truth.py as tests/sim/test_sim_changes.py does): every
change `expected_changes` names is delivered exactly once across both versions, and both versions' topics are
archived whole.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from change_truth import expected_changes, read_with_the_rule

from div import archive
from heartbeat.changes import Verdict
from sim import SimConfig
from sim import run as simulate
from sim.config import TimedFault

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SWAP_AT_S = 8.0


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet (it is replaced atomically)
        return None


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    out = tmp_path_factory.mktemp("live-swap") / "out"
    cfg = SimConfig(
        out=str(out),
        live=True,
        duration_s=20.0,
        seed=5,
        regions=3,
        partitions=2,
        keys=400,
        batch_records=100,
        write_rate=[50.0],
        heartbeat_every_records=50,
        heartbeat_every_ms=500,
        default_lag_ms=100,
        lag_ms={(0, 2): 250},
        fault_times=[
            TimedFault("failover", 4.0),
            # End of Push at 9 s, the VersionSwap due at 12 s while the next failover goes on (until 13.5 s):
            # it waits for the successor
            TimedFault("swap", SWAP_AT_S),
            TimedFault("failover", 11.5),
            TimedFault("failover", 16.0),  # a leader of version 2
        ],
        failover_delay_ms=2000,
        swap_push_ms=1000,
        swap_rewind_ms=2000,  # 1-3 s, longer than every lag
        swap_overlap_ms=3000,
        live_chunk_s=10.0,  # the second failover is placed with the next chunk, after the swap: the run must hold
        workers="inline",  # the VersionSwap back itself
    )
    lines: list[str] = []
    truths: list[dict] = []
    lives: list[dict] = []
    done = threading.Event()

    def watch() -> None:  # what a reader of the run's files sees while it runs
        while not done.is_set():
            for path, seen in ((out / "truth.json", truths), (out / "live.json", lives)):
                doc = _read_json(path)
                if doc is not None and (not seen or doc != seen[-1]):
                    seen.append(doc)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = simulate(cfg, progress=lines.append)
    finally:
        done.set()
        watcher.join()
    return {"result": result, "truth": result.truth, "lines": lines, "truths": truths, "lives": lives}


def _swap(truth: dict) -> dict:
    (f,) = [f for f in truth["faults"] if f["kind"] == "swap"]
    return f


def test_the_swap_happens_live_and_says_so(live):
    truth, lines = live["truth"], live["lines"]
    assert truth["faults_shortfall"] == {}
    assert sorted(f["kind"] for f in truth["faults"]) == ["failover", "failover", "failover", "swap"]
    assert truth["run"]["vt_topics"] == ["sim_store_v1", "sim_store_v2"]
    said = [line for line in lines if "version" in line and "t+" not in line]
    eop = said.index("[simulate --live] version 2 of sim_store: End of Push written")
    vs = said.index("[simulate --live] version 1 ended with VersionSwap; version 2 is current")
    assert eop < vs
    f = _swap(truth)
    d = f["detail"]
    assert f["at"] <= d["end_of_push_at"] <= d["version_swap_at"] <= f["end_at"]
    start = truth["run"]["start_ms"]
    assert d["snapshot_ms"] - start == SWAP_AT_S * 1000 and d["end_of_push_ms"] == d["snapshot_ms"] + 1000
    # the failover going on when the VersionSwap was due: it came once the successor had taken over
    (going,) = [g for g in truth["faults"] if g["kind"] == "failover" and g["time_ms"] - start == 11_500]
    assert d["version_swap_waited_for_failover"] == [going["id"]]
    assert d["version_swap_ms"] == going["end_ms"] + 1 and f["end_ms"] == d["version_swap_ms"]
    (after,) = [g for g in truth["faults"] if g["kind"] == "failover" and g["time_ms"] - start == 16_000]
    assert after["detail"]["topic"] == "sim_store_v2" and after["detail"]["new_leader"]


def test_the_new_version_topic_appears_at_the_re_push(live):
    lives = live["lives"]
    running = [doc for doc in lives if doc["state"] == "running"]
    assert running[0]["vt_topics"] == ["sim_store_v1"] and running[0]["current_version"] == 1
    assert all(r["topics"] == ["sim_store_rt", "sim_store_v1"] for r in running[0]["regions"])
    assert (
        running[-1]["vt_topics"] == ["sim_store_v1", "sim_store_v2"] and running[-1]["current_version"] == 2
    )
    assert all(
        r["topics"] == ["sim_store_rt", "sim_store_v1", "sim_store_v2"] for r in running[-1]["regions"]
    )
    assert lives[-1]["state"] == "stopped" and lives[-1]["current_version"] == 2


def test_truth_json_carries_the_swap_as_it_happens(live):
    final = live["truth"]["changes"]
    during = [t["changes"] for t in live["truths"] if t["run"]["end_ms"] is None]
    assert during[0]["versions"] == [1], "before the re-push, one version"
    stages = []
    for ch in during:
        for x, per in ch["regions"].items():
            v1 = per["1"]
            assert v1["applied"] is None and v1["eop_offsets"] == final["regions"][x]["1"]["eop_offsets"]
            if ch["versions"] == [1]:
                assert set(per) == {"1"} and v1["version_swap_offsets"] is None
                stage = 0
                continue
            v2 = per["2"]
            assert v2["topic"] == "sim_store_v2" and v2["applied"] is None
            # each fact, once there, is the final one
            for version, field in (("2", "eop_offsets"), ("2", "rewind"), ("1", "version_swap_offsets")):
                if per[version][field] is not None:
                    assert per[version][field] == final["regions"][x][version][field]
            if v1["version_swap_offsets"] is not None:
                assert v1["hbw_at_version_swap"] == final["regions"][x]["1"]["hbw_at_version_swap"]
            stage = 1 + (v2["eop_offsets"] is not None) + (v1["version_swap_offsets"] is not None)
        stages.append(stage)
    assert stages == sorted(stages) and {0, 1, 2, 3} <= set(stages), (
        "re-push, End of Push and VersionSwap each seen in truth.json while the run went on"
    )
    assert all(
        o is not None for x in final["regions"].values() for o in x["1"]["version_swap_offsets"].values()
    )


@pytest.mark.parametrize("region", [0, 1, 2])
def test_every_change_once_across_both_versions(live, region):
    result, truth = live["result"], live["truth"]
    delivered, verdicts = read_with_the_rule(truth, result.archives, region)
    expected = expected_changes(truth, region)
    counts = Counter(delivered)
    twice = {c: k for c, k in counts.items() if k > 1}
    assert not twice, f"delivered more than once: {sorted(twice)[:10]}"
    assert set(counts) - expected == set(), f"not expected: {sorted(set(counts) - expected)[:10]}"
    assert expected - set(counts) == set(), f"never delivered: {sorted(expected - set(counts))[:10]}"
    # version 2 brought changes of its own (after the VersionSwap), and its replay repeated some of version 1's
    v2_applied = truth["changes"]["regions"][str(region)]["2"]["applied"]
    assert sum(len(pos) for by_r in v2_applied.values() for pos in by_r.values()) > 0
    assert verdicts[Verdict.BELOW_RECORD] + verdicts[Verdict.BELOW_HEARTBEAT] > 0


def test_the_archives_hold_both_versions_whole(live):
    result, truth = live["result"], live["truth"]
    ends = truth["run"]["end_offsets"]
    for x, arch in result.archives.items():
        infos = {(i.topic, i.partition): i for i in archive.describe(arch)}
        for topic in ("sim_store_v1", "sim_store_v2"):
            for q in range(2):
                end = ends[str(x)][f"{topic}[{q}]"]
                info = infos[(topic, q)]
                assert (info.first_offset, info.last_offset, info.records) == (0, end - 1, end)
                vs = truth["changes"]["regions"][str(x)]["1"]["version_swap_offsets"][str(q)]
                if topic == "sim_store_v1":
                    assert vs < end
                else:
                    assert end > truth["changes"]["regions"][str(x)]["2"]["eop_offsets"][str(q)] + 2


def test_a_run_stopped_during_the_swap_completes_it(tmp_path):
    """Stopped by its duration between the re-push and the VersionSwap (due 6.5 s, the run stops at 4 s): End of Push
    and the VersionSwap are written at the stop, as outages end there, and every change is still delivered once."""
    lines: list[str] = []
    cfg = SimConfig(
        out=str(tmp_path / "out"),
        live=True,
        duration_s=4.0,
        seed=7,
        regions=2,
        partitions=2,
        keys=300,
        batch_records=50,
        write_rate=[40.0],
        heartbeat_every_records=40,
        heartbeat_every_ms=500,
        default_lag_ms=100,
        fault_times=[TimedFault("swap", 3.0)],
        swap_push_ms=3000,
        swap_rewind_ms=1500,
        swap_overlap_ms=500,
        workers="inline",
    )
    result = simulate(cfg, progress=lines.append)
    truth = result.truth
    d = _swap(truth)["detail"]
    assert truth["faults_shortfall"] == {} and d["completed_at_stop"] is True
    assert d["end_of_push_ms"] == d["version_swap_ms"] < d["snapshot_ms"] + 3000
    assert truth["changes"]["versions"] == [1, 2]
    assert any(line.endswith("version 1 ended with VersionSwap; version 2 is current") for line in lines)
    for region in (0, 1):
        delivered, _ = read_with_the_rule(truth, result.archives, region)
        counts = Counter(delivered)
        assert max(counts.values()) == 1 and set(counts) == expected_changes(truth, region)
