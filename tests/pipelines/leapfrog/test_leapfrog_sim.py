"""Acceptance: `tidegauge leapfrog` on simulated replication finds exactly the divergences truth.json expects.

One small simulation (3 regions, every fault kind including a leader failover, region 1 quiet for part of the
run, region 2 lagging behind the others) is checked three ways:

- heartbeat mode reports `expect.leapfrog` of every fault in truth.json, nothing else, and exits 1 — except a
  MISSING whose empty region has the compacted range in that partition: the reference rule freezes a key's
  absence at the mark before the region's first gap, and in this run that mark does not cover the dropped
  write yet (a liveness limit, pinned on its own in test_leapfrog_job_edges.py);
- footer mode (Venice's lily-pad rule, record footers only) reports a subset of what truth.json expects and
  leaves at least as many keys pending: without heartbeats a quiet or lagging region blocks comparisons. (It
  is not always a subset of heartbeat mode's findings: footer mode has no gap rule, so it can report the
  MISSING behind the compacted range that heartbeat mode leaves pending.);
- `--pairs 0-1` reports only that pair, exactly the heartbeat run's findings for it.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from pipelines.core.sources import SourceSpec
from pipelines.leapfrog.job import LeapfrogOptions, parse_pairs, run
from sim import QuietPeriod, SimConfig
from sim import run as simulate

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

FAULTS = {
    "dropped": 2,
    "poisoned": 2,
    "failover": 1,
    "duplicate": 1,
    "gap": 1,
    "corrupt": 1,
    "compaction": 1,
    "broker": 1,
}


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim-leapfrog")
    cfg = SimConfig(
        out=str(out / "sim"),
        seed=23,
        regions=3,
        partitions=2,
        records=4000,
        keys=1200,
        batch_records=300,
        write_rate=[1000.0],
        heartbeat_every_records=150,
        heartbeat_every_ms=400,
        default_lag_ms=100,
        lag_ms={(0, 2): 600, (1, 2): 450},  # region 2 lags
        quiet=[QuietPeriod(1, 0.25, 0.6, None)],  # region 1 writes nothing for a while
        failover_delay_ms=250,
        faults=dict(FAULTS),
        broker_down_s=0.5,
        step_records=1000,
        progress=False,
    )
    result = simulate(cfg)
    result.root = out
    return result


def _leapfrog(spark, sim, out, mode="heartbeat", pairs=None, regions=None):
    t = sim.truth["run"]
    code = run(
        LeapfrogOptions(
            store=t["store"],
            version=t["version"],
            out=str(out),
            mode=mode,
            pairs=pairs,
            sources=[
                SourceSpec(x, d) for x, d in sorted(sim.archives.items()) if regions is None or x in regions
            ],
        ),
        spark=spark,
    )
    summary = json.loads((out / "summary.json").read_text())
    found = {
        (r["type"], r["region_a"], r["region_b"], r["partition"], r["key"].hex())
        for r in pq.read_table(out / "inconsistencies").to_pylist()
    }
    return code, summary, found


@pytest.fixture(scope="module")
def heartbeat_run(spark, simulated):
    return _leapfrog(spark, simulated, simulated.root / "leapfrog-heartbeat")


def _expected(truth) -> set[tuple]:
    return {
        (e["type"], e["region_a"], e["region_b"], e["partition"], e["key"])
        for f in truth["faults"]
        for e in f["expect"]["leapfrog"]
    }


def test_the_simulation_has_what_the_acceptance_needs(simulated):
    truth = simulated.truth
    assert truth["faults_shortfall"] == {}
    assert {f["kind"] for f in truth["faults"]} == set(FAULTS)
    assert truth["regions"][1]["quiet_periods"]
    kinds = {e[0] for e in _expected(truth)}
    assert "VALUE_MISMATCH" in kinds and kinds & {"MISSING_IN_A", "MISSING_IN_B"}


def test_heartbeat_mode_finds_exactly_the_truth(simulated, heartbeat_run):
    code, summary, found = heartbeat_run
    expected = _expected(simulated.truth)
    assert found <= expected, "safe: nothing truth.json does not expect"
    assert found == expected, "live: every expected finding is found, behind the compacted range too"
    print("leapfrog heartbeat mode on the simulation: expected", len(expected), "found", len(found))
    assert code == 1
    assert summary["failed_partitions"] == []
    assert summary["totals"]["undecodable"] == 0 and summary["totals"]["out_of_range"] == 0
    compaction = next(f for f in simulated.truth["faults"] if f["kind"] == "compaction")
    facts = {(r["region"], r["partition"]): r for r in summary["by_region"]}
    ranges = facts[(compaction["region"], compaction["partition"])]["compacted_ranges"]
    assert ranges, "the compacted VT range is reported"
    # every region heartbeats into every VT, quiet or not
    assert all(set(r["heartbeats_by_origin"]) == {"0", "1", "2"} for r in summary["by_region"])


def test_footer_mode_finds_a_subset_and_leaves_more_pending(spark, simulated, heartbeat_run, tmp_path):
    _, hb_summary, hb_found = heartbeat_run
    code, summary, found = _leapfrog(spark, simulated, tmp_path / "footer", mode="footer")
    expected = _expected(simulated.truth)
    assert found <= expected
    assert found <= hb_found, "heartbeat mode finds at least every divergence footer mode finds"
    hb, ft = hb_summary["totals"], summary["totals"]
    assert ft["pending_keys"] >= hb["pending_keys"]
    assert ft["keys"] == hb["keys"] and ft["records"] == hb["records"]
    hb_pairs = {(e["partition"], e["region_a"], e["region_b"]): e for e in hb_summary["by_pair"]}
    for e in summary["by_pair"]:
        assert e["pending_keys"] >= hb_pairs[(e["partition"], e["region_a"], e["region_b"])]["pending_keys"]
    assert code == (1 if found else 0)
    numbers = {
        m: {
            "findings": sum(t["findings"].values()),
            "comparable_pairs": t["comparable_pairs"],
            "skipped_pairs": t["skipped_pairs"],
            "pending_keys": t["pending_keys"],
            "keys": t["keys"],
        }
        for m, t in (("heartbeat", hb), ("footer", ft))
    }
    numbers["expected"] = len(expected)
    print("leapfrog on the simulation:", json.dumps(numbers))


def test_pairs_restrict_the_output(spark, simulated, heartbeat_run, tmp_path):
    _, _, hb_found = heartbeat_run
    code, summary, found = _leapfrog(
        spark, simulated, tmp_path / "pair01", pairs=parse_pairs("0-1", [0, 1, 2])
    )
    assert summary["pairs"] == [[0, 1]]
    assert {(e["region_a"], e["region_b"]) for e in summary["by_pair"]} == {(0, 1)}
    assert found == {f for f in hb_found if f[1:3] == (0, 1)}
    assert found, "the simulation has a divergence between regions 0 and 1"
    assert code == 1


@pytest.mark.parametrize("regions", [(0, 1), (1, 2)])
def test_two_of_three_regions_report_exactly_their_pairs_findings(
    spark, simulated, heartbeat_run, tmp_path, regions
):
    # Issue 28's reproduction in miniature: the records of the region left out still raise the marks and their
    # values stand, through the failover and the compacted range (previously: false findings, out_of_range > 0).
    _, _, hb_found = heartbeat_run
    code, summary, found = _leapfrog(spark, simulated, tmp_path / "two", regions=regions)
    assert found == {f for f in hb_found if f[1:3] == regions}
    assert summary["store_regions"] == 3 and summary["store_regions_from"] == "heartbeats"
    assert summary["totals"]["out_of_range"] == 0
    assert code == (1 if found else 0)
