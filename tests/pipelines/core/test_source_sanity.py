"""Source sanity (issue 16, finding 3): no verdict over a source that holds nothing, or several regions at once.

- a source holding no record of what was asked (an empty directory, only non-Parquet files) is exit 2 naming it;
- the same (topic, partition, offset) twice with different records in one source — several regions' archives
  under one directory — is exit 2 naming the source and the offset; a record merely repeated is read once;
- relative paths are made absolute on the driver, so executors never resolve them in their own directory.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil

import pytest

from pipelines.cli import main
from pipelines.core.sources import SourceSpec, parse_source
from pipelines.leapfrog.source import plan
from sim import SimConfig
from sim import run as simulate


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp("source-sanity")
    cfg = SimConfig(
        out=str(root / "sim"),
        seed=5,
        regions=2,
        partitions=2,
        records=400,
        keys=100,
        batch_records=20,
        heartbeat_every_records=50,
        step_records=400,
        progress=False,
        workers="inline",
    )
    return simulate(cfg)


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    assert "Traceback" not in err.getvalue() and "internal error" not in err.getvalue(), err.getvalue()
    return code, err.getvalue()


def _validate(source, out) -> tuple[int, str]:
    return _cli(["div", "validate", "--source", f"0={source}", "--out", str(out)])


def test_div_validate_on_an_empty_directory_is_a_usage_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = _validate(empty, tmp_path / "out")
    assert code == 2 and str(empty) in err and "holds no record" in err
    assert not (tmp_path / "out").exists()


def test_div_validate_on_a_directory_without_parquet_files_is_a_usage_error(tmp_path):
    d = tmp_path / "csvs"
    d.mkdir()
    (d / "records.csv").write_text("a,b\n")
    (d / "README").write_text("not an archive")
    code, err = _validate(d, tmp_path / "out")
    assert code == 2 and "holds no record" in err


def test_leapfrog_on_a_source_without_the_store_is_a_usage_error(sim, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    t = sim.truth["run"]
    code, err = _cli(
        [
            "leapfrog",
            "--store",
            t["store"],
            "--version",
            str(t["version"]),
            "--source",
            f"0={sim.archives[0]}",
            "--source",
            f"1={empty}",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 2 and f"1={empty}" in err and f"{t['store']}_v{t['version']}" in err


def _merged(sim, tmp_path):
    parent = tmp_path / "all-regions"
    for r, a in sim.archives.items():
        shutil.copytree(a, parent / f"dc-{r}")
    return parent


def test_several_regions_archives_under_one_directory_are_a_usage_error(sim, tmp_path):
    parent = _merged(sim, tmp_path)
    code, err = _validate(parent, tmp_path / "out")
    assert code == 2
    assert "twice" in err and "several regions' archives under one directory?" in err and str(parent) in err
    t = sim.truth["run"]
    code, err = _cli(
        [
            "leapfrog",
            "--store",
            t["store"],
            "--version",
            str(t["version"]),
            "--source",
            f"0={parent}",
            "--source",
            f"1={sim.archives[1]}",
            "--out",
            str(tmp_path / "lf"),
        ]
    )
    assert code == 2 and "twice" in err


def test_a_record_repeated_identically_is_read_once(sim, tmp_path):
    twice = tmp_path / "twice"
    shutil.copytree(sim.archives[0], twice / "a")
    shutil.copytree(sim.archives[0], twice / "b")
    code_twice, err = _validate(twice, tmp_path / "out-twice")
    code_once, _ = _validate(sim.archives[0], tmp_path / "out-once")
    assert code_twice == code_once, err
    import json

    s2 = json.loads((tmp_path / "out-twice" / "summary.json").read_text())
    s1 = json.loads((tmp_path / "out-once" / "summary.json").read_text())
    assert s2["records_read"] == s1["records_read"] > 0 and s2["findings"] == s1["findings"]


def test_relative_source_paths_reach_executors_absolute(sim, tmp_path, monkeypatch):
    monkeypatch.chdir(os.path.dirname(sim.archives[0]))
    spec = parse_source("0=dc-0")
    assert spec.uri == sim.archives[0]
    assert SourceSpec(0, "file://dc-0").uri == f"file://{sim.archives[0]}"
    assert SourceSpec(0, "kafka://h:9092").uri == "kafka://h:9092"
    t = sim.truth["run"]
    splits = plan({0: SourceSpec(0, "dc-0").uri}, f"{t['store']}_v{t['version']}")
    assert splits and all(os.path.isabs(s.uri) for s in splits)


@pytest.mark.kafka
def test_an_opened_source_never_shows_its_kafka_settings(embedded_kafka):
    from pipelines.core.sources import open_source

    src = open_source(SourceSpec(0, embedded_kafka.uri), {"client.id": "hunter2-secret"})
    assert "hunter2-secret" not in repr(src) and "hunter2-secret" not in str(src)
