"""Prometheus metrics of `HeartbeatLeader`s, for a leader process that wants them (issue 19).

A leader counts what it does once, in its `LeaderStats`; this module is a second view of those same numbers,
read when Prometheus scrapes, so the leader's hot path pays nothing for it and no number is counted twice. A
leader process registers its leaders and serves the registry itself:

    from prometheus_client import CollectorRegistry, start_http_server
    from heartbeat.metrics import LeaderMetrics

    registry = CollectorRegistry()
    metrics = LeaderMetrics(registry)
    metrics.add(leader)                   # again with the new leader after a restart with a new term
    start_http_server(9465, registry=registry)

Every series is labelled with the leader's `region`, `partition` and `topic` (heartbeat counters also with
`kind`, rt or vt, and `topic` is then the topic written). The names are a contract: `conf/alerts.yaml` and
docs/watch.md use them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from .leader import HeartbeatLeader

_LEADER = ["region", "partition", "topic"]
_HEARTBEAT = [*_LEADER, "kind"]
_PER_SOURCE = [*_LEADER, "source_region"]


class LeaderMetrics:
    """A Prometheus collector over the leaders `add`ed to it, registered in `registry` (a new
    `CollectorRegistry` when none is given; never the process-wide default one unless it is passed)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lock = threading.Lock()
        self._leaders: dict[tuple[int, str, int], HeartbeatLeader] = {}
        self.registry.register(self)

    def add(self, leader: HeartbeatLeader) -> HeartbeatLeader:
        """Show `leader`'s counters. A leader of the same region, VT topic and partition already shown is
        replaced (the restart with a new term after `LeaderBrokenError`: its counters start again from zero,
        which Prometheus reads as a counter reset). Returns `leader`."""
        with self._lock:
            self._leaders[_identity(leader)] = leader
        return leader

    def remove(self, leader: HeartbeatLeader) -> None:
        """Stop showing `leader` (a leader that stepped down). Unknown leaders are ignored."""
        with self._lock:
            if self._leaders.get(_identity(leader)) is leader:
                del self._leaders[_identity(leader)]

    def describe(self) -> list[Metric]:
        return list(_families())

    def collect(self) -> Iterator[Metric]:
        """One sample per leader and metric, read from the leaders now (called by the registry on a scrape)."""
        with self._lock:
            leaders = list(self._leaders.values())
        fams = {f.name: f for f in _families()}
        for leader in leaders:
            _collect_one(leader, fams)
        yield from fams.values()


def _identity(leader: HeartbeatLeader) -> tuple[int, str, int]:
    return (leader.region, leader.vt_topic, leader.partition)


def _families() -> Iterator[Metric]:
    c, g = CounterMetricFamily, GaugeMetricFamily
    yield c(
        "tidegauge_leader_heartbeats_written",
        "Heartbeats produced (rt: to the local RT; vt: for a consumed RT heartbeat, with hbw and hbd).",
        labels=_HEARTBEAT,
    )
    yield c("tidegauge_leader_heartbeats_acked", "Heartbeats the broker acknowledged.", labels=_HEARTBEAT)
    yield c(
        "tidegauge_leader_heartbeats_failed",
        "Heartbeats whose send failed for good (they claim nothing; the next one claims at least as much).",
        labels=_HEARTBEAT,
    )
    yield c(
        "tidegauge_leader_rt_records",
        "RT records handed to the leader (heartbeats included).",
        labels=_LEADER,
    )
    yield c(
        "tidegauge_leader_records_sent",
        "VT records produced for RT records (segment control records included).",
        labels=_LEADER,
    )
    yield c("tidegauge_leader_records_acked", "VT records the broker acknowledged.", labels=_LEADER)
    yield c(
        "tidegauge_leader_records_failed",
        "VT records whose send failed for good (the leader is then broken).",
        labels=_LEADER,
    )
    yield c(
        "tidegauge_leader_hbd_truncated",
        "VT heartbeats whose hbd was cut to fit hbd_max_bytes.",
        labels=_LEADER,
    )
    yield g(
        "tidegauge_leader_pending_heartbeats",
        "VT heartbeats waiting for earlier sends to be acknowledged.",
        labels=_LEADER,
    )
    yield g("tidegauge_leader_pending_sends", "VT sends not acknowledged yet.", labels=_LEADER)
    yield g(
        "tidegauge_leader_broken",
        "1 once a VT send failed for good: restart with a new term.",
        labels=_LEADER,
    )
    yield g(
        "tidegauge_leader_heartbeat_interval_seconds",
        "The leader's RT heartbeat interval (absent when the caller emits RT heartbeats itself).",
        labels=_LEADER,
    )
    yield g(
        "tidegauge_leader_watermark",
        "The acknowledged high-water mark of source_region's RT: what a heartbeat written now would claim.",
        labels=_PER_SOURCE,
    )
    yield g(
        "tidegauge_leader_watermark_age_seconds",
        "Time since source_region's acknowledged watermark last "
        "moved (or the term began), on the leader's clock, at scrape time.",
        labels=_PER_SOURCE,
    )


def _collect_one(leader: HeartbeatLeader, fams: dict[str, Metric]) -> None:
    # Read from another thread than the leader's: each value is one attribute read or a list copy, so a scrape
    # sees every number as it was at some moment of the leader's loop (not all at the same moment).
    st = leader.stats
    base = [str(leader.region), str(leader.partition), leader.vt_topic]
    rt = [str(leader.region), str(leader.partition), leader.rt_topic, "rt"]
    vt = [*base, "vt"]
    for name, rt_value, vt_value in (
        ("tidegauge_leader_heartbeats_written", st.rt_heartbeats, st.vt_heartbeats),
        ("tidegauge_leader_heartbeats_acked", st.rt_heartbeats_acked, st.vt_heartbeats_acked),
        ("tidegauge_leader_heartbeats_failed", st.rt_heartbeats_failed, st.vt_heartbeats_failed),
    ):
        fams[name].add_metric(rt, rt_value)
        fams[name].add_metric(vt, vt_value)
    fams["tidegauge_leader_rt_records"].add_metric(
        [str(leader.region), str(leader.partition), leader.rt_topic], st.rt_records
    )
    fams["tidegauge_leader_records_sent"].add_metric(base, st.vt_sends)
    fams["tidegauge_leader_records_acked"].add_metric(base, st.vt_acked)
    fams["tidegauge_leader_records_failed"].add_metric(base, st.vt_failed)
    fams["tidegauge_leader_hbd_truncated"].add_metric(base, st.hbd_truncated)
    fams["tidegauge_leader_pending_heartbeats"].add_metric(base, leader.pending_heartbeats)
    tracker = leader.tracker
    fams["tidegauge_leader_pending_sends"].add_metric(base, tracker.pending_sends if tracker else 0)
    fams["tidegauge_leader_broken"].add_metric(base, 1 if leader.broken else 0)
    if leader.interval_ms > 0:
        fams["tidegauge_leader_heartbeat_interval_seconds"].add_metric(base, leader.interval_ms / 1000)
    if tracker is None:
        return  # no term yet: no watermark to show
    now = leader.clock()
    advanced = dict(st.watermark_advanced_ms)
    for source, mark in enumerate(tracker.watermarks()):
        labels = [*base, str(source)]
        fams["tidegauge_leader_watermark"].add_metric(labels, mark)
        if source in advanced:
            fams["tidegauge_leader_watermark_age_seconds"].add_metric(
                labels, max(0, now - advanced[source]) / 1000
            )
