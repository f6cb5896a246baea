"""The report's plots, read back from the SVG they render: what a reader of the page sees."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

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


def _x_tick_labels(svg: str, plot: str) -> list[str]:
    """The x tick labels drawn into one plot's SVG (matplotlib groups each as `<g id="xtick_N">`)."""
    root = ET.fromstring(svg)
    return [
        "".join(text.itertext()).strip()
        for group in root.iter(f"{SVG}g")
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
