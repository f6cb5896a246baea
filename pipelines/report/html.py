"""Render the morning report as one self-contained HTML page.

Written for a newcomer opening it at 8 am: the verdict first (are the regions consistent, are the logs whole,
how far behind is each region, what changed since the last run), then the checks, then one section per
concern with a plot, a summary table and every finding row (key in hex, offsets, vectors). Summary cells link
to the rows that prove them.

Everything that comes from data passes through `_e` (html.escape) before it reaches the page; keys are shown
as hex. The page carries a Content-Security-Policy that allows no script and no network fetch at all, so even
a missed escape could not run code or call out. Styles and plots are inline; no fonts, scripts or images are
loaded from anywhere.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from leapfrog.compare import HEALED
from pipelines.core.progress import duration
from pipelines.report import plots
from pipelines.report.expectations import ExpectationOutcome, SuiteOutcome, ValidationRun
from pipelines.report.history import DIV_FINDING_ID, DIVERGENCE_ID, Trend, div_finding_ids, divergence_ids
from pipelines.report.inputs import Inputs

MAX_ROWS = 1000  # finding rows per table; the rest stay in the Parquet datasets (the page says so)
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"


@dataclass
class Page:
    """Everything the page shows, gathered by `run_report`."""

    inputs: Inputs
    tables: dict[str, pd.DataFrame]
    numbers: dict[str, Any]
    validation: ValidationRun
    verdict: dict[str, Any]
    thresholds: dict[str, float]
    expectations_files: list[str]
    trend: Trend | None
    history_dir: str | None
    run_at: dt.datetime
    warnings: list[str]
    timings: dict[str, float]
    layout: dict[str, Any]  # from `finding_layout`


# ------------------------------------------------------------------------------------------------ formatting


def _e(value: Any) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    return html.escape("" if value is None else str(value), quote=True)


def _n(value: Any) -> str:
    """A count with thousands separators; blank for unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


# a command-line flag, with "(needs " before it when the text says so: "(needs --lag)", "--history"
_FLAG = re.compile(r"\(needs --[a-z][a-z0-9-]*\)|--[a-z][a-z0-9-]*")


def _flags_whole(escaped: str) -> str:
    """Keep each command-line flag in already escaped text on one line: browsers may break a line after a
    hyphen, which split "(needs --lag)" between "--" and "lag". A white-space:nowrap span keeps the real
    hyphen-minus characters, so a reader who copies the flag gets one the shell accepts (non-breaking hyphens,
    U+2011, would look the same and fail)."""
    return _FLAG.sub(lambda m: f'<span class="nowrap">{m.group(0)}</span>', escaped)


def _plural(count: int, word: str, plural: str | None = None) -> str:
    """`1 partition`, `3 partitions`."""
    return f"{_n(count)} {word if count == 1 else (plural or word + 's')}"


fmt_ms = duration  # one human format for durations everywhere (pipelines.core.progress)


def fmt_time(when: dt.datetime | int | None) -> str:
    if when is None:
        return "unknown"
    if isinstance(when, int | float):
        when = dt.datetime.fromtimestamp(when / 1000, tz=dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _vector(value: Any) -> str:
    if value is None:
        return "–"
    try:
        return "[" + ", ".join(str(int(v)) for v in value) + "]"
    except TypeError:
        return str(value)


def _key_cell(key: Any) -> str:
    raw = bytes(key) if key is not None else b""
    text = f'<code class="key">{_e(raw.hex()) or "(empty)"}</code>'
    if raw and all(32 <= b < 127 for b in raw):
        text += f'<div class="ascii">text: <code>{_e(raw.decode("ascii"))}</code></div>'
    return text


def _slug(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]


# anchors: stable ids, made only of digits, letters and dashes, whatever the data holds
def a_pair(a: int, b: int, p: int) -> str:
    return f"pair-{a}-{b}-p{p}"


def a_pair_findings(a: int, b: int, p: int) -> str:
    return f"lfg-{a}-{b}-p{p}"


def a_divp(region: int, topic: str, partition: int) -> str:
    return f"divp-{region}-p{partition}-{_slug(topic)}"


def a_divp_findings(region: int, topic: str, partition: int) -> str:
    return f"dvg-{region}-p{partition}-{_slug(topic)}"


def a_hb(region: int, partition: int) -> str:
    return f"hb-{region}-p{partition}"


def a_lag(vt: int, partition: int, source: int) -> str:
    return f"lag-{vt}-p{partition}-s{source}"


def a_dec(job: str, region: int, topic: str, partition: int) -> str:
    return f"dec-{_slug(job)}-{region}-p{partition}-{_slug(topic)}"


def _table(headers: Sequence[str], rows: Iterable[str], cls: str = "", caption: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    cap = f"<caption>{caption}</caption>" if caption else ""
    body = "\n".join(rows)
    return f'<div class="scroll"><table class="{cls}">{cap}<thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table></div>'


def _split_table(
    headers: Sequence[str], items: Sequence[tuple[str, str, str, bool]], cls: str, ok_text: str, what: str
) -> str:
    """Rows that need attention in plain sight (with their anchors), every row in a collapsed <details>.

    `items` are (anchor, row class, cells html, needs attention). Long tables (partitions x regions) would
    otherwise bury the few rows that matter.
    """
    shown = [f'<tr id="{a}" class="{c}">{cells}</tr>' for a, c, cells, attention in items if attention]
    body = _table(headers, shown, cls) if shown else f'<p class="empty">{_e(ok_text)}</p>'
    every = [f'<tr class="{c}">{cells}</tr>' for _, c, cells, _ in items]
    return (
        body
        + f"<details><summary>All {_n(len(items))} {_e(what)}</summary>{_table(headers, every, cls)}</details>"
    )


def _flagged(page: Page, table: str) -> set[str]:
    """Anchors of the rows of `table` that a failed expectation named."""
    out = set()
    for suite in page.validation.suites:
        if suite.table != table:
            continue
        for exp in suite.expectations:
            for row in exp.unexpected_rows:
                out.add(_row_link(table, None, row, page))
    return out


def _figure(svg: str | None, caption: str, empty: str, narrow: str | None = None) -> str:
    """A plot and its caption; with a `narrow` drawing of it, narrow screens show that one instead (the CSS
    switches between the two, the page carries no script)."""
    if svg is None:
        return f'<p class="empty">{_e(empty)}</p>'
    if narrow is not None:
        svg = svg.replace('class="plot"', 'class="plot wide"', 1) + narrow
    return f"<figure>{svg}<figcaption>{_e(caption)}</figcaption></figure>"


def _badge(ok: bool | None, yes: str = "PASS", no: str = "FAIL", none: str = "NOT RUN") -> str:
    cls, word = ("skip", none) if ok is None else (("ok", yes) if ok else ("bad", no))
    return f'<span class="badge {cls}">{_e(word)}</span>'


# ------------------------------------------------------------------------------------------------ sections


def _verdict(page: Page) -> str:
    v = page.verdict
    n = page.numbers
    regions, logs, lag, changes = v["regions"], v["logs"], v["lag"], v["changes"]
    if v["checks_failed"]:
        headline = f"{v['checks_failed']} of {v['checks_evaluated']} checks failed"
    elif v["overall"] == "PARTIAL":
        headline = f"All {v['checks_evaluated']} checks passed, over partial evidence"
    else:
        headline = f"All {v['checks_evaluated']} checks passed"
    tiles = []

    consistent = regions["status"] == "CONSISTENT"
    if regions["status"] == "UNVERIFIED":
        sub = (
            f"No divergent key found, but not every record was read and decoded: "
            f"{_plural(regions['unverified_keys'], 'key')} unverified, "
            f"{_plural(n['decoding']['undecodable_leapfrog'], 'undecodable record')}, "
            f"{_plural(n['leapfrog_failed_partitions'], 'partition')} not read (see Decoding)."
        )
    elif consistent:
        sub = "No divergent keys in any region pair."
    else:
        sub = (
            f"{_plural(regions['divergent_keys'], 'divergent key')} "
            f"({_plural(regions['divergences'], 'open finding')} in {regions['pairs_with_divergences']} of "
            f"{_plural(regions['pairs'], 'region pair')})."
        )
    if regions.get("healed_findings"):
        sub += f" {_plural(regions['healed_findings'], 'finding')} healed since (history, below)."
    sub += (
        f" {_n(n['coverage']['keys'])} keys compared; {n['coverage']['pending_percent']:.1f} % still pending."
    )
    tiles.append(
        _tile(
            "Are the regions consistent?",
            regions["status"],
            None if regions["status"] == "UNVERIFIED" else consistent,
            sub,
            "#divergences",
        )
    )

    whole = logs["status"] == "LOGS WHOLE"
    parts = [
        _plural(logs["fatal_findings"], "fatal DIV finding"),
        _plural(logs["warnings"], "warning") + " (not fatal)",
    ]
    if logs["undecodable"]:
        parts.append(_plural(logs["undecodable"], "undecodable record"))
    if logs["unread_partitions"]:
        parts.append(_plural(logs["unread_partitions"], "partition") + " not read")
    parts.append(f"{_n(page.numbers['div']['records_read'])} records checked")
    if not logs.get("checked", True):
        parts = ["No div validate output was given (--div DIR): the logs were not checked"]
    tiles.append(
        _tile(
            "Are the logs whole?",
            logs["status"],
            None if logs["status"] in ("UNVERIFIED", "NOT CHECKED") else whole,
            "; ".join(parts) + ".",
            "#div",
        )
    )

    if lag["measured"]:
        items = []
        for r in lag["by_region"]:
            cls = "bad" if r["over_limit"] else "ok"
            items.append(
                f'<li class="{cls}">region {_e(r["region"])}: <b>{_e(fmt_ms(r["max_time_lag_ms"]))}</b> behind</li>'
            )
        body = (
            f'<ul class="lagl">{"".join(items)}</ul><div class="sub">worst partition and source region; limit {_e(fmt_ms(lag["limit_ms"]))}'
            f"{', measured ' + _e(fmt_time(lag['now_ms'])) if lag.get('now_ms') else ''}.</div>"
        )
        tiles.append(_tile_html("How far behind is each region?", body, not lag["any_over_limit"], "#lag"))
    else:
        tiles.append(
            _tile_html(
                "How far behind is each region?",
                '<div class="big muted">NOT MEASURED</div><div class="sub">Run with <span class="nowrap">--lag</span> DIR '
                "(the output of `tidegauge lag`) to see lag.</div>",
                None,
                "#lag",
            )
        )

    if changes["history"] and changes["compared_with"]:
        d, f = changes["divergences"], changes["div_findings"]
        body = (
            f'<div class="big">{_n(d["new"] + f["new"])} new · {_n(d["still"] + f["still"])} still · '
            f'{_n(d["healed"] + f["healed"])} healed</div><div class="sub">findings compared with the run of '
            f"{_e(fmt_time(dt.datetime.fromisoformat(changes['compared_with'])))}: divergences "
            f"{_n(d['new'])} / {_n(d['still'])} / {_n(d['healed'])}, DIV findings {_n(f['new'])} / "
            f"{_n(f['still'])} / {_n(f['healed'])}.</div>"
        )
        tiles.append(
            _tile_html(
                "What changed since the last run?",
                body,
                None if not (d["new"] or f["new"]) else False,
                "#changes",
            )
        )
    elif changes["history"]:
        tiles.append(
            _tile_html(
                "What changed since the last run?",
                '<div class="big muted">FIRST RUN</div><div class="sub">No earlier run in the '
                "history directory to compare with; tomorrow's report will.</div>",
                None,
                "#changes",
            )
        )
    else:
        tiles.append(
            _tile_html(
                "What changed since the last run?",
                '<div class="big muted">NO HISTORY</div><div class="sub">Run with <span class="nowrap">--history</span> DIR to '
                "compare each run with the previous one.</div>",
                None,
                "#changes",
            )
        )

    others = []
    hb, cov = v["heartbeats"], v["coverage"]
    others.append(
        f"<li>{_badge(hb['ok'], 'OK', 'MISSING')} Heartbeats: "
        + (
            "every partition of every region holds heartbeats from every region."
            if hb["missing"] == 0
            else f"{_plural(hb['missing'], 'region partition')} lack"
            f'{"s" if hb["missing"] == 1 else ""} heartbeats from some region (<a href="#heartbeats">which</a>).'
        )
        + "</li>"
    )
    others.append(
        f"<li>{_badge(cov['ok'], 'OK', 'LOW')} Coverage: {_n(cov['pending_keys'])} keys pending "
        f"({cov['pending_percent']:.1f} % of {_n(cov['keys'])}); worst region pair and partition "
        f"{cov['worst_pending_percent']:.1f} % (limit {_e(_fmt_threshold(page.thresholds, 'max_pending_percent', '%'))})."
        ' <a href="#coverage">details</a></li>'
    )
    failed_suites = [s for s in page.validation.suites if s.success is False]
    if failed_suites:
        others.append(
            "<li>Failed checks: "
            + ", ".join(f'<a href="#check-{_e(s.name)}">{_e(s.name)}</a>' for s in failed_suites)
            + "</li>"
        )
    cls = {"PASS": "pass", "PARTIAL": "partial"}.get(v["overall"], "fail")
    warn = "".join(f'<p class="warn">Warning: {_e(w)}</p>' for w in page.warnings)
    return f"""
<section id="verdict" class="verdict {cls}" data-verdict="{_e(v["overall"])}">
  <h1><span class="overall">{_e(v["overall"])}</span> {_e(headline)}</h1>
  <div class="tiles">{"".join(tiles)}</div>
  <ul class="also">{"".join(others)}</ul>
  {warn}
</section>"""


def _fmt_threshold(thresholds: dict[str, float], name: str, unit: str = "") -> str:
    if name not in thresholds:
        return "not set"
    value = thresholds[name]
    if name.endswith("_ms"):
        return fmt_ms(value)
    return f"{value:g}{' ' + unit if unit else ''}"


def _tile(question: str, status: str, ok: bool | None, sub: str, href: str) -> str:
    return _tile_html(question, f'<div class="big">{_e(status)}</div><div class="sub">{sub}</div>', ok, href)


def _tile_html(question: str, body: str, ok: bool | None, href: str) -> str:
    cls = "neutral" if ok is None else ("good" if ok else "bad")
    return (
        f'<div class="tile {cls}"><div class="q">{_e(question)}</div>{body}'
        f'<a class="more" href="{_e(href)}">details ↓</a></div>'
    )


def _row_link(table: str, column: str | None, row: dict[str, Any], page: Page) -> str:
    """Anchor of the page row that proves one offending row of a GX table."""
    try:
        if table == "pairs":
            key = (int(row["region_a"]), int(row["region_b"]), int(row["partition"]))
            if (
                column in ("divergences", "value_mismatch", "missing_in_a", "missing_in_b")
                and a_pair_findings(*key) in page.layout["anchors"]
            ):
                return a_pair_findings(*key)
            return a_pair(*key)
        if table == "div_partitions":
            key = (int(row["region"]), str(row["topic"]), int(row["partition"]))
            if (
                column in ("fatal_findings", "findings", "warnings")
                and a_divp_findings(*key) in page.layout["anchors"]
            ):
                return a_divp_findings(*key)
            return a_divp(*key)
        if table == "heartbeat_grid":
            return a_hb(int(row["region"]), int(row["partition"]))
        if table == "lag":
            return a_lag(int(row["vt_region"]), int(row["partition"]), int(row["source_region"]))
        if table == "decoding":
            return a_dec(str(row["job"]), int(row["region"]), str(row["topic"]), int(row["partition"]))
    except (KeyError, TypeError, ValueError):
        pass
    return ""


def _row_label(table: str, row: dict[str, Any]) -> str:
    if table == "pairs":
        return f"regions {row.get('region_a')}↔{row.get('region_b')} partition {row.get('partition')}"
    if table == "div_partitions":
        return f"region {row.get('region')} {row.get('topic')} partition {row.get('partition')}"
    if table == "heartbeat_grid":
        return f"region {row.get('region')} partition {row.get('partition')}"
    if table == "lag":
        return f"region {row.get('vt_region')} partition {row.get('partition')} from region {row.get('source_region')}"
    if table == "decoding":
        return f"{row.get('job')}: region {row.get('region')} {row.get('topic')} partition {row.get('partition')}"
    return ", ".join(f"{k}={v}" for k, v in row.items())


def _limit(exp: ExpectationOutcome) -> str:
    k = exp.kwargs
    parts = []
    for arg, word in (("min_value", "at least"), ("max_value", "at most")):
        if k.get(arg) is not None:
            value = k[arg]
            shown = (
                fmt_ms(value)
                if (exp.column or "").endswith("_ms")
                else f"{value:g}"
                if isinstance(value, int | float)
                else str(value)
            )
            ref = exp.thresholds.get(arg)
            parts.append(f"{word} {shown}" + (f" ({ref})" if ref else ""))
    if "value_set" in k:
        parts.append(
            "one of " + ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in k["value_set"])
        )
    if not parts and exp.type.endswith("not_be_null"):
        parts.append("not empty")
    return "; ".join(parts) or "–"


def _checks(page: Page) -> str:
    rows = []
    suites = sorted(page.validation.suites, key=lambda s: {False: 0, True: 1, None: 2}[s.success])
    for suite in suites:
        first = True
        exps = suite.expectations or [None]
        for exp in exps:
            cells = []
            if first:
                cells.append(
                    f'<td rowspan="{len(exps)}" id="check-{_e(suite.name)}"><b>{_e(suite.name)}</b>'
                    f'<div class="muted">{_flags_whole(_e(suite.meaning))}</div></td>'
                )
            first = False
            if exp is None:
                cells.append(f'<td colspan="4" class="muted">{_flags_whole(_e(suite.skipped_reason))}</td>')
                cells.append(f"<td>{_badge(None)}</td>")
            else:
                cells.append(
                    f'<td>{_flags_whole(_e(exp.meaning))}<div class="muted"><code>{_e(exp.type)}</code>'
                    f"{' on ' + _e(exp.column) if exp.column else ''}</div></td>"
                )
                cells.append(f"<td>{_e(_limit(exp))}</td>")
                cells.append(f"<td>{_observed(suite, exp, page)}</td>")
                cells.append(f"<td>{_badge(exp.success)}</td>")
            cls = "bad" if exp is not None and not exp.success else ""
            rows.append(f'<tr class="{cls}">{"".join(cells)}</tr>')
    return f"""
<section id="checks">
  <h2>Checks (Great Expectations)</h2>
  <p>Each check reads a table built from the job outputs; a failed check lists the rows that broke it, linked
  to the evidence below. Thresholds come from {", ".join(f"<code>{_e(f)}</code>" for f in page.expectations_files)}.</p>
  {_table(["suite", "what it checks", "limit", "what was found", "result"], rows, "checks")}
</section>"""


def _observed(suite: SuiteOutcome, exp: ExpectationOutcome, page: Page) -> str:
    if exp.exception:
        return f'<span class="bad">GX could not evaluate it: {_e(exp.exception)}</span>'
    if exp.unexpected_count is not None and exp.element_count is not None:
        if exp.unexpected_count == 0:
            return (
                f"all {_plural(exp.element_count, 'row')} within it"
                if exp.element_count
                else "no rows to check"
            )
        text = f"{_n(exp.unexpected_count)} of {_plural(exp.element_count, 'row')} break it"
        if exp.unexpected_rows:
            links = []
            for row in exp.unexpected_rows:
                anchor = _row_link(suite.table, exp.column, row, page)
                label = _row_label(suite.table, row)
                value = row.get(exp.column) if exp.column else None
                if value is not None and exp.column and exp.column.endswith("_ms"):
                    value = fmt_ms(value)
                shown = f"{label}: {value}" if value is not None else label
                links.append(
                    f'<li><a href="#{_e(anchor)}">{_e(shown)}</a></li>' if anchor else f"<li>{_e(shown)}</li>"
                )
            more = (
                ""
                if exp.unexpected_count <= len(exp.unexpected_rows)
                else f"<li>… and {_n(exp.unexpected_count - len(exp.unexpected_rows))} more</li>"
            )
            text += f'<ul class="rows">{"".join(links)}{more}</ul>'
        return text
    if exp.observed_value is not None:
        return f"observed {_e(exp.observed_value)}"
    return "–"


def _identity_text(kind: str, ident: tuple) -> str:
    if kind == "divergence":
        d = dict(zip(DIVERGENCE_ID, ident, strict=True))
        return (
            f"{d['type']} regions {d['region_a']}↔{d['region_b']} partition {d['partition']} "
            f"key {d['key_hex'] or '(empty)'} (store {d['store']} v{d['version']})"
        )
    d = dict(zip(DIV_FINDING_ID, ident, strict=True))
    return f"{d['type']} region {d['region']} {d['topic']} partition {d['partition']} offset {d['offset']}"


def _changes(page: Page) -> str:
    trend = page.trend
    head = '<section id="changes"><h2>What changed since the last run</h2>'
    if trend is None:
        return (
            head
            + '<p>No history directory was given (<code class="nowrap">--history DIR</code>), so this run is '
            "not compared with earlier ones.</p></section>"
        )
    plot = _figure(
        plots.trends(trend.runs),
        "Findings, worst lag and pending keys across runs (oldest left).",
        "Trends appear from the second run on.",
        plots.trends(trend.runs, narrow=True),
    )
    if trend.previous is None:
        return (
            head + f"<p>This is the first run of store <code>{_e(page.numbers['store'])}</code> in "
            f"<code>{_e(page.history_dir)}</code>; nothing to compare with yet.</p>{plot}</section>"
        )
    blocks = []
    for kind, label, changes, anchors in (
        ("divergence", "Divergences", trend.divergences, page.layout["divergence_anchor"]),
        ("div", "DIV findings", trend.div_findings, page.layout["div_anchor"]),
    ):
        rows = []
        for status, idents in (("NEW", changes.new), ("HEALED", changes.healed), ("STILL", changes.still)):
            for ident in idents[:MAX_ROWS]:
                anchor = anchors.get(ident)
                text = _e(_identity_text(kind, ident))
                cell = f'<a href="#{anchor}">{text}</a>' if anchor else text
                rows.append(
                    f'<tr class="st-{status.lower()}"><td><span class="badge st-{status.lower()}">{status}'
                    f"</span></td><td>{cell}</td></tr>"
                )
            if len(idents) > MAX_ROWS:
                rows.append(
                    f'<tr><td></td><td class="muted">… and {_n(len(idents) - MAX_ROWS)} more {status.lower()}'
                    "</td></tr>"
                )
        summary = (
            f"{_n(len(changes.new))} new, {_n(len(changes.still))} still present, "
            f"{_n(len(changes.healed))} healed"
        )
        body = (
            _table(["", "finding"], rows, "changes") if rows else '<p class="empty">None in either run.</p>'
        )
        blocks.append(f"<h3>{_e(label)}: {_e(summary)}</h3>{body}")
    prev = trend.previous
    return (
        head
        + f"""
  <p>Compared with the run of <b>{_e(fmt_time(prev.run_at))}</b> (result then: {_e("PASS" if prev.success else "FAIL")},
  {_n(prev.divergences)} divergences, {_n(prev.fatal_div_findings)} fatal DIV findings). <b>New</b>: found now, not
  then. <b>Still</b>: found in both runs. <b>Healed</b>: found then, gone now.</p>
  {plot}{"".join(blocks)}</section>"""
    )


def _divergences(page: Page) -> str:
    pairs = page.tables["pairs"]
    rows_df = page.inputs.leapfrog.inconsistencies
    statuses = page.layout["divergence_status"]
    flagged = _flagged(page, "pairs")
    items = []
    for r in pairs.itertuples(index=False):
        key = (int(r.region_a), int(r.region_b), int(r.partition))
        cls = "bad" if r.divergences or a_pair(*key) in flagged else ""
        link = (
            f'<a href="#{a_pair_findings(*key)}">{_n(r.divergences)}</a>'
            if r.divergences and a_pair_findings(*key) in page.layout["anchors"]
            else _n(r.divergences)
        )
        cells = (
            f'<td>{r.region_a} ↔ {r.region_b}</td><td class="num">{r.partition}</td>'
            f'<td class="num">{link}</td><td class="num">{_n(r.value_mismatch)}</td><td class="num">{_n(r.missing_in_a)}</td>'
            f'<td class="num">{_n(r.missing_in_b)}</td><td class="num">{_n(r.keys)}</td>'
            f'<td class="num">{_n(r.comparable_pairs)}</td><td class="num">{_n(r.skipped_pairs)}</td>'
            f'<td class="num">{_n(r.pending_keys)} ({r.pending_percent:.1f} %)</td>'
        )
        items.append((a_pair(*key), cls, cells, bool(cls)))
    totals = []
    for (a, b), g in pairs.groupby(["region_a", "region_b"]):
        n = int(g["divergences"].sum())
        keys, pending = int(g["keys"].sum()), int(g["pending_keys"].sum())
        totals.append(
            f'<tr class="{"bad" if n else ""}"><td>{a} ↔ {b}</td><td class="num">{_n(n)}</td>'
            f'<td class="num">{_n(keys)}</td><td class="num">{_n(g["comparable_pairs"].sum())}</td>'
            f'<td class="num">{_n(g["skipped_pairs"].sum())}</td>'
            f'<td class="num">{_n(pending)} ({100.0 * pending / keys if keys else 0.0:.1f} %)</td></tr>'
        )
    summary = (
        "<h3>Per region pair</h3>"
        + _table(
            [
                "region pair",
                "divergent keys",
                "keys",
                "record pairs compared",
                "skipped (lag)",
                "keys pending",
            ],
            totals,
            "pairs",
        )
        + "<h3>Per region pair and partition</h3>"
        + _split_table(
            [
                "region pair",
                "partition",
                "divergent keys",
                "value mismatch",
                "missing in A",
                "missing in B",
                "keys",
                "record pairs compared",
                "skipped (lag)",
                "keys pending",
            ],
            items,
            "pairs",
            "No partition of any region pair needs attention.",
            "region pairs and partitions",
        )
    )
    plot = _figure(
        plots.divergences_heatmap(pairs),
        "Divergent keys per region pair (rows) and partition (columns).",
        "No divergences: every comparable key holds the same value in every region.",
    )
    detail = ""
    if len(rows_df):
        ordered = page.layout["divergence_order"]
        out, last_group = [], None
        for i in ordered[:MAX_ROWS]:
            r = rows_df.iloc[i]
            group = (int(r["region_a"]), int(r["region_b"]), int(r["partition"]))
            if group != last_group:
                out.append(
                    f'<tr class="group" id="{a_pair_findings(*group)}"><th colspan="7">regions {group[0]} ↔ '
                    f"{group[1]}, partition {group[2]}</th></tr>"
                )
                last_group = group
            status = statuses.get(i, "")
            badge = f' <span class="badge st-{status.lower()}">{status}</span>' if status else ""
            history = ' class="muted"' if r["status"] == HEALED else ""  # healed: the regions agree again
            out.append(
                f'<tr id="lf-{i}"{history}><td>{_e(r["type"])}{badge}</td>'
                f"<td>{_e(r['status'])}</td><td>{_key_cell(r['key'])}"
                f'<div class="muted">key hash {_e(r["key_hash"])}</div></td>'
                f"{_side(r, 'a')}{_side(r, 'b')}"
                f'<td class="muted">{_e(r["store"])} v{_e(r["version"])}</td></tr>'
            )
        more = (
            f'<p class="muted">Showing {_n(MAX_ROWS)} of {_n(len(rows_df))} rows; all are in '
            f"<code>{_e(page.inputs.leapfrog.path / 'inconsistencies')}</code>.</p>"
            if len(rows_df) > MAX_ROWS
            else ""
        )
        detail = (
            "<h3>Every finding</h3><p>Open findings first: the two regions still differ (or cannot be "
            "compared yet). Healed ones follow as history: a later comparable pair of the key's records agrees "
            "(a repair or a newer write converged the regions); they fail no check. The row shows the first "
            "divergence of the key. Region A is the lower region id of the pair. Offsets are VT "
            "offsets; a vector holds, per region, the RT offset the record was derived from (−1: nothing "
            "from that region); the high-water mark is the one the record was judged with.</p>"
            + _table(
                [
                    "type",
                    "status",
                    "key (hex)",
                    "region A: offset · value hash · vector · high-water mark",
                    "region B: offset · value hash · vector · high-water mark",
                    "store",
                ],
                out,
                "findings",
            )
            + more
        )
    return f"""
<section id="divergences">
  <h2>Divergences between regions</h2>
  <p>Leap Frog compares the value of every key in every pair of regions once both regions have caught up to each
  other (their high-water marks cover the other's record). A divergence is a key whose values differ, or that one
  region holds and the other does not.</p>
  {plot}{summary}{detail}
</section>"""


def _side(r: pd.Series, side: str) -> str:
    offset = r[f"{side}_vt_offset"]
    if offset is None:
        return '<td class="muted">no record</td>'
    deleted = " · deleted" if r[f"{side}_deleted"] else ""
    return (
        f'<td><span class="num">offset {_e(offset)}</span> · hash {_e(r[f"{side}_value_hash"])}{deleted}'
        f"<div>vector <code>{_e(_vector(r[f'{side}_vector']))}</code></div>"
        f"<div>HWM <code>{_e(_vector(r[f'{side}_high_watermark']))}</code></div></td>"
    )


def _div(page: Page) -> str:
    if not page.inputs.div.given:
        return """
<section id="div">
  <h2>Data Integrity Validation</h2>
  <p>Not checked: no <code>div validate</code> output was given (<code>--div DIR</code>).</p>
</section>"""
    parts = page.tables["div_partitions"]
    errors = page.inputs.div.errors
    statuses = page.layout["div_status"]
    flagged = _flagged(page, "div_partitions")
    items = []
    for r in parts.itertuples(index=False):
        key = (int(r.region), str(r.topic), int(r.partition))
        cls = (
            "bad"
            if (r.fatal_findings or not r.read_ok or a_divp(*key) in flagged)
            else ("warnrow" if r.findings else "")
        )
        anchor = a_divp_findings(*key)
        count = (
            f'<a href="#{anchor}">{_n(r.findings)}</a>'
            if r.findings and anchor in page.layout["anchors"]
            else _n(r.findings)
        )
        read = "yes" if r.read_ok else f"NO: {r.error}"
        cells = (
            f'<td class="num">{r.region}</td><td>{_e(r.topic)}</td>'
            f'<td class="num">{r.partition}</td><td class="num">{_n(r.records)}</td><td class="num">{count}</td>'
            f'<td class="num">{_n(r.fatal_findings)}</td><td class="num">{_n(r.warnings)}</td><td>{_e(read)}</td>'
        )
        items.append((a_divp(*key), cls, cells, bool(cls)))
    summary = _split_table(
        ["region", "topic", "partition", "records", "findings", "fatal", "warnings", "read to the end"],
        items,
        "divparts",
        f"All {_n(len(parts))} log partitions were read to the end without findings.",
        "log partitions",
    )
    plot = _figure(
        plots.div_findings_by_type(errors),
        "DIV findings per type: fatal (red) and warnings (amber).",
        "No DIV findings: every segment, sequence number and checksum checked out.",
        plots.div_findings_by_type(errors, narrow=True),
    )
    detail = ""
    if len(errors):
        out, last = [], None
        for i in page.layout["div_order"][:MAX_ROWS]:
            r = errors.iloc[i]
            group = (int(r["region"]), str(r["topic"]), int(r["partition"]))
            if group != last:
                out.append(
                    f'<tr class="group" id="{a_divp_findings(*group)}"><th colspan="7">region {group[0]}, topic '
                    f"{_e(group[1])}, partition {group[2]}</th></tr>"
                )
                last = group
            status = statuses.get(i, "")
            badge = f' <span class="badge st-{status.lower()}">{status}</span>' if status else ""
            fatal = bool(r["fatal"]) if r["fatal"] is not None else False
            out.append(
                f'<tr id="dv-{i}" class="{"bad" if fatal else ""}"><td class="num">{_e(r["offset"])}</td>'
                f"<td>{_e(r['type'])}{badge}</td><td>{'fatal' if fatal else 'warning'}</td>"
                f'<td><code>{_e(r["producer_guid"]) or "unknown"}</code></td><td class="num">{_e(r["segment"])}</td>'
                f'<td class="num">{_e(r["sequence"])}</td><td>{_e(r["detail"])}</td></tr>'
            )
        more = (
            f'<p class="muted">Showing {_n(MAX_ROWS)} of {_n(len(errors))} rows; all are in '
            f"<code>{_e(page.inputs.div.path / 'errors')}</code>.</p>"
            if len(errors) > MAX_ROWS
            else ""
        )
        detail = (
            "<h3>Every DIV finding</h3><p>Fatal findings come first. Segment and sequence −1: unknown.</p>"
            + _table(
                ["offset", "type", "severity", "producer GUID", "segment", "sequence", "detail"],
                out,
                "findings",
            )
            + more
        )
    return f"""
<section id="div">
  <h2>Log integrity (DIV)</h2>
  <p>Data Integrity Validation follows every producer's segments, sequence numbers and checksums through the logs.
  A finding before End of Push is fatal (the data is incomplete or corrupt); after it, Venice treats it as a
  warning.</p>
  {plot}{summary}{detail}
</section>"""


def _lag(page: Page) -> str:
    head = '<section id="lag"><h2>Lag: how far behind each region is</h2>'
    if "lag" not in page.tables:
        return (
            head
            + '<p>Not measured: run the report with <code class="nowrap">--lag DIR</code> (the output of '
            "<code>tidegauge lag</code>).</p></section>"
        )
    lag = page.tables["lag"]
    limit = page.thresholds.get("max_lag_ms")
    plot = _figure(
        plots.lag_over_time(page.inputs.lag.heartbeats, limit),
        "Heartbeat delay per region over time: time from a heartbeat's origin to its write into the "
        "region's version topic; the worst partition and source region in each time slice.",
        "No heartbeats in the lag output.",
        plots.lag_over_time(page.inputs.lag.heartbeats, limit, narrow=True),
    )
    flagged = _flagged(page, "lag")
    items = []
    for r in lag.itertuples(index=False):
        over = limit is not None and not math.isnan(r.time_lag_ms) and r.time_lag_ms > limit
        unknown = math.isnan(r.time_lag_ms)
        anchor = a_lag(int(r.vt_region), int(r.partition), int(r.source_region))
        cls = "bad" if over or unknown or anchor in flagged else ""
        items.append(
            (
                anchor,
                cls,
                f'<td class="num">{r.vt_region}</td><td class="num">{r.partition}</td><td class="num">{r.source_region}</td>'
                f'<td class="num">{_e(fmt_ms(r.time_lag_ms))}</td><td class="num">{_n(r.offset_lag)}</td>'
                f'<td class="num">{_n(r.heartbeats)}</td><td>{_e(fmt_time(None if math.isnan(r.last_heartbeat_origin_ms) else int(r.last_heartbeat_origin_ms)))}</td>'
                f'<td class="num">{_n(r.last_heartbeat_vt_offset)}</td><td class="num">{_n(r.watermark)}</td>'
                f'<td class="num">{_n(r.rt_end_offset)}</td>',
                bool(cls),
            )
        )
    per_region = []
    for r in page.numbers["lag"]["by_region"]:
        over = r["max_time_lag_ms"] is None or (limit is not None and r["max_time_lag_ms"] > limit)
        per_region.append(
            f'<tr class="{"bad" if over else ""}"><td class="num">{r["region"]}</td>'
            f'<td class="num"><b>{_e(fmt_ms(r["max_time_lag_ms"]))}</b></td>'
            f'<td class="num">{_e(r["worst_partition"])}</td><td class="num">{_e(r["worst_source_region"])}</td>'
            f'<td class="num">{_n(r["max_offset_lag"])}</td></tr>'
        )
    now = page.inputs.lag.now_ms
    return (
        head
        + f"""
  <p>Time lag: how old the newest heartbeat from a source region is in a region's version topic
  {
            "at " + _e(fmt_time(now)) if now else ""
        }. Offset lag: records of the source region's real-time topic not yet
  covered by the watermark (blank when the real-time topic was not readable). Limit: {
            _e(fmt_ms(limit)) if limit is not None else "none"
        }.</p>
  {plot}
  <h3>Per region (worst partition and source region)</h3>
  {
            _table(
                ["region", "time lag", "worst partition", "from region", "worst offset lag (records)"],
                per_region,
                "lagr",
            )
        }
  <h3>Over the limit or unknown</h3>
  {
            _split_table(
                [
                    "region",
                    "partition",
                    "source region",
                    "time lag",
                    "offset lag (records)",
                    "heartbeats",
                    "last heartbeat origin",
                    "its VT offset",
                    "watermark",
                    "RT end offset",
                ],
                items,
                "lagt",
                "Every region, partition and source region is within the limit.",
                "regions x partitions x source regions",
            )
        }
</section>"""
    )


def _heartbeats(page: Page) -> str:
    grid = page.tables["heartbeat_grid"]
    flagged = _flagged(page, "heartbeat_grid")
    items = []
    for r in grid.itertuples(index=False):
        anchor = a_hb(int(r.region), int(r.partition))
        bad = (
            r.min_heartbeats_from_a_region < page.thresholds.get("min_heartbeats_per_region", 1)
            or anchor in flagged
            or not r.reported
        )
        missing = r.regions_without_heartbeats or "none"
        note = "" if r.reported else "not in the leapfrog output"
        if r.error:
            note = f"{note}; {r.error}" if note else r.error
        items.append(
            (
                anchor,
                "bad" if bad else "",
                f'<td class="num">{r.region}</td><td class="num">{r.partition}</td><td class="num">{_n(r.heartbeats)}</td>'
                f"<td>{_e(r.heartbeats_by_origin)}</td><td>{_e(missing)}</td><td>{_e(note)}</td>",
                bad,
            )
        )
    return f"""
<section id="heartbeats">
  <h2>Heartbeats</h2>
  <p>Every region's leaders write heartbeats that every region replicates. A partition without heartbeats from some
  region cannot be checked against it (Leap Frog cannot tell lag from divergence there).</p>
  {
        _split_table(
            ["region", "partition", "heartbeats", "from each region", "regions with none", "note"],
            items,
            "hbt",
            f"All {_n(len(grid))} region partitions hold heartbeats from every region.",
            "region partitions",
        )
    }
</section>"""


def _coverage(page: Page) -> str:
    pairs = page.tables["pairs"]
    c = page.numbers["coverage"]
    plot = _figure(
        plots.coverage(pairs, page.thresholds.get("max_pending_percent")),
        "Keys still pending per region pair and partition (percent of its keys; dashed line: limit).",
        "No region pairs in the leapfrog output.",
        plots.coverage(pairs, page.thresholds.get("max_pending_percent"), narrow=True),
    )
    return f"""
<section id="coverage">
  <h2>Coverage</h2>
  <p>{_n(c["keys"])} keys; {_n(c["comparable_pairs"])} record pairs compared; {_n(c["skipped_pairs"])} records
  skipped because the other region had not caught up (lag); {_n(c["pending_keys"])} keys
  ({c["pending_percent"]:.1f} %) still pending: their latest values could not be compared yet. Pending keys are
  checked on a later run. Per pair and partition: <a href="#divergences">the region pair table</a>.</p>
  {plot}
</section>"""


def _decoding(page: Page) -> str:
    table = page.tables["decoding"]
    bad = table[(table["undecodable"] > 0) | (table["out_of_range"] > 0)]
    rows = [
        f'<tr id="{a_dec(r.job, r.region, r.topic, r.partition)}" class="bad"><td>{_e(r.job)}</td>'
        f'<td class="num">{r.region}</td><td>{_e(r.topic)}</td><td class="num">{r.partition}</td>'
        f'<td class="num">{_n(r.undecodable)}</td><td class="num">{_n(r.out_of_range)}</td>'
        f"<td><code>{_e(r.offsets)}</code></td></tr>"
        for r in bad.itertuples(index=False)
    ]
    body = (
        _table(
            ["job", "region", "topic", "partition", "undecodable", "out of range", "offsets"], rows, "dect"
        )
        if rows
        else f'<p class="empty">Every record of {_n(len(table))} log partitions decoded.</p>'
    )
    return f"""
<section id="decoding">
  <h2>Undecodable records</h2>
  <p>Records neither job could decode (bad magic byte, unknown protocol version, broken Avro): they were not
  checked at all.</p>
  {body}
</section>"""


def _about(page: Page) -> str:
    inp = page.inputs
    items = [
        ("leapfrog output", str(inp.leapfrog.path)),
        ("div validate output", str(inp.div.path) if inp.div.given else "not given"),
        ("lag output", str(inp.lag.path) if inp.lag else "not given"),
        ("history", page.history_dir or "not given"),
        ("expectations", ", ".join(page.expectations_files)),
        ("store", f"{page.numbers['store']} version {page.numbers['version']}"),
        ("regions", ", ".join(str(r) for r in page.numbers["regions"])),
        ("partitions", str(len(page.numbers["partitions"]))),
        ("leapfrog mode", str(inp.leapfrog.summary.get("mode", "unknown"))),
        (
            "jobs started",
            f"leapfrog {inp.leapfrog.summary.get('started_at', '?')}, div validate "
            f"{inp.div.summary.get('started_at', '?')}",
        ),
        ("Great Expectations", page.validation.gx_version),
        ("report timings", ", ".join(f"{k} {v:.2f} s" for k, v in page.timings.items())),
    ]
    rows = [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in items]
    return f"""
<section id="about">
  <h2>About this report</h2>
  <div class="scroll"><table class="about"><tbody>{"".join(rows)}</tbody></table></div>
  <p class="muted">Exit code of <code>tidegauge report</code>: 0 when every check passed, 1 when any failed.
  The same numbers are in <code>report.json</code> next to this page.</p>
</section>"""


_CSS = """
:root { --good:#1b7f3b; --bad:#b00020; --warn:#b36b00; --muted:#666; --line:#ddd; }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0;
       color: #1a1a1a; background: #fafafa; line-height: 1.45; overflow-wrap: break-word; }
main { max-width: 1280px; margin: 0 auto; padding: 16px 24px 48px; }
header.top { color: var(--muted); font-size: 14px; margin-bottom: 8px; }
h1 { font-size: 26px; margin: 0 0 12px; }
h2 { font-size: 20px; margin: 14px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 16px; margin: 20px 0 6px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 4px 18px 14px; margin: 14px 0; }
.verdict { padding: 16px 18px; border-width: 2px; }
.verdict.pass { border-color: var(--good); } .verdict.fail { border-color: var(--bad); }
.verdict.partial { border-color: var(--warn); } .partial .overall { background: var(--warn); }
.overall { display: inline-block; padding: 2px 10px; border-radius: 4px; color: #fff; margin-right: 8px; }
.pass .overall { background: var(--good); } .fail .overall { background: var(--bad); }
.tiles { display: grid; grid-template-columns: repeat(auto-fit, minmax(260px, 1fr)); gap: 12px; }
.tile { border: 1px solid var(--line); border-left: 6px solid #999; border-radius: 5px; padding: 10px 12px; position: relative; }
.tile.good { border-left-color: var(--good); } .tile.bad { border-left-color: var(--bad); background: #fff5f6; }
.tile .q { font-size: 13px; color: var(--muted); text-transform: uppercase; letter-spacing: .03em; }
.tile .big { font-size: 22px; font-weight: 700; margin: 4px 0; }
.tile.good .big { color: var(--good); } .tile.bad .big { color: var(--bad); }
.tile .sub { font-size: 14px; } .tile .more { font-size: 13px; display: inline-block; margin-top: 6px; }
ul.lagl { list-style: none; padding: 0; margin: 4px 0; font-size: 15px; }
ul.lagl li.bad { color: var(--bad); } ul.lagl li.bad::before { content: "▲ "; }
ul.also { margin: 12px 0 0; padding-left: 0; list-style: none; } ul.also li { margin: 4px 0; }
.badge { display: inline-block; font-size: 12px; font-weight: 700; padding: 1px 6px; border-radius: 3px;
         border: 1px solid currentColor; white-space: nowrap; }
.badge.ok { color: var(--good); } .badge.bad { color: var(--bad); } .badge.skip { color: var(--muted); }
.badge.st-new { color: var(--bad); } .badge.st-still { color: var(--warn); } .badge.st-healed { color: var(--good); }
.muted { color: var(--muted); font-size: 13px; } .empty { color: var(--good); } .warn { color: var(--warn); font-weight: 600; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 8px 0; font-size: 14px; min-width: 50%; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
thead th { background: #f0f0f0; position: sticky; top: 0; }
tr.group th { background: #eef3fb; text-align: left; }
tr.bad td { background: #fff0f2; } tr.warnrow td { background: #fff8e6; }
td.num, span.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 13px; }
code.key { word-break: break-all; } .ascii { font-size: 12px; color: var(--muted); }
ul.rows { margin: 4px 0 0; padding-left: 18px; font-size: 13px; }
figure { margin: 8px 0; } figcaption { font-size: 13px; color: var(--muted); }
svg.plot { width: 100%; height: auto; display: block; } svg.plot.narrow { display: none; }
details { margin: 6px 0; } details summary { cursor: pointer; color: #0645ad; font-size: 14px; }
nav.toc { font-size: 14px; margin: 10px 0; display: flex; flex-wrap: wrap; gap: 2px 12px; }
.nowrap { white-space: nowrap; }
table.about td, table.changes td { overflow-wrap: anywhere; }  /* paths, hex keys: wrap in their cell */
td.num { white-space: nowrap; }  /* 1.5 s, 6 (1.0 %): a number and its unit stay together */
@media (max-width: 720px) {
  svg.plot.wide { display: none; } svg.plot.narrow { display: block; }
}
@media (max-width: 600px) {
  main { padding: 8px 8px 32px; }
  section { padding: 4px 10px 12px; }
  .verdict { padding: 10px; }
  h1 { font-size: 22px; }
}
:target { outline: 3px solid #ffbf00; }
"""


def render(page: Page) -> str:
    """The whole page as a string (UTF-8 when written)."""
    v = page.verdict
    title = (
        f"tidegauge report: {v['overall']} — store {page.numbers['store']} v{page.numbers['version']} — "
        f"{fmt_time(page.run_at)}"
    )
    toc = "".join(
        f'<a href="#{a}">{_e(t)}</a>'
        for a, t in (
            ("checks", "Checks"),
            ("changes", "Changes"),
            ("divergences", "Divergences"),
            ("div", "DIV"),
            ("lag", "Lag"),
            ("heartbeats", "Heartbeats"),
            ("coverage", "Coverage"),
            ("decoding", "Decoding"),
            ("about", "About"),
        )
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<main>
<header class="top">tidegauge nightly report · store <b>{_e(page.numbers["store"])}</b> version {_e(page.numbers["version"])}
 · regions {_e(", ".join(str(r) for r in page.numbers["regions"]))} · {_n(len(page.numbers["partitions"]))} partitions
 · generated {_e(fmt_time(page.run_at))}</header>
{_verdict(page)}
<nav class="toc">{toc}</nav>
{_checks(page)}
{_changes(page)}
{_divergences(page)}
{_div(page)}
{_lag(page)}
{_heartbeats(page)}
{_coverage(page)}
{_decoding(page)}
{_about(page)}
</main>
</body>
</html>
"""


def finding_layout(inputs: Inputs, trend: Trend | None) -> dict[str, Any]:
    """Row order, anchors and new/still badges of the finding tables (shared by the page and the checks)."""
    lf_rows = inputs.leapfrog.inconsistencies
    div_rows = inputs.div.errors
    lf_order = (
        list(
            lf_rows.assign(_healed=lf_rows["status"] == HEALED)
            .sort_values(["_healed", "region_a", "region_b", "partition", "type"], kind="stable")
            .index
        )
        if len(lf_rows)
        else []
    )
    if len(div_rows):
        div_order = list(
            div_rows.assign(_fatal=~div_rows["fatal"].fillna(False).astype(bool))
            .sort_values(["_fatal", "region", "topic", "partition", "offset"], kind="stable")
            .index
        )
    else:
        div_order = []
    anchors: set[str] = set()
    lf_ids = divergence_ids(lf_rows)
    div_ids = div_finding_ids(div_rows)
    lf_anchor: dict[tuple, str] = {}
    div_anchor: dict[tuple, str] = {}
    for i in lf_order[:MAX_ROWS]:
        r = lf_rows.iloc[i]
        anchors.add(a_pair_findings(int(r["region_a"]), int(r["region_b"]), int(r["partition"])))
        lf_anchor.setdefault(lf_ids[i], f"lf-{i}")
    for i in div_order[:MAX_ROWS]:
        r = div_rows.iloc[i]
        anchors.add(a_divp_findings(int(r["region"]), str(r["topic"]), int(r["partition"])))
        div_anchor.setdefault(div_ids[i], f"dv-{i}")
    lf_status: dict[int, str] = {}
    div_status: dict[int, str] = {}
    if trend is not None and trend.previous is not None:
        new_lf, new_div = set(trend.divergences.new), set(trend.div_findings.new)
        lf_status = {i: ("NEW" if lf_ids[i] in new_lf else "STILL") for i in range(len(lf_ids))}
        div_status = {i: ("NEW" if div_ids[i] in new_div else "STILL") for i in range(len(div_ids))}
    for i, healed in enumerate(lf_rows["status"] == HEALED if len(lf_rows) else []):
        if healed:  # the regions agree again: history, whatever earlier runs said
            lf_status[i] = "HEALED"
    return {
        "anchors": anchors,
        "divergence_order": lf_order,
        "div_order": div_order,
        "divergence_anchor": lf_anchor,
        "div_anchor": div_anchor,
        "divergence_status": lf_status,
        "div_status": div_status,
    }
