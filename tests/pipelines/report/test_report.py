"""Tests of `tidegauge report`: each GX suite fails when, and only when, its planted problem is present;
thresholds and suites can be overridden; history tells new / still / healed; data cannot inject markup."""

from __future__ import annotations

import datetime as dt
import html
import json
import os
import pathlib
import re
import socket
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from report_fixtures import HOSTILE, PROBLEMS, build_outputs

from pipelines.cli import main as cli_main
from pipelines.report.expectations import load_expectations
from pipelines.report.job import ExpectationsConfigError, InputError, run_report

DAY = dt.timedelta(days=1)
T0 = dt.datetime(2026, 9, 20, 6, 0, tzinfo=dt.UTC)


def _report(
    tmp_path: pathlib.Path,
    problems=(),
    *,
    lag=True,
    history=None,
    expectations=None,
    now=T0,
    name="run",
    **fixture,
):
    outputs = build_outputs(tmp_path / f"in-{name}", problems, **fixture)
    result = run_report(
        outputs.leapfrog,
        outputs.div,
        tmp_path / f"out-{name}",
        lag_dir=outputs.lag if lag else None,
        history_dir=history,
        expectations_file=expectations,
        now=now,
    )
    report = json.loads(result.json_path.read_text(encoding="utf-8"))
    return result, report


def _failed_suites(report: dict) -> set[str]:
    return {s["name"] for s in report["expectations"]["suites"] if s["success"] is False}


def test_clean_outputs_pass_every_check(tmp_path):
    result, report = _report(tmp_path)
    assert result.exit_code == 0
    assert _failed_suites(report) == set()
    assert {s["name"] for s in report["expectations"]["suites"]} == set(load_expectations().suites)
    assert all(s["success"] is True for s in report["expectations"]["suites"])
    v = report["verdict"]
    assert (v["overall"], v["regions"]["status"], v["logs"]["status"]) == ("PASS", "CONSISTENT", "LOGS WHOLE")
    assert [r["over_limit"] for r in v["lag"]["by_region"]] == [False, False, False]
    page = result.html_path.read_text(encoding="utf-8")
    assert 'data-verdict="PASS"' in page and "CONSISTENT" in page and "LOGS WHOLE" in page


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
def test_each_suite_fails_only_on_its_planted_problem(tmp_path, problem):
    result, report = _report(tmp_path, [problem])
    expected = {PROBLEMS[problem]} - {None}
    assert _failed_suites(report) == expected
    # a check of the evidence (a record not decoded, a partition not read) makes the report partial, not failed
    evidence_only = problem in ("undecodable_leapfrog", "undecodable_div", "div_unreadable")
    assert result.exit_code == (0 if not expected else 3 if evidence_only else 1)
    assert report["exit_code"] == result.exit_code


def test_failed_expectation_names_the_offending_rows_and_the_page_links_them(tmp_path):
    result, report = _report(tmp_path, ["divergence", "lag", "fatal_div"])
    suites = {s["name"]: s for s in report["expectations"]["suites"]}
    [divergence] = suites["consistency"]["expectations"]
    assert sorted((r["region_a"], r["region_b"], r["partition"]) for r in divergence["unexpected_rows"]) == [
        (0, 1, 1),
        (1, 2, 0),
    ]
    lag_rows = [r for e in suites["lag"]["expectations"] for r in e["unexpected_rows"]]
    assert [(r["vt_region"], r["partition"], r["source_region"]) for r in lag_rows] == [(2, 1, 0)]
    # the raw GX result is kept too
    gx_results = suites["consistency"]["gx_validation_result"]["results"]
    assert gx_results[0]["expectation_config"]["type"] == "expect_column_values_to_be_between"
    assert gx_results[0]["expectation_config"]["kwargs"]["max_value"] == 0

    page = result.html_path.read_text(encoding="utf-8")
    for anchor in ("lfg-0-1-p1", "lfg-1-2-p0", "lag-2-p1-s0"):
        assert f'href="#{anchor}"' in page, anchor
        assert f'id="{anchor}"' in page, anchor
    assert re.search(r'href="#dvg-1-p0-[0-9a-f]{10}"', page)
    # the proving row shows the key in hex, offsets and vectors
    assert "6b65792d3137" in page  # b"key-17"
    assert "[40, 17, -1]" in page and "offset 120" in page
    assert "00ff62696e" in page  # a binary key


def test_lag_suite_is_not_run_without_lag_output(tmp_path):
    result, report = _report(tmp_path, lag=False)
    assert result.exit_code == 0
    lag = next(s for s in report["expectations"]["suites"] if s["name"] == "lag")
    assert lag["success"] is None and "--lag" in lag["skipped_reason"]
    assert report["verdict"]["lag"]["measured"] is False
    assert "NOT MEASURED" in result.html_path.read_text(encoding="utf-8")


def test_thresholds_from_an_expectations_file_change_the_outcome(tmp_path):
    loose = tmp_path / "loose.yaml"
    loose.write_text("thresholds:\n  max_lag_ms: 1800000\n  max_divergences_per_pair: 1\n")
    result, report = _report(tmp_path, ["lag", "divergence"], expectations=loose, name="loose")
    assert result.exit_code == 0, report["verdict"]
    # the data still diverges: the words say so even though the checks tolerate it
    assert report["verdict"]["regions"]["status"] == "DIVERGENT"
    assert report["verdict"]["overall"] == "PASS"
    assert report["thresholds"]["max_lag_ms"] == 1800000
    assert report["thresholds"]["max_pending_percent"] == 5.0  # untouched thresholds keep their default

    strict = tmp_path / "strict.yaml"
    strict.write_text("thresholds:\n  max_lag_ms: 1000\n")  # the clean fixture lags about 1.5 s
    result, report = _report(tmp_path, expectations=strict, name="strict")
    assert result.exit_code == 1
    assert _failed_suites(report) == {"lag"}


def test_a_suite_in_the_expectations_file_replaces_the_default_suite(tmp_path):
    custom = tmp_path / "custom.yaml"
    custom.write_text(
        "suites:\n"
        "  coverage:\n"
        "    table: pairs\n"
        "    expectations:\n"
        "      - type: expect_column_values_to_be_between\n"
        "        column: skipped_pairs\n"
        "        max_value: 3\n"
        "        meaning: at most 3 records skipped as lag per pair and partition\n"
    )
    result, report = _report(tmp_path, expectations=custom)
    coverage = next(s for s in report["expectations"]["suites"] if s["name"] == "coverage")
    assert [e["column"] for e in coverage["expectations"]] == ["skipped_pairs"]
    assert coverage["success"] is False and result.exit_code == 1  # the fixture skips 4 per pair


@pytest.mark.parametrize(
    "text, message",
    [
        ("thresholds:\n  max_lag_ms: fast\n", "max_lag_ms"),
        (
            "suites:\n  lag:\n    table: lag\n    expectations:\n      - type: expect_column_values_to_be_between\n"
            "        column: time_lag_ms\n        max_value: $max_lagg_ms\n",
            "max_lagg_ms",
        ),
        (
            "suites:\n  lag:\n    table: lag\n    expectations:\n      - type: expect_values_to_be_nice\n"
            "        column: time_lag_ms\n",
            "expect_values_to_be_nice",
        ),
        ("suites:\n  x:\n    table: nowhere\n    expectations: []\n", "nowhere"),
        ("suites: [1, 2\n", "YAML"),
    ],
)
def test_bad_expectations_file_is_named(tmp_path, text, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ExpectationsConfigError, match=re.escape(message)) as info:
        load_expectations(bad)
    assert str(bad) in str(info.value)


def test_unknown_column_in_a_suite_is_a_config_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "suites:\n  coverage:\n    table: pairs\n    expectations:\n"
        "      - type: expect_column_values_to_not_be_null\n        column: no_such_column\n"
    )
    with pytest.raises(ExpectationsConfigError, match="no_such_column"):
        _report(tmp_path, expectations=bad)


def test_history_tells_new_still_and_healed_across_three_runs(tmp_path):
    history = tmp_path / "history"
    _, first = _report(
        tmp_path, history=history, now=T0, name="1", divergent_keys=[b"a", b"b"], fatal_offsets=[10]
    )
    assert first["trends"]["previous_run_at"] is None
    assert first["verdict"]["changes"]["compared_with"] is None

    result2, second = _report(
        tmp_path, history=history, now=T0 + DAY, name="2", divergent_keys=[b"b", b"c"], fatal_offsets=[10, 11]
    )
    trends = second["trends"]
    assert trends["previous_run_at"] == T0.isoformat()
    keys = {k: [d["key_hex"] for d in trends["divergences"][k]] for k in ("new", "still", "healed")}
    assert keys == {"new": [b"c".hex()], "still": [b"b".hex()], "healed": [b"a".hex()]}
    offsets = {k: [d["offset"] for d in trends["div_findings"][k]] for k in ("new", "still", "healed")}
    assert offsets == {"new": [11], "still": [10], "healed": []}
    assert second["verdict"]["changes"]["divergences"] == {"new": 1, "still": 1, "healed": 1}

    result3, third = _report(tmp_path, history=history, now=T0 + 2 * DAY, name="3", divergent_keys=[b"c"])
    trends = third["trends"]
    assert trends["previous_run_at"] == (T0 + DAY).isoformat()
    keys = {k: [d["key_hex"] for d in trends["divergences"][k]] for k in ("new", "still", "healed")}
    assert keys == {"new": [], "still": [b"c".hex()], "healed": [b"b".hex()]}
    assert sorted(d["offset"] for d in trends["div_findings"]["healed"]) == [10, 11]
    assert [r["divergences"] for r in trends["runs"]] == [2, 2, 1]
    assert [r["fatal_div_findings"] for r in trends["runs"]] == [1, 2, 0]
    assert len(list(history.glob("run-*.parquet"))) == 3
    assert [p.name for p in history.glob(".*")] == [
        ".tidegauge"
    ]  # the marker; no temporary files left behind

    page = result3.html_path.read_text(encoding="utf-8")
    assert 'data-plot="trends"' in page
    assert "HEALED" in page and "STILL" in page
    page2 = result2.html_path.read_text(encoding="utf-8")
    assert 'class="badge st-new">NEW' in page2


def test_history_of_another_store_and_damaged_files_are_not_compared(tmp_path):
    history = tmp_path / "history"
    history.mkdir()
    (history / "run-20260101T000000000000Z-deadbeef.parquet").write_bytes(b"not parquet")
    result, report = _report(tmp_path, history=history, divergent_keys=[b"a"])
    assert result.exit_code == 1  # the divergence, not the damaged file
    assert report["trends"]["previous_run_at"] is None
    assert any("deadbeef" in w for w in report["warnings"])
    assert "deadbeef" in result.html_path.read_text(encoding="utf-8")


def test_hostile_strings_are_escaped_everywhere(tmp_path):
    result, report = _report(tmp_path, ["fatal_div", "divergence"], hostile=True)
    page = result.html_path.read_text(encoding="utf-8")
    lowered = page.lower()
    assert "<script" not in lowered
    assert "<img" not in lowered
    assert "onerror=alert(1)>" not in lowered.replace("&gt;", "")  # never as markup
    assert html.escape(HOSTILE, quote=True) in page  # shown as text, in the store name, topic and detail
    assert HOSTILE.encode().hex() in page  # the hostile key, as hex
    # anchors are made of safe characters whatever the data
    ids = re.findall(r'\bid="([^"]*)"', page)
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+", a) for a in ids), [
        a for a in ids if not re.fullmatch(r"[A-Za-z0-9_.-]+", a)
    ]
    assert len(ids) == len(set(ids))  # no duplicate ids, also across the inline plots
    # the JSON twin keeps the data as data
    assert report["summary"]["store"].endswith(HOSTILE)


def test_page_is_self_contained(tmp_path):
    result, _ = _report(tmp_path, ["divergence", "fatal_div", "lag"])
    page = result.html_path.read_text(encoding="utf-8")
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"<(link|script|iframe|object|embed|img)\b", page, re.I)
    assert not re.search(r"\bsrc\s*=", page, re.I)
    hrefs = re.findall(r"\bhref=\"([^\"]*)\"", page)
    assert all(h.startswith("#") for h in hrefs), [h for h in hrefs if not h.startswith("#")]
    assert not re.search(r"url\(\s*['\"]?(https?:|//)", page, re.I)
    assert not re.search(r"@import", page, re.I)
    for plot in ("lag", "divergences", "div", "coverage"):
        assert f'data-plot="{plot}"' in page, plot


def test_report_makes_no_network_connection_and_prints_nothing(tmp_path, monkeypatch, capfd):
    attempts = []
    real_connect = socket.socket.connect

    def guarded_connect(self, address):
        if not (isinstance(address, tuple) and address[0] in ("127.0.0.1", "::1", "localhost")):
            attempts.append(address)
            raise OSError("network disabled by the test")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    capfd.readouterr()
    result, _ = _report(tmp_path, ["divergence"], history=tmp_path / "h")
    out, err = capfd.readouterr()
    assert attempts == []
    assert result.exit_code == 1
    assert out == "" and err == ""  # no progress bars, warnings or logs from GX
    assert os.environ.get("GX_ANALYTICS_ENABLED") == "false"


def test_input_errors_name_the_file(tmp_path):
    outputs = build_outputs(tmp_path / "in")
    (outputs.div / "summary.json").write_text("{not json")
    with pytest.raises(InputError, match=re.escape(str(outputs.div / "summary.json"))):
        run_report(outputs.leapfrog, outputs.div, tmp_path / "out")

    outputs = build_outputs(tmp_path / "in2")
    for f in (outputs.leapfrog / "inconsistencies").iterdir():
        f.unlink()
    (outputs.leapfrog / "inconsistencies").rmdir()
    with pytest.raises(InputError, match="inconsistencies"):
        run_report(outputs.leapfrog, outputs.div, tmp_path / "out")

    outputs = build_outputs(tmp_path / "in3")
    pq.write_table(pa.table({"region": [1]}), outputs.div / "errors" / "part-00000-c000.snappy.parquet")
    with pytest.raises(InputError, match="lacks the column"):
        run_report(outputs.leapfrog, outputs.div, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written on bad input


def test_an_empty_findings_directory_is_an_empty_dataset(tmp_path):
    outputs = build_outputs(tmp_path / "in")
    for f in (outputs.div / "errors").iterdir():
        f.unlink()
    result = run_report(outputs.leapfrog, outputs.div, tmp_path / "out")
    assert result.exit_code == 0


def test_cli_exit_codes(tmp_path, capsys):
    clean = build_outputs(tmp_path / "clean")
    assert (
        cli_main(
            [
                "report",
                "--leapfrog",
                str(clean.leapfrog),
                "--div",
                str(clean.div),
                "--lag",
                str(clean.lag),
                "--out",
                str(tmp_path / "o1"),
            ]
        )
        == 0
    )
    assert "PASS" in capsys.readouterr().out
    bad = build_outputs(tmp_path / "bad", ["fatal_div"])
    assert (
        cli_main(
            ["report", "--leapfrog", str(bad.leapfrog), "--div", str(bad.div), "--out", str(tmp_path / "o2")]
        )
        == 1
    )
    assert "DIV ERRORS" in capsys.readouterr().out
    assert (
        cli_main(
            [
                "report",
                "--leapfrog",
                str(tmp_path / "missing"),
                "--div",
                str(bad.div),
                "--out",
                str(tmp_path / "o3"),
            ]
        )
        == 2
    )
    assert "--leapfrog" in capsys.readouterr().err
    # a directory given to the wrong flag
    assert (
        cli_main(["report", "--leapfrog", str(bad.div), "--div", str(bad.div), "--out", str(tmp_path / "o4")])
        == 2
    )
    assert "div validate" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli_main(["report", "--div", str(bad.div), "--out", str(tmp_path / "o5")])
    assert info.value.code == 2


def test_cli_help_teaches_flags_exit_codes_and_an_example(capsys):
    with pytest.raises(SystemExit):
        cli_main(["report", "--help"])
    text = capsys.readouterr().out
    for needle in (
        "--leapfrog DIR",
        "inconsistencies/",
        "errors/",
        "heartbeats/",
        "--history",
        "exit codes",
        "examples:",
        "report.html",
    ):
        assert needle in text, needle


def test_gx_import_survives_python_dash_c(tmp_path):
    """PySpark's Spark Connect module exits the process with 0 on import under `python -c`; we must not."""
    code = "from pipelines.report.expectations import _import_gx; _import_gx(); print('alive')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "alive" in proc.stdout, proc.stderr


def test_a_summary_that_disagrees_with_its_rows_is_flagged(tmp_path):
    outputs = build_outputs(tmp_path / "in", ["divergence"])
    summary_path = outputs.leapfrog / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["by_pair"][0]["findings"]["VALUE_MISMATCH"] += 5
    summary_path.write_text(json.dumps(summary))
    result = run_report(outputs.leapfrog, outputs.div, tmp_path / "out")
    report = json.loads(result.json_path.read_text())
    assert report["summary"]["divergences"]["total"] == 2  # the rows, which the page can show
    assert report["summary"]["divergences"]["summary_total"] == 7
    assert any("holds 2 rows" in w for w in report["warnings"])
    assert "holds 2 rows" in result.html_path.read_text(encoding="utf-8")


def test_leapfrog_failed_partitions_fail_the_heartbeat_check_of_the_right_region(tmp_path):
    outputs = build_outputs(tmp_path / "in")
    summary_path = outputs.leapfrog / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["by_region"] = [e for e in summary["by_region"] if (e["region"], e["partition"]) != (2, 1)]
    summary["failed_partitions"] = [
        {"partition": 1, "regions": [2], "error": "partition 1 has no records in [2]"}
    ]
    summary_path.write_text(json.dumps(summary))
    result = run_report(outputs.leapfrog, outputs.div, tmp_path / "out")
    report = json.loads(result.json_path.read_text())
    assert _failed_suites(report) == {"heartbeats"}
    [exp] = next(s for s in report["expectations"]["suites"] if s["name"] == "heartbeats")["expectations"]
    assert [(r["region"], r["partition"]) for r in exp["unexpected_rows"]] == [(2, 1)]
    assert "has no records in [2]" in result.html_path.read_text(encoding="utf-8")


def test_the_nightly_report_appends_to_the_same_history_night_after_night(tmp_path, capsys):
    """Found by the object-store tests: the second `report --history H` was refused (exit 2) because the history
    was checked as if it were an output to replace."""
    outputs = build_outputs(tmp_path / "in", ["divergence"])
    argv = ["report", "--leapfrog", str(outputs.leapfrog), "--div", str(outputs.div)]
    history = tmp_path / "history"
    codes = [
        cli_main([*argv, "--out", str(tmp_path / f"night-{n}"), "--history", str(history)]) for n in (1, 2)
    ]
    assert codes[0] == codes[1] == 1, capsys.readouterr().err
    assert len(list(history.glob("run-*.parquet"))) == 2
