"""Every command on an object store: sources, outputs, the incremental state, the report's history on an S3 server
on loopback, in local mode, giving what the same commands give on local disk; and a nightly run killed at each of
its storage steps, then re-run, gives the same result as one that was never killed.

The cluster twin (tests/test_cluster.py) runs the Spark jobs on a standalone cluster against the same server.
"""

from __future__ import annotations

import json
import os

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from kill_points import Killed, kill_at
from s3_server import s3_server
from small_sim import small_sim

from pipelines.core import publish
from pipelines.core.storage import Location, locate

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture(scope="module")
def world(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("objstore")
    sim = small_sim(root / "sim", seed=11, records=1000, keys=200, faults={"dropped": 1, "poisoned": 1})
    with s3_server() as server:
        # local mode's Python workers get the session's executor environment (what spark.executorEnv.* sets)
        env = spark.sparkContext.environment
        saved = dict(env)
        env.update(server.env)
        bucket = server.bucket()
        s3 = locate(f"s3://{bucket}")
        for region, path in sim.archives.items():
            pafs.copy_files(path, (s3 / f"archive/dc-{region}").path, destination_filesystem=s3.fs)
        try:
            yield {
                "root": root,
                "server": server,
                "bucket": bucket,
                "s3": f"s3://{bucket}",
                "s3a": f"s3a://{bucket}",
                "store": sim.store,
                "version": str(sim.version),
                "archives": sim.archives,
            }
        finally:
            env.clear()
            env.update(saved)


def _main(argv: list[str]) -> int:
    from pipelines.cli import main

    return main(argv)


def _sources(world, where: str) -> list[str]:
    if where == "local":
        return [a for r, p in sorted(world["archives"].items()) for a in ("--source", f"{r}={p}")]
    return [a for r in sorted(world["archives"]) for a in ("--source", f"{r}={world[where]}/archive/dc-{r}")]


def _read(uri: str) -> Location:
    """Where a reader finds a published output (following the pointer on an object store)."""
    return publish.current(locate(uri))


def _findings(uri: str) -> list[tuple]:
    where = _read(uri) / "inconsistencies"
    rows = []
    for f in where.files(".parquet"):
        rows += pq.read_table(f.path, filesystem=f.fs).to_pylist()
    return sorted((r["type"], r["region_a"], r["region_b"], r["partition"], r["key"]) for r in rows)


def _json(uri: str, name: str) -> dict:
    return json.loads((_read(uri) / name).read_text())


def _leapfrog(world, where: str) -> list[str]:
    return ["leapfrog", "--store", world["store"], "--version", world["version"], *_sources(world, where)]


def test_leapfrog_reads_and_writes_s3_as_it_does_local_disk(world):
    local = str(world["root"] / "lf")
    assert _main([*_leapfrog(world, "local"), "--out", local]) == 1
    remote = f"{world['s3a']}/out/lf"
    assert _main([*_leapfrog(world, "s3a"), "--out", remote]) == 1
    assert _findings(remote) == _findings(local) != []
    a, b = _json(remote, "summary.json"), _json(local, "summary.json")
    assert a["evidence"]["read_records"] == b["evidence"]["read_records"] > 0
    assert a["sources"]["0"].startswith("s3a://")
    # published by a pointer: one run under _runs/, nothing written beside it
    keys = world["server"].keys(world["bucket"], "out/lf/")
    assert {k.split("/")[2] for k in keys} == {".tidegauge", "_published.json", "_runs"}
    assert len({k.split("/")[3] for k in keys if k.startswith("out/lf/_runs/")}) == 1


def test_incremental_state_on_s3_gives_the_findings_of_a_full_run(world):
    full = str(world["root"] / "lf-full")
    assert _main([*_leapfrog(world, "local"), "--out", full]) == 1
    state = f"{world['s3']}/state/lf"
    for run in (1, 2):  # the second run finds nothing new: the findings stand
        out = f"{world['s3']}/out/inc-{run}"
        assert _main([*_leapfrog(world, "s3"), "--state", state, "--out", out]) == 1
        assert _findings(out) == _findings(full)
    assert (_read(state) / "state.json").is_file()
    runs = world["server"].keys(world["bucket"], "state/lf/_runs/")
    assert len({k.split("/")[3] for k in runs}) == 1  # the replaced state was removed after publication


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_div_validate_on_s3_equals_local_disk(world, engine):
    args = ["div", "validate", "--now-ms", "1800000000000", "--engine", engine]
    local = str(world["root"] / f"div-{engine}")
    remote = f"{world['s3']}/out/div-{engine}"
    codes = {
        _main([*args, *_sources(world, "local"), "--out", local]),
        _main([*args, *_sources(world, "s3"), "--out", remote]),
    }
    assert len(codes) == 1
    a, b = _json(remote, "summary.json"), _json(local, "summary.json")
    assert a["records_read"] == b["records_read"] > 0
    assert a["verdict"] == b["verdict"] and a["findings_by_type"] == b["findings_by_type"]


def test_div_restore_and_the_report_on_s3(world):
    s3 = world["s3"]
    restore = ["div", "restore", "--store", world["store"], "--version", world["version"]]
    restore += ["--partition", "0", "--at-offset", "200"]
    a0 = world["archives"][0]
    assert _main([*restore, "--source", f"0={a0}", "--out", str(world["root"] / "rs")]) == 0
    assert _main([*restore, "--source", f"0={s3}/archive/dc-0", "--out", f"{s3}/out/rs"]) == 0
    assert _json(f"{s3}/out/rs", "state.json") == _json(str(world["root"] / "rs"), "state.json")
    assert (_read(f"{s3}/out/rs") / "partition_state.bin").is_file()

    for where, base in (("local", str(world["root"])), ("s3", f"{s3}/out")):
        assert _main([*_leapfrog(world, where), "--out", f"{base}/r-lf"]) == 1
        div = ["div", "validate", "--now-ms", "1800000000000", *_sources(world, where)]
        assert _main([*div, "--out", f"{base}/r-div"]) in (0, 1)
        for _ in range(2):  # twice: the second report has a trend from the history
            code = _main(
                ["report", "--leapfrog", f"{base}/r-lf", "--div", f"{base}/r-div"]
                + ["--out", f"{base}/r-report", "--history", f"{base}/r-history"]
            )
            assert code == 1
    remote = json.loads(locate(f"{s3}/out/r-report/report.json").read_text())
    local = json.loads((world["root"] / "r-report" / "report.json").read_text())
    for doc in (remote, local):  # when the previous report ran differs, of course
        doc["verdict"]["changes"].pop("compared_with")
    assert remote["verdict"] == local["verdict"] and remote["summary"] == local["summary"]
    assert remote["verdict"]["changes"]["history"] is True
    assert len([f for f in locate(f"{s3}/out/r-history").children() if f.name.startswith("run-")]) == 2
    assert "<html" in locate(f"{s3}/out/r-report/report.html").read_text().lower()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_nightly_run_killed_at_any_storage_step_then_rerun_gives_the_same_result(world, where, monkeypatch):
    base = str(world["root"] / "kill") if where == "local" else f"{world['s3']}/kill"
    argv = _leapfrog(world, where)
    expected = None
    with monkeypatch.context() as m:
        counter = kill_at(m, step=-1)
        assert _main([*argv, "--state", f"{base}/ref-state", "--out", f"{base}/ref-out"]) == 1
        steps = counter[0]
    expected = _findings(f"{base}/ref-out")
    assert steps >= 8, steps
    for step in sorted({1, 2, steps // 3, steps // 2, steps - 2, steps - 1, steps}):
        state, out = f"{base}/s{step}", f"{base}/o{step}"
        with monkeypatch.context() as m:
            kill_at(m, step)
            with pytest.raises(Killed):
                _main([*argv, "--state", state, "--out", out])
        assert _main([*argv, "--state", state, "--out", out]) == 1, f"re-run after a kill at step {step}"
        assert _findings(out) == expected, f"killed at step {step} of {steps}"
        assert _main([*argv, "--state", state, "--out", out]) == 1  # and the state it left carries on
        assert _findings(out) == expected
    if where == "local":
        left = sorted(n for n in os.listdir(base) if n.startswith("."))
        assert left == [], left
