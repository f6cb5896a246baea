"""Unreadable records never raise a divergence (issue 16, finding 2), on Spark.

Reported: in one region's archive 20 record values replaced with random bytes and in another 20 values cut
short, `leapfrog` went from the 2 real findings to 39 — 37 about keys whose record there could not be decoded.
Now such a key is unverified in that region (leapfrog.unverified): counted with its offsets, and no finding
rests on it. What the undamaged run finds about other keys is still found, and the verdict is partial when
nothing else is found.
"""

from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest
from damage import Damage, damage_archive, read_archive

from pipelines.core.sources import SourceSpec
from pipelines.leapfrog.job import LeapfrogOptions, run
from sim import SimConfig
from sim import run as simulate

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("leapfrog-unverified")
    cfg = SimConfig(
        out=str(root / "sim"),
        seed=11,
        regions=3,
        partitions=2,
        records=1500,
        keys=300,
        batch_records=100,
        heartbeat_every_records=100,
        heartbeat_every_ms=400,
        default_lag_ms=100,
        faults={"dropped": 1, "poisoned": 1},
        step_records=1500,
        progress=False,
        workers="inline",
    )
    sim = simulate(cfg)
    t = sim.truth["run"]
    vt = f"{t['store']}_v{t['version']}"
    archives = {int(k): v for k, v in sim.archives.items()}
    damaged = dict(archives)
    truth = {}
    for region, kind in ((1, "value_random"), (2, "value_truncate")):
        rows = read_archive(archives[region]).to_pylist()
        # PUT/DELETE records of the VT (the archives hold the RT too, which leapfrog does not read)
        data = [i for i, r in enumerate(rows) if r["topic"] == vt and r["key"] and r["key"][0] == 0]
        picked = random.Random(region).sample(data, 20)
        dst = root / f"dc-{region}-damaged"
        truth[region] = damage_archive(archives[region], dst, [Damage(kind, row=i, seed=i) for i in picked])
        damaged[region] = str(dst)
    return {
        "root": root,
        "store": t["store"],
        "version": t["version"],
        "archives": archives,
        "damaged": damaged,
        "truth": truth,
    }


def _run(spark, world, archives, out, state=None):
    code = run(
        LeapfrogOptions(
            store=world["store"],
            version=world["version"],
            out=str(out),
            state_dir=state,
            sources=[SourceSpec(r, a) for r, a in sorted(archives.items())],
        ),
        spark=spark,
    )
    rows = pq.read_table(out / "inconsistencies").to_pylist()
    return (
        code,
        {(f["type"], f["region_a"], f["region_b"], f["partition"], f["key"]) for f in rows},
        json.loads((out / "summary.json").read_text()),
    )


@pytest.fixture(scope="module")
def clean(spark, world):
    return _run(spark, world, world["archives"], world["root"] / "clean")


def test_damaged_values_raise_no_finding_and_are_counted(spark, world, clean):
    code0, found0, _ = clean
    assert code0 == 1 and found0  # the simulation's dropped and poisoned writes
    code, found, summary = _run(spark, world, world["damaged"], world["root"] / "damaged")
    assert found <= found0, f"findings the undamaged input does not produce: {found - found0}"
    damaged_keys = {r.key_before[1:] for t in world["truth"].values() for r in t.records}
    assert {f for f in found0 if f[4] not in damaged_keys} <= found  # the rest is still found
    listed = {
        (e["region"], e["partition"], o) for e in summary["by_region"] for o in e["undecodable_offsets"]
    }
    for region, t in world["truth"].items():
        for r in t.records:
            assert (region, r.partition, r.offset) in listed
    assert summary["totals"]["undecodable"] == 40
    assert 0 < summary["totals"]["unverified_keys"] <= 40
    assert summary["evidence"]["undecodable_records"] == 40
    assert code == (1 if found else 3)
    assert summary["verdict"] == ("findings" if found else "partial") and summary["exit_code"] == code


def test_incremental_runs_keep_the_keys_unverified(spark, world):
    state = world["root"] / "state"
    code1, found1, _ = _run(spark, world, world["damaged"], world["root"] / "inc-1", state=str(state))
    code2, found2, summary2 = _run(spark, world, world["damaged"], world["root"] / "inc-2", state=str(state))
    _, full, _ = _run(spark, world, world["damaged"], world["root"] / "full")
    assert found1 == found2 == full
    assert code1 == code2
    assert summary2["totals"]["unverified_keys"] > 0
