"""`tidegauge demo`: the fault check on planted findings, the output directory rules, and one real demo run.

The fault check is what tells a first-time user that the product works, so it is tested on its own with
findings planted around a small truth.json: a fault found, missed, found with the wrong type, a false alarm
next to a fault that must cause nothing, and one anywhere else.
"""

from __future__ import annotations

import json

import pytest

from pipelines.cli import main as cli_main
from pipelines.demo.cut_step import (
    AFTER_FAULT_MS,
    CutFault,
    apply_changes,
    check_replay,
    check_snapshot,
    choose_cut,
    choose_fault,
    read_snapshot,
)
from pipelines.demo.job import (
    MARKER,
    DemoError,
    DemoOptions,
    check_faults,
    check_report,
    prepare_out,
    read_div_findings,
    read_leapfrog_findings,
    run_demo,
)

KEY = "186b65792d3030303030313732"  # Avro string "key-00000172"
OTHER_KEY = "186b65792d3030303030343336"

TRUTH = {
    "faults": [
        {
            "id": 1,
            "kind": "dropped",
            "region": 2,
            "partition": 1,
            "key": KEY,
            "expect": {
                "leapfrog": [
                    {"type": "VALUE_MISMATCH", "region_a": 0, "region_b": 2, "partition": 1, "key": KEY},
                    {"type": "VALUE_MISMATCH", "region_a": 1, "region_b": 2, "partition": 1, "key": KEY},
                ],
                "div": [],
            },
        },
        {
            "id": 2,
            "kind": "gap",
            "region": 1,
            "partition": 0,
            "key": OTHER_KEY,
            "expect": {
                "leapfrog": [],
                "div": [
                    {
                        "region": 1,
                        "topic": "s_rt",
                        "partition": 0,
                        "offset": 50,
                        "type": "MISSING",
                        "fatal": False,
                    }
                ],
            },
        },
        {
            "id": 3,
            "kind": "failover",
            "region": 0,
            "partition": 2,
            "key": None,
            "detail": {
                "new_leader": {"term": 2},
                "resumed_from_vt_heartbeat_offset": 700,
                "reapplied_vt_records": 9,
            },
            "expect": {"leapfrog": [], "div": []},
        },
    ]
}
ALL_LF = {("VALUE_MISMATCH", 0, 2, 1, KEY), ("VALUE_MISMATCH", 1, 2, 1, KEY)}
ALL_DIV = {(1, "s_rt", 0, 50, "MISSING", False)}


def by_subject(checks):
    return {c.subject: c for c in checks}


def test_every_fault_found_and_nothing_else_is_all_ticks():
    checks = check_faults(TRUTH, set(ALL_LF), set(ALL_DIV))
    assert all(c.ok for c in checks), [c.line() for c in checks]
    lines = by_subject(checks)
    assert (
        "found by leapfrog VALUE_MISMATCH regions 0-2 partition 1 key 'key-00000172'"
        in lines["#1 dropped (region 2 partition 1)"].detail
    )
    assert "MISSING in region 1 s_rt[0] at offset 50" in lines["#2 gap (region 1 partition 0)"].detail
    assert "no false alarm" in lines["#3 failover (region 0 partition 2)"].detail
    assert lines["leapfrog: nothing else"].line().startswith("✓")


def test_a_missed_finding_fails_its_fault_only():
    checks = by_subject(check_faults(TRUTH, {("VALUE_MISMATCH", 0, 2, 1, KEY)}, set()))
    dropped, gap = checks["#1 dropped (region 2 partition 1)"], checks["#2 gap (region 1 partition 0)"]
    assert not dropped.ok and "regions 1-2" in dropped.detail and "regions 0-2" not in dropped.detail
    assert not gap.ok and "MISSING in region 1 s_rt[0] at offset 50" in gap.detail
    assert checks["#3 failover (region 0 partition 2)"].ok and checks["leapfrog: nothing else"].ok


def test_a_finding_of_the_wrong_type_is_blamed_on_its_fault_not_on_a_neighbour():
    truth = json.loads(json.dumps(TRUTH))
    truth["faults"][2]["partition"] = 1  # the failover happened where the wrongly typed finding is
    found = {("MISSING_IN_A", 0, 2, 1, KEY), ("VALUE_MISMATCH", 1, 2, 1, KEY)}
    checks = by_subject(check_faults(truth, found, set(ALL_DIV)))
    dropped = checks["#1 dropped (region 2 partition 1)"]
    assert not dropped.ok and "reported as MISSING_IN_A instead" in dropped.detail
    assert checks["#3 failover (region 0 partition 1)"].ok
    assert checks["leapfrog: nothing else"].ok


def test_a_false_alarm_where_a_quiet_fault_happened_fails_that_fault_and_nothing_else():
    extra = ("VALUE_MISMATCH", 0, 1, 2, OTHER_KEY)  # regions 0-1, partition 2: where the failover was
    checks = by_subject(check_faults(TRUTH, ALL_LF | {extra}, set(ALL_DIV)))
    assert not checks["#3 failover (region 0 partition 2)"].ok
    assert "key-00000436" in checks["#3 failover (region 0 partition 2)"].detail
    assert not checks["leapfrog: nothing else"].ok
    assert checks["#1 dropped (region 2 partition 1)"].ok


def test_a_false_alarm_anywhere_fails_nothing_else():
    extra = (2, "s_v1", 0, 9, "CORRUPT", True)
    checks = by_subject(check_faults(TRUTH, set(ALL_LF), ALL_DIV | {extra}))
    assert not checks["div validate: nothing else"].ok
    assert "CORRUPT (fatal) in region 2 s_v1[0] at offset 9" in checks["div validate: nothing else"].detail
    assert checks["#3 failover (region 0 partition 2)"].ok  # region 2 is not where it happened


def _report(failed: list[str], not_run: list[str] = ()) -> dict:
    names = ["consistency", "integrity", "decoding", "heartbeats", "lag", "coverage"]
    suites = [{"name": n, "success": None if n in not_run else n not in failed} for n in names]
    return {
        "expectations": {"suites": suites},
        "verdict": {"overall": "FAIL", "regions": {"status": "DIVERGENT"}, "logs": {"status": "LOGS WHOLE"}},
    }


def test_the_report_must_fail_exactly_the_checks_the_faults_break():
    assert check_report(TRUTH, _report(["consistency"])).ok
    assert not check_report(TRUTH, _report([])).ok  # a divergence was injected: consistency must fail
    wrong = check_report(TRUTH, _report(["consistency", "lag"]))
    assert not wrong.ok and "failed lag that no fault breaks" in wrong.detail
    assert not check_report(TRUTH, _report(["consistency"], not_run=["lag"])).ok
    quiet = {"faults": [TRUTH["faults"][2]]}
    assert check_report(quiet, _report([])).ok


def test_out_must_be_new_empty_or_an_earlier_demo(tmp_path):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.txt").write_text("keep me")
    with pytest.raises(DemoError, match="not empty"):
        prepare_out(mine)
    assert (mine / "thesis.txt").exists()
    assert cli_main(["demo", "--out", str(mine)]) == 2

    earlier = tmp_path / "demo"
    (earlier / "history").mkdir(parents=True)
    (earlier / "history" / "run.parquet").write_bytes(b"x")
    (earlier / "leapfrog").mkdir()
    (earlier / MARKER).write_text("{}")
    prepare_out(earlier)
    assert sorted(p.name for p in earlier.iterdir()) == ["history"]  # replaced, but the report history stays


def test_too_few_records_is_bad_usage(tmp_path, capsys):
    assert cli_main(["demo", "--out", str(tmp_path / "d"), "--records", "100"]) == 2
    assert "--records 100" in capsys.readouterr().err


# Checks that fail today because of a known bug elsewhere, each with the reason; the demo test requires them to
# fail, so that fixing the bug makes the test say to remove the entry. None today.
KNOWN_MISMATCHES: dict[str, str] = {}


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
def test_demo_finds_every_injected_fault_and_nothing_else(demo_run):
    result, lines = demo_run  # the test run's one demo (conftest.py), also read by tests/test_docs.py
    text = "\n".join(lines)
    assert [s.name for s in result.steps] == [
        "simulate",
        "spark",
        "leapfrog",
        "repair plan",
        "repair apply",
        "replicate",
        "lag",
        "div validate",
        "div restore",
        "report",
        "leapfrog",
        "repair verify",
        "cut",
    ], text
    assert all(s.ok for s in result.steps), text
    truth = json.loads((result.out / "sim" / "truth.json").read_text())
    assert {f["kind"] for f in truth["faults"]} == {
        "dropped",
        "poisoned",
        "failover",
        "duplicate",
        "gap",
        "corrupt",
        "compaction",
    }
    checks = by_subject(result.checks)
    assert len([c for c in result.checks if c.subject.startswith("#")]) == len(truth["faults"])
    for subject, check in checks.items():
        if subject in KNOWN_MISMATCHES:
            assert not check.ok and KNOWN_MISMATCHES[subject] in check.detail, check.line()
        else:
            assert check.ok, check.line()
    assert {"leapfrog: nothing else", "div validate: nothing else", "div restore", "report"} <= set(checks)
    # the repair loop: a write per injected divergence, applied into region 0's RT during the simulation's repair
    # window, replicated by every region's leaders; each planned key agrees now, and no new divergence
    repair = [c for c in checks if c.startswith(("repair ", "leapfrog after the repair"))]
    assert len(repair) == 3, sorted(checks)
    window = truth["repair_window"]
    plan = json.loads((result.out / "repair" / "plan" / "summary.json").read_text())
    assert plan["writes"] == plan["divergent_keys"] > 0 and window["closed_by"] == "done"
    assert sum(window["rt_records"]["0"].values()) > plan["writes"]  # the writes and their DIV segments
    verify = json.loads((result.out / "repair" / "verify" / "summary.json").read_text())
    assert verify["by_status"]["converged"] == verify["planned_keys"] == plan["writes"]
    # issue 41: after the repair converged the regions, leapfrog over the archives keeps its findings as history,
    # healed, and exits 0 (the nightly alert stops)
    after = json.loads((result.out / "repair" / "leapfrog-after" / "summary.json").read_text())
    assert after["exit_code"] == 0 and after["verdict"] == "clean", after["totals"]
    assert (
        sum(after["totals"]["open_findings"].values()) == 0 < sum(after["totals"]["healed_findings"].values())
    )
    assert "the repair made the regions agree" in text
    assert result.exit_code == (1 if KNOWN_MISMATCHES else 0)

    # the fault check agrees with what the jobs wrote, and the user is told where the report is
    assert read_leapfrog_findings(result.out / "leapfrog") and read_div_findings(result.out / "div")
    assert result.report_html == result.out / "report" / "report.html" and result.report_html.exists()
    assert f"Report: {result.report_html}" in text and result.report_html.as_uri() in text
    marker = json.loads((result.out / MARKER).read_text())
    assert marker["exit_code"] == result.exit_code and len(marker["fault_check"]) == len(result.checks)
    for name in ("lag/lag.json", "leapfrog/summary.json", "div/summary.json", "report/report.json"):
        assert (result.out / name).exists(), name
    assert any((result.out / "history").iterdir())

    # the cut: C, two regions' snapshots (the fault's key as the fault left it in each) and the changes after it,
    # each checked against the simulator's truth
    cut_lines = [c for c in checks if c.startswith("cut at ") or "snapshot" in c]
    assert len(cut_lines) == 5, sorted(checks)
    snapshots = [checks[c] for c in cut_lines if c.endswith("snapshot at the cut")]
    assert any("lost here" in c.detail or "poisoned here" in c.detail for c in snapshots), snapshots
    assert any("holds its write" in c.detail for c in snapshots), snapshots
    regions = sorted(int(p.name.removeprefix("region-")) for p in (result.out / "cut").glob("region-*"))
    assert len(regions) == 2
    cut = json.loads((result.out / "cut" / f"region-{regions[0]}" / "cut.json").read_text())
    assert cut["from"] == "rt" and cut["store"] == truth["run"]["store"]
    assert truth["run"]["start_ms"] < cut["at_ms"] < truth["run"]["last_write_ms"]
    for x in regions:
        assert any((result.out / "cut" / f"region-{x}" / "snapshot").glob("*.parquet"))
        changes = json.loads((result.out / "cut" / f"changes-{x}" / "summary.json").read_text())
        assert changes["state"]["used"] == "cut" and changes["delivered"] > 0 and changes["bulk_load"] == 0


@pytest.mark.spark
@pytest.mark.slow
def test_the_demo_on_real_brokers_finds_every_fault_and_nothing_else(spark, kafka_jars, tmp_path):
    """`demo --kafka real`: the same simulation on an Apache Kafka broker per region, the same verdict."""
    lines: list[str] = []
    result = run_demo(
        DemoOptions(out=str(tmp_path / "demo"), seed=2, kafka="real"), emit=lines.append, spark=spark
    )
    text = "\n".join(lines)
    assert "3 regions on Apache Kafka brokers" in text and "one Apache Kafka broker each" in text, text
    truth = json.loads((result.out / "sim" / "truth.json").read_text())
    assert (truth["run"]["kafka"], truth["run"]["brokers_per_region"]) == ("real", 1)
    failed = [c.line() for c in result.checks if not c.ok]
    assert result.matched and not failed and result.exit_code == 0, text
    assert json.loads((result.out / MARKER).read_text())["options"]["kafka"] == "real"


def test_demo_on_real_brokers_without_maven_says_what_to_install(tmp_path, monkeypatch, capsys):
    from sim import brokers

    monkeypatch.setenv("TIDEGAUGE_CACHE_DIR", str(tmp_path / "cache"))
    which = brokers.shutil.which
    monkeypatch.setattr(
        brokers.shutil, "which", lambda name, *a, **k: None if name == "mvn" else which(name, *a, **k)
    )
    for argv in (["demo"], ["demo", "--watch"]):
        out = tmp_path / "-".join(argv)
        assert cli_main([*argv, "--kafka", "real", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "--kafka real:" in err and "apt-get install -y maven" in err, err


# -- the cut's checks -----------------------------------------------------------------------------------------

K1, K2 = b"\x18key-00000001", b"\x18key-00000002"
WRITTEN = ("PUT", b"v", 1_700_000_000_100, 0, 7)  # region 0's write at RT offset 7
FAULT = CutFault(4, "dropped", 1, K1, (0, 7), faulted=2, spared=0, written=WRITTEN)


def test_the_cut_check_passes_a_snapshot_equal_to_the_truth_and_shows_the_fault():
    spared = {(1, K1): WRITTEN, (1, K2): ("PUT", b"bulk", 1_699_999_940_000, None, None)}
    truth_spared = {**spared, (1, K2): ("PUT", b"bulk", None, None, None)}  # bulk rows: no DCR timestamp
    ok, detail = check_snapshot(0, spared, truth_spared, 0, FAULT)
    assert ok and "holds its write dc-0@7" in detail, detail
    faulted = {(1, K1): ("PUT", b"old", 1_700_000_000_050, 1, 3)}
    ok, detail = check_snapshot(2, faulted, dict(faulted), 0, FAULT)
    assert ok and "'key-00000001': PUT from dc-1@3 (its write dc-0@7 lost here)" in detail, detail


def test_the_cut_check_fails_a_snapshot_of_another_time_or_one_that_hides_the_fault():
    truth = {(1, K1): WRITTEN}
    earlier = {(1, K1): ("PUT", b"old", 1_700_000_000_050, 1, 3)}  # the key as it was before the cut
    ok, detail = check_snapshot(0, earlier, truth, 0, FAULT)
    assert not ok and "1 of 1 keys differ from the truth: 1:'key-00000001' is PUT from dc-1@3" in detail
    assert "not its write dc-0@7" in detail
    ok, detail = check_snapshot(2, truth, truth, 0, FAULT)  # the faulted region holding the write: no fault
    assert not ok and "the fault is not seen" in detail
    ok, detail = check_snapshot(0, truth, truth, 1, FAULT)
    assert not ok and "1 rows not exact" in detail
    ok, detail = check_replay(0, {}, truth, 0)
    assert not ok and "differ from the final state" in detail


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
def test_the_demos_snapshot_against_the_truth_of_another_time_fails(demo_run):
    """The check is sharp on a real run: the demo's own snapshot passes against the truth at its cut and fails
    against the truth one second earlier; the snapshot without one change after the cut is not the final state."""
    from sim.truth_at import RunTruth

    result, _ = demo_run
    truth = RunTruth.load(result.out / "sim")
    x = min(int(p.name.removeprefix("region-")) for p in (result.out / "cut").glob("region-*"))
    at_ms = json.loads((result.out / "cut" / f"region-{x}" / "cut.json").read_text())["at_ms"]
    got, not_exact = read_snapshot(result.out / "cut" / f"region-{x}" / "snapshot")
    assert check_snapshot(x, got, truth.state_at(x, at_ms), not_exact, None)[0]
    ok, detail = check_snapshot(x, got, truth.state_at(x, at_ms - 1000), not_exact, None)
    assert not ok and "differ from the truth" in detail, detail
    final, n = apply_changes(got, result.out / "cut" / f"changes-{x}" / "changes")
    assert check_replay(x, final, truth.final_state(x), n)[0]
    some_key = next(k for k in final if k not in got or final[k] != got[k])
    final[some_key] = got.get(some_key, ("DELETE", None, None, None, None))  # one change after the cut lost
    assert not check_replay(x, final, truth.final_state(x), n)[0]


def test_the_cut_shows_a_fault_outside_the_compacted_regions_and_waits_for_one_when_none_is_visible():
    """A write dropped in regions 0 and 1, region 0 compacted: the faulted region is 1 (a snapshot of a compacted
    region can show a record the cleaner superseded); before any fault is visible, the cut moves to just after
    the first fault's write."""
    truth = {
        "run": {"start_ms": 0, "last_write_ms": 4000},
        "faults": [
            {"id": 8, "kind": "compaction", "region": 0, "partition": 1, "key": None, "time_ms": None},
            {
                "id": 4,
                "kind": "dropped",
                "region": 2,
                "partition": 1,
                "key": K1.hex(),
                "rt_offset": 7,
                "time_ms": 2500,
                "detail": {"dropped_in": [0, 1]},
            },
        ],
    }
    held = {2: {(1, K1): ("PUT", b"v", 2500, 2, 7)}, 1: {}, 0: {}}

    def state_at(x, at_ms):
        return held[x] if at_ms >= 2500 else {}

    at_ms, fault = choose_cut(truth, state_at)
    assert at_ms == 2500 + AFTER_FAULT_MS and (fault.faulted, fault.spared) == (1, 2)
    assert choose_fault(truth, 2000, lambda x: state_at(x, 2000)) is None  # not written yet at the midpoint
