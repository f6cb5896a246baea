"""The Prometheus metrics of `tidegauge watch`'s driver (issue 19, item 5), served on `--metrics-port`.

The streaming job hands the driver small rows from each micro-batch (heartbeats seen, findings, record counts,
lag when offsets are planned) and Spark's `StreamingQueryProgress`; `WatchMetrics` turns them into metrics in its
own `CollectorRegistry` (never the process-wide one, so two watches or a test suite in one process do not mix).
Every update method is plain Python, cheap, and never raises on a bad row: a metrics update must not stop the job,
so a row it cannot read is skipped, counted in `tidegauge_metric_rows_rejected_total{method}` and logged with the
row and the reason.

The time since the last heartbeat is computed when Prometheus scrapes, from the newest arrival seen, so it keeps
growing while no micro-batch runs and while nobody writes: a region whose leaders stopped heartbeating, or a
watch that stopped reading, crosses its alert threshold without any update. An older heartbeat that arrives late
never makes it go backwards.

The watch runs Leap Frog and DIV as one streaming query, `watch`, and with --changes the change stream as a second,
`changes`. Every metric fed from a query's progress (its micro-batch timings, rows, state, last batch, last
progress time, and the offset lag its source reports) carries a `query` label, `watch` or `changes`
(`QUERY_NAMES`), so that the series say which query they describe: a stalled or lagging change stream is alerted
on as the watch's own query is.

The metric names and labels are a contract: `conf/alerts.yaml` and docs/watch.md use them. Label values are
strings; region ids and partitions are written in decimal, booleans as `true`/`false`.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

log = logging.getLogger("tidegauge.watch.metrics")

HEARTBEAT_LABELS = ("region", "partition", "source_region")
# the `query` label's values, the watch's queries in the order it starts them (`pipelines.watch.job.QUERIES`): its
# streaming query of Leap Frog and DIV, then the change stream's (--changes)
QUERY_NAMES = ("watch", "changes")


class BadRow(ValueError):
    """A row an update method cannot read (the message names the field)."""


@dataclass(slots=True)
class _Heartbeats:
    """What one (region, partition, source_region) told so far."""

    last: tuple[int, int] | None = (
        None  # (arrival, origin) in ms of the newest heartbeat: arrival is broker time
    )
    since_s: float | None = None  # expect_heartbeats(): when the watch began waiting for one
    mark: int | None = None  # the highest running high-water mark reported


@dataclass(slots=True)
class _Progress:
    """The parts of the last StreamingQueryProgress the metrics show."""

    timestamp_s: float
    batch_id: int
    duration_ms: dict[str, float] = field(default_factory=dict)
    input_rows: int | None = None
    input_rows_per_second: float | None = None
    processed_rows_per_second: float | None = None
    state_rows: dict[str, float] = field(default_factory=dict)
    state_memory_bytes: dict[str, float] = field(default_factory=dict)


class WatchMetrics:
    """The watch driver's metrics and the calls that update them.

    `heartbeat_interval_ms`: the leaders' heartbeat interval, exported as `tidegauge_heartbeat_interval_seconds`
    so alert rules can say "3 intervals". `clock`: epoch seconds, read at scrape time for heartbeat ages
    (injectable for tests and simulations).
    """

    def __init__(
        self, *, heartbeat_interval_ms: int = 60_000, clock: Callable[[], float] = time.time
    ) -> None:
        if not heartbeat_interval_ms > 0:
            raise ValueError(f"heartbeat_interval_ms must be positive, got {heartbeat_interval_ms!r}")
        self.registry = CollectorRegistry()
        self.clock = clock
        self._open_labels: set[tuple[str, str, str]] = set()  # pairs and types whose open count was set
        self._lock = threading.Lock()
        self._heartbeats: dict[tuple[str, str, str], _Heartbeats] = {}
        self._progress: dict[str, _Progress] = {}  # query → its last progress
        self._read_until_s: float | None = None  # heartbeats that arrived before it have all been read
        self.registry.register(_DriverCollector(self))
        r = self.registry
        self._interval = Gauge(
            "tidegauge_heartbeat_interval_seconds", "The leaders' configured heartbeat interval.", registry=r
        )
        self._interval.set(heartbeat_interval_ms / 1000)
        self._lag = Gauge(
            "tidegauge_offset_lag_records",
            "Records not read yet: the partition's latest offset minus the next offset the query reads.",
            ["query", "region", "topic", "partition"],
            registry=r,
        )
        self._source_up = Gauge(
            "tidegauge_source_up",
            "1 when the region's cluster answered when offsets were last planned, else 0.",
            ["region"],
            registry=r,
        )
        self._divergences = Counter(
            "tidegauge_divergences",
            "Leap Frog findings (VALUE_MISMATCH, MISSING_IN_A, MISSING_IN_B) by region pair.",
            ["type", "region_a", "region_b"],
            registry=r,
        )
        self._open_divergences = Gauge(
            "tidegauge_open_divergences",
            "Leap Frog findings still open (the regions still differ, or cannot be compared yet) by region pair "
            "and type; a healed finding (a repair or a newer write converged the key) is not counted. What pages.",
            ["type", "region_a", "region_b"],
            registry=r,
        )
        self._div_findings = Counter(
            "tidegauge_div_findings",
            "DIV rows appended to the findings, by type, fatality, region and topic.",
            ["type", "fatal", "region", "topic"],
            registry=r,
        )
        self._pending = Gauge(
            "tidegauge_pending_keys",
            "Keys whose current values in the two regions are not comparable yet.",
            ["region_a", "region_b"],
            registry=r,
        )
        self._unverified = Gauge(
            "tidegauge_unverified_keys",
            "Keys whose last record in the region could not be decoded.",
            ["region"],
            registry=r,
        )
        self._records = Counter(
            "tidegauge_records",
            "Records the watch's Leap Frog read, by region and topic (each region's VT).",
            ["region", "topic"],
            registry=r,
        )
        self._input_rows = Counter(
            "tidegauge_input_rows",
            "Rows Spark read, summed over the query's progress reports.",
            ["query"],
            registry=r,
        )
        self._changes = Counter(
            "tidegauge_changes",
            "With --changes: change records the change stream delivered, and those it could not deliver "
            "(undecodable, no coordinate, an incomplete chunked value), by outcome.",
            ["outcome"],
            registry=r,
        )
        self._rejected = Counter(
            "tidegauge_metric_rows_rejected",
            "Update rows the metrics could not read and skipped (the log says which and why).",
            ["method"],
            registry=r,
        )

    # -- heartbeats ------------------------------------------------------------------------------------
    def expect_heartbeats(
        self, region: Any, partitions: Iterable[Any], source_regions: Iterable[Any]
    ) -> None:
        """Start waiting for heartbeats from `source_regions` in `region`'s VT `partitions`: until the first one
        arrives, the age counts from now, so a partition that never heartbeats is seen too (Venice's heartbeat
        monitor does the same). Pairs that already had a heartbeat are unchanged."""
        now = self.clock()
        keys = [
            (_label(region), _label(p), _label(s)) for p in list(partitions) for s in list(source_regions)
        ]
        with self._lock:
            for key in keys:
                state = self._heartbeats.setdefault(key, _Heartbeats())
                if state.since_s is None:
                    state.since_s = now

    def observe_heartbeats(self, rows: Iterable[Any]) -> None:
        """VT heartbeats seen in a micro-batch, in any order: one row per heartbeat, a mapping (or a Spark Row)
        with `region` (whose VT), `partition`, `source_region` (the heartbeat's origin), `origin_ms` (its origin
        time), `arrival_ms` (the VT record's broker timestamp, epoch ms: Spark's `unix_millis(timestamp)`; ≤ 0 or
        null: the origin time, as `lag` does) and,
        optionally, `mark`: the running high-water mark of `source_region` in that partition after it.

        The newest arrival wins: an older heartbeat delivered late changes neither age nor delay. The
        high-water mark shown is the highest reported."""
        parsed = self._read_rows("observe_heartbeats", rows, _heartbeat_row)
        with self._lock:
            for key, arrival, origin, mark in parsed:
                state = self._heartbeats.setdefault(key, _Heartbeats())
                if state.last is None or (arrival, origin) > state.last:
                    state.last = (arrival, origin)
                if mark is not None and (state.mark is None or mark > state.mark):
                    state.mark = mark

    def set_high_water_marks(
        self, region: Any, partition: Any, marks: Mapping[Any, int] | Iterable[int]
    ) -> None:
        """The running high-water mark vector of `region`'s VT `partition` (`marks[source_region]`, a mapping or
        a sequence indexed by region), for a job that tracks it apart from heartbeat rows. Highest wins."""
        items = marks.items() if isinstance(marks, Mapping) else enumerate(marks)
        rows = [{"region": region, "partition": partition, "source_region": s, "mark": m} for s, m in items]
        parsed = self._read_rows("set_high_water_marks", rows, _mark_row)
        with self._lock:
            for key, mark in parsed:
                state = self._heartbeats.setdefault(key, _Heartbeats())
                if state.mark is None or mark > state.mark:
                    state.mark = mark

    # -- sources -------------------------------------------------------------------------------------------
    def set_lag(
        self, region: Any, topic: str, partition: Any, latest_offset: int, next_offset: int, *, query: str
    ) -> None:
        """Offset lag of one partition for the query `query` (`watch` or `changes`) when its offsets are planned:
        `latest_offset` (Kafka's end offset, the offset the next record will get) minus `next_offset` (the next one
        the query reads), never below 0 (an end offset read before the read position moved can be the older of
        the two)."""
        try:
            labels = (_query(query), _label(region), _label(topic), _label(partition))
            lag = max(0, _int(latest_offset, "latest_offset") - _int(next_offset, "next_offset"))
        except BadRow as exc:
            self._reject("set_lag", 1, (query, region, topic, partition, latest_offset, next_offset), exc)
            return
        self._lag.labels(*labels).set(lag)

    def set_source_up(self, region: Any, up: bool) -> None:
        """Whether `region`'s cluster answered when the watch last planned offsets."""
        try:
            label = _label(region)
        except BadRow as exc:
            self._reject("set_source_up", 1, (region, up), exc)
            return
        self._source_up.labels(label).set(1 if up else 0)

    def add_records(self, region: Any, topic: str, count: int) -> None:
        """`count` more records read from `region`'s `topic`."""
        try:
            labels = (_label(region), _label(topic))
            n = _int(count, "count")
            if n < 0:
                raise BadRow(f"count {n} is negative")
        except BadRow as exc:
            self._reject("add_records", 1, (region, topic, count), exc)
            return
        self._records.labels(*labels).inc(n)

    def add_changes(self, delivered: int, problems: int) -> None:
        """A micro-batch of the change stream (--changes): changes delivered, records that could not be."""
        self._changes.labels("delivered").inc(max(0, int(delivered)))
        self._changes.labels("not_delivered").inc(max(0, int(problems)))

    # -- findings --------------------------------------------------------------------------------------
    def observe_divergences(self, rows: Iterable[Any]) -> None:
        """Leap Frog findings appended in a micro-batch: rows with the findings' `type`, `region_a`,
        `region_b` (other columns are ignored, so the findings rows themselves can be passed)."""
        tally = Tally(self._read_rows("observe_divergences", rows, _divergence_row))
        for labels, n in tally.items():
            self._divergences.labels(*labels).inc(n)

    def set_open_divergences(self, rows: Iterable[Any]) -> None:
        """The watch's findings with their status now: rows with `type`, `region_a`, `region_b` and `status`
        (every finding reported so far). Sets the open count of each pair and type, zero where none is open."""
        opened = Tally(
            self._read_rows(
                "set_open_divergences",
                (r for r in rows if _mapping(r).get("status") != "healed"),
                _divergence_row,
            )
        )
        for labels in self._open_labels | set(opened):
            self._open_divergences.labels(*labels).set(opened.get(labels, 0))
        self._open_labels |= set(opened)

    def observe_div_findings(self, rows: Iterable[Any]) -> None:
        """DIV rows appended in a micro-batch: rows with `type`, `fatal`, `region`, `topic` (the columns of
        `div validate`'s errors/; other columns are ignored)."""
        tally = Tally(self._read_rows("observe_div_findings", rows, _div_row))
        for labels, n in tally.items():
            self._div_findings.labels(*labels).inc(n)

    def set_pending_keys(self, region_a: Any, region_b: Any, count: int) -> None:
        """Keys of the pair whose current values are not comparable yet (the state's count after a batch)."""
        try:
            labels = (_label(region_a), _label(region_b))
            n = _int(count, "count")
        except BadRow as exc:
            self._reject("set_pending_keys", 1, (region_a, region_b, count), exc)
            return
        self._pending.labels(*labels).set(n)

    def set_unverified_keys(self, region: Any, count: int) -> None:
        """Keys of `region` whose last record could not be decoded."""
        try:
            label, n = _label(region), _int(count, "count")
        except BadRow as exc:
            self._reject("set_unverified_keys", 1, (region, count), exc)
            return
        self._unverified.labels(label).set(n)

    # -- Spark's progress ------------------------------------------------------------------------------
    def observe_progress(
        self, progress: Mapping[str, Any] | str, *, query: str, heartbeats_read: bool = False
    ) -> None:
        """One `StreamingQueryProgress` (`query.lastProgress`, a listener event's `progress`, or its JSON) of the
        streaming query `query` (`watch`, the `query` label of the series it feeds). A report older than that
        query's last one shown, or the same one again, is ignored.

        `heartbeats_read`: this is the progress of the query whose rows feed `observe_heartbeats`. Its timestamp
        (when the micro-batch's offsets were planned) is then the time up to which every heartbeat has been
        read, and heartbeat ages count up to it rather than up to the scrape: a watch that runs behind must not
        make every partition look silent (a watch that stopped making progress has an alert of its own)."""
        try:
            name = _query(query)
            if isinstance(progress, str | bytes):
                progress = json.loads(progress)
            parsed = _progress(progress)
        except (BadRow, ValueError, TypeError) as exc:
            self._reject("observe_progress", 1, progress, exc)
            return
        if heartbeats_read:
            with self._lock:
                if self._read_until_s is None or parsed.timestamp_s > self._read_until_s:
                    self._read_until_s = parsed.timestamp_s
        with self._lock:
            last = self._progress.get(name)
            if last is not None and (
                parsed.timestamp_s < last.timestamp_s
                or (parsed.timestamp_s, parsed.batch_id) == (last.timestamp_s, last.batch_id)
            ):
                return
            self._progress[name] = parsed
        if parsed.input_rows:
            self._input_rows.labels(name).inc(parsed.input_rows)

    # -- serving ---------------------------------------------------------------------------------------
    def serve(self, port: int, addr: str = "127.0.0.1") -> MetricsServer:
        """Serve this registry at http://addr:port/metrics from a daemon thread (port 0: a free port, see
        `.port`). Close it with `.close()`. Raises OSError naming the address when it cannot listen."""
        try:
            httpd, thread = start_http_server(int(port), addr=addr, registry=self.registry)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from exc
        return MetricsServer(addr, httpd.server_port, httpd, thread)

    # -- internals -------------------------------------------------------------------------------------
    def _read_rows(self, method: str, rows: Iterable[Any], read: Callable[[Mapping], Any]) -> list:
        out = []
        bad = 0
        first: tuple[Any, Exception] | None = None
        for row in rows:
            try:
                out.append(read(_mapping(row)))
            except (BadRow, KeyError, TypeError, ValueError) as exc:
                bad += 1
                if first is None:
                    first = (row, exc)
        if first is not None:
            self._reject(method, bad, first[0], first[1])
        return out

    def _reject(self, method: str, count: int, row: Any, exc: Exception) -> None:
        self._rejected.labels(method).inc(count)
        reason = f"no field {exc}" if isinstance(exc, KeyError) else str(exc)
        text = repr(row)
        log.warning(
            "%s: skipped %d row(s) it could not read; the first: %s: %s",
            method,
            count,
            text if len(text) <= 300 else text[:300] + "...",
            reason,
        )

    def _snapshot(
        self,
    ) -> tuple[float, list[tuple[tuple[str, str, str], _Heartbeats]], dict[str, _Progress]]:
        """(the time heartbeat ages count up to, the heartbeat series, each query's last progress)."""
        with self._lock:
            beats = [(k, _Heartbeats(v.last, v.since_s, v.mark)) for k, v in self._heartbeats.items()]
            progress, read_until = dict(self._progress), self._read_until_s
        return (self.clock() if read_until is None else read_until), beats, progress


@dataclass
class MetricsServer:
    """A running metrics endpoint (what `WatchMetrics.serve` returns)."""

    addr: str
    port: int
    _httpd: Any = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _DriverCollector:
    """The metrics computed at scrape time: heartbeat age and delay, high-water marks, and the last progress."""

    def __init__(self, owner: WatchMetrics) -> None:
        self.owner = owner

    def describe(self) -> list[Metric]:
        return list(_families())

    def collect(self) -> Iterator[Metric]:
        now, beats, progress = self.owner._snapshot()
        fams = {f.name: f for f in _families()}
        for key, st in sorted(beats):
            labels = list(key)
            if st.last is not None:
                arrival, origin = st.last
                # a driver clock behind the broker's would give a negative age: none has passed yet
                fams["tidegauge_heartbeat_age_seconds"].add_metric(
                    labels, max(0.0, now * 1000 - arrival) / 1000
                )
                fams["tidegauge_heartbeat_delay_seconds"].add_metric(labels, (arrival - origin) / 1000)
            elif st.since_s is not None:
                fams["tidegauge_heartbeat_age_seconds"].add_metric(labels, max(0.0, now - st.since_s))
            if st.mark is not None:
                fams["tidegauge_high_water_mark"].add_metric(labels, st.mark)
        for query, p in sorted(progress.items()):
            fams["tidegauge_last_progress_timestamp_seconds"].add_metric([query], p.timestamp_s)
            fams["tidegauge_last_batch_id"].add_metric([query], p.batch_id)
            for phase, ms in sorted(p.duration_ms.items()):
                fams["tidegauge_microbatch_duration_seconds"].add_metric([query, phase], ms / 1000)
            for name, value in (
                ("tidegauge_microbatch_input_rows", p.input_rows),
                ("tidegauge_input_rows_per_second", p.input_rows_per_second),
                ("tidegauge_processed_rows_per_second", p.processed_rows_per_second),
            ):
                if value is not None:
                    fams[name].add_metric([query], value)
            for op, rows in sorted(p.state_rows.items()):
                fams["tidegauge_state_rows"].add_metric([query, op], rows)
            for op, size in sorted(p.state_memory_bytes.items()):
                fams["tidegauge_state_memory_bytes"].add_metric([query, op], size)
        yield from fams.values()


def _families() -> Iterator[Metric]:
    g = GaugeMetricFamily
    hb = list(HEARTBEAT_LABELS)
    yield g(
        "tidegauge_heartbeat_age_seconds",
        "Time since the newest heartbeat from source_region arrived in region's VT partition (broker time), up to "
        "when the watch's last micro-batch was planned (everything that arrived before then has been read; at "
        "scrape time before the first one); before the first heartbeat, since the watch began waiting for it.",
        labels=hb,
    )
    yield g(
        "tidegauge_heartbeat_delay_seconds",
        "Arrival (broker time) minus origin time of that newest heartbeat.",
        labels=hb,
    )
    yield g(
        "tidegauge_high_water_mark",
        "The running high-water mark of source_region's RT in region's VT partition.",
        labels=hb,
    )
    q = ["query"]
    yield g(
        "tidegauge_last_progress_timestamp_seconds",
        "Start of the trigger of the query's last Spark progress report (epoch seconds).",
        labels=q,
    )
    yield g("tidegauge_last_batch_id", "Micro-batch id of the query's last Spark progress report.", labels=q)
    yield g(
        "tidegauge_microbatch_duration_seconds",
        "Time the query's last micro-batch spent in each phase (Spark's durationMs).",
        labels=[*q, "phase"],
    )
    yield g(
        "tidegauge_microbatch_input_rows",
        "Spark rows the query's last micro-batch read (numInputRows): the watch reads packed batches of "
        "records, so these are batches; tidegauge_records_total counts records.",
        labels=q,
    )
    yield g(
        "tidegauge_input_rows_per_second",
        "Spark's inputRowsPerSecond of the query's last micro-batch.",
        labels=q,
    )
    yield g(
        "tidegauge_processed_rows_per_second",
        "Spark's processedRowsPerSecond of the query's last micro-batch.",
        labels=q,
    )
    yield g(
        "tidegauge_state_rows",
        "Rows in the query's state store after its last micro-batch, by stateful operator (numRowsTotal).",
        labels=[*q, "operator"],
    )
    yield g(
        "tidegauge_state_memory_bytes",
        "The query's state store memory after its last micro-batch, by stateful operator (memoryUsedBytes).",
        labels=[*q, "operator"],
    )


# -- reading rows -----------------------------------------------------------------------------------------
def _mapping(row: Any) -> Mapping:
    if isinstance(row, Mapping):
        return row
    as_dict = getattr(row, "asDict", None)  # a pyspark Row
    if callable(as_dict):
        return as_dict()
    raise BadRow(f"a row must be a mapping or a Spark Row, not {type(row).__name__}")


def _label(value: Any) -> str:
    if isinstance(value, str):
        if not value:
            raise BadRow("a label value is empty")
        return value
    if isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", "") == "b":
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    raise BadRow(f"label value {value!r} is neither a string, an integer nor a boolean")


def _query(value: Any) -> str:
    if value not in QUERY_NAMES:
        raise BadRow(f"query {value!r} is not one of the watch's queries {QUERY_NAMES}")
    return value


def _flag(value: Any, name: str) -> str:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower()
    if isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", "") == "b":
        return "true" if value else "false"
    raise BadRow(f"{name} {value!r} is not a boolean")


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or value is None:
        raise BadRow(f"{name} {value!r} is not an integer")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise BadRow(f"{name} {value!r} is not an integer")


def _number(value: Any, name: str) -> float | None:
    """A finite number, or None when Spark left it out (null, or NaN for a rate over no time)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise BadRow(f"{name} {value!r} is not a number")
    value = float(value)
    return value if math.isfinite(value) else None


def _heartbeat_key(row: Mapping) -> tuple[str, str, str]:
    return (_label(row["region"]), _label(row["partition"]), _label(row["source_region"]))


def _heartbeat_row(row: Mapping) -> tuple[tuple[str, str, str], int, int, int | None]:
    key = _heartbeat_key(row)
    origin = _int(row["origin_ms"], "origin_ms")
    arrival = row.get("arrival_ms")
    arrival = origin if arrival is None else _int(arrival, "arrival_ms")
    if arrival <= 0:
        arrival = origin  # no broker time: the origin time stands in, as the lag job does
    mark = row.get("mark")
    return key, arrival, origin, None if mark is None else _int(mark, "mark")


def _mark_row(row: Mapping) -> tuple[tuple[str, str, str], int]:
    return _heartbeat_key(row), _int(row["mark"], "mark")


def _divergence_row(row: Mapping) -> tuple[str, str, str]:
    return (_label(row["type"]), _label(row["region_a"]), _label(row["region_b"]))


def _div_row(row: Mapping) -> tuple[str, str, str, str]:
    return (_label(row["type"]), _flag(row["fatal"], "fatal"), _label(row["region"]), _label(row["topic"]))


def _progress(p: Any) -> _Progress:
    if not isinstance(p, Mapping):
        raise BadRow(f"a progress report must be a mapping, not {type(p).__name__}")
    stamp = p.get("timestamp")
    if not isinstance(stamp, str):
        raise BadRow(f"timestamp {stamp!r} is not an ISO-8601 string")
    try:
        timestamp = datetime.fromisoformat(stamp).timestamp()
    except ValueError as exc:
        raise BadRow(f"timestamp {stamp!r} is not an ISO-8601 string") from exc
    out = _Progress(timestamp, _int(p.get("batchId"), "batchId"))
    for phase, ms in (p.get("durationMs") or {}).items():
        value = _number(ms, f"durationMs.{phase}")
        if value is not None:
            out.duration_ms[str(phase)] = value
    rows = p.get("numInputRows")
    out.input_rows = None if rows is None else _int(rows, "numInputRows")
    out.input_rows_per_second = _number(p.get("inputRowsPerSecond"), "inputRowsPerSecond")
    out.processed_rows_per_second = _number(p.get("processedRowsPerSecond"), "processedRowsPerSecond")
    for op in p.get("stateOperators") or ():
        if not isinstance(op, Mapping):
            raise BadRow(f"a stateOperators entry must be a mapping, not {type(op).__name__}")
        name = _label(op.get("operatorName") or "unnamed")
        # two operators of one kind add up: their rows and bytes are all held by the job
        for target, key in ((out.state_rows, "numRowsTotal"), (out.state_memory_bytes, "memoryUsedBytes")):
            value = _number(op.get(key), f"stateOperators.{key}")
            if value is not None:
                target[name] = target.get(name, 0.0) + value
    return out
