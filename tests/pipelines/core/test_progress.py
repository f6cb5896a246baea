"""Long jobs say what they are doing, and every duration reads the same way (issue 16, finding 7).

`leapfrog` used to print nothing for ~40 s; `lag` showed "26530.9 h" and the report "95511319724 ms". Each job
now logs a progress line at least every interval (10 s by default; TIDEGAUGE_PROGRESS_S shortens it here) with
its stage and the records read so far, and every duration goes through `pipelines.core.progress.duration`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import time

import pytest
from small_sim import small_sim

from pipelines.cli import main
from pipelines.core.progress import Progress, duration


@pytest.mark.parametrize(
    "ms,text",
    [
        (None, "unknown"),
        (float("nan"), "unknown"),
        (0, "0 ms"),
        (850, "850 ms"),
        (12_345, "12.3 s"),
        (252_000, "4.2 min"),
        (11_160_000, "3.1 h"),
        (95_511_319_724, "1105.5 days"),
        (-1500, "-1.5 s"),
    ],
)
def test_one_human_format_for_durations(ms, text):
    assert duration(ms) == text


def test_a_progress_line_comes_at_least_every_interval_with_stage_and_records(caplog):
    caplog.set_level(logging.INFO, logger="tidegauge.progress")
    with Progress("job", every_s=0.05) as p:
        p.stage("reading region 0")
        for _ in range(4):
            p.add(1000)
            time.sleep(0.06)
    lines = [r.getMessage() for r in caplog.records if r.name == "tidegauge.progress"]
    assert len(lines) >= 3
    assert re.fullmatch(r"job: reading region 0, [\d,]+ records read, \d+ ms elapsed", lines[-1]), lines[-1]
    assert "4,000 records read" in lines[-1] or "3,000 records read" in lines[-1]


def test_a_short_job_prints_no_progress(caplog):
    caplog.set_level(logging.INFO, logger="tidegauge.progress")
    with Progress("job", every_s=5) as p:
        p.add(10)
    assert not [r for r in caplog.records if r.name == "tidegauge.progress"]


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    root = tmp_path_factory.mktemp("progress")
    sim = small_sim(root / "sim", seed=3, regions=2, records=600, keys=100)
    return {
        "root": root,
        "store": sim.store,
        "version": str(sim.version),
        "sources": [a for r, p in sorted(sim.archives.items()) for a in ("--source", f"{r}={p}")],
    }


def _progress_lines(caplog, argv, monkeypatch) -> list[str]:
    monkeypatch.setenv("TIDEGAUGE_PROGRESS_S", "0.05")
    caplog.set_level(logging.INFO, logger="tidegauge.progress")
    with contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    assert code in (0, 1, 3)
    return [r.getMessage() for r in caplog.records if r.name == "tidegauge.progress"]


@pytest.mark.slow
@pytest.mark.spark
def test_leapfrog_reports_progress_with_spark_tasks(archives, spark, caplog, monkeypatch):
    lines = _progress_lines(
        caplog,
        [
            "leapfrog",
            "--store",
            archives["store"],
            "--version",
            archives["version"],
            "--out",
            str(archives["root"] / "lf"),
            *archives["sources"],
        ],
        monkeypatch,
    )
    assert lines, "no progress line during a multi-second Spark job"
    assert all(
        line.startswith("leapfrog: ") and " records read" in line and " elapsed" in line for line in lines
    )
    assert any(re.search(r"tasks \d+/\d+ done, \d+ running", line) for line in lines), lines


@pytest.mark.slow
def test_div_validate_and_lag_report_progress(archives, caplog, monkeypatch):
    # slow the reading down so that a 0.05 s ticker fires inside each partition, whatever the machine
    from pipelines.core import sources

    original = sources.ArchiveSource.iter_partition

    def slow(self, *a, **k):
        for b in original(self, *a, **k):
            yield b
            time.sleep(0.2)  # after the batch: its records are counted when the ticker fires

    monkeypatch.setattr(sources.ArchiveSource, "iter_partition", slow)
    first = archives["sources"][1].split("=", 1)[1]
    lines = _progress_lines(
        caplog,
        ["div", "validate", "--source", f"0={first}", "--out", str(archives["root"] / "dv")],
        monkeypatch,
    )
    assert any(
        re.match(r"div validate: partition \d+/\d+ \(region 0 .*\), [\d,]+ records read", ln) for ln in lines
    ), lines
    caplog.clear()
    lines = _progress_lines(
        caplog,
        [
            "lag",
            "--store",
            archives["store"],
            "--version",
            archives["version"],
            "--out",
            str(archives["root"] / "lag"),
            *archives["sources"],
        ],
        monkeypatch,
    )
    assert any(re.match(r"lag: reading region \d .*, [\d,]+ records read", ln) for ln in lines), lines


def test_no_progress_line_before_the_first_stage(caplog):
    # while a job still opens its sources (an unreachable broker takes 10 s to give up) the one line is its error
    caplog.set_level(logging.INFO, logger="tidegauge.progress")
    with Progress("job", every_s=0.02):
        time.sleep(0.1)
    assert not [r for r in caplog.records if r.name == "tidegauge.progress"]
