"""`div restore` says when the state it wrote rests on partial evidence (issue 16).

A restored state is the restore point advanced over the records after it. If some of those records could not be
decoded, or a region's RT ends before the offset the replica resumes at, the state is written (it is the best
there is) but the run is `partial`, exit 3, with the offsets on stderr and in summary.json — never a silent 0.
"""

from __future__ import annotations

import contextlib
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from damage import read_archive
from small_sim import small_sim

from div import archive
from pipelines.cli import main

PARTITION, AT = 1, 300


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("restore-evidence")
    sim = small_sim(root / "sim", seed=11, records=900, keys=200)
    world = {"root": root, "store": sim.store, "version": sim.version, "archives": sim.archives}
    code, err, summary = _restore(world, world["archives"], "clean")
    assert code == 0 and summary["verdict"] == "clean", err
    world["clean"] = summary
    return world


def _restore(world, archives, name):
    out = world["root"] / name
    argv = [
        "div",
        "restore",
        "--store",
        world["store"],
        "--version",
        str(world["version"]),
        "--partition",
        str(PARTITION),
        "--at-offset",
        str(AT),
        "--out",
        str(out),
        "--source",
        f"1={archives[1]}",
    ]
    for r, a in sorted(archives.items()):
        argv += ["--rt-source", f"{r}={a}"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue(), json.loads((out / "summary.json").read_text())


def _rewrite(src, dst, change) -> None:
    """Copy an archive with `change(row)` applied to every row (returning None drops the row)."""
    rows = [r2 for r in read_archive(src).to_pylist() if (r2 := change(dict(r))) is not None]
    dst.mkdir()
    pq.write_table(pa.Table.from_pylist(rows, archive.KAFKA_ARROW_SCHEMA), dst / "records.parquet")


def test_undecodable_records_in_the_vt_replay_make_the_restore_partial(world, caplog):
    hb = world["clean"]["heartbeat_offset"]
    topic = f"{world['store']}_v{world['version']}"
    broken = {hb + 1, hb + 3}
    assert max(broken) <= AT

    def mangle(r):
        if r["topic"] == topic and r["partition"] == PARTITION and r["offset"] in broken:
            r["value"] = b"\x07not a venice value"
        return r

    archives = dict(world["archives"])
    archives[1] = str(world["root"] / "vt-mangled")
    _rewrite(world["archives"][1], world["root"] / "vt-mangled", mangle)
    code, err, summary = _restore(world, archives, "vt-mangled-out")
    assert code == 3, err
    assert summary["verdict"] == "partial" and summary["exit_code"] == 3
    vt = next(e for e in summary["evidence"]["by_partition"] if e["topic"] == topic)
    assert vt["undecodable"] == 2 and vt["undecodable_offsets"] == sorted(broken)
    assert f"{topic}[{PARTITION}]: 2 record(s) could not be decoded" in caplog.text  # stderr, through logging
    assert (world["root"] / "vt-mangled-out" / "partition_state.bin").exists()  # the state is still written


def test_an_rt_that_ends_before_the_resume_offset_makes_the_restore_partial(world, caplog):
    rt = f"{world['store']}_rt"
    replayed = [
        e for e in world["clean"]["evidence"]["by_partition"] if e["topic"] == rt and e["read_records"] > 1
    ]
    assert replayed, "the scenario must replay some region's RT"
    region, (start, end) = replayed[0]["region"], replayed[0]["planned_offsets"]

    def cut(r):
        if r["topic"] == rt and r["partition"] == PARTITION and r["offset"] > start:
            return None
        return r

    archives = dict(world["archives"])
    archives[region] = str(world["root"] / "rt-cut")
    _rewrite(world["archives"][region], world["root"] / "rt-cut", cut)
    code, err, summary = _restore(world, archives, "rt-cut-out")
    assert code == 3, err
    entry = next(e for e in summary["evidence"]["by_partition"] if e["topic"] == rt and e["region"] == region)
    assert entry["short"] and entry["read_records"] == 1 and entry["planned_offsets"] == [start, end]
    assert f"source {region} {rt}[{PARTITION}]: read 1 of offsets {start}..{end - 1}" in caplog.text
