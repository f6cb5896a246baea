"""The nightly job after a repair (issue 41): its findings are kept as history, with a status, and the exit code,
summary.json's verdict, the stdout summary, `repair plan` and the report follow the open ones.

Two hand-built regions (tests/support/vt_builder.py) where region 1's leader poisoned key `p` and dropped key `m`,
and poisoned key `o` too; the repair re-emits the winners of `p` and `m` into region 0's RT, which region 1 applies
and region 0 (holding them already) ignores. `o` is not repaired. Night 1 is the log before the repair, night 2
the same log with the repair and the heartbeats after it: the demo's situation, at the size of a unit test."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from vt_builder import RegionVt, write_archive

from pipelines.cli import main

pytestmark = [pytest.mark.spark]

TOPIC = "heal_v1"


def _region(x: int, *, repaired: bool, poison_o: bool) -> RegionVt:
    vt = RegionVt(x)
    vt.start_of_push()
    vt.end_of_push()
    vt.put(b"a", b"1", 0, 10)
    vt.put(b"p", b"good" if x == 0 else b"poisoned", 0, 11)
    if x == 0:
        vt.put(b"m", b"2", 0, 12)  # region 1 dropped it
    vt.put(b"o", b"good" if x == 0 or not poison_o else b"poisoned", 0, 13)
    vt.heartbeat(0, 14, [14, 21])
    vt.heartbeat(1, 21, [14, 21])
    if repaired:  # the repair's writes 0@15 and 0@16: region 0 holds both values already and writes nothing
        if x == 1:
            vt.put(b"p", b"good", 0, 15)
            vt.put(b"m", b"2", 0, 16)
        vt.heartbeat(0, 17, [17, 22])
        vt.heartbeat(1, 22, [17, 22])
    return vt


def _archives(tmp_path, name: str, *, repaired: bool, poison_o: bool) -> list[str]:
    out = []
    for x in (0, 1):
        vt = _region(x, repaired=repaired, poison_o=poison_o)
        out.append(f"--source={x}={write_archive([vt], tmp_path / 'archives' / name / f'dc-{x}', TOPIC)}")
    return out


def _rows(out) -> dict[bytes, tuple[str, str]]:
    return {r["key"]: (r["type"], r["status"]) for r in pq.read_table(out / "inconsistencies").to_pylist()}


def test_after_a_repair_the_findings_are_healed_and_leapfrog_exits_0(spark, tmp_path, capsys):
    out = tmp_path / "lf"
    # no --store, no --version: the sources hold one store version
    code = main(["leapfrog", *_archives(tmp_path, "a", repaired=True, poison_o=False), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert _rows(out) == {b"p": ("VALUE_MISMATCH", "healed"), b"m": ("MISSING_IN_B", "healed")}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == "clean" and summary["exit_code"] == 0
    assert (summary["store"], summary["version"]) == ("heal", 1)
    totals = summary["totals"]
    assert sum(totals["open_findings"].values()) == 0 and sum(totals["healed_findings"].values()) == 2
    assert sum(totals["findings"].values()) == 2 and totals["divergent_keys"] == 0
    assert "0 open finding(s), 2 healed" in printed
    assert "pair 0-1 VALUE_MISMATCH healed: 1" in printed and "partition 0 key 70" in printed
    assert "verdict: clean (exit 0)" in printed

    # the report on this output alone (no --div): the regions are consistent, the healed findings history
    report = tmp_path / "report"
    assert main(["report", "--leapfrog", str(out), "--out", str(report)]) == 0, capsys.readouterr()
    said = capsys.readouterr().out
    assert "regions: CONSISTENT (0 divergent keys, 2 healed findings)" in said and "logs: NOT CHECKED" in said
    page = (report / "report.html").read_text()
    assert "Not checked: no <code>div validate</code> output was given" in page
    assert page.count(">healed</td>") == 2 and "st-healed" in page


def test_an_incremental_night_heals_night_1s_findings_and_plan_and_report_count_divergent_keys_alike(
    spark, tmp_path, capsys
):
    state, night1, night2 = tmp_path / "state", tmp_path / "n1", tmp_path / "n2"
    base = ["leapfrog", "--store", "heal", "--version", "1", "--state", str(state)]
    assert main([*base, *_archives(tmp_path, "n1", repaired=False, poison_o=True), "--out", str(night1)]) == 1
    assert set(_rows(night1).values()) == {("VALUE_MISMATCH", "open"), ("MISSING_IN_B", "open")}
    capsys.readouterr()
    sources = _archives(tmp_path, "n2", repaired=True, poison_o=True)
    assert main([*base, *sources, "--out", str(night2)]) == 1  # o is still open
    printed = capsys.readouterr().out
    # night 1's findings, read back from the state, take night 2's status
    assert _rows(night2) == {
        b"p": ("VALUE_MISMATCH", "healed"),
        b"m": ("MISSING_IN_B", "healed"),
        b"o": ("VALUE_MISMATCH", "open"),
    }
    summary = json.loads((night2 / "summary.json").read_text())
    assert summary["totals"]["divergent_keys"] == 1 and summary["verdict"] == "findings"
    assert "1 open finding(s), 2 healed; 1 divergent key(s)" in printed
    assert "pair 0-1 VALUE_MISMATCH open: 1\n    partition 0 key 6f" in printed

    # one definition of a divergent key: repair plan plans o alone (undecidable without the RTs: exit 1, named),
    # the report counts one
    plan = tmp_path / "plan"
    assert main(["repair", "plan", "--store", "heal", "--version", "1", *sources, "--leapfrog", str(night2), "--out", str(plan)]) == 1  # fmt: skip
    planned = json.loads((plan / "summary.json").read_text())
    assert planned["divergent_keys"] == 1 and [k["key"] for k in planned["undecidable_keys"]] == ["6f"]
    report = tmp_path / "report"
    assert main(["report", "--leapfrog", str(night2), "--out", str(report)]) == 1
    said = capsys.readouterr().out
    assert "regions: DIVERGENT (1 divergent key" in said
    page = (report / "report.html").read_text()
    assert "1 divergent key (1 open finding in 1 of 1 region pair)" in page
