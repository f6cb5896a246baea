"""Draw the report's plots as inline SVG with matplotlib, so the page needs no network and no image files.

Figures are built with `matplotlib.figure.Figure`, never pyplot: no GUI backend is touched and no global
figure state leaks between plots or into a caller's process. Text stays text in the SVG (searchable,
readable by screen readers); matplotlib escapes it as XML, so data strings cannot inject markup.
Every function returns an `<svg>` element as a string, or None when there is nothing to draw.

A plot drawn for a desktop page (8-9 inches wide) and scaled down to a phone's 390 px would show its text at
4-6 px. So the wide plots can also be drawn `narrow=True`: 4 inches wide, stacked where the wide one puts
panels side by side, for the page to show on narrow screens instead (html.py switches with a media query).
"""

from __future__ import annotations

import datetime as dt
import io
import re
from collections.abc import Sequence
from typing import Any

import matplotlib
import matplotlib.dates as mdates
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
_MAX_POINTS_PER_LINE = 400
_MAX_BARS = 24
_NARROW_WIDTH = 4.0  # inches: 384 px drawn, so on a phone's ~350 px the text keeps ~90 % of its size


def _to_svg(fig: Figure, name: str, label: str, narrow: bool = False) -> str:
    """Serialise `fig`; ids inside the SVG are salted with `name` (and `-narrow` for a narrow drawing) so
    several plots can share one page."""
    cls = "plot narrow" if narrow else "plot"
    salt = f"{name}-narrow" if narrow else name
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"tidegauge-{salt}"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]  # drop the XML prolog and DOCTYPE, which are invalid inside HTML
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, count=1, flags=re.S)
    # matplotlib numbers its ids per figure (figure_1, axes_1, ...): prefix them, one page holds several plots
    svg = re.sub(r'\bid="', f'id="{salt}-', svg)
    svg = re.sub(r'(xlink:href|href)="#', lambda m: f'{m.group(1)}="#{salt}-', svg)
    svg = svg.replace("url(#", f"url(#{salt}-")
    # scale down with the page but never beyond the drawn size (small plots would get giant letters)
    svg = re.sub(
        r'<svg([^>]*?) width="([0-9.]+)pt" height="[^"]*"',
        lambda m: (
            f'<svg{m.group(1)} class="{cls}" role="img" data-plot="{name}" '
            f'style="max-width: {float(m.group(2)) * 4 / 3:.0f}px"'
        ),
        svg,
        count=1,
    )
    label = label.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    return svg.replace("<svg", f'<svg aria-label="{label}"', 1)


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    fig.set_facecolor("white")
    return fig


def _style(ax) -> None:
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)


def _dates(ms: np.ndarray) -> np.ndarray:
    """Epoch milliseconds as matplotlib dates (whatever date epoch matplotlib is configured with)."""
    return mdates.date2num(np.asarray(ms, dtype="int64").astype("datetime64[ms]"))


def _time_axis(ax, ms: np.ndarray, fontsize: float | None = None, narrow: bool = False) -> None:
    """Label an x axis drawn over `_dates(ms)` in UTC, with ticks and labels chosen by the span.

    matplotlib's AutoDateLocator picks round steps (seconds to years) and ConciseDateFormatter labels each tick
    with only what changes between them, so a run of a few minutes reads 22:13, 22:13:30, 22:14 rather than
    six identical 22:13. The date the labels leave out is in the axis' offset text. Seconds-level ticks show
    the whole clock time (matplotlib's default would show bare seconds, `20`, `40`, repeated each minute), and
    days show their month (`Sep 29`, `Oct 06`: weeks of nightly runs), as does midnight among hourly ticks.
    Hourly ticks over more than a day, and monthly ones over more than a year, repeat (`12:00`, `Sep 22`,
    `12:00`): the date or year between them tells them apart.

    maxticks=7 is the fewest with which AutoDateLocator never warns (under three hours it counts minutes, and
    179 minutes in 30-minute steps need seven ticks); with fewer it warns, on stderr, and draws more anyway.
    A narrow axis has room for about four labels: there the locator may also step a whole minute, hour, day
    or year, which lets it keep to five ticks (four below a second, where labels are longest) without warning.
    """
    if narrow:
        locator = mdates.AutoDateLocator(
            tz=dt.UTC,
            minticks=3,
            maxticks=dict.fromkeys(
                (
                    mdates.YEARLY,
                    mdates.MONTHLY,
                    mdates.DAILY,
                    mdates.HOURLY,
                    mdates.MINUTELY,
                    mdates.SECONDLY,
                ),
                5,
            )
            | {mdates.MICROSECONDLY: 4},
        )
        locator.intervald[mdates.MONTHLY] = [1, 2, 3, 4, 6, 12]
        locator.intervald[mdates.HOURLY] = [1, 2, 3, 4, 6, 12, 24]
        locator.intervald[mdates.MINUTELY] = [1, 5, 10, 15, 30, 60]
        locator.intervald[mdates.SECONDLY] = [1, 5, 10, 15, 30, 60]
    else:
        locator = mdates.AutoDateLocator(tz=dt.UTC, minticks=3, maxticks=7)
    formatter = mdates.ConciseDateFormatter(
        locator,
        tz=dt.UTC,
        formats=["%Y", "%b", "%b %d", "%H:%M", "%H:%M", "%H:%M:%S.%f"],
        zero_formats=["", "%Y", "%b %d", "%b %d", "%H:%M", "%H:%M"],
        offset_formats=["", "%Y", "%Y", "%Y-%m-%d", "%Y-%m-%d", "%Y-%m-%d"],
    )
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(formatter)
    if len(ms) and ms.max() == ms.min():  # one instant: a minute either side, not matplotlib's years
        ax.set_xlim(_dates(np.array([ms.min() - 60_000, ms.max() + 60_000])))
    if fontsize is not None:
        ax.tick_params(axis="x", labelsize=fontsize)
        ax.xaxis.get_offset_text().set_fontsize(fontsize)
    ax.set_xlabel("time (UTC)", fontsize=fontsize)


def lag_over_time(
    heartbeats: pd.DataFrame, max_lag_ms: float | None = None, narrow: bool = False
) -> str | None:
    """Heartbeat delay (VT write time minus origin time) per VT region over time: the worst partition and
    source region in each time slice, so a single stuck partition shows."""
    if heartbeats is None or not len(heartbeats):
        return None
    frame = pd.DataFrame(
        {
            "region": heartbeats["vt_region"].astype("int64"),
            "t": pd.to_numeric(heartbeats["vt_timestamp_ms"], errors="coerce"),
            "delay_s": pd.to_numeric(heartbeats["delay_ms"], errors="coerce") / 1000.0,
        }
    ).dropna()
    if not len(frame):
        return None
    t0, t1 = frame["t"].min(), frame["t"].max()
    width = max((t1 - t0) / _MAX_POINTS_PER_LINE, 1.0)
    frame["slice"] = ((frame["t"] - t0) // width).astype("int64")
    worst = frame.groupby(["region", "slice"]).agg(t=("t", "max"), delay_s=("delay_s", "max")).reset_index()
    fig = _figure(_NARROW_WIDTH, 3.0) if narrow else _figure(9, 3.2)
    ax = fig.add_subplot()
    for i, (region, group) in enumerate(worst.groupby("region")):
        ax.plot(
            _dates(group["t"].to_numpy()),
            group["delay_s"],
            label=f"region {region}",
            color=_COLORS[i % len(_COLORS)],
            linewidth=1.4,
            marker="o" if len(group) < 40 else None,
            markersize=3,
        )
    if max_lag_ms is not None:
        ax.axhline(max_lag_ms / 1000.0, color="#b00020", linestyle="--", linewidth=1)
        ax.annotate(
            f"limit {max_lag_ms / 1000.0:g} s",
            (0.995, max_lag_ms / 1000.0),
            xycoords=("axes fraction", "data"),
            ha="right",
            va="bottom",
            color="#b00020",
            fontsize=8,
        )
    top = max(worst["delay_s"].max(), (max_lag_ms or 0) / 1000.0)
    if top > 0 and worst["delay_s"].max() > 0 and top / max(worst["delay_s"].median(), 1e-3) > 100:
        ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylabel("heartbeat delay (s)")
    _time_axis(ax, worst["t"].to_numpy(), fontsize=9 if narrow else None, narrow=narrow)
    ax.set_ylim(bottom=0)
    fig.legend(
        loc="outside upper left", frameon=False, ncols=min(len(worst["region"].unique()), 3 if narrow else 8)
    )
    _style(ax)
    return _to_svg(fig, "lag", "Heartbeat delay per region over time, in seconds", narrow)


def divergences_heatmap(pairs: pd.DataFrame) -> str | None:
    """Divergent keys per region pair (rows) and partition (columns)."""
    if pairs is None or not len(pairs) or int(pairs["divergences"].sum()) == 0:
        return None
    grid = pairs.pivot_table(
        index=["region_a", "region_b"], columns="partition", values="divergences", aggfunc="sum", fill_value=0
    )
    labels = [f"{a} ↔ {b}" for a, b in grid.index]
    parts = [str(p) for p in grid.columns]
    values = grid.to_numpy()
    fig = _figure(min(2.0 + 0.5 * len(parts), 10), 1.2 + 0.4 * len(labels))
    ax = fig.add_subplot()
    shown = np.where(values > 0, values, np.nan)
    # pcolormesh, not imshow: cells stay vectors (imshow would embed a bitmap in the SVG)
    ax.pcolormesh(
        np.ma.masked_invalid(shown),
        cmap="Reds",
        vmin=0,
        vmax=max(values.max(), 1) * 1.25,
        edgecolors="white",
        linewidth=1,
    )
    ax.set_xlim(0, len(parts))
    ax.set_ylim(len(labels), 0)
    ax.set_facecolor("#f3f3f3")
    for (i, j), v in np.ndenumerate(values if len(parts) <= 32 else np.zeros((0, 0))):  # too crowded beyond
        ax.text(
            j + 0.5,
            i + 0.5,
            f"{v:,}" if v else "·",
            ha="center",
            va="center",
            fontsize=9,
            color="white" if v > values.max() * 0.6 else "black",
        )
    ax.set_title("divergent keys (empty cell: none)", fontsize=9)
    ax.set_yticks(np.arange(len(labels)) + 0.5, labels)
    step = max(1, len(parts) // 16)
    ax.set_xticks(np.arange(0, len(parts), step) + 0.5, parts[::step])
    ax.set_xlabel("partition")
    ax.set_ylabel("region pair")
    return _to_svg(fig, "divergences", "Divergent keys per region pair and partition")


def div_findings_by_type(errors: pd.DataFrame, narrow: bool = False) -> str | None:
    """DIV findings per type, fatal and warning stacked."""
    if errors is None or not len(errors):
        return None
    fatal = errors["fatal"].fillna(False).astype(bool)
    counts = pd.DataFrame({"type": errors["type"].astype(str), "fatal": fatal})
    table = counts.groupby(["type", "fatal"]).size().unstack(fill_value=0)
    for col in (True, False):
        if col not in table.columns:
            table[col] = 0
    table = table.loc[(table[True] + table[False]).sort_values().index]
    room = 24 if narrow else 40
    labels = [t if len(t) <= room else t[: room - 1] + "…" for t in table.index]
    fig = _figure(_NARROW_WIDTH if narrow else 8, 0.9 + 0.35 * len(labels))
    ax = fig.add_subplot()
    y = np.arange(len(labels))
    ax.barh(y, table[True], color="#b00020", label="fatal")
    ax.barh(y, table[False], left=table[True], color="#f0a030", label="warning (not fatal)")
    for i, (f, w) in enumerate(zip(table[True], table[False], strict=True)):
        ax.text(f + w, i, f"  {f + w:,}", va="center", fontsize=8)
    ax.set_yticks(y, labels)
    ax.set_xlabel("findings")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0, (table[True] + table[False]).max() * (1.3 if narrow else 1.15))
    fig.legend(loc="outside upper right", frameon=False, ncols=2)
    _style(ax)
    ax.grid(axis="y", visible=False)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    return _to_svg(fig, "div", "DIV findings per type, fatal and warnings", narrow)


def coverage(
    pairs: pd.DataFrame, max_pending_percent: float | None = None, narrow: bool = False
) -> str | None:
    """Pending keys (not yet comparable) per region pair and partition, as a percent of its keys."""
    if pairs is None or not len(pairs):
        return None
    title = ""
    if len(pairs) > _MAX_BARS:  # one bar per pair and partition does not scale: show the worst
        title = f"the {_MAX_BARS} worst of {len(pairs)} region pairs and partitions"
        pairs = pairs.sort_values("pending_percent", ascending=False, kind="stable").head(_MAX_BARS)
    labels = [
        f"{a} ↔ {b} p{p}"
        for a, b, p in zip(pairs["region_a"], pairs["region_b"], pairs["partition"], strict=True)
    ]
    values = pairs["pending_percent"].to_numpy(dtype=float)
    fig = _figure(_NARROW_WIDTH if narrow else 8, 0.9 + 0.28 * len(labels))
    ax = fig.add_subplot()
    y = np.arange(len(labels))
    over = values > (max_pending_percent if max_pending_percent is not None else np.inf)
    ax.barh(y, values, color=np.where(over, "#b00020", "#4a90d9"))
    for i, (v, n) in enumerate(zip(values, pairs["pending_keys"], strict=True)):
        ax.text(v, i, f"  {v:.1f} % ({n:,} keys)", va="center", fontsize=8)
    if max_pending_percent is not None:
        ax.axvline(max_pending_percent, color="#b00020", linestyle="--", linewidth=1)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel("keys pending (% of the pair's keys)")
    if title:
        ax.set_title(title, fontsize=9)
    room = 1.8 if narrow else 1.35  # for the "1.0 % (6 keys)" beside the longest bar
    ax.set_xlim(0, max(values.max() if len(values) else 0, max_pending_percent or 0, 1) * room)
    _style(ax)
    ax.grid(axis="y", visible=False)
    return _to_svg(fig, "coverage", "Keys still pending per region pair and partition, in percent", narrow)


def trends(runs: Sequence[Any], narrow: bool = False) -> str | None:
    """Counts across report runs (history): findings, worst lag, pending keys. Needs two runs or more.
    Three panels side by side, or one above the other when `narrow`."""
    if len(runs) < 2:
        return None
    when = np.array([int(r.run_at.timestamp() * 1000) for r in runs])
    fig = _figure(_NARROW_WIDTH, 6.6) if narrow else _figure(9, 3.0)
    axes = fig.subplots(3, 1) if narrow else fig.subplots(1, 3)
    series = [
        (
            axes[0],
            "findings",
            [
                ("divergences", [r.divergences for r in runs], "#d62728"),
                ("fatal DIV findings", [r.fatal_div_findings for r in runs], "#8c1c13"),
                ("DIV warnings", [r.div_warnings for r in runs], "#f0a030"),
            ],
        ),
        (
            axes[1],
            "worst lag (s)",
            [("lag", [np.nan if r.max_lag_ms is None else r.max_lag_ms / 1000.0 for r in runs], "#1f77b4")],
        ),
        (axes[2], "keys pending", [("pending keys", [r.pending_keys for r in runs], "#4a90d9")]),
    ]
    for ax, title, lines in series:
        for label, values, color in lines:
            ax.plot(_dates(when), values, marker="o", markersize=3, linewidth=1.3, color=color, label=label)
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        _style(ax)
        _time_axis(ax, when, fontsize=8 if narrow else 7, narrow=narrow)
    axes[0].legend(loc="upper left", frameon=False, fontsize=7)
    return _to_svg(fig, "trends", "Findings, worst lag and pending keys across report runs", narrow)
