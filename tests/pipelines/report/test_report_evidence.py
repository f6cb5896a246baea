"""The report never says CONSISTENT or LOGS WHOLE over evidence it did not read (issue 16, findings 3 and 7).

Reported: `div validate` on an empty directory exited 0 with 0 records read and `report` then said LOGS WHOLE;
the report counted undecodable records twice (80 for 40), once per job that met them.
"""

from __future__ import annotations

import json

from report_fixtures import build_outputs

from pipelines.report.job import run_report


def _report(tmp_path, edit=None, problems=()):
    outputs = build_outputs(tmp_path / "in", problems)
    if edit is not None:
        for job, path in (
            ("leapfrog", outputs.leapfrog / "summary.json"),
            ("div", outputs.div / "summary.json"),
        ):
            doc = json.loads(path.read_text())
            edit(job, doc)
            path.write_text(json.dumps(doc))
    result = run_report(outputs.leapfrog, outputs.div, tmp_path / "out", lag_dir=outputs.lag)
    return result, json.loads(result.json_path.read_text())


def test_zero_records_read_is_never_logs_whole(tmp_path):
    def empty(job, doc):
        if job == "div":
            doc["records_read"] = 0
            doc["partitions"] = []

    result, report = _report(tmp_path, empty)
    assert report["verdict"]["logs"]["status"] == "UNVERIFIED"
    assert result.exit_code != 0
    assert "LOGS WHOLE" not in result.html_path.read_text()


def test_outputs_without_a_verdict_prove_nothing(tmp_path):
    def older(job, doc):
        doc.pop("verdict", None)

    result, report = _report(tmp_path, older)
    v = report["verdict"]
    assert (v["regions"]["status"], v["logs"]["status"]) == ("UNVERIFIED", "UNVERIFIED")
    assert result.exit_code == 3  # every check passed, over evidence that is not known to be whole


def test_unverified_keys_are_not_consistent(tmp_path):
    def unverified(job, doc):
        if job == "leapfrog":
            doc["verdict"] = "partial"
            doc["totals"]["unverified_keys"] = 7

    result, report = _report(tmp_path, unverified)
    assert report["verdict"]["regions"]["status"] == "UNVERIFIED"
    assert report["verdict"]["regions"]["unverified_keys"] == 7
    page = result.html_path.read_text()
    assert "7 keys unverified" in page and "CONSISTENT" not in page.split("Are the logs whole?")[0]


def test_a_record_both_jobs_could_not_decode_is_counted_once(tmp_path):
    def same_record(
        job, doc
    ):  # leapfrog met the record div validate reports at region 0 partition 0 offset 77
        if job == "leapfrog":
            e = next(e for e in doc["by_region"] if (e["region"], e["partition"]) == (0, 0))
            e["undecodable"], e["undecodable_offsets"] = 1, [77]
            doc["totals"]["undecodable"] = 1

    result, report = _report(tmp_path, same_record, problems=["undecodable_div"])
    d = report["summary"]["decoding"]
    assert (d["undecodable_leapfrog"], d["undecodable_div"]) == (1, 1)
    assert report["verdict"]["logs"]["undecodable"] == d["undecodable_records"] == 1
    assert "1 undecodable record" in result.html_path.read_text()


def test_undecodable_records_alone_make_the_report_partial_not_failed(tmp_path):
    # The decoding suite fails (a record could not be read), but no check of the replicas or the logs did: the
    # report pages as partial (3), like the jobs, never as a finding (1).
    result, report = _report(tmp_path, problems=["undecodable_div"])
    decoding = next(s for s in report["expectations"]["suites"] if s["table"] == "decoding")
    assert decoding["success"] is False
    assert all(
        s["success"] is not False for s in report["expectations"]["suites"] if s["table"] != "decoding"
    )
    assert result.exit_code == report["exit_code"] == 3
