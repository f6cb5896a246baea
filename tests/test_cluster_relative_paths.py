"""On a real Spark standalone cluster, relative paths mean what they mean on the driver (issue 16, finding 3).

Reported: `leapfrog --master spark://HOST:PORT` with relative source paths read 0 records and exited 0 with
"0 findings" — each executor resolved the paths in its worker's working directory, found nothing there, and
nothing said so. Paths are now made absolute on the driver before anything reaches an executor, and a partition
read short is a failed partition. Here a master and two workers (one core each, each with its own working
directory) run `leapfrog` (full, then incremental with a relative --state, twice) and `div validate --engine
spark` from a working directory given relative paths, as separate driver processes; their findings must equal
local mode's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from small_sim import small_sim
from standalone_cluster import standalone_cluster

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    sim = small_sim(root / "sim", seed=5, records=1200, keys=250, faults={"dropped": 1, "poisoned": 1})
    archives = {r: os.path.relpath(a, root) for r, a in sim.archives.items()}
    assert all(not os.path.isabs(a) for a in archives.values())
    with standalone_cluster(root / "spark") as cluster:
        yield {
            "root": root,
            "cluster": cluster,
            "store": sim.store,
            "version": str(sim.version),
            "topic": sim.topic,
            "archives": archives,
        }


def _run(world, argv: list[str]) -> tuple[int, str]:
    """A tidegauge driver process on the cluster, in the world's directory (where the relative paths hold)."""
    p = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *argv, "--master", world["cluster"].master_url],
        cwd=world["root"],
        env=world["cluster"].env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return p.returncode, p.stderr


def _local(world, argv: list[str]) -> int:
    """The same command in this process, in local mode (the test run's SparkSession), on absolute paths."""
    from pipelines.cli import main

    cwd = os.getcwd()
    os.chdir(world["root"])
    try:
        return main(argv)
    finally:
        os.chdir(cwd)


def _sources(world) -> list[str]:
    return [a for r, p in sorted(world["archives"].items()) for a in ("--source", f"{r}={p}")]


def _findings(path: Path) -> list[tuple]:
    return sorted(
        (r["type"], r["region_a"], r["region_b"], r["partition"], r["key"])
        for r in pq.read_table(path).to_pylist()
    )


def test_leapfrog_on_the_cluster_with_relative_paths_equals_local_mode(world, spark):
    base = ["leapfrog", "--store", world["store"], "--version", world["version"], *_sources(world)]
    assert _local(world, [*base, "--out", "lf-local"]) == 1
    code, err = _run(world, [*base, "--out", "lf-cluster"])
    assert code == 1, err  # the simulation's dropped and poisoned writes
    root = world["root"]
    assert _findings(root / "lf-cluster" / "inconsistencies") == _findings(
        root / "lf-local" / "inconsistencies"
    )
    cluster, local = (json.loads((root / d / "summary.json").read_text()) for d in ("lf-cluster", "lf-local"))
    assert cluster["verdict"] == local["verdict"] == "findings"
    assert cluster["evidence"]["read_records"] == local["evidence"]["read_records"] > 0
    assert cluster["evidence"]["partitions_read_short"] == 0
    assert all(
        Path(uri).is_absolute() for uri in cluster["sources"].values()
    )  # what the executors were given


def test_incremental_leapfrog_on_the_cluster_with_a_relative_state(world, spark):
    base = [
        "leapfrog",
        "--store",
        world["store"],
        "--version",
        world["version"],
        *_sources(world),
        "--state",
        "state/leapfrog",
    ]
    first, err = _run(world, [*base, "--out", "inc-1"])
    assert first == 1, err
    again, err = _run(world, [*base, "--out", "inc-2"])  # nothing new: the findings stand
    assert again == 1, err
    root = world["root"]
    assert (root / "state" / "leapfrog").is_dir()
    assert _findings(root / "inc-2" / "inconsistencies") == _findings(root / "inc-1" / "inconsistencies")


def test_div_validate_on_the_cluster_with_relative_paths_equals_local_mode(world):
    source = ["--source", f"0={world['archives'][0]}", "--now-ms", "1800000000000"]
    assert _local(world, ["div", "validate", *source, "--out", "div-local"]) in (0, 1)
    code, err = _run(world, ["div", "validate", *source, "--engine", "spark", "--out", "div-cluster"])
    assert code in (0, 1), err
    root = world["root"]
    cluster, local = (
        json.loads((root / d / "summary.json").read_text()) for d in ("div-cluster", "div-local")
    )
    assert cluster["records_read"] == local["records_read"] > 0
    assert cluster["verdict"] == local["verdict"] and cluster["findings_by_type"] == local["findings_by_type"]
