"""What a job comparing regions learns before it reads a record (pipelines.leapfrog.regions): the store's region
count, and that no log is given for two regions.

Comparing a log with itself finds nothing, which would read as a clean run: one archive given for two regions is
a usage error (exit 2) naming both, whether the paths are the same or two copies hold the same records.
"""

from __future__ import annotations

import os
import shutil

import pytest
from leapfrog_histories import generated
from vt_fixtures import STORE, TOPIC, write_archives

from pipelines.cli import main
from pipelines.core.errors import UsageError
from pipelines.leapfrog.regions import (
    FROM_FLAG,
    FROM_HEARTBEATS,
    FROM_SOURCES,
    StoreRegions,
    same_logs,
    store_regions,
    tails,
)
from pipelines.leapfrog.source import plan


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    histories = [h for h in generated(6, (3, 3)) if h.mix.name in ("faults", "everything")]
    return write_archives(histories, tmp_path_factory.mktemp("regions") / "archives")


def _probe(sources):
    return tails(plan(sources, TOPIC), TOPIC)


def test_the_heartbeats_say_how_many_regions_the_store_has(archives):
    two = {0: archives[0], 2: archives[2]}
    assert store_regions([0, 2], _probe(two)) == StoreRegions(3, FROM_HEARTBEATS)
    assert store_regions([0, 1], _probe({0: archives[0], 1: archives[1]})) == StoreRegions(3, FROM_HEARTBEATS)
    assert store_regions([0, 2], _probe(two), given=5) == StoreRegions(5, FROM_FLAG)
    with pytest.raises(UsageError, match="--regions 2: .* names region 2"):
        store_regions([0, 2], _probe(two), given=2)
    # no heartbeat in view: the sources' ids are all there is to go by
    assert store_regions([0, 1], {}) == StoreRegions(2, FROM_SOURCES)


def test_distinct_archives_are_not_one_log(archives):
    assert same_logs(archives, _probe(archives)) == []


def test_one_path_given_twice_is_one_log(archives, tmp_path, monkeypatch):
    monkeypatch.chdir(os.path.dirname(archives[0]))
    link = tmp_path / "link"
    link.symlink_to(archives[0])
    for other in (archives[0] + "/", "dc-0", str(link), "file://" + archives[0]):
        assert same_logs({0: archives[0], 1: other}, {}) == [(0, 1)], other


def test_a_copy_of_one_region_under_two_ids_is_one_log(archives, tmp_path):
    copy = shutil.copytree(archives[1], tmp_path / "copy-of-dc-1")
    sources = {0: archives[0], 1: archives[1], 2: str(copy)}
    assert same_logs(sources, _probe(sources)) == [(1, 2)]


def _leapfrog(tmp_path, capsys, *flags: str) -> tuple[int, str]:
    code = main(["leapfrog", "--store", STORE, "--version", "1", *flags, "--out", str(tmp_path / "out")])
    return code, capsys.readouterr().err


def test_the_cli_refuses_a_copy_given_for_two_regions_naming_both(archives, tmp_path, capsys):
    copy = shutil.copytree(archives[1], tmp_path / "copy")
    code, err = _leapfrog(tmp_path, capsys, "--source", f"1={archives[1]}", "--source", f"0={copy}")
    assert code == 2, err
    assert f"--source 0={copy}" in err and f"--source 1={archives[1]}" in err
    assert "one log (byte-identical" in err
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_the_same_path_for_two_regions(archives, tmp_path, capsys):
    code, err = _leapfrog(tmp_path, capsys, "--source", f"0={archives[0]}", "--source", f"1={archives[0]}")
    assert code == 2 and "one log (the same location)" in err
    assert f"--source 0={archives[0]}" in err and f"--source 1={archives[0]}" in err
    assert not (tmp_path / "out").exists()


def test_a_source_id_past_the_given_region_count_is_a_usage_error(archives, tmp_path, capsys):
    flags = ("--source", f"0={archives[0]}", "--source", f"2={archives[2]}", "--regions", "2")
    code, err = _leapfrog(tmp_path, capsys, *flags)
    assert code == 2 and "--regions 2: the store's regions are 0..1, but a --source names region 2" in err
