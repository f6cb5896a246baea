"""On a real Spark standalone cluster, with the paths users give: relative, absolute, `file://` and `s3://`.

Reported (issue 16, finding 3): `leapfrog --master spark://HOST:PORT` with relative source paths read 0 records
and exited 0 with "0 findings" — each executor resolved the paths in its worker's working directory. Reported
(issue 18): `--out file:///…` created a directory literally named `file:`, and a real cluster has no shared disk
at all. Paths are now made absolute on the driver, every path goes through one filesystem layer that executors
use too (`pipelines.core.storage`), and outputs and state are published whole (`pipelines.core.publish`). Here a
master and two workers (two cores each, each with its own working directory) run `leapfrog` (full with each
spelling; incremental with --state twice, on local disk and on S3), `div validate --engine spark`, `div restore`
and `report` as separate driver processes; the results must equal local mode's. The S3 server (moto, on
loopback) is started before the cluster, so workers and drivers reach it through the AWS environment variables.
The cluster and the S3 server are the test run's (conftest.spark_cluster), shared with tests/test_cluster_kafka.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from s3_server import environ
from small_sim import small_sim

from pipelines.core.publish import current
from pipelines.core.storage import locate

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture(scope="module")
def world(tmp_path_factory, spark_cluster):
    """The session's cluster and S3 server (conftest.spark_cluster); this process's AWS environment points at
    the server meanwhile."""
    cluster, s3 = spark_cluster
    root = tmp_path_factory.mktemp("cluster")
    sim = small_sim(root / "sim", seed=5, records=1200, keys=250, faults={"dropped": 1, "poisoned": 1})
    archives = {r: os.path.relpath(a, root) for r, a in sim.archives.items()}
    assert all(not os.path.isabs(a) for a in archives.values())
    with environ(s3.env):
        bucket = s3.bucket()
        for r, a in sim.archives.items():
            dest = locate(f"s3://{bucket}/archive/dc-{r}")
            pafs.copy_files(a, dest.path, destination_filesystem=dest.fs)
        yield {
            "root": root,
            "cluster": cluster,
            "store": sim.store,
            "version": str(sim.version),
            "topic": sim.topic,
            "archives": archives,
            "s3": f"s3://{bucket}",
        }


def _run(world, argv: list[str]) -> tuple[int, str]:
    """A tidegauge driver process on the cluster, in the world's directory (where the relative paths hold)."""
    spark = argv[0] == "leapfrog" or argv[:2] == ["div", "validate"]  # the others run on the driver alone
    master = ["--master", world["cluster"].master_url] if spark else []
    p = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *argv, *master],
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


def _spelled(world, region: int, spelling: str) -> str:
    rel = world["archives"][region]
    absolute = str(world["root"] / rel)
    return {
        "relative": rel,
        "absolute": absolute,
        "file-uri": "file://" + absolute,
        "s3": f"{world['s3']}/archive/dc-{region}",
    }[spelling]


def _sources(world, spelling: str = "relative") -> list[str]:
    """Every region's --source; "mixed": one region each relative, absolute and as a file:// URI."""
    mixed = ("relative", "absolute", "file-uri")
    return [
        a
        for i, r in enumerate(sorted(world["archives"]))
        for a in ("--source", f"{r}={_spelled(world, r, mixed[i % 3] if spelling == 'mixed' else spelling)}")
    ]


def _published(world, path: str) -> Path | None:
    """A published output as the reader finds it (a relative path is the world's)."""
    return current(locate(path if "://" in path or os.path.isabs(path) else world["root"] / path))


def _findings(where) -> list[tuple]:
    where = locate(where)
    rows = []
    for f in where.files(".parquet"):
        rows += pq.read_table(f.path, filesystem=f.fs).to_pylist()
    return sorted((r["type"], r["region_a"], r["region_b"], r["partition"], r["key"]) for r in rows)


def _summary(world, out: str, name: str = "summary.json") -> dict:
    return json.loads((_published(world, out) / name).read_text())


@pytest.fixture(scope="module")
def local_leapfrog(world, spark):
    """The findings of local mode (this process's session), on the relative paths."""
    base = ["leapfrog", "--store", world["store"], "--version", world["version"], *_sources(world)]
    assert _local(world, [*base, "--out", "lf-local"]) == 1
    return _findings(world["root"] / "lf-local" / "inconsistencies"), _summary(world, "lf-local")


NOW = ["--now-ms", "1800000000000"]


@pytest.fixture(scope="module")
def on_s3(world):
    """`leapfrog` and `div validate --engine spark` on the cluster, sources and outputs on S3 (run once: several
    tests read them)."""
    s3 = world["s3"]
    lf = ["leapfrog", "--store", world["store"], "--version", world["version"], *_sources(world, "s3")]
    div = ["div", "validate", *NOW, "--source", f"0={_spelled(world, 0, 's3')}", "--engine", "spark"]
    return {
        "leapfrog": (f"{s3}/out/lf", *_run(world, [*lf, "--out", f"{s3}/out/lf"])),
        "div": (f"{s3}/out/div", *_run(world, [*div, "--out", f"{s3}/out/div"])),
    }


@pytest.mark.parametrize("spelling", ["mixed", "s3"])
def test_leapfrog_on_the_cluster_equals_local_mode_whatever_the_paths(
    world, local_leapfrog, spelling, request
):
    """Mixed: sources relative, absolute and file:// (one region each), --out a file:// URI."""
    if spelling == "s3":
        out, code, err = request.getfixturevalue("on_s3")["leapfrog"]
    else:
        out = "file://" + str(world["root"] / "lf-uri")
        base = [
            "leapfrog",
            "--store",
            world["store"],
            "--version",
            world["version"],
            *_sources(world, spelling),
        ]
        code, err = _run(world, [*base, "--out", out])
    assert code == 1, err  # the simulation's dropped and poisoned writes
    findings, local = local_leapfrog
    assert _findings(_published(world, out) / "inconsistencies") == findings != []
    cluster = _summary(world, out)
    assert cluster["verdict"] == local["verdict"] == "findings"
    assert cluster["evidence"]["read_records"] == local["evidence"]["read_records"] > 0
    assert cluster["evidence"]["partitions_read_short"] == 0
    if spelling == "mixed":
        assert not (world["root"] / "file:").exists()  # once, a directory literally named `file:` appeared
    for uri in cluster["sources"].values():  # what the executors were given: never a relative path
        assert "://" in uri or Path(uri).is_absolute()


@pytest.mark.parametrize("where", ["relative", "s3"])
def test_incremental_leapfrog_on_the_cluster_with_its_state(world, local_leapfrog, where):
    state = "state/leapfrog" if where == "relative" else f"{world['s3']}/state/leapfrog"
    # the second run reads nothing new and the findings stand; it is run on S3 only (a cluster run costs about
    # 30 s), where the state is read back through the object store
    outs = ("inc-1",) if where == "relative" else (f"{world['s3']}/out/inc-1", f"{world['s3']}/out/inc-2")
    base = ["leapfrog", "--store", world["store"], "--version", world["version"], *_sources(world, where)]
    for out in outs:
        code, err = _run(world, [*base, "--state", state, "--out", out])
        assert code == 1, err
        assert _findings(_published(world, out) / "inconsistencies") == local_leapfrog[0]
    assert (_published(world, state) / "state.json").is_file()


@pytest.mark.parametrize("where", ["relative", "s3"])
def test_div_validate_on_the_cluster_equals_local_mode(world, where, request):
    source = ["--source", f"0={_spelled(world, 0, 'relative')}", *NOW]
    assert _local(world, ["div", "validate", *source, "--out", f"div-local-{where}"]) in (0, 1)
    if where == "s3":
        out, code, err = request.getfixturevalue("on_s3")["div"]
    else:
        out = "div-cluster"
        code, err = _run(world, ["div", "validate", *source, "--engine", "spark", "--out", out])
    assert code in (0, 1), err
    cluster, local = _summary(world, out), _summary(world, f"div-local-{where}")
    assert cluster["records_read"] == local["records_read"] > 0
    assert cluster["verdict"] == local["verdict"] and cluster["findings_by_type"] == local["findings_by_type"]


def test_div_restore_and_the_report_from_cluster_outputs_on_s3(world, local_leapfrog, on_s3):
    """div restore replays one partition on the driver (no Spark); the report reads the cluster's outputs."""
    s3 = world["s3"]
    restore = ["div", "restore", "--store", world["store"], "--version", world["version"]]
    restore += ["--partition", "1", "--at-offset", "150"]
    assert _local(world, [*restore, "--source", f"0={_spelled(world, 0, 'relative')}", "--out", "rs"]) == 0
    code, err = _run(world, [*restore, "--source", f"0={_spelled(world, 0, 's3')}", "--out", f"{s3}/out/rs"])
    assert code == 0, err
    assert _summary(world, f"{s3}/out/rs", "state.json") == _summary(world, "rs", "state.json")

    (lf, code, err), (div, div_code, div_err) = on_s3["leapfrog"], on_s3["div"]
    assert code == 1 and div_code in (0, 1), err + div_err
    report = ["report", "--leapfrog", lf, "--div", div]
    code, err = _run(world, [*report, "--out", f"{s3}/out/r-report", "--history", f"{s3}/out/r-history"])
    assert code == 1, err
    doc = json.loads(locate(f"{s3}/out/r-report/report.json").read_text())
    assert doc["verdict"]["overall"] == "FAIL" and doc["summary"]["divergences"]["total"] == len(
        local_leapfrog[0]
    )
