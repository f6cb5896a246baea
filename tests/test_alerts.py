"""conf/alerts.yaml (issue 19): Prometheus alerting rules that speak only of metrics the watch and the leader export.

Every rule has an expression, a `for`, a severity and a summary and description; every metric an expression
reads, and every label it selects on, is one that `WatchMetrics` or `LeaderMetrics` exports — read from their
registries after one update of everything, not from a list kept here. With `promtool` on PATH the file is also
checked by Prometheus' own parser, and its unit tests (tests/support/alerts_promtool_test.yaml: synthetic series,
the alerts that must fire or not, and their rendered annotations) are run.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from heartbeat import HeartbeatLeader
from heartbeat.metrics import LeaderMetrics
from pipelines.watch.metrics import WatchMetrics

REPO = Path(__file__).resolve().parents[1]
ALERTS = REPO / "conf" / "alerts.yaml"
PROMTOOL_TESTS = REPO / "tests" / "support" / "alerts_promtool_test.yaml"
TARGET_LABELS = {"job", "instance"}  # added by Prometheus' scrape, on every series
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def _rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _watch_with_everything() -> WatchMetrics:
    m = WatchMetrics(heartbeat_interval_ms=10_000, clock=lambda: 1000.0)
    m.observe_heartbeats(
        [{"region": 0, "partition": 0, "source_region": 1, "origin_ms": 1, "arrival_ms": 2, "mark": 3}]
    )
    m.set_lag(0, "s_v1", 0, 10, 5, query="watch")
    m.set_source_up(0, True)
    m.add_records(0, "s_v1", 1)
    m.observe_divergences([{"type": "VALUE_MISMATCH", "region_a": 0, "region_b": 1}])
    m.set_open_divergences([{"type": "VALUE_MISMATCH", "region_a": 0, "region_b": 1, "status": "open"}])
    m.observe_div_findings([{"type": "MISSING", "fatal": True, "region": 0, "topic": "s_v1"}])
    m.set_pending_keys(0, 1, 2)
    m.set_unverified_keys(0, 1)
    m.add_changes(3, 1)
    m.observe_progress(
        {
            "timestamp": "2026-01-01T00:00:00.000Z",
            "batchId": 1,
            "numInputRows": 5,
            "inputRowsPerSecond": 1.0,
            "processedRowsPerSecond": 2.0,
            "durationMs": {"addBatch": 3},
            "stateOperators": [{"operatorName": "x", "numRowsTotal": 1, "memoryUsedBytes": 1}],
        },
        query="watch",
    )
    m.observe_heartbeats([{"nonsense": 1}])  # one rejected row, so that counter has a sample too
    return m


class _Quiet:
    """Enough of a producer for a leader that only emits an RT heartbeat."""

    def produce(self, *a, on_delivery=None, **kw) -> None:
        if on_delivery is not None:
            on_delivery(None, None)

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0


def _leader_metrics_with_a_leader() -> LeaderMetrics:
    metrics = LeaderMetrics()
    leader = HeartbeatLeader(
        _Quiet(), vt_topic="s_v1", rt_topic="s_rt", partition=0, region=0, n_regions=2, host="h:1"
    )
    leader.take_over()
    leader.emit_rt_heartbeat()
    metrics.add(leader)
    return metrics


def _exported() -> dict[str, set[str]]:
    """Every metric name a scrape can show, with its label names, from the two registries."""
    out: dict[str, set[str]] = {}
    for registry in (_watch_with_everything().registry, _leader_metrics_with_a_leader().registry):
        for family in registry.collect():
            assert family.samples, f"{family.name}: the update of everything above left it without a sample"
            labels = set().union(*(s.labels for s in family.samples))
            for suffix in SUFFIXES[family.type]:
                out[family.name + suffix] = labels
    return out


_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
}


def metric_selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names it is selected on) of every vector selector in a PromQL expression."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string contents are not names
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # range durations
    expr = re.sub(r"\boffset\s+\w+", " ", expr)
    out = []
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?\s*(\()?", expr):
        name, matchers, call = m.groups()
        if call or name in _KEYWORDS:
            continue  # a function or an aggregation, not a metric
        labels = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers or ""))
        out.append((name, labels))
    return out


def test_the_selector_reader_reads_promql():
    expr = (
        'min without (partition) (a_seconds{x="1"}) > ignoring(region) group_left() (3 * b_total)\n'
        'unless on(job) (time() - c offset 10m) or increase(d_total{fatal="true", y=~"a|b"}[10m]) > bool 0'
    )
    assert metric_selectors(expr) == [
        ("a_seconds", {"x"}),
        ("b_total", set()),
        ("c", set()),
        ("d_total", {"fatal", "y"}),
    ]


def test_every_rule_is_complete():
    rules = _rules()
    names = [r.get("alert") for r in rules]
    assert len(rules) >= 6 and all(names) and len(set(names)) == len(names), names
    for rule in rules:
        where = rule["alert"]
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, where
        assert isinstance(rule.get("expr"), str) and rule["expr"].strip(), where
        assert re.fullmatch(r"\d+[smhd]", str(rule.get("for", ""))), f"{where}: for = {rule.get('for')!r}"
        assert rule.get("labels", {}).get("severity") in {"warning", "critical"}, where
        notes = rule.get("annotations", {})
        assert notes.get("summary") and notes.get("description"), where


def test_every_metric_and_label_in_the_rules_is_exported():
    exported = _exported()
    used = set()
    for rule in _rules():
        selectors = metric_selectors(rule["expr"])
        assert selectors, rule["alert"]
        for name, labels in selectors:
            assert name in exported, (
                f"{rule['alert']}: {name} is exported by neither WatchMetrics nor LeaderMetrics"
            )
            assert labels <= exported[name] | TARGET_LABELS, f"{rule['alert']}: {name} has no label {labels}"
            used.add(name)
        # what the annotations name must be a label of a metric the rule reads (or a target label)
        known = TARGET_LABELS.union(*(exported[n] for n, _ in selectors))
        for note in rule["annotations"].values():
            for label in re.findall(r"\$labels\.(\w+)", note):
                assert label in known, f"{rule['alert']}: annotation names {label}, which no metric of it has"
    # the conditions issue 19 asks rules for
    assert {
        "tidegauge_heartbeat_age_seconds",
        "tidegauge_heartbeat_interval_seconds",
        "tidegauge_offset_lag_records",
        "tidegauge_open_divergences",
        "tidegauge_div_findings_total",
        "tidegauge_source_up",
    } <= used


def test_a_rule_reading_an_unknown_metric_would_be_caught():
    exported = _exported()
    assert "tidegauge_heartbeat_age_seconds" in exported and "tidegauge_heartbeat_age" not in exported
    assert "tidegauge_divergences_total" in exported and "tidegauge_divergences" not in exported
    assert exported["tidegauge_div_findings_total"] == {"type", "fatal", "region", "topic"}


@pytest.fixture(scope="module")
def promtool(prometheus_binaries) -> str:
    """Prometheus' promtool (tests/conftest.py's `prometheus_binaries`: on PATH, else from Debian's `prometheus`
    package); else the tests that need it skip, saying why."""
    path = prometheus_binaries.get("promtool")
    if path is None:
        pytest.skip(
            prometheus_binaries.why_missing("promtool")
            + ": Prometheus' own check of conf/alerts.yaml and its unit tests did not run"
        )
    return path


def test_promtool_accepts_the_rules(promtool):
    proc = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in proc.stdout


def test_the_test_copy_of_the_rules_differs_in_its_for_durations_only(promtool, tmp_path):
    """tests/test_alerts_prometheus.py runs Prometheus on a copy of conf/alerts.yaml whose `for:` durations are
    scaled to its heartbeat interval (`scale_for_durations`, interval / the 60 s the file was written for): every
    other line is the real file's, every `for:` is scaled, and promtool accepts the copy."""
    from prometheus_server import PRODUCTION_INTERVAL_S, duration_ms, scale_for_durations

    text = ALERTS.read_text(encoding="utf-8")
    assert "chosen for Venice's default 60 s interval" in text and PRODUCTION_INTERVAL_S == 60
    factor = 5 / PRODUCTION_INTERVAL_S
    scaled = scale_for_durations(text, factor)
    before, after = text.splitlines(), scaled.splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert changed and all(a.strip().startswith("for:") and b.strip().startswith("for:") for a, b in changed)
    real, copy = _rules(), [r for g in yaml.safe_load(scaled)["groups"] for r in g["rules"]]
    assert [{k: v for k, v in r.items() if k != "for"} for r in copy] == [
        {k: v for k, v in r.items() if k != "for"} for r in real
    ]
    for r, c in zip(real, copy, strict=True):
        assert duration_ms(str(c["for"])) == round(duration_ms(str(r["for"])) * factor), r["alert"]
    assert {str(c["for"]) for c in copy} == {"0s", "5s", "10s", "25s"}  # 0m, 1m, 2m, 5m at a 5 s interval
    (tmp_path / "alerts.yaml").write_text(scaled, encoding="utf-8")
    proc = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "alerts.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_durations_read_and_write_as_prometheus_writes_them():
    from prometheus_server import duration_ms, duration_text, scale_for_durations

    assert [duration_ms(d) for d in ("0m", "90s", "1m", "1h30m", "250ms")] == [
        0,
        90_000,
        60_000,
        5_400_000,
        250,
    ]
    assert [duration_text(ms) for ms in (0, 5_000, 2_500)] == ["0s", "5s", "2500ms"]
    for bad in ("", "1", "m", "1 m", "1m30"):
        with pytest.raises(ValueError):
            duration_ms(bad)
    with pytest.raises(ValueError):
        scale_for_durations(ALERTS.read_text(encoding="utf-8"), 0)


def test_the_rules_fire_when_they_should(promtool):
    proc = subprocess.run(
        [promtool, "test", "rules", PROMTOOL_TESTS.name],
        cwd=PROMTOOL_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = set(re.findall(r"alertname: (\w+)", PROMTOOL_TESTS.read_text(encoding="utf-8")))
    assert tested == {r["alert"] for r in _rules()}, "every rule has a promtool test"


# -- the query stalls: the metrics' own series, through promtool ---------------------------------------------
STEP_S = 15  # the scrape interval the series below are sampled at (and promtool's evaluation interval)


def _progress(at_s: float, batch: int) -> dict:
    """A Spark progress report of a trigger at `at_s` (epoch seconds; promtool's time starts at 0)."""
    from datetime import UTC, datetime

    stamp = datetime.fromtimestamp(at_s, UTC).isoformat()
    return {"timestamp": stamp, "batchId": batch, "numInputRows": 1, "durationMs": {"triggerExecution": 100}}


def _scraped(stalled: bool, stall_at_s: float, steps: int) -> dict[str, str]:
    """The watch's series as Prometheus would scrape them every STEP_S seconds from time 0, in promtool's
    `input_series` form (series → values): at each step the watch's query hands WatchMetrics its progress as the
    watch's driver does (`observe_progress`, with heartbeats_read) and a fresh heartbeat, except that with
    `stalled` it hands nothing over after `stall_at_s`."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    now = [0.0]
    m = WatchMetrics(heartbeat_interval_ms=60_000, clock=lambda: now[0])
    values: dict[str, list[str]] = {}
    for step in range(steps + 1):
        now[0] = t = float(step * STEP_S)
        if not (stalled and t > stall_at_s):  # a stalled query reads nothing: no progress, no heartbeat
            m.observe_progress(_progress(t, step), query="watch", heartbeats_read=True)
            ms = int(t * 1000)
            m.observe_heartbeats(
                [{"region": 0, "partition": 0, "source_region": 1, "origin_ms": ms, "arrival_ms": ms}]
            )
        text = generate_latest(m.registry).decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = {"job": "watch", "instance": "w:9400", **sample.labels}
                inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                series = values.setdefault(f"{sample.name}{{{inner}}}", ["_"] * step)
                series.append(repr(float(sample.value)))
        for series in values.values():
            series.extend(["_"] * (step + 1 - len(series)))
    return {name: " ".join(vals) for name, vals in values.items()}


def _stalled_alert(query: str, age: str) -> dict:
    return {
        "exp_labels": {"severity": "critical", "job": "watch", "instance": "w:9400", "query": query},
        "exp_annotations": {
            "summary": f"tidegauge watch w:9400: the {query} query made no progress for {age}",
            "description": (
                f"Spark's last progress report of the {query} query of the watch at w:9400 is {age} old, more "
                "than 3 heartbeat intervals: that query is not reading, and its findings wait (the watch "
                "query's stall also holds the heartbeat alerts back). See the driver's log."
            ),
        },
    }


@pytest.mark.parametrize("stalled", [True, False])
def test_a_stalled_query_fires_the_stalled_watch_alert(promtool, tmp_path, stalled):
    """The watch's query stops reporting progress at 60 s, or reports every 15 s (the metrics fed through
    WatchMetrics.observe_progress, scraped from its registry): conf/alerts.yaml's TidegaugeWatchStalled, run by
    promtool, fires for it (query="watch") once its last report is over 3 intervals (180 s) old and `for: 1m`
    has passed; progressing, it never fires. The stall raises no heartbeat alert: the ages stop where the query
    stopped reading."""
    series = _scraped(stalled, stall_at_s=60, steps=28)  # 0 .. 7 minutes
    progress = {k: v for k, v in series.items() if k.startswith("tidegauge_last_progress_timestamp_seconds")}
    assert len(progress) == 1 and all('query="watch"' in k for k in progress)  # the one query's series
    # over 180 s old from 255 s on: pending then, firing a minute later (promtool evaluates every 15 s)
    firing = [_stalled_alert("watch", "5m 0s")] if stalled else []
    checks = [
        {"eval_time": "5m", "alertname": "TidegaugeWatchStalled", "exp_alerts": []},
        {"eval_time": "6m", "alertname": "TidegaugeWatchStalled", "exp_alerts": firing},
        {"eval_time": "7m", "alertname": "TidegaugeHeartbeatMissing", "exp_alerts": []},
    ]
    if stalled:
        checks.append(
            {
                "eval_time": "7m",
                "alertname": "TidegaugeWatchStalled",
                "exp_alerts": [_stalled_alert("watch", "6m 0s")],
            }
        )
    doc = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": f"{STEP_S}s",
        "tests": [
            {
                "name": f"the watch query {'stalled' if stalled else 'progressing'}",
                "interval": f"{STEP_S}s",
                "input_series": [{"series": k, "values": v} for k, v in sorted(series.items())],
                "alert_rule_test": checks,
            }
        ],
    }
    (tmp_path / "stalled_test.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    proc = subprocess.run(
        [promtool, "test", "rules", "stalled_test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the real server ------------------------------------------------------------------------------------------
def test_the_prometheus_server_loads_the_rules_and_is_gone_afterwards_even_when_the_test_fails(
    prometheus_binaries,
):
    """tests/support/prometheus_server.py's server, as tests/test_alerts_prometheus.py uses it: started on a free
    loopback port with conf/alerts.yaml (its `for:`s scaled) it lists every rule through /api/v1/rules; when the
    code using it raises, its process is gone and its directory removed all the same."""
    from prometheus_server import prometheus_server, scale_for_durations

    binary = prometheus_binaries.get("prometheus")
    if binary is None:
        pytest.skip(prometheus_binaries.why_missing("prometheus"))
    rules = scale_for_durations(ALERTS.read_text(encoding="utf-8"), 1 / 12)
    with pytest.raises(RuntimeError, match="the test failed"):
        with prometheus_server(binary, {"nothing": ["127.0.0.1:1"]}, rules) as prom:
            process, root = prom.process, prom.log.parent
            loaded = {r["name"]: r["duration"] for g in prom.api("rules")["groups"] for r in g["rules"]}
            raise RuntimeError("the test failed")
    assert loaded["TidegaugeHeartbeatMissing"] == 5 and set(loaded) == {r["alert"] for r in _rules()}
    assert process.poll() is not None, "the server still runs"
    assert not root.exists(), f"{root} is left behind"
