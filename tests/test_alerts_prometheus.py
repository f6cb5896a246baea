"""Prometheus for real (issue 29, item 3): the real Prometheus server scrapes a running `tidegauge watch` and a
heartbeat leader process, with conf/alerts.yaml loaded, and its HTTP API says what fires.

One live run, as a user would start it: `tidegauge simulate --live --brokers real` (3 regions, each an Apache
Kafka broker on loopback, 2 partitions, heartbeats every 5 s), `tidegauge watch` on its clusters serving its
metrics, and a leader process (a `HeartbeatLeader` of its own topics on region 0's cluster, heartbeating every
5 s, serving `LeaderMetrics` as docs/watch.md shows). A
Prometheus (Debian's binary, tests/support/prometheus_server.py) scrapes both every 2 s and evaluates the rules
every second. The simulation is healthy until, 110 s after its first write (the watch is up after 45 to 100 s on
a loaded 2-core host), a write is dropped in two regions, and 20 s later one leader goes silent for 50 s. Through
/api/v1/alerts (while it runs) and /api/v1/query (`ALERTS`, the series Prometheus writes at every evaluation of an
active alert, and the watch's own series) the test asserts that:

* nothing fires, nor is even pending, from the moment Prometheus sees the watch up (both targets scraped, every
  heartbeat series under its threshold, its query progressing) to the first fault: a healthy run; and nothing
  but the two faults' own alerts after it;
* `TidegaugeDivergence` fires for every region pair the dropped write left diverging (its delay after the write
  is reported);
* `TidegaugeHeartbeatMissing` fires for the silent leader's partition in every region, within its threshold:
  3 intervals after the leader's last heartbeat arrived, plus the rule's `for:`, plus 1.5 intervals (the live
  demo's goal for the watch's own view of the age), plus one scrape and one evaluation interval; and it goes
  once the leader heartbeats again.

The rules' thresholds are counted in heartbeat intervals, read from `tidegauge_heartbeat_interval_seconds` and
`tidegauge_leader_heartbeat_interval_seconds`, so they follow the 5 s interval by themselves; their `for:`
durations are wall-clock time chosen for a 60 s interval, so the server loads a copy of the real file with only
those scaled, by 5/60 (`scale_for_durations`; `tests/test_alerts.py` checks that nothing else differs).

Timing on a shared host: a missed timing goal (the heartbeat alert late or held back by a watch running behind,
a heartbeat or stall alert where none should be, a healthy stretch shorter than 20 s because the watch came up
late) is reported rather than failed when the 1-minute load average exceeded `LOAD_PER_CORE_LIMIT` per
core while it happened, as `tidegauge demo --watch` judges its own goals. A divergence alert that does not fire,
or fires for a pair no fault explains, fails at any load. Every process and directory the test starts (the
simulation, the watch, Prometheus) is stopped and removed afterwards, whatever happened.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_server import (
    PRODUCTION_INTERVAL_S,
    Prometheus,
    duration_ms,
    prometheus_server,
    scale_for_durations,
)

from div.kafka_log import parse_kafka_uri
from heartbeat import HeartbeatLeader
from heartbeat.metrics import LeaderMetrics
from pipelines.demo.job import Check, DemoError
from pipelines.demo.watch import _cli, _Proc, _read_json, load_during, overloaded, timing_check
from pipelines.demo.watch import _wait as wait_for

REPO = Path(__file__).resolve().parents[1]
ALERTS = REPO / "conf" / "alerts.yaml"

# The clusters the simulation runs on (and so the leader process, on region 0's): an Apache Kafka broker per
# region, started by the simulation (its jars from the `kafka_jars` fixture's cache).
CLUSTERS = ("--brokers", "real")

INTERVAL_S = 5.0  # the leaders' heartbeat interval (the live demo's): thresholds of 15 s
TRIGGER = "2 seconds"  # the watch's micro-batches
SCRAPE_S = 2.0  # Prometheus scrapes both targets this often (a scrape may take as long)
EVAL_S = 1.0  # and evaluates the rules this often
FOR_FACTOR = INTERVAL_S / PRODUCTION_INTERVAL_S  # `for: 1m` → 5 s
DROPPED_AT_S, SILENT_AT_S, SILENT_FOR_S = 90, 105, 35  # seconds after the simulation's first write
FAULTS = f"dropped@{DROPPED_AT_S},silent@{SILENT_AT_S}+{SILENT_FOR_S}"
HEALTHY_MIN_S = 20.0  # the healthy stretch judged before the first fault, at least
RESOLVED_WITHIN_S = 60.0  # the heartbeat alert goes within this after the silence (generous: 12 intervals)
DEADLINE_S = 600.0  # only against a run that hangs (pytest-timeout stops a test at 900 s)
TIMING_ALERTS = {  # alerts a slow host alone can raise: a late micro-batch, scrape or heartbeat
    "TidegaugeHeartbeatMissing",
    "TidegaugeRegionHeartbeatMissing",
    "TidegaugeWatchStalled",
    "TidegaugeSourceDown",
    "TidegaugeOffsetLagHigh",
    "TidegaugeLeaderWatermarkStalled",
}

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.kafka]


# -- the leader process --------------------------------------------------------------------------------------
class LeaderProcess:
    """A leader process as docs/watch.md shows one: a `HeartbeatLeader` (region 0 of 1, partition 0 of topics of
    its own on `bootstrap`) that writes an RT heartbeat every interval, consumes its RT back and writes each
    heartbeat's VT heartbeat, its `LeaderMetrics` served on a free loopback port. Its acknowledged watermark
    moves once an interval, so `TidegaugeLeaderWatermarkStalled` has real input and must stay quiet."""

    RT, VT = "leader_probe_rt", "leader_probe_v1"

    def __init__(self, bootstrap: str, interval_ms: int) -> None:
        self.bootstrap = bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})  # a real broker creates no topic on first use
        for fut in admin.create_topics([NewTopic(t, 1, 1) for t in (self.RT, self.VT)]).values():
            fut.result(60)
        self.leader = HeartbeatLeader(
            {"bootstrap.servers": bootstrap, "log_level": 0},  # its broker goes with the simulation, first
            vt_topic=self.VT,
            rt_topic=self.RT,
            partition=0,
            region=0,
            n_regions=1,
            host="leader-probe:1",
            term_id=1,
            interval_ms=interval_ms,
        )
        registry = CollectorRegistry()
        LeaderMetrics(registry).add(self.leader)
        self._httpd, self._http_thread = start_http_server(0, addr="127.0.0.1", registry=registry)
        self.target = f"127.0.0.1:{self._httpd.server_port}"
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        consumer = None
        try:
            self.leader.take_over()
            self.leader.poll()  # the first RT heartbeat
            self.leader.flush()
            consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": "leader-probe",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                }
            )
            consumer.assign([TopicPartition(self.RT, 0, 0)])
            while not self._stop.is_set():
                self.leader.poll()
                for m in consumer.consume(100, timeout=0.2):
                    if m.error() is not None:
                        continue  # a transient consumer error (the fetch is retried)
                    rec = self.leader.on_rt_record(
                        0, m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]
                    )
                    if not rec.is_heartbeat:
                        self.leader.done()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc
        finally:
            if consumer is not None:
                consumer.close()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        try:
            self.leader.close(10)
        finally:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._http_thread.join(10)


# -- watching the run ----------------------------------------------------------------------------------------
def _wait(what: str, until, timeout: float, proc: _Proc | None = None):
    """The demo's wait, failing the test with the process's output when it does not come."""
    try:
        return wait_for(what, until, timeout, proc)
    except DemoError as exc:
        pytest.fail(f"{exc}:\n{proc.text()[-3000:]}" if proc is not None else str(exc))


def _key(alert: dict) -> tuple[str, tuple]:
    labels = dict(alert["labels"])
    return labels.pop("alertname"), tuple(sorted((k, v) for k, v in labels.items() if k != "alertstate"))


@dataclass
class Observed:
    """What the test saw while the run went on (epoch seconds)."""

    regions: int = 0
    loads: list[tuple[float, float]] = field(default_factory=list)
    ready_at: float | None = None  # the watch up: every heartbeat series fresh, its query progressing
    seen: dict[tuple, dict[str, float]] = field(default_factory=dict)  # alert → state → first poll seeing it
    alerts: dict[tuple, dict] = field(default_factory=dict)  # the last /api/v1/alerts entry of each
    truth: dict = field(default_factory=dict)
    silence_over_at: float | None = None
    silent_fired: bool = False  # a heartbeat alert of the silent leader's series was seen firing
    resolved_at: float | None = None  # the silent leader's heartbeat alerts all gone after the silence


def _ready(prom: Prometheus, regions: int, partitions: int, silent: dict | None) -> bool:
    """Whether the watch is up and caught up, as Prometheus sees it: both targets scraped, every heartbeat series
    there and under its threshold (but the silent leader's, once its silence began), the watch query's progress
    fresh, every region's source up, and the leader's series there."""
    up = {r["metric"]["job"]: r["value"][1] for r in prom.query("up")["result"]}
    if up != {"tidegauge-watch": "1", "tidegauge-leader": "1"}:
        return False
    threshold = f"{3 * INTERVAL_S:g}"
    ages = prom.query("tidegauge_heartbeat_age_seconds")["result"]
    late = [
        r["metric"]
        for r in ages
        if float(r["value"][1]) >= float(threshold)
        and not (
            silent is not None
            and r["metric"]["source_region"] == str(silent["region"])
            and r["metric"]["partition"] == str(silent["partition"])
        )
    ]
    progress = prom.query(f"time() - tidegauge_last_progress_timestamp_seconds < {threshold}")["result"]
    sources = prom.query("tidegauge_source_up == 1")["result"]
    leader = prom.query("tidegauge_leader_watermark_age_seconds")["result"]
    return (
        len(ages) == regions * partitions * regions
        and not late
        and len(progress) == 1
        and len(sources) == regions
        and bool(leader)
    )


def _observe(prom: Prometheus, out: Path, sim: _Proc, watch: _Proc, leader: LeaderProcess) -> Observed:
    """Poll /api/v1/alerts (and truth.json, and the load) every half second until the silent leader's alerts
    have come and gone, or a process ends, or the deadline."""
    live = _read_json(out / "sim" / "live.json") or {}
    regions, partitions = len(live["regions"]), int(live["partitions"])
    seen = Observed(regions=regions)
    start = time.monotonic()
    while time.monotonic() - start < DEADLINE_S:
        now = time.time()
        seen.loads.append((now, os.getloadavg()[0]))
        for proc, name in ((sim, "the simulation"), (watch, "the watch")):
            if not proc.alive():
                pytest.fail(f"{name} ended (exit {proc.p.returncode}):\n{proc.text()[-3000:]}")
        if not leader.alive():
            pytest.fail(f"the leader process stopped: {leader.error!r}")
        seen.truth = _read_json(out / "sim" / "truth.json") or seen.truth
        faults = seen.truth.get("faults", [])
        silent = next((f for f in faults if f["kind"] == "silent"), None)
        if seen.ready_at is None and _ready(prom, regions, partitions, silent):
            seen.ready_at = now
        active = prom.alerts()
        for alert in active:
            key = _key(alert)
            seen.seen.setdefault(key, {}).setdefault(alert["state"], now)
            seen.alerts[key] = alert
        if silent is not None and silent.get("end_at"):
            seen.silence_over_at = silent["end_at"] / 1000
            mine = [
                a
                for a in active
                if a["labels"]["alertname"] == "TidegaugeHeartbeatMissing"
                and a["labels"].get("source_region") == str(silent["region"])
                and a["labels"].get("partition") == str(silent["partition"])
            ]
            seen.silent_fired = seen.silent_fired or any(a["state"] == "firing" for a in mine)
            if now > seen.silence_over_at:
                if seen.silent_fired and not mine and seen.resolved_at is None:
                    seen.resolved_at = now
                if seen.resolved_at is not None and _divergence_fired(seen):
                    return seen
                if now > seen.silence_over_at + RESOLVED_WITHIN_S:  # it never came, or never went
                    return seen
        time.sleep(0.5)
    pytest.fail(f"the run did not end within {DEADLINE_S:g} s: {seen}")


def _divergence_fired(seen: Observed) -> bool:
    """Whether TidegaugeDivergence was seen firing for every pair the dropped write left diverging (a watch
    slowed by a loaded host reads the covering heartbeats late; the observation waits for it, within bounds)."""
    dropped = next((f for f in seen.truth.get("faults", []) if f["kind"] == "dropped"), None)
    if dropped is None:
        return False
    firing = {
        (dict(labels).get("type"), dict(labels).get("region_a"), dict(labels).get("region_b"))
        for (name, labels), states in seen.seen.items()
        if name == "TidegaugeDivergence" and "firing" in states
    }
    return all(
        (e["type"], str(e["region_a"]), str(e["region_b"])) in firing for e in dropped["expect"]["leapfrog"]
    )


def _values(prom: Prometheus, selector: str, since: float) -> list[tuple[dict, list[tuple[float, str]]]]:
    """Every sample of the series `selector` from `since` on, as Prometheus stored them: (labels, [(time,
    value)]) by series."""
    window = max(1, int(time.time() - since) + 2 * int(SCRAPE_S) + 1)
    result = prom.query(f"{selector}[{window}s]")["result"]
    return [(r["metric"], [(float(t), v) for t, v in r["values"] if float(t) >= since]) for r in result]


def _samples(prom: Prometheus, selector: str, since: float) -> list[tuple[dict, list[float]]]:
    """The times of those samples: (labels, [time])."""
    return [(labels, [t for t, _ in values]) for labels, values in _values(prom, selector, since)]


# -- the test ------------------------------------------------------------------------------------------------
def test_prometheus_fires_the_real_rules_on_a_live_watch_and_leader(
    prometheus_binaries, kafka_jars, tmp_path
):
    binary = prometheus_binaries.get("prometheus")
    if binary is None:
        pytest.skip(prometheus_binaries.why_missing("prometheus"))
    t0 = time.monotonic()
    out = tmp_path
    conf = out / "simulate.yaml"
    conf.write_text("simulate:\n  default_lag_ms: 200\n")  # not the repository's conf/simulate.yaml
    sim_argv = _cli(
        "simulate", "--live", "--out", str(out / "sim"), "--conf", str(conf), "--seed", "5", "--regions", "3",
        "--partitions", "2", "--rate", "20", "--heartbeat-ms", str(int(INTERVAL_S * 1000)),
        "--duration", str(int(DEADLINE_S)), "--faults", FAULTS, "--no-progress", *CLUSTERS,
    )  # fmt: skip
    rules = scale_for_durations(ALERTS.read_text(encoding="utf-8"), FOR_FACTOR)
    sim = watch = leader = None
    figures: dict = {"cores": os.cpu_count() or 1}
    try:
        sim = _Proc(sim_argv, out / "simulate.log")
        live = _wait(
            "the simulation's clusters",
            lambda: (i := _read_json(out / "sim" / "live.json")) and i.get("state") == "running" and i,
            180,
            sim,
        )
        figures["simulation_up_s"] = round(time.monotonic() - t0, 1)
        watch = _Proc(
            _cli(
                "watch", "--store", live["store"], "--version", str(live["version"]),
                *[f"--source={r['region']}={r['uri']}" for r in live["regions"]],
                "--checkpoint", str(out / "watch-checkpoint"), "--out", str(out / "watch"),
                "--metrics-port", "0", "--trigger-interval", TRIGGER,
                "--heartbeat-interval-ms", str(int(INTERVAL_S * 1000)), "--master", "local[2]",
            ),
            out / "watch.log",
        )  # fmt: skip
        leader = LeaderProcess(parse_kafka_uri(live["regions"][0]["uri"]), int(INTERVAL_S * 1000))
        line = _wait(
            "the watch's metrics",
            lambda: next((x for x in watch.text().splitlines() if "metrics on http" in x), None),
            300,
            watch,
        )
        target = urlsplit(line.split("metrics on ", 1)[1].strip()).netloc
        jobs = {"tidegauge-watch": [target], "tidegauge-leader": [leader.target]}
        with prometheus_server(
            binary, jobs, rules, scrape_interval_s=SCRAPE_S, evaluation_interval_s=EVAL_S
        ) as prom:
            loaded = {r["name"]: r["duration"] for g in prom.api("rules")["groups"] for r in g["rules"]}
            real = [
                r for g in yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"] for r in g["rules"]
            ]
            assert loaded == {  # every rule of the file, with its `for:` scaled
                r["alert"]: round(duration_ms(str(r["for"])) * FOR_FACTOR) / 1000 for r in real
            }, loaded
            figures["rules_for_s"] = loaded
            seen = _observe(prom, out, sim, watch, leader)
            since = seen.truth["live"]["started_at"] / 1000  # every sample of the run
            alerts = _samples(prom, "ALERTS", since)
            counted = _samples(prom, "tidegauge_divergences_total", since)
            figures["scrapes"] = {
                labels["job"]: {"scrapes": len(values), "failed": sum(v != "1" for _, v in values)}
                for labels, values in _values(prom, "up", since)
            }
            figures["alerts_before_the_watch_was_up"] = sorted(
                {
                    k[0]
                    for k, states in seen.seen.items()
                    if seen.ready_at is None or min(states.values()) < seen.ready_at
                }
            )
            _judge(prom, seen, alerts, counted, figures, watch.text())
    finally:
        if leader is not None:
            leader.stop()
        for proc in (watch, sim):
            if proc is not None:
                proc.stop(60)
        figures["test_s"] = round(time.monotonic() - t0, 1)
        (out / "figures.json").write_text(json.dumps(figures, indent=1, default=str, ensure_ascii=False))
        print("figures:")
        for name, value in figures.items():
            print(f"  {name}: {json.dumps(value, default=str, ensure_ascii=False)}")


def _judge(
    prom: Prometheus, seen: Observed, alerts: list, counted: list, figures: dict, watch_log: str
) -> None:
    cores = figures["cores"]
    faults = seen.truth.get("faults", [])
    dropped = next(f for f in faults if f["kind"] == "dropped")
    silent = next(f for f in faults if f["kind"] == "silent")
    first_fault = min(f["at"] for f in faults) / 1000
    started = seen.truth["live"]["started_at"] / 1000
    figures["load_max_1m"] = round(max(v for _, v in seen.loads), 1)
    figures["watch_up_after_s"] = None if seen.ready_at is None else round(seen.ready_at - started, 1)
    figures["first_fault_after_s"] = round(first_fault - started, 1)
    checks: list[Check] = []

    # expected alerts: the dropped write's pairs, the silent leader's partition from every region
    pairs = {(e["type"], str(e["region_a"]), str(e["region_b"])) for e in dropped["expect"]["leapfrog"]}
    assert pairs, dropped

    def expected(labels: dict) -> bool:
        name = labels["alertname"]
        if name == "TidegaugeDivergence":
            return (labels["type"], labels["region_a"], labels["region_b"]) in pairs
        return (
            name == "TidegaugeHeartbeatMissing"
            and labels["source_region"] == str(silent["region"])
            and labels["partition"] == str(silent["partition"])
        )

    # 1. a healthy run. From the first evaluation after Prometheus saw the watch up: nothing active before the
    # first fault, and nothing but the faults' own alerts after it. Before that moment the watch was starting
    # (its heartbeat ages count from its start until its first micro-batch reads them, and Spark's first
    # micro-batches are long): the alerts a slow host raises then are listed, not judged; any other is judged
    # over the whole run (a divergence no fault explains is wrong at any time).
    judged_from = None if seen.ready_at is None else seen.ready_at + EVAL_S
    healthy_s = 0.0 if judged_from is None else max(0.0, first_fault - judged_from)
    figures["healthy_judged_before_the_first_fault_s"] = round(healthy_s, 1)
    if healthy_s < HEALTHY_MIN_S:  # the watch came up late: the host's doing when it is loaded
        load = load_during(seen.loads, started, first_fault)
        checks.append(
            Check(
                False,
                "a healthy stretch judged before the first fault",
                f"{healthy_s:.1f} s, under {HEALTHY_MIN_S:g} s: the watch "
                + ("was never seen up" if judged_from is None else "came up late")
                + (f" (not judged: load {load:.1f} on {cores} cores)" if overloaded(load, cores) else ""),
                judged=not overloaded(load, cores),
            )
        )
    unexplained: dict[tuple, dict[str, list[float]]] = {}  # alert (its labels) → state → sample times
    for labels, times in alerts:
        if labels["alertname"] in TIMING_ALERTS:
            times = [t for t in times if judged_from is not None and t >= judged_from]
        if times and (times[0] < first_fault or not expected(labels)):
            shown = tuple(sorted((k, v) for k, v in labels.items() if k not in _NOT_SHOWN))
            unexplained.setdefault(shown, {})[labels["alertstate"]] = times
    for shown, states in sorted(unexplained.items()):
        name = dict(shown)["alertname"]
        times = sorted(t for ts in states.values() for t in ts)
        load = load_during(seen.loads, times[0], times[-1])
        timing = name in TIMING_ALERTS and overloaded(load, cores)
        checks.append(
            Check(
                False,
                f"nothing fires unless a fault explains it: {_alert_text(shown)}",
                f"{' and '.join(sorted(states))} from {times[0] - first_fault:+.1f} s to "
                f"{times[-1] - first_fault:+.1f} s after the first fault"
                + (f" (not judged: load {load:.1f} on {cores} cores)" if timing else ""),
                judged=not timing,
            )
        )

    # 2. the divergence alert, for every pair the dropped write left diverging
    at = dropped["at"] / 1000
    divergence = []
    for pair in sorted(pairs):
        labels = {
            "alertname": "TidegaugeDivergence",
            "type": pair[0],
            "region_a": pair[1],
            "region_b": pair[2],
        }
        fired = [
            t
            for lab, times in alerts
            if lab.get("alertstate") == "firing" and all(lab.get(k) == v for k, v in labels.items())
            for t in times
        ]
        seen_count = [
            t
            for lab, times in counted
            if (lab.get("type"), lab.get("region_a"), lab.get("region_b")) == pair
            for t in times
        ]
        if not fired:
            # A wrong verdict only if the watch's query got far enough to see it: its last progress
            # report after the heartbeats that cover the write (an interval, plus one for the replication).
            progress = [
                float(v)
                for _, values in _values(prom, 'tidegauge_last_progress_timestamp_seconds{query="watch"}', at)
                for _, v in values
            ]
            reached = max(progress, default=0.0)
            covered = at + 2 * INTERVAL_S
            load = load_during(seen.loads, at, time.time())
            if reached < covered:  # the watch never read that far: a stalled query, which its own alert names
                checks.append(
                    Check(
                        False,
                        f"TidegaugeDivergence for {pair} after the dropped write",
                        f"the watch query's last progress was {reached - at:+.1f} s after the write, before "
                        f"the heartbeats that cover it (+{covered - at:g} s)"
                        + (
                            f" (not judged: load {load:.1f} on {cores} cores)"
                            if overloaded(load, cores)
                            else ""
                        ),
                        judged=not overloaded(load, cores),
                    )
                )
                continue
            pytest.fail(
                f"TidegaugeDivergence never fired for {pair} after the dropped write {dropped}, though the watch "
                f"query progressed to {reached - at:+.1f} s after it; the watch's log ends:\n"
                + watch_log[-3000:]
            )
        assert min(fired) >= at, f"TidegaugeDivergence fired for {pair} before the write was dropped"
        row = {
            "pair": pair,
            "scraped_after_s": round(min(seen_count) - at, 2) if seen_count else None,
            "firing_after_s": round(min(fired) - at, 2),
        }
        row["firing_after_intervals"] = round(row["firing_after_s"] / INTERVAL_S, 2)
        divergence.append(row)
    figures["divergence_alert"] = divergence

    # 3. the heartbeat alert: in every region, within its threshold; gone once the leader heartbeats again
    for_s = figures["rules_for_s"]["TidegaugeHeartbeatMissing"]  # as Prometheus loaded it
    goal_s = for_s + 1.5 * INTERVAL_S + SCRAPE_S + EVAL_S
    rows = []
    for x in range(seen.regions):
        labels = {
            "alertname": "TidegaugeHeartbeatMissing",
            "region": str(x),
            "partition": str(silent["partition"]),
            "source_region": str(silent["region"]),
        }
        states = {  # from the silence on (before it, the watch's start may have raised them)
            state: [
                t
                for lab, times in alerts
                if lab.get("alertstate") == state and all(lab.get(k) == v for k, v in labels.items())
                for t in times
                if t >= silent["at"] / 1000
            ]
            for state in ("pending", "firing")
        }
        subject = (
            f"TidegaugeHeartbeatMissing for the silent leader (region {silent['region']}, partition "
            f"{silent['partition']}) in region {x}"
        )
        if not states["firing"]:  # a watch running behind holds it back (the rule's `unless`): load
            load = load_during(seen.loads, silent["at"] / 1000, seen.silence_over_at or time.time())
            held = overloaded(load, cores)
            checks.append(
                Check(
                    False,
                    subject,
                    ("pending, but never fired" if states["pending"] else "never fired, nor was pending")
                    + (f" (not judged: load {load:.1f} on {cores} cores)" if held else ""),
                    judged=not held,
                )
            )
            continue
        firing = min(states["firing"])
        pending = min(states["pending"]) if states["pending"] else firing
        selector = ",".join(f'{k}="{v}"' for k, v in labels.items() if k != "alertname")
        age = float(
            prom.query(f"tidegauge_heartbeat_age_seconds{{{selector}}}", at=firing)["result"][0]["value"][1]
        )
        planned = float(
            prom.query('tidegauge_last_progress_timestamp_seconds{query="watch"}', at=firing)["result"][0][
                "value"
            ][1]
        )
        arrived = planned - age  # when its last heartbeat arrived in region x's VT (broker time)
        threshold = arrived + 3 * INTERVAL_S
        over = [  # the first scrape of the watch showing the age over the threshold: the watch's own delay
            t
            for _, values in _values(prom, f"tidegauge_heartbeat_age_seconds{{{selector}}}", threshold)
            for t, v in values
            if float(v) > 3 * INTERVAL_S
        ]
        late = firing - threshold
        load = load_during(seen.loads, threshold, firing)
        rows.append(
            {
                "region": x,
                "last_heartbeat_before_silence_s": round(silent["at"] / 1000 - arrived, 2),
                "scraped_over_threshold_after_s": round(min(over) - threshold, 2) if over else None,
                "pending_after_threshold_s": round(pending - threshold, 2),
                "firing_after_threshold_s": round(late, 2),
                "firing_after_threshold_intervals": round(late / INTERVAL_S, 2),
                "firing_after_silence_s": round(firing - silent["at"] / 1000, 2),
                "load_1m": None if load is None else round(load, 1),
            }
        )
        detail = (
            f"fired {late:.1f} s = {late / INTERVAL_S:.2f} intervals after the threshold (for: {for_s:g} s)"
        )
        checks.append(timing_check(subject, late, goal_s, detail, load, cores))
        listed = [a for a in seen.alerts.values() if all(a["labels"].get(k) == v for k, v in labels.items())]
        summary = listed[-1]["annotations"]["summary"] if listed else ""
        assert summary.startswith(
            f"No heartbeat from region {silent['region']} in region {x}'s VT partition {silent['partition']} for"
        ), summary
    figures["heartbeat_alert"] = rows
    figures["heartbeat_alert_goal_after_threshold_s"] = goal_s
    resolved = None if seen.resolved_at is None else round(seen.resolved_at - seen.silence_over_at, 1)
    figures["heartbeat_alert_gone_after_silence_s"] = resolved
    if seen.silent_fired and seen.silence_over_at is not None:
        load = load_during(seen.loads, seen.silence_over_at, seen.silence_over_at + RESOLVED_WITHIN_S)
        late = resolved is None and overloaded(load, cores)
        checks.append(
            Check(
                resolved is not None,
                "the heartbeat alert goes once the leader heartbeats again",
                f"gone {resolved} s after the silence ended"
                if resolved is not None
                else f"still active {RESOLVED_WITHIN_S:g} s after the silence ended"
                + (f" (not judged: load {load:.1f} on {cores} cores)" if late else ""),
                judged=not late,
            )
        )
    figures["checks"] = [c.line() for c in checks]
    failed = [c.line() for c in checks if not c.ok and c.judged]
    assert not failed, "\n".join(failed) + "\nthe watch's log ends:\n" + watch_log[-2000:]


_NOT_SHOWN = {"__name__", "alertstate", "severity", "job", "instance"}


def _alert_text(labels: tuple) -> str:
    """`TidegaugeWatchStalled{query="watch"}`: an alert's name and its own labels."""
    d = dict(labels)
    name = d.pop("alertname")
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(d.items())) + "}"
