"""The report job: `run_report` runs the Great Expectations suites of conf/expectations.yaml, writes one self-contained HTML page
(`report.html`) and its JSON twin (`report.json`), and appends the run to a history directory so the next
report can say what is new, still present or healed. The exit code is 1 when any expectation failed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from pipelines.core.storage import Location, locate
from pipelines.report.expectations import (
    ExpectationsConfigError,
    ValidationRun,
    load_expectations,
    run_suites,
)
from pipelines.report.history import RunRecord, Trend, append_run, compare, read_history
from pipelines.report.inputs import InputError, Inputs, load_inputs
from pipelines.report.tables import build_tables, open_findings, summary_numbers

__all__ = ["ExpectationsConfigError", "InputError", "ReportResult", "run_report"]

from pipelines.core.errors import EXIT_CLEAN, EXIT_PARTIAL
from pipelines.core.errors import EXIT_FINDINGS as EXIT_FAILED

# Checks of the evidence (could every record be read and decoded?), not of the replicas or the logs: every check
# of a suite over one of these tables, and every check of one of these columns. Their failure makes the report
# partial (exit 3), never a finding (exit 1), as in every job.
EVIDENCE_TABLES = frozenset({"decoding"})
EVIDENCE_COLUMNS = frozenset({"read_ok", "undecodable"})
OVERALL = {EXIT_CLEAN: "PASS", EXIT_FAILED: "FAIL", EXIT_PARTIAL: "PARTIAL"}


@dataclass
class ReportResult:
    verdict: dict[str, Any]
    exit_code: int
    html_path: Location
    json_path: Location
    history_path: Location | None
    counts: dict[str, Any]
    failed_checks: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("tidegauge")
    except Exception:  # not installed (run from a source tree): the report still works
        return "unknown"


def _suite_ok(validation: ValidationRun, name: str, fallback: bool) -> bool:
    suite = validation.suite(name)
    return fallback if suite is None or suite.success is None else bool(suite.success)


def compute_verdict(
    numbers: dict[str, Any], validation: ValidationRun, thresholds: dict[str, float], trend: Trend | None
) -> dict[str, Any]:
    """The answers at the top of the page.

    The words state the data: DIVERGENT as soon as one divergent key exists, LOGS WHOLE only with no fatal
    finding, no undecodable record and every partition read. PASS/FAIL and the exit code follow the checks,
    whose thresholds may tolerate some findings; the page shows both so neither hides the other.
    """
    div = numbers["div"]
    undecodable = numbers["decoding"]["undecodable_records"]
    ev = numbers["evidence"]
    # CONSISTENT and LOGS WHOLE are claims about evidence: only over records that were all read and decoded, by a
    # job that said so itself (an output without a verdict, from an older version, proves nothing either way)
    regions_read = (
        ev["leapfrog_verdict"] in ("clean", "findings")
        and ev["leapfrog_records"] > 0
        and ev["unverified_keys"] == 0
        and numbers["leapfrog_failed_partitions"] == 0
        and numbers["decoding"]["undecodable_leapfrog"] == 0
    )
    # without a `div validate` output the logs are not checked: the page says so, and it is no partial evidence
    # about the regions
    logs_checked = div.get("checked", True)
    logs_read = not logs_checked or (
        ev["div_verdict"] in ("clean", "findings")
        and ev["div_records"] > 0
        and div["failed_partitions"] == 0
        and numbers["decoding"]["undecodable_div"] == 0
    )
    limit = thresholds.get("max_lag_ms")
    lag = {"measured": "lag" in numbers, "limit_ms": limit, "by_region": [], "any_over_limit": False}
    if "lag" in numbers:
        lag["now_ms"] = numbers["lag"]["now_ms"]
        for r in numbers["lag"]["by_region"]:
            worst = r["max_time_lag_ms"]
            over = worst is None or r["unknown"] > 0 or (limit is not None and worst > limit)
            lag["by_region"].append({**r, "over_limit": over})
            lag["any_over_limit"] |= over
    changes: dict[str, Any] = {"history": trend is not None, "compared_with": None}
    if trend is not None:
        changes["compared_with"] = trend.previous.run_at.isoformat() if trend.previous else None
        for name, c in (("divergences", trend.divergences), ("div_findings", trend.div_findings)):
            changes[name] = {"new": len(c.new), "still": len(c.still), "healed": len(c.healed)}
    pairs = numbers["divergences"]
    coverage = numbers["coverage"]
    return {
        "overall": "PASS" if validation.success else "FAIL",
        "checks_evaluated": validation.evaluated,
        "checks_failed": validation.failed,
        "checks_not_run": [s.name for s in validation.suites if s.success is None],
        "regions": {
            "status": "DIVERGENT" if pairs["total"] else ("CONSISTENT" if regions_read else "UNVERIFIED"),
            "evidence_whole": regions_read,
            "unverified_keys": ev["unverified_keys"],
            "records": ev["leapfrog_records"],
            "check_passed": _suite_ok(validation, "consistency", pairs["total"] == 0),
            "divergences": pairs["total"],
            "divergent_keys": pairs.get("divergent_keys", pairs["total"]),
            "healed_findings": pairs.get("healed", 0),
            "pairs_with_divergences": pairs["region_pairs_with_divergences"],
            "pairs": pairs["region_pairs"],
        },
        "logs": {
            "status": "NOT CHECKED"
            if not logs_checked
            else "DIV ERRORS"
            if div["fatal_findings"]
            else ("LOGS WHOLE" if logs_read else "UNVERIFIED"),
            "checked": logs_checked,
            "evidence_whole": logs_read,
            "records": ev["div_records"],
            "check_passed": _suite_ok(validation, "integrity", div["fatal_findings"] == 0)
            and _suite_ok(validation, "decoding", undecodable == 0),
            "fatal_findings": div["fatal_findings"],
            "warnings": div["warnings"],
            "undecodable": undecodable,
            "unread_partitions": div["failed_partitions"],
        },
        "lag": lag,
        "heartbeats": {
            "ok": _suite_ok(validation, "heartbeats", True),
            "missing": numbers["heartbeats"]["region_partitions_missing_heartbeats"],
        },
        "coverage": {
            "ok": _suite_ok(validation, "coverage", True),
            "keys": coverage["keys"],
            "pending_keys": coverage["pending_keys"],
            "pending_percent": coverage["pending_percent"],
            "worst_pending_percent": coverage["worst_pending_percent"],
        },
        "changes": changes,
    }


def _record(
    run_at: dt.datetime,
    inputs: Inputs,
    numbers: dict[str, Any],
    verdict: dict[str, Any],
    validation: ValidationRun,
) -> RunRecord:
    from pipelines.report.history import div_finding_ids, divergence_ids

    return RunRecord(
        run_at=run_at,
        store=numbers["store"],
        version=numbers["version"],
        success=validation.success,
        consistent=verdict["regions"]["status"] == "CONSISTENT",
        logs_whole=verdict["logs"]["status"] == "LOGS WHOLE",
        expectations_evaluated=validation.evaluated,
        expectations_failed=validation.failed,
        divergences=numbers["divergences"]["total"],
        fatal_div_findings=numbers["div"]["fatal_findings"],
        div_warnings=numbers["div"]["warnings"],
        pending_keys=numbers["coverage"]["pending_keys"],
        undecodable=verdict["logs"]["undecodable"],
        max_lag_ms=(numbers.get("lag") or {}).get("max_time_lag_ms"),
        divergence_ids=divergence_ids(open_findings(inputs.leapfrog.inconsistencies)),
        div_finding_ids=div_finding_ids(inputs.div.errors),
    )


def is_evidence_check(table: str, column: str | None) -> bool:
    return table in EVIDENCE_TABLES or column in EVIDENCE_COLUMNS


def exit_code_for(validation, verdict: dict) -> int:
    """1 when a check of the replicas or logs failed; else 3 when an evidence check failed or the evidence is
    not whole (every check passed, over records not all read: never a clean exit); else 0."""
    failed = [
        (s.table, e.column)
        for s in validation.suites
        if s.success is False
        for e in s.expectations
        if not e.success
    ]
    if any(not is_evidence_check(table, column) for table, column in failed):
        return EXIT_FAILED
    if failed or not (verdict["regions"]["evidence_whole"] and verdict["logs"]["evidence_whole"]):
        return EXIT_PARTIAL
    return EXIT_CLEAN


def _consistency_warnings(inputs: Inputs, numbers: dict[str, Any]) -> list[str]:
    """Say so when a job's summary disagrees with its own finding rows: the report counts the rows."""
    out = []
    d = numbers["divergences"]
    if d["summary_total"] != d["total"] + d["healed"]:
        out.append(
            f"{inputs.leapfrog.path / 'summary.json'} counts {d['summary_total']} findings in by_pair but "
            f"{inputs.leapfrog.path / 'inconsistencies'} holds {d['total'] + d['healed']} rows; this report "
            "counts the rows."
        )
    claimed = inputs.div.summary.get("findings")
    if isinstance(claimed, int) and claimed != numbers["div"]["findings"]:
        out.append(
            f"{inputs.div.path / 'summary.json'} counts {claimed} findings but {inputs.div.path / 'errors'} "
            f"holds {numbers['div']['findings']} rows; this report counts the rows."
        )
    return out


def _sources(inputs: Inputs) -> dict[str, str]:
    merged: dict[str, str] = {}
    for summary in (inputs.leapfrog.summary, inputs.div.summary, inputs.lag.summary if inputs.lag else {}):
        for region, uri in (summary.get("sources") or {}).items():
            merged.setdefault(str(region), str(uri))
    return merged


def _trend_json(trend: Trend | None) -> dict[str, Any] | None:
    if trend is None:
        return None
    from pipelines.report.history import DIV_FINDING_ID, DIVERGENCE_ID

    def ids(kind: tuple[str, ...], items: list[tuple]) -> list[dict[str, Any]]:
        return [dict(zip(kind, i, strict=True)) for i in items]

    return {
        "previous_run_at": trend.previous.run_at.isoformat() if trend.previous else None,
        "runs": [r.counts() for r in trend.runs],
        "divergences": {
            k: ids(DIVERGENCE_ID, getattr(trend.divergences, k)) for k in ("new", "still", "healed")
        },
        "div_findings": {
            k: ids(DIV_FINDING_ID, getattr(trend.div_findings, k)) for k in ("new", "still", "healed")
        },
        "warnings": trend.warnings,
    }


def run_report(
    leapfrog_dir: str | os.PathLike,
    div_dir: str | os.PathLike | None,
    out_dir: str | os.PathLike,
    lag_dir: str | os.PathLike | None = None,
    history_dir: str | os.PathLike | None = None,
    expectations_file: str | os.PathLike | None = None,
    now: dt.datetime | None = None,
) -> ReportResult:
    """Check the job outputs, write `out_dir/report.html` and `report.json`, and append the run to history.

    Raises `InputError` (a job output is missing or malformed) or `ExpectationsConfigError` (the expectations
    file is), both naming the file; nothing is written then. `now` is the run's timestamp (default: the
    current time), which orders runs in the history.
    """
    started = time.perf_counter()
    run_at = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    timings: dict[str, float] = {}

    t = time.perf_counter()
    config = load_expectations(expectations_file)
    timings["load_expectations_s"] = time.perf_counter() - t
    t = time.perf_counter()
    inputs = load_inputs(leapfrog_dir, div_dir, lag_dir)
    tables = build_tables(inputs)
    numbers = summary_numbers(inputs, tables)
    timings["load_inputs_s"] = time.perf_counter() - t

    validation = run_suites(config, tables)
    timings.update(validation.timings)

    history_runs, history_warnings = ([], [])
    if history_dir is not None:
        history_runs, history_warnings = read_history(history_dir)
    # a first verdict without the trend, to build this run's history record; the trend needs the record
    verdict = compute_verdict(numbers, validation, config.thresholds, None)
    record = _record(run_at, inputs, numbers, verdict, validation)
    trend = compare(history_runs, record, history_warnings) if history_dir is not None else None
    verdict = compute_verdict(numbers, validation, config.thresholds, trend)

    from pipelines.core.output import MARKER, write_marker

    out = locate(out_dir)
    out.makedirs()
    if not (out / MARKER).exists():
        write_marker(out, "report")
    exit_code = exit_code_for(validation, verdict)
    verdict["overall"] = OVERALL[exit_code]
    t = time.perf_counter()
    from pipelines.report import html

    warnings_shown = list(history_warnings) + _consistency_warnings(inputs, numbers)
    page = html.Page(
        inputs=inputs,
        tables=tables,
        numbers=numbers,
        validation=validation,
        verdict=verdict,
        thresholds=config.thresholds,
        expectations_files=config.files,
        trend=trend,
        history_dir=str(history_dir) if history_dir is not None else None,
        run_at=run_at,
        warnings=warnings_shown,
        timings=timings,
        layout=html.finding_layout(inputs, trend),
    )
    html_path = out / "report.html"
    html_path.write_text(html.render(page))  # each file appears whole (pipelines.core.storage)
    timings["render_s"] = time.perf_counter() - t

    history_path = append_run(history_dir, record) if history_dir is not None else None
    failed = [
        f"{s.name}: {e.meaning or e.type}" for s in validation.suites for e in s.expectations if not e.success
    ]
    report = {
        "job": "report",
        "tidegauge_version": _version(),
        "started_at": run_at.isoformat(),
        "elapsed_s": round(time.perf_counter() - started, 3),
        "exit_code": exit_code,
        "sources": _sources(inputs),
        "inputs": {
            "leapfrog": str(inputs.leapfrog.path),
            "div": str(inputs.div.path) if inputs.div.given else None,
            "lag": str(inputs.lag.path) if inputs.lag else None,
            "history": str(history_dir) if history_dir is not None else None,
            "expectations": config.files,
        },
        "verdict": verdict,
        "summary": numbers,
        "thresholds": config.thresholds,
        "expectations": {
            "success": validation.success,
            "evaluated": validation.evaluated,
            "failed": validation.failed,
            "great_expectations_version": validation.gx_version,
            "suites": [
                {
                    "name": s.name,
                    "table": s.table,
                    "meaning": s.meaning,
                    "success": s.success,
                    "skipped_reason": s.skipped_reason,
                    "expectations": [e.__dict__ for e in s.expectations],
                    "gx_validation_result": s.gx_result,
                }
                for s in validation.suites
            ],
        },
        "trends": _trend_json(trend),
        "history_file": str(history_path) if history_path else None,
        "warnings": warnings_shown,
        "timings": {k: round(v, 4) for k, v in timings.items()},
    }
    json_path = out / "report.json"
    json_path.write_text(json.dumps(report, indent=2, default=str, ensure_ascii=False) + "\n")
    return ReportResult(
        verdict=verdict,
        exit_code=exit_code,
        html_path=html_path,
        json_path=json_path,
        history_path=history_path,
        counts={
            "divergences": numbers["divergences"]["total"],
            "fatal_div_findings": numbers["div"]["fatal_findings"],
            "div_findings": numbers["div"]["findings"],
            "pending_keys": numbers["coverage"]["pending_keys"],
            "checks_evaluated": validation.evaluated,
            "checks_failed": validation.failed,
        },
        failed_checks=failed,
        timings=timings,
    )
