"""`tidegauge report`: the command-line face of `pipelines.report.job`.

Kept apart from the package so `tidegauge --help` stays fast: Great Expectations and matplotlib are imported
only when a report is actually made.
"""

from __future__ import annotations

import argparse

from pipelines.core.errors import EXIT_USAGE, UsageError, exit_codes
from pipelines.core.progress import duration
from pipelines.report.errors import ExpectationsConfigError, InputError

DESCRIPTION = """\
Make the morning report from the outputs of the nightly jobs: run the Great Expectations suites of
conf/expectations.yaml over them, write one self-contained HTML page (no network needed to view it) and
its JSON twin, and remember the run so the next report can say what is new, still present or healed.
"""

EPILOG = """\
exit codes:
  0  every expectation passed, over whole evidence
  1  at least one expectation about the replicas or their logs failed (divergence, fatal DIV finding, lag over
     the limit, missing heartbeats, too many pending keys): read report.html
  2  bad usage, or an input is missing or unreadable (the message names it); nothing is written
  3  no such expectation failed, but the evidence is partial: records that could not be decoded, partitions
     not read, or keys left unverified (report.html says how many and where)

examples:
  tidegauge report --leapfrog out/leapfrog --div out/div --lag out/lag \\
      --history reports/history --out reports/2026-09-21
  then open reports/2026-09-21/report.html in a browser.
  tidegauge report --leapfrog out/leapfrog --out reports/leapfrog-only     # the regions only
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="HTML + JSON data-quality report (Great Expectations) over the job outputs",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    parser.add_argument(
        "--leapfrog",
        required=True,
        metavar="DIR",
        help="the output of `tidegauge leapfrog --out DIR`: summary.json and inconsistencies/ (divergences "
        "between regions, coverage, heartbeats per partition, undecodable records)",
    )
    parser.add_argument(
        "--div",
        metavar="DIR",
        help="optional: the output of `tidegauge div validate --out DIR`: summary.json and errors/ (DIV findings: "
        "gaps, corruption, duplicates; fatal or not); without it, the logs are reported as not checked",
    )
    parser.add_argument(
        "--lag",
        metavar="DIR",
        help="optional: the output of `tidegauge lag --out DIR`: lag.json, lag/ and heartbeats/ (how far behind "
        "each region is); without it, lag is reported as not measured",
    )
    parser.add_argument(
        "--history",
        metavar="DIR",
        help="optional: a directory of earlier runs (Parquet, one file per run, created if absent); this run is "
        "added to it",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="where report.html and report.json are written (created if absent)",
    )
    parser.add_argument(
        "--expectations",
        metavar="FILE",
        help="optional: YAML read on top of conf/expectations.yaml; its thresholds and suites replace those of the "
        "same name (e.g. `thresholds: {max_lag_ms: 60000}`)",
    )
    parser.set_defaults(func=run)


def _exists(flag: str, value: str | None, directory: bool) -> None:
    """A named input exists (a local path or any URI the filesystem layer serves), before GX is imported."""
    if value is None:
        return
    from pipelines.core.storage import locate

    try:
        where = locate(value)
        found = where.is_dir() if directory else where.is_file()
    except OSError as exc:
        raise UsageError(f"{flag} {value}: cannot read: {exc}") from None
    if not found:
        raise UsageError(f"{flag} {value}: no such {'directory' if directory else 'file'}")


@exit_codes(InputError, ExpectationsConfigError)
def run(args: argparse.Namespace) -> int:
    for flag, value in (("--leapfrog", args.leapfrog), ("--div", args.div), ("--lag", args.lag)):
        _exists(flag, value, directory=True)
    _exists("--expectations", args.expectations, directory=False)
    from pipelines.core.output import check_history, guard

    guard(
        "report",
        {"--out": args.out, "--history": args.history},
        {"--leapfrog": args.leapfrog, "--div": args.div, "--lag": args.lag},
    )
    check_history(args.history)

    from pipelines.report.job import run_report

    result = run_report(
        args.leapfrog,
        args.div,
        args.out,
        lag_dir=args.lag,
        history_dir=args.history,
        expectations_file=args.expectations,
    )
    v = result.verdict
    lines = [
        f"{v['overall']}: {v['checks_failed']} of {v['checks_evaluated']} checks failed",
        f"regions: {v['regions']['status']} ({v['regions']['divergent_keys']} divergent keys, "
        f"{v['regions']['healed_findings']} healed findings)",
        f"logs: {v['logs']['status']}"
        + (f" ({v['logs']['fatal_findings']} fatal DIV findings)" if v["logs"]["checked"] else " (no --div)"),
    ]
    if v["lag"]["measured"]:
        lines.append(
            "lag: "
            + ", ".join(
                f"region {r['region']} {duration(r['max_time_lag_ms'])}" for r in v["lag"]["by_region"]
            )
        )
    lines += [f"failed: {name}" for name in result.failed_checks]
    lines.append(f"report: {result.html_path}")
    print("\n".join(lines))
    return result.exit_code if result.exit_code in (0, 1, 3) else EXIT_USAGE
