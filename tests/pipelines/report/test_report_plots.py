"""The report's plots, read back from the SVG they render: what a reader of the page sees."""

from __future__ import annotations

import datetime as dt
import re
import warnings
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from report_fixtures import NOW_MS

from pipelines.report import plots

SVG = "{http://www.w3.org/2000/svg}"


def _heartbeats(span_ms: int, points: int = 40) -> pd.DataFrame:
    """Heartbeats of two regions spread evenly over `span_ms`, starting at 14:26:27 UTC (not a round time)."""
    start = NOW_MS + 13 * 60_000 + 7_000
    times = start + np.linspace(0, span_ms, points).astype("int64")
    return pd.DataFrame(
        [{"vt_region": r, "vt_timestamp_ms": int(t), "delay_ms": 300 + 10 * r} for t in times for r in (0, 1)]
    )


def _x_tick_labels(svg: str, plot: str, axes: int = 1) -> list[str]:
    """The x tick labels drawn into one panel of a plot's SVG (matplotlib writes `<g id="axes_N">` per panel,
    `<g id="xtick_M">` per tick in it; `_to_svg` prefixes the ids with the plot's name)."""
    panel = next(g for g in ET.fromstring(svg).iter(f"{SVG}g") if g.get("id") == f"{plot}-axes_{axes}")
    return [
        "".join(text.itertext()).strip()
        for group in panel.iter(f"{SVG}g")
        if re.fullmatch(rf"{plot}-xtick_\d+", group.get("id", ""))
        for text in group.iter(f"{SVG}text")
    ]


@pytest.mark.parametrize(
    "span_ms",
    [0, 800, 45_000, 4 * 60_000, 3_600_000, 26 * 3_600_000, 9 * 86_400_000],
    ids=["one-instant", "under-a-second", "45s", "4min", "1h", "26h", "9d"],
)
def test_lag_plot_time_ticks_are_distinct_whatever_the_span(span_ms):
    labels = _x_tick_labels(plots.lag_over_time(_heartbeats(span_ms), 5_000), "lag")
    assert len(labels) >= 3, labels
    assert all(labels), labels
    assert len(set(labels)) == len(labels), labels


def test_a_run_of_a_few_minutes_is_labelled_in_minutes_and_dated_once():
    """The case of issue 28: a four-minute run showed six identical 22:13 ticks."""
    svg = plots.lag_over_time(_heartbeats(4 * 60_000))
    labels = _x_tick_labels(svg, "lag")
    assert all(re.fullmatch(r"14:[23]\d", label) for label in labels), labels
    assert len(set(labels)) == len(labels) >= 3, labels
    assert ">2026-09-21</text>" in svg  # the date the labels leave out, once, beside the axis


def test_seconds_ticks_show_the_clock_time_not_bare_seconds():
    labels = _x_tick_labels(plots.lag_over_time(_heartbeats(45_000)), "lag")
    assert all(re.fullmatch(r"14:2[67](:\d\d)?", label) for label in labels), labels
    assert any(label.count(":") == 2 for label in labels), labels
    assert len(set(labels)) == len(labels) >= 3, labels


@pytest.mark.parametrize(
    "step", [dt.timedelta(seconds=20), dt.timedelta(hours=5), dt.timedelta(days=1)], ids=["20s", "5h", "1d"]
)
def test_trend_plot_time_ticks_are_distinct_for_runs_seconds_or_days_apart(step):
    """Its ticks were three times at minute precision: the same label twice for runs a minute apart in all."""
    start = dt.datetime(2026, 9, 21, 14, 26, 27, tzinfo=dt.UTC)
    runs = [
        SimpleNamespace(
            run_at=start + i * step,
            divergences=i,
            fatal_div_findings=0,
            div_warnings=1,
            max_lag_ms=1_500.0,
            pending_keys=10 - i,
        )
        for i in range(4)
    ]
    svg = plots.trends(runs)
    for panel in (1, 2, 3):  # findings, worst lag, keys pending: each has its own x axis
        labels = _x_tick_labels(svg, "trends", panel)
        assert len(labels) >= 2 and all(labels), (panel, labels)
        assert len(set(labels)) == len(labels), (panel, labels)


DAY, YEAR = dt.timedelta(days=1), dt.timedelta(days=365)
SPANS = [
    dt.timedelta(seconds=2, milliseconds=900),
    dt.timedelta(seconds=12),
    dt.timedelta(seconds=40),
    dt.timedelta(seconds=100),
    dt.timedelta(minutes=2, seconds=59),
    dt.timedelta(minutes=50),
    dt.timedelta(hours=2, minutes=59),
    dt.timedelta(hours=20),
    dt.timedelta(hours=47),
    dt.timedelta(hours=71),
    dt.timedelta(days=29),
    dt.timedelta(days=60),
    dt.timedelta(days=89),
    dt.timedelta(days=400),
    dt.timedelta(days=4000),
]


@pytest.mark.parametrize("narrow", [False, True], ids=["wide", "narrow"])
@pytest.mark.parametrize("span", SPANS, ids=[str(s).replace(" ", "") for s in SPANS])
def test_time_axes_of_any_span_draw_distinct_labels_that_do_not_overlap_and_warn_nothing(
    span, narrow, monkeypatch
):
    """Both time plots, drawn and read back from their Axes: the labels inside the view are distinct (but for the
    repeats plots._time_axis explains) and do not touch, and matplotlib warned nothing (a warning would reach
    the report's stderr, which stays quiet)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    monkeypatch.setattr(plots, "_to_svg", lambda fig, *args: fig)  # the Figure, not its SVG
    start = dt.datetime(2026, 9, 21, 14, 26, 27, tzinfo=dt.UTC)
    runs = [
        SimpleNamespace(
            run_at=start + span * i / 3,
            divergences=i,
            fatal_div_findings=0,
            div_warnings=1,
            max_lag_ms=1_500.0,
            pending_keys=3,
        )
        for i in range(4)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figures = [
            plots.lag_over_time(_heartbeats(int(span.total_seconds() * 1000)), narrow=narrow),
            plots.trends(runs, narrow=narrow),
        ]
        for fig in figures:
            canvas = FigureCanvasAgg(fig)
            canvas.draw()
            for ax in fig.axes:
                low, high = sorted(ax.get_xlim())
                shown = [
                    label
                    for loc, label in zip(
                        ax.xaxis.get_majorticklocs(), ax.xaxis.get_majorticklabels(), strict=True
                    )
                    if low <= loc <= high
                ]
                texts = [label.get_text() for label in shown]
                assert len(texts) >= 2 and all(texts), texts
                assert all(a != b for a, b in zip(texts, texts[1:], strict=False)), texts
                if not (DAY < span < 3 * DAY or YEAR < span < 3 * YEAR):  # see plots._time_axis
                    assert len(set(texts)) == len(texts), texts
                boxes = [label.get_window_extent(canvas.get_renderer()) for label in shown]
                assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:], strict=False)), texts


def test_narrow_drawings_are_four_inches_wide_and_their_ids_differ_from_the_wide_ones():
    """The page holds both drawings of a plot (CSS shows one): the narrow one must be narrow, marked as such,
    and share no id with the wide one."""
    pairs = pd.DataFrame(
        {
            "region_a": [0, 0],
            "region_b": [1, 2],
            "partition": [0, 1],
            "pending_percent": [1.0, 7.5],
            "pending_keys": [1, 9],
        }
    )
    errors = pd.DataFrame({"type": ["DUPLICATE", "MISSING" * 10], "fatal": [True, False]})
    start = dt.datetime(2026, 9, 21, 6, tzinfo=dt.UTC)
    runs = [
        SimpleNamespace(
            run_at=start + i * dt.timedelta(days=1),
            divergences=i,
            fatal_div_findings=0,
            div_warnings=1,
            max_lag_ms=None,
            pending_keys=3,
        )
        for i in range(3)
    ]
    drawings = {
        "lag": lambda narrow: plots.lag_over_time(_heartbeats(3_600_000), 5_000, narrow=narrow),
        "trends": lambda narrow: plots.trends(runs, narrow=narrow),
        "div": lambda narrow: plots.div_findings_by_type(errors, narrow=narrow),
        "coverage": lambda narrow: plots.coverage(pairs, 5.0, narrow=narrow),
    }
    for name, draw in drawings.items():
        wide, narrow = ET.fromstring(draw(False)), ET.fromstring(draw(True))
        assert wide.get("class") == "plot" and narrow.get("class") == "plot narrow", name
        assert narrow.get("data-plot") == wide.get("data-plot") == name
        assert narrow.get("style") == "max-width: 384px", name  # 4 inches at 96 px an inch
        assert float(wide.get("style").split(":")[1].rstrip("px")) >= 768, name
        ids = {e.get("id") for e in wide.iter() if e.get("id")}
        narrow_ids = {e.get("id") for e in narrow.iter() if e.get("id")}
        assert narrow_ids and all(i.startswith(f"{name}-narrow-") for i in narrow_ids), name
        assert not ids & narrow_ids, name
