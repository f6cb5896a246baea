"""The simulator's change-capture truth, checked with the rule itself: a simulation with VT redeliveries, a leader
failover and a version swap; every region's VTs of both versions read from the archives through heartbeat/changes.py
(a reader that starts on version 1 with no state and follows version 2 at version 1's VersionSwap) deliver every
coordinate `expected_changes` names exactly once, in increasing position per (partition, source region), and nothing
else. A naive reader (Venice's at-least-once changelog consumer: every data record after End of Push, and on the swap
a seek to version 2's End of Push) delivers some changes more than once. `div validate` on the archives finds exactly
what truth.json expects (the redelivered copies' DUPLICATEs); on version 2 alone a swap finds nothing.
"""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.parquet as pq
import pytest
from change_truth import expected_changes, read_naively, read_with_the_rule, swap_sim_config

from heartbeat.changes import DELIVERED, Verdict
from sim import SimConfig, run
from sim.config import TimedFault

pytestmark = [pytest.mark.kafka]


_config = swap_sim_config


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    return run(_config(tmp_path_factory.mktemp("sim-changes") / "out"))


def test_the_run_has_what_the_check_needs(sim):
    truth = sim.truth
    assert truth["faults_shortfall"] == {}
    kinds = Counter(f["kind"] for f in truth["faults"])
    assert kinds == {"redelivery": 2, "failover": 1, "swap": 1}
    assert truth["changes"]["versions"] == [1, 2]
    assert truth["run"]["vt_topics"] == ["sim_store_v1", "sim_store_v2"]
    for f in truth["faults"]:
        if f["kind"] == "redelivery":
            first, copy = f["vt_offsets"][str(f["region"])]
            assert copy > first and f["detail"]["coordinate"][1] == f["rt_offset"]
        if f["kind"] == "failover":
            assert f["vt_offsets"][str(f["region"])], "the successor re-applied writes"
    rewinds = [truth["changes"]["regions"][str(x)]["2"]["rewind"] for x in range(truth["run"]["regions"])]
    assert all(pos > 0 for by_r in rewinds[0].values() for pos in by_r.values()), (
        "the rewind lies inside the RTs"
    )
    assert all(r == rewinds[0] for r in rewinds), (
        "a rewind longer than the lags replays the same writes everywhere"
    )


@pytest.mark.parametrize("region", [0, 1, 2])
def test_the_rule_delivers_exactly_the_expected_changes(sim, region):
    delivered, verdicts = read_with_the_rule(sim.truth, sim.archives, region)
    expected = expected_changes(sim.truth, region)
    counts = Counter(delivered)
    twice = {c: k for c, k in counts.items() if k > 1}
    assert not twice, f"delivered more than once: {sorted(twice)[:10]}"
    assert set(counts) - expected == set(), f"not expected: {sorted(set(counts) - expected)[:10]}"
    assert expected - set(counts) == set(), f"never delivered: {sorted(expected - set(counts))[:10]}"
    by_stream: dict[tuple[int, int], list[int]] = {}
    for p, r, q in delivered:
        by_stream.setdefault((p, r), []).append(q)
    assert all(qs == sorted(qs) for qs in by_stream.values()), (
        "per (partition, source) in increasing position"
    )
    dups = verdicts[Verdict.BELOW_RECORD] + verdicts[Verdict.BELOW_HEARTBEAT]
    assert dups > 0 and verdicts[Verdict.BULK_SKIPPED] > 0
    print(
        f"dc-{region}: delivered {len(delivered)} changes exactly once "
        f"({sum(verdicts[v] for v in DELIVERED) - len(delivered)} bulk-load records), dropped {dups} duplicates"
    )


@pytest.mark.parametrize("region", [0, 1, 2])
def test_a_naive_reader_delivers_duplicates(sim, region):
    got = read_naively(sim.truth, sim.archives, region)
    duplicates = sum(k - 1 for k in got.values())
    expected = expected_changes(sim.truth, region)
    print(
        f"dc-{region}: the naive reader delivered {sum(got.values())} changes, {duplicates} of them duplicates"
    )
    assert duplicates > 0
    assert expected <= set(got), "at least once"


def test_the_truth_changes_are_compact_in_truth_json(sim):
    text = open(sim.truth_path).read()
    assert json.loads(text)["changes"] == sim.truth["changes"]
    changes_lines = text[text.index('"changes"') :].count("\n")
    assert changes_lines < 20, "one line per region"


def test_div_finds_exactly_the_redelivered_copies(sim, tmp_path):
    from pipelines.core.sources import SourceSpec
    from pipelines.div.validate import ValidateOptions, run_local

    truth = sim.truth
    sources = [SourceSpec(x, d) for x, d in sorted(sim.archives.items())]
    code = run_local(
        ValidateOptions(sources=sources, out=str(tmp_path / "div"), now_ms=truth["run"]["end_ms"])
    )
    summary = json.loads((tmp_path / "div" / "summary.json").read_text())
    expected = sorted(
        (e["region"], e["topic"], e["partition"], e["offset"], e["type"])
        for f in truth["faults"]
        for e in f["expect"]["div"]
    )
    found = sorted(
        (r["region"], r["topic"], r["partition"], r["offset"], r["type"])
        for r in pq.read_table(tmp_path / "div" / "errors").to_pylist()
    )
    assert found == expected and expected, summary
    assert code == 0 and summary["fatal_findings"] == 0, (
        "a redelivered VT record is not fatal after End of Push"
    )


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("version", [1, 2])
def test_leapfrog_finds_nothing_on_either_version(sim, spark, tmp_path, version):
    """Redelivery, failover and swap cause no divergence: `leapfrog --version N` on both versions' archives is
    clean. (The same bulk load in every region matters here: Leap Frog compares what the regions wrote after End
    of Push, and regions that started version 2 from different snapshots would write different replays.)"""
    from pipelines.core.sources import SourceSpec
    from pipelines.leapfrog.job import LeapfrogOptions
    from pipelines.leapfrog.job import run as leapfrog

    run_ = sim.truth["run"]
    opts = LeapfrogOptions(
        store=run_["store"],
        version=version,
        sources=[SourceSpec(x, d) for x, d in sorted(sim.archives.items())],
        out=str(tmp_path / "lf"),
    )
    code = leapfrog(opts, spark=spark)
    summary = json.loads((tmp_path / "lf" / "summary.json").read_text())
    assert not any(e for f in sim.truth["faults"] for e in f["expect"]["leapfrog"])
    assert code == 0 and summary["verdict"] == "clean", summary["totals"]
    assert summary["totals"]["comparable_pairs"] > 0


def test_one_swap_per_run():
    from sim.config import ConfigError, parse_fault_spec

    assert parse_fault_spec("redelivery=2,swap@3") == ({"redelivery": 2}, [TimedFault("swap", 3.0)])
    with pytest.raises(ConfigError, match="at most one version swap"):
        SimConfig(faults={"swap": 2}).validate()
    SimConfig(live=True, fault_times=[TimedFault("swap", 3.0)]).validate()  # live runs swap too
    with pytest.raises(ConfigError, match="at most one version swap"):
        SimConfig(live=True, fault_times=[TimedFault("swap", 3.0), TimedFault("swap", 5.0)]).validate()
