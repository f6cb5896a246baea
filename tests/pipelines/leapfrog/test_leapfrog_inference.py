"""`leapfrog` infers --store and --version from the sources' topics as `lag` does (one rule,
`pipelines.core.topics`), and names the choices when the sources hold several store versions; `lag --now-ms`
says what it defaults to. No Spark: both end before a job starts."""

from __future__ import annotations

import pytest
from vt_builder import RegionVt, write_archive

from pipelines.cli import main


def _archive(tmp_path, region: int, topic: str) -> str:
    vt = RegionVt(region)
    vt.start_of_push()
    vt.end_of_push()
    vt.put(b"a", b"1", 0, 1)
    return f"--source={region}={write_archive([vt], tmp_path / f'dc-{region}', topic)}"


def test_several_store_versions_are_named_and_nothing_runs(tmp_path, capsys):
    sources = [_archive(tmp_path, 0, "shop_v1"), _archive(tmp_path, 1, "shop_v2")]
    assert main(["leapfrog", *sources, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "several version topics match (shop_v1, shop_v2): choose one with --store and --version" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
    # the same rule, the same words, in lag
    assert main(["lag", *sources]) == 2
    assert "several version topics match (shop_v1, shop_v2)" in capsys.readouterr().err


def test_a_version_no_source_holds_is_named(tmp_path, capsys):
    sources = [_archive(tmp_path, 0, "shop_v1"), _archive(tmp_path, 1, "cart_v3")]
    # only --version given: no topic of any store has it
    assert main(["leapfrog", *sources, "--version", "7", "--out", str(tmp_path / "out")]) == 2
    assert "no version topic *_v7 in the sources" in capsys.readouterr().err


def test_lag_now_ms_help_says_what_it_defaults_to(capsys):
    with pytest.raises(SystemExit):
        main(["lag", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: now)" not in text
    assert "on archives, the newest record's timestamp in the sources" in text
    assert "on Kafka, the current time" in text
