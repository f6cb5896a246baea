"""`run(SimConfig) -> SimResult`: the reference replication harness, coordinated step by simulated step.

A run replays a schedule decided up front from the seed (`sim.traffic`, `sim.faults`) on one Kafka cluster per
region. The coordinator (this module) owns the clusters, the online producers and the RT heartbeats; each
region's leaders, followers, VT producer and archive run in that region's worker (`sim.worker`, a process of
its own by default). Time is simulated; the run advances in steps [T0, T1):

1. the coordinator produces the online writes with time in the step (one producer per region, DIV segments,
   logical timestamp = write time, faults applied) and the RT heartbeats of every live leader (every
   `heartbeat_every_ms`, and after every `heartbeat_every_records` writes to the leader's RT partition),
   flushes, and tells every worker the RT end offsets;
2. each worker reads all RTs to those offsets and lets each leader process the RT records that arrive before
   T1 (write time + lag), writing its VT; its followers replay the VT.

The coordinator runs at most two steps ahead of the slowest worker. Step boundaries are cut wherever the
topology changes (a leader fails or takes over, a broker goes down); those actions run between steps. After the
last write the producers close their segments, every live leader heartbeats once more and every leader
processes those heartbeats, and leaders step down: every run, however short, ends with heartbeats from every
region in every partition, covering every write.

Nothing depends on Kafka delivery timing: what each leader processes, in which order, at which simulated time,
is fixed by the schedule, and leaders flush before each VT heartbeat so watermarks are exact. Same seed and
settings ⇒ identical archives (offsets, keys, values, headers, timestamps).

A live run (`cfg.live`) is this simulation paced by the wall clock, without a planned end: simulated time is
wall-clock time from the moment the workers are up, each step waits for the wall clock to reach its end, the
schedule is drawn a chunk at a time (`live_chunk_s`) and each chunk's faults are placed as it is drawn
(`sim.faults.PlanState`), and the run ends after `duration_s` or when `stop` is set. Ending is the same as a
planned run's, from wherever it stopped: outages still going end, producers close, leaders heartbeat a last time
and step down, archives are completed. Each fault is added to `truth.json` when it happens, with the wall-clock
time `at` (and `end_at` for faults that stop and resume); `live.json` names each region's cluster and topics
as soon as they are up.
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from div import archive
from div import checksum as cks
from div.checkpoint import atomic_write
from div.writer import SegmentWriter
from heartbeat.records import rt_heartbeat

from . import faults as F
from .cluster import ClusterError, Region, RegionProducer, SimClock
from .compaction import compact_range
from .config import STOP_RESUME_KINDS, ConfigError, SimConfig, TimedFault
from .follower import MetadataBytes
from .traffic import PUT, KeySpace, Values, build_schedule
from .worker import InlineWorker, ProcessWorker, WorkerSpec, leader_host, seeded_guid

log = logging.getLogger(__name__)

PUSH_LEAD_MS = 60_000  # the push job runs this long before the first online write
MAX_STEPS_AHEAD = 2
_FAR = 1 << 62  # a time no run reaches
# how long past a broker outage the simulator keeps looking for the new partition leader (metadata under load)
ELECTION_WATCH_S = 20.0


class SimulationError(RuntimeError):
    """The simulation could not complete (a cluster lost records, a worker failed, ...)."""


@dataclass
class SimResult:
    """What a run produced: paths, and the summary also written to `DIR/summary.json`."""

    out: str
    truth_path: str
    summary_path: str
    archives: dict[int, str]
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def truth(self) -> dict:
        with open(self.truth_path) as f:
            return json.load(f)


def run(
    cfg: SimConfig,
    progress: Callable[[str], None] | None = None,
    *,
    stop: threading.Event | None = None,
    on_ready: Callable[[dict], None] | None = None,
    on_repair_window: Callable[[dict], None] | None = None,
) -> SimResult:
    """Run a simulation; `progress` receives one-line progress reports (default: stderr when cfg.progress).

    A live run (`cfg.live`) ends cleanly after `cfg.duration_s` or once `stop` is set (from a signal handler or
    another thread); `on_ready` receives what `OUT/live.json` holds (each region's `kafka://` URI and topics)
    as soon as the clusters are up and the clock starts.

    With `cfg.repair_window_s`, the run holds a repair window after its last write (`_Simulation._repair_window`):
    `on_repair_window` is called then with live.json's content (state `repair-window`), in this thread, and the
    window closes when it returns; without it the window lasts `repair_window_s`, or until the file named in
    live.json's `repair_window_done` exists, or `stop` is set."""
    cfg.validate()
    if progress is None and cfg.progress:

        def progress(line: str) -> None:
            print(line, file=sys.stderr, flush=True)

    sim = _Simulation(cfg, progress, stop, on_ready)
    sim.on_repair_window = on_repair_window
    try:
        return sim.run()
    finally:
        sim.close()


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Simulation:
    def __init__(
        self,
        cfg: SimConfig,
        progress: Callable[[str], None] | None,
        stop: threading.Event | None = None,
        on_ready: Callable[[dict], None] | None = None,
    ) -> None:
        if cfg.live:
            # Simulated time is wall-clock time; the push job's records are stamped a minute before the start.
            cfg = cfg.with_(start_ms=_now_ms())
        self.cfg = cfg
        self.progress = progress
        self.stop = stop or threading.Event()
        self.on_ready = on_ready
        self.out = Path(cfg.out)
        self.clock = SimClock(cfg.start_ms)
        self.start_ms = cfg.start_ms
        self.regions: list[Region] = []
        self.producers: list[RegionProducer] = []
        self.workers: list[Any] = []
        self.timers: dict[int, threading.Timer] = {}
        self.election_watchers: list[threading.Thread] = []
        self.broker_up: dict[int, Callable[[], None]] = {}
        self.t_wall0 = time.monotonic()
        self.started_at = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        self.timings: Counter = Counter()
        self.worker_progress: dict[int, dict] = {}
        self.last_progress = 0.0
        self.actions: dict[int, list[Callable[[], None]]] = {}
        self.t_now = -_FAR  # the end of the last step handed to the workers
        self.t_close = self.t_final_hb = self.t_done = _FAR
        self.write_base = 0  # global index of the current schedule chunk's first write
        self.write_ptr = 0
        self.write_limit = _FAR  # no write at or after this time is produced (a live run's stop)
        self.last_write_ms = cfg.start_ms
        self.chunk_no = 0
        self.chunk_end = _FAR if not cfg.live else 0
        self.truth_dirty = False
        self.stopped_by: str | None = None
        self.stopped_at_ms: int | None = None
        self.behind_ms = 0
        self.announced: str | None = None  # live.json's state
        self.clusters_up = False  # lingering after the stop (live.json `clusters_up`)
        self.started_brokers: list[Any] = []  # Apache Kafka clusters started here (closed by close())
        self.on_repair_window: Callable[[dict], None] | None = None
        self.repair_window: dict[str, Any] | None = None  # truth.json's `repair_window`, once it opened

    # ------------------------------------------------------------------------------------------ setup
    def _prepare_out(self) -> None:
        arch = self.out / "archive"
        if arch.exists() and any(arch.iterdir()):
            raise ConfigError(f"--out {self.out}: {arch} already holds an archive; choose an empty directory")
        for x in range(self.cfg.regions):
            (arch / f"dc-{x}").mkdir(parents=True, exist_ok=True)
            (self.out / "followers" / f"dc-{x}").mkdir(parents=True, exist_ok=True)

    def _setup(self) -> None:
        cfg = self.cfg
        t0 = time.perf_counter()
        self.keyspace = KeySpace.build(cfg.keys, cfg.partitions)
        self.values = Values(np.random.default_rng([cfg.seed, 2]), cfg.value_size_max)
        if cfg.live:
            # Drawn a chunk at a time once the clock runs (`_next_chunk`); counted faults get their times now.
            self.schedule = build_schedule(cfg.with_(records=0), self.keyspace, np.random.default_rng(0))
            self.plan = F.FaultPlan(requested=F.requested_faults(cfg.faults, cfg.fault_times))
            self.plan_state = F.PlanState.fresh(cfg.keys)
            self.timed = list(cfg.fault_times) + F.times_for_counts(cfg, np.random.default_rng([cfg.seed, 5]))
            self.timed.sort(key=lambda tf: tf.at_s)
        else:
            self.schedule = build_schedule(cfg, self.keyspace, np.random.default_rng([cfg.seed, 1]))
            self.plan = F.plan_faults(
                cfg, self.schedule, self.keyspace.keys, np.random.default_rng([cfg.seed, 3])
            )
        self.timings["plan_s"] += time.perf_counter() - t0
        n, p = cfg.regions, cfg.partitions
        swaps = self.plan.of("swap")
        self.swap_fault = swaps[0] if swaps else None
        # every VT topic of the run: version N, and N+1 when a swap is planned (created up front, empty until the
        # re-push starts; a live run creates it when the re-push starts, `_swap`)
        self.vt_topics = [cfg.vt_topic] + ([self.swap_fault.detail["to_topic"]] if self.swap_fault else [])
        # a live run's swap: requested (placed once the clock runs), then which of its steps happened
        self.live_swap = cfg.live and any(tf.kind == "swap" for tf in self.timed)
        self.swap_step: str | None = None  # "snapshot", "started" (End of Push), "ended" (VersionSwap)
        # region -> what its worker said of End of Push, the rewind and the VersionSwap
        self.swap_live_facts: dict[int, dict[str, Any]] = {}
        self.current_version = cfg.version
        started = self._start_brokers() if cfg.kafka is None and cfg.brokers == "real" else None
        confs = {}
        for x in range(n):
            conf = dict(cfg.kafka_conf)
            conf.update(cfg.kafka_conf_by_region.get(x, {}))
            if cfg.kafka is None:
                # Brokers started here go down on purpose (broker faults) and at the end of the run: keep
                # librdkafka's connection-refused/disconnected lines off stderr unless the caller asks.
                conf.setdefault("log_level", 2)
            confs[x] = conf
            region = Region(
                x,
                None if cfg.kafka is None else cfg.kafka[x],
                conf,
                self.clock,
                brokers=None if started is None else started[x],
            )
            self.regions.append(region)
            region.create_topics([cfg.rt_topic, *self.vt_topics], p)
            self.producers.append(RegionProducer(region.bootstrap, conf, self.clock))
        self.writers = [
            [
                SegmentWriter(
                    seeded_guid(cfg.seed, 1, x, w),
                    clock=self.clock,
                    host_name=f"dc{x}-producer-{w}",
                    max_segment_age_ms=cfg.segment_max_age_ms,
                )
                for w in range(cfg.producers_per_region)
            ]
            for x in range(n)
        ]
        self.alive = [[True] * p for _ in range(n)]
        self.silent = [[False] * p for _ in range(n)]
        self.terms = [[1] * p for _ in range(n)]
        self.writes_done = np.zeros(n, dtype=np.int64)
        self.pending_faults: list[list[tuple]] = [[] for _ in range(n)]
        self.writer_watch: dict[tuple[int, int, int], list[Callable]] = {}
        push = self._push_records()
        in_partition = Counter(q for *_, q in push)
        self.eop_offsets = {q: in_partition[q] - 2 for q in range(p)}  # EndOfPush, then its EndOfSegment
        t0 = time.perf_counter()
        for x in range(n):
            spec = WorkerSpec(
                cfg,
                x,
                {r.region: r.bootstrap for r in self.regions},
                confs,
                str(self.out / "archive" / f"dc-{x}"),
                str(self.out / "followers" / f"dc-{x}"),
                push,
                cfg.start_ms - PUSH_LEAD_MS,
                self._worker_swap(),
            )
            self.workers.append(ProcessWorker(spec) if cfg.workers == "process" else InlineWorker(spec))
        self.timings["start_workers_s"] += time.perf_counter() - t0

    def _worker_swap(self) -> dict[str, Any] | None:
        """What a region worker is told of the run's swap up front (`WorkerSpec.swap`)."""
        cfg = self.cfg
        if self.swap_fault is not None:
            d = self.swap_fault.detail
            return {
                "to_version": d["to_version"],
                "topic": d["to_topic"],
                "rewind_from_ms": d["rewind_from_ms"],
            }
        if self.live_swap:  # placed when its chunk is drawn: the worker learns the rest at the re-push
            to = cfg.version + 1
            return {"to_version": to, "topic": f"{cfg.store}_v{to}", "rewind_from_ms": None, "live": True}
        return None

    def _start_brokers(self) -> list:
        """One Apache Kafka cluster per region on loopback (`sim.brokers`), started side by side; each region
        closes its own."""
        from .brokers import BrokersError, start_clusters

        cfg = self.cfg
        say = self.progress or (lambda _line: None)
        t0 = time.perf_counter()
        try:
            clusters = start_clusters(
                cfg.regions,
                brokers=cfg.brokers_per_region,
                name="sim",
                progress=lambda line: say(f"[simulate] {line}"),
            )
        except BrokersError as exc:
            raise ClusterError(f"starting the Apache Kafka brokers: {exc}") from None
        self.started_brokers = clusters
        self.timings["start_brokers_s"] += time.perf_counter() - t0
        say(
            f"[simulate] {cfg.regions} Apache Kafka {clusters[0].version} clusters up ({cfg.brokers_per_region} "
            f"node(s) each) in {time.perf_counter() - t0:.1f} s"
        )
        return clusters

    def _push_records(self) -> list[tuple[bytes, bytes, list | None, int]]:
        """The push job: StartOfPush, the batch keys, EndOfPush for every partition (identical in every VT)."""
        cfg = self.cfg
        clock = SimClock(cfg.start_ms - PUSH_LEAD_MS)
        push = SegmentWriter(
            seeded_guid(cfg.seed, 0), clock=clock, host_name="push-job", max_segment_age_ms=-1
        )
        sizes = np.random.default_rng([cfg.seed, 4]).integers(
            cfg.value_size_min, cfg.value_size_max + 1, cfg.batch_records
        )
        by_part: list[list[int]] = [[] for _ in range(cfg.partitions)]
        for k in range(cfg.batch_records):
            by_part[int(self.keyspace.partition[k])].append(k)
        records = []
        for q in range(cfg.partitions):
            records.extend(push.start_of_push(q))
            for k in by_part[q]:
                records.extend(push.put(q, self.keyspace.keys[k], self.values.batch(k, int(sizes[k]))))
            records.extend(push.end_of_push(q))
        return [(r.key, r.value, list(r.headers) or None, r.partition) for r in records]

    # ------------------------------------------------------------------------------------------ live
    def _start_clock(self) -> None:
        """Once every worker is up (the push job written), simulated time starts at the wall-clock time."""
        for w in self.workers:
            w.call("progress")
        self.start_ms = self.t_now = self.last_write_ms = _now_ms()
        self.clock.now = self.start_ms
        if self.live_swap:
            # the new leaders replay the RTs from up to 1.5 x swap_rewind_ms before the snapshot (and no later than
            # where the source region's leaders stood, up to a lag behind): the workers keep those records
            cfg = self.cfg
            max_lag = max(max(row) for row in cfg.lag_matrix())
            first = min(self._at_ms(tf) for tf in self.timed if tf.kind == "swap")
            keep = first - (3 * cfg.swap_rewind_ms + 1) // 2 - max_lag - 1
            for w in self.workers:
                w.send("swap_keep", keep)
        self._announce("running")
        self._publish_truth()

    def _announce(self, state: str) -> None:
        """`OUT/live.json`: where a watch can attach (each region's cluster and topics) and whether it still
        runs; `on_ready` gets the same when the run starts."""
        cfg = self.cfg
        info = {
            "state": state,
            "pid": os.getpid(),
            "store": cfg.store,
            "version": cfg.version,
            "partitions": cfg.partitions,
            "rt_topic": cfg.rt_topic,
            "vt_topic": cfg.vt_topic,
            # a swap: the new version's topic from its re-push on; current_version changes at the VersionSwap
            "vt_topics": list(self.vt_topics),
            "current_version": self.current_version,
            "heartbeat_every_ms": cfg.heartbeat_every_ms,
            "regions": [
                {
                    "region": r.region,
                    "uri": "kafka://" + r.bootstrap,
                    "topics": [cfg.rt_topic, *self.vt_topics],
                    "archive": str(self.out / "archive" / f"dc-{r.region}"),
                }
                | ({} if r.brokers is None else {"brokers": _brokers_info(r.brokers)})
                for r in self.regions
            ],
            "started_at": self.start_ms,
            "stopped_at": self.stopped_at_ms,
            "clusters_up": state == "running" or self.clusters_up,
            "truth": str(self.out / "truth.json"),
        }
        if cfg.repair_window_s:
            info["repair_window_done"] = str((self.out / "repair-window.done").resolve())
        atomic_write(self.out / "live.json", (json.dumps(info, indent=2) + "\n").encode())
        ready = state == "running" and self.announced != "running"  # once (a swap announces its topic again)
        self.announced = state
        if ready and self.on_ready is not None:
            self.on_ready(info)

    # ------------------------------------------------------------------------------------------ run
    def run(self) -> SimResult:
        cfg = self.cfg
        self._prepare_out()
        self._setup()
        if cfg.live:
            self._start_clock()
        self._main_loop()
        reports = self._finish()
        if cfg.live:
            rng = np.random.default_rng([cfg.seed, 6])
            F.place_compactions(cfg, self.plan, rng, cfg.faults.get("compaction", 0))
            self._live_shortfall()
        self._compactions()
        complete = self._check_archives()
        truth = self._write_truth(reports)
        summary = self._summary(complete, reports)
        summary_path = self.out / "summary.json"
        atomic_write(summary_path, (json.dumps(summary, indent=2) + "\n").encode())
        if cfg.live:
            self._announce("stopped")
            self._linger()
        return SimResult(
            str(self.out),
            truth,
            str(summary_path),
            {x: str(self.out / "archive" / f"dc-{x}") for x in range(self.cfg.regions)},
            summary,
        )

    def _linger(self) -> None:
        """Keep the clusters serving after a stop by duration (`linger_s`), so a watch attached to them reads every
        record before they go: live.json says `clusters_up` until then. A stop asked for ends it at once."""
        if not self.cfg.linger_s or self.stop.is_set():
            return
        self.clusters_up = True
        self._announce("stopped")
        if self.progress:
            self.progress(f"[simulate --live] stopped; the clusters keep serving for {self.cfg.linger_s:g} s")
        self.stop.wait(self.cfg.linger_s)
        self.clusters_up = False
        self._announce("stopped")

    # ------------------------------------------------------------------------------------------ steps
    def _at(self, t: int, fn: Callable[[], None]) -> None:
        """Run `fn` between steps, once everything before simulated time `t` is done. (A live run registers a
        chunk's actions when it draws the chunk: none may fall before the step it is in.)"""
        self.actions.setdefault(max(int(t), self.t_now + 1), []).append(fn)

    def _register(self, f: F.Fault) -> None:
        """The actions of a fault that acts between steps."""
        if f.kind == "failover":
            self._at(f.time_ms, lambda: self._fail(f))
            self._at(f.end_ms, lambda: self._take_over(f))
        elif f.kind == "broker":
            self._at(f.time_ms, lambda: self._broker_fault(f))
        elif f.kind == "silent":
            self._at(f.time_ms, lambda: self._silence(f))
            self._at(f.end_ms, lambda: self._unsilence(f))
        elif f.kind == "isolated":
            self._at(f.time_ms, lambda: self._isolate(f))
            self._at(f.end_ms, lambda: self._reconnect(f))
        elif f.kind == "redelivery":
            self._at(f.time_ms, lambda: self._redelivery(f))
        elif f.kind == "swap":
            d = f.detail
            self._at(
                d["snapshot_ms"],
                lambda: self._swap("swap_snapshot", f, d["snapshot_ms"], d["to_version"], None),
            )
            self._at(d["end_of_push_ms"], lambda: self._swap("swap_start", f, d["end_of_push_ms"]))
            self._at(
                d["version_swap_ms"], lambda: self._swap("swap_end", f, d["version_swap_ms"], d["to_version"])
            )

    def _ending(self, t_last: int) -> None:
        """After the last write (at or before `t_last`): producers close their segments, every live leader
        heartbeats once more, every leader processes those heartbeats, and leaders step down."""
        max_lag = max(max(row) for row in self.cfg.lag_matrix())
        self.t_close = t_last + 1
        self.t_final_hb = self.t_close + max_lag + 1
        self.t_done = self.t_final_hb + max_lag + 1
        if self.cfg.live:
            self._at(self.t_close, self._end_outages)
        self._at(self.t_close, self._close_writers)
        self._at(self.t_final_hb, self._final_heartbeats)
        self._at(self.t_done, self._repair_window if self.cfg.repair_window_s else self._close_leaders)

    def _planned_steps(self) -> list[tuple[int, list[Callable[[], None]]]]:
        """Step ends, each with the actions that run once everything before it is done. Step boundaries are
        cut every `step_records` writes and wherever an action is due."""
        cfg, s = self.cfg, self.schedule
        for i in range(cfg.step_records, len(s), cfg.step_records):
            self.actions.setdefault(int(s.time_ms[i]), [])
        for f in self.plan.faults:
            self._register(f)
        self._ending(s.end_ms)
        return sorted(self.actions.items())

    def _live_steps(self) -> Iterator[tuple[int, list[Callable[[], None]]]]:
        """Steps of `live_step_ms`, cut wherever an action is due or a schedule chunk ends, until the duration
        is over or a stop is requested; then the same ending as a planned run."""
        cfg = self.cfg
        end = None if cfg.duration_s is None else self.start_ms + int(round(cfg.duration_s * 1000))
        t = self.start_ms
        while not self.stop.is_set() and (end is None or t < end):
            if t >= self.chunk_end:
                self._next_chunk()
            t1 = min(t + cfg.live_step_ms, self.chunk_end, _FAR if end is None else end)
            if self.actions:
                t1 = min(t1, min(self.actions))
            yield t1, self.actions.pop(t1, [])
            t = t1
        self.stopped_by = "stop requested" if self.stop.is_set() else "duration"
        self.stopped_at_ms = _now_ms()
        self._say(f"stopping ({self.stopped_by}): producers close, leaders heartbeat a last time")
        self.actions.clear()  # whatever was still to come never happens, the rest of the chunk's writes included
        self.write_limit = t
        self._ending(t)
        yield from sorted(self.actions.items())

    def _next_chunk(self) -> None:
        """Draw the next `live_chunk_s` of traffic and place the faults due in it."""
        cfg = self.cfg
        t = time.perf_counter()
        k = self.chunk_no
        t0 = self.chunk_end if k else self.start_ms
        n = int(round(sum(cfg.rate(r) for r in range(cfg.regions)) * cfg.live_chunk_s))
        chunk = build_schedule(
            cfg.with_(records=n, start_ms=t0), self.keyspace, np.random.default_rng([cfg.seed, 1, k])
        ).without_keys(self.plan_state.retired)
        self.write_base += len(self.schedule)
        self.schedule = chunk
        self.write_ptr = 0
        self.chunk_end = max(chunk.end_ms + 1, t0 + int(cfg.live_chunk_s * 1000))
        due = self.plan.waiting + [tf for tf in self.timed if self._at_ms(tf) < self.chunk_end]
        self.timed = [tf for tf in self.timed if self._at_ms(tf) >= self.chunk_end]
        self.plan.waiting = []
        known = len(self.plan.faults)
        F.plan_faults(
            cfg,
            chunk,
            self.keyspace.keys,
            np.random.default_rng([cfg.seed, 3, k]),
            counted={},
            timed=due,
            origin_ms=self.start_ms,
            plan=self.plan,
            state=self.plan_state,
            base=self.write_base,
            carry=True,
        )
        for f in self.plan.faults[known:]:
            self._register(f)
        self.chunk_no += 1
        self.timings["plan_s"] += time.perf_counter() - t

    def _at_ms(self, tf: TimedFault) -> int:
        return self.start_ms + int(round(tf.at_s * 1000))

    def _main_loop(self) -> None:
        cfg = self.cfg
        self.next_grid_hb = self.start_ms + cfg.heartbeat_every_ms
        steps = self._live_steps() if cfg.live else self._planned_steps()
        for t1, actions in steps:
            if cfg.live:
                self._pace(t1)
            t = time.perf_counter()
            self._produce_until(t1)
            self.timings["produce_s"] += time.perf_counter() - t
            self._flush()
            ends = self._rt_ends()
            for x, w in enumerate(self.workers):
                w.send("step", t1, ends, self.pending_faults[x])
                self.pending_faults[x] = []
            self.t_now = t1
            for action in actions:
                action()
            if self.truth_dirty:
                self._publish_truth()
            self._collect(MAX_STEPS_AHEAD)
            self._report_progress()

    def _pace(self, t1: int) -> None:
        """A live step is produced once the wall clock reaches its end (records are never stamped ahead of it)."""
        delay_ms = t1 - _now_ms()
        if delay_ms > 0:
            time.sleep(delay_ms / 1000)
        else:
            self.behind_ms = max(self.behind_ms, -delay_ms)

    def _collect(self, max_outstanding: int) -> None:
        t = time.perf_counter()
        for x, w in enumerate(self.workers):
            while w.outstanding() > max_outstanding:
                reply = w.recv()
                if isinstance(reply, dict) and "vt_records" in reply:
                    self.worker_progress[x] = reply
        self.timings["wait_for_workers_s"] += time.perf_counter() - t

    def _flush(self) -> None:
        t = time.perf_counter()
        for x, prod in enumerate(self.producers):
            left = prod.flush(300)
            if left:
                raise SimulationError(f"region {x}: {left} RT records not delivered after 300 s")
        self.timings["flush_s"] += time.perf_counter() - t

    # ------------------------------------------------------------------------------------------ producing
    def _produce_until(self, t1: int) -> None:
        cfg, s = self.cfg, self.schedule
        i = self.write_ptr
        j = max(i, int(np.searchsorted(s.time_ms, min(t1, self.write_limit), side="left")))
        times = s.time_ms[i:j].tolist()
        regions = s.region[i:j].tolist()
        kids = s.key[i:j].tolist()
        parts = s.partition[i:j].tolist()
        ops = s.op[i:j].tolist()
        sizes = s.size[i:j].tolist()
        wids = s.writer[i:j].tolist()
        hb_after = s.heartbeat_after[i:j].tolist()
        clock = self.clock
        keys = self.keyspace.keys
        values = self.values
        rt = cfg.rt_topic
        by_write = self.plan.by_write
        producers = self.producers
        writers = self.writers
        alive = self.alive
        silent = self.silent
        grid_end = self.t_close
        base = self.write_base + i
        for n in range(j - i):
            now = times[n]
            while self.next_grid_hb < now and self.next_grid_hb < grid_end:
                self._grid_heartbeats(self.next_grid_hb)
            idx = base + n
            r, q, w = regions[n], parts[n], wids[n]
            clock.now = now
            writer = writers[r][w]
            if ops[n] == PUT:
                recs = writer.put(q, keys[kids[n]], values.write(idx, r, sizes[n]), logical_ts=now)
            else:
                recs = writer.delete(q, keys[kids[n]], logical_ts=now)
            faults = by_write.get(idx)
            if faults is None and not self.writer_watch:
                prod = producers[r]
                for rec in recs:
                    prod.produce(rt, rec.value, rec.key, q, list(rec.headers) if rec.headers else None)
            else:
                self._produce_faulty(r, w, q, recs, faults or [])
            if hb_after[n] and alive[r][q] and not silent[r][q]:
                self._rt_heartbeat(r, q, now)
        if j > i:
            self.writes_done += np.bincount(s.region[i:j], minlength=cfg.regions)
            self.last_write_ms = times[-1]
        self.write_ptr = j
        while self.next_grid_hb < t1 and self.next_grid_hb < grid_end:
            self._grid_heartbeats(self.next_grid_hb)

    def _rt_heartbeat(self, x: int, q: int, ts: int) -> None:
        """The RT heartbeat leader (x, q) writes every interval (built by the heartbeat library, written
        through the region's RT producer so that the RT partition has one producer)."""
        self.clock.now = ts
        rec = rt_heartbeat(leader_host(x, q, self.terms[x][q]), ts, partition=q, checksum_type=cks.ADHASH)
        self.producers[x].produce(self.cfg.rt_topic, rec.value, rec.key, q, list(rec.headers))

    def _grid_heartbeats(self, t: int) -> None:
        for x in range(self.cfg.regions):
            for q in range(self.cfg.partitions):
                if self.alive[x][q] and not self.silent[x][q]:
                    self._rt_heartbeat(x, q, t)
        self.next_grid_hb = t + self.cfg.heartbeat_every_ms

    def _produce_rt(self, r: int, w: int, q: int, rec) -> int:
        prod = self.producers[r]
        prod.produce(self.cfg.rt_topic, rec.value, rec.key, q, list(rec.headers) if rec.headers else None)
        off = prod.last_offset
        watchers = self.writer_watch.get((r, w, q))
        if watchers:
            left = [cb for cb in watchers if not cb(rec, off)]
            if left:
                self.writer_watch[(r, w, q)] = left
            else:
                del self.writer_watch[(r, w, q)]
        return off

    def _produce_faulty(self, r: int, w: int, q: int, recs: list, faults: list[F.Fault]) -> None:
        """Produce one write's records, applying the write faults planned for it."""
        for rec in recs[:-1]:
            self._produce_rt(r, w, q, rec)
        data = recs[-1]
        by_kind = {f.kind: f for f in faults}
        rt = self.cfg.rt_topic
        guid = self.writers[r][w].guid.hex()
        if "gap" in by_kind:
            f = by_kind["gap"]
            f.detail = {"producer_guid": guid, "segment": data.segment, "lost_sequence": data.sequence}
            self._watch_after_loss(f, r, w, q, data.segment, rt, gap=True)
            self._started(f, f"dc-{r} p{q}: a write of producer {guid[:8]} never reaches the RT")
            return
        if "corrupt" in by_kind:
            f = by_kind["corrupt"]
            value = self.values.write(f.write, r, int(self.schedule.size[f.write - self.write_base]))
            pos = data.value.rfind(value)
            if pos < 0:
                raise SimulationError(f"corrupt fault {f.id}: value not found in its envelope")
            bad = bytearray(data.value)
            bad[pos + len(value) // 2] ^= 0xFF
            data = type(data)(data.partition, data.key, bytes(bad), data.headers, data.segment, data.sequence)
            f.detail = {
                "producer_guid": guid,
                "segment": data.segment,
                "sequence": data.sequence,
                "flipped_value_byte": len(value) // 2,
            }
        off = self._produce_rt(r, w, q, data)
        for f in faults:
            f.rt_offset = off
            if f.kind == "corrupt":
                self._watch_after_loss(f, r, w, q, data.segment, rt, gap=False)
            elif f.kind == "duplicate":
                dup = self._produce_rt(r, w, q, data)
                f.detail = {
                    "producer_guid": guid,
                    "segment": data.segment,
                    "sequence": data.sequence,
                    "copy_offset": dup,
                }
                f.expect = {"leapfrog": [], "div": [F.div_expect(r, rt, q, dup, "DUPLICATE")]}
            elif f.kind in ("dropped", "poisoned"):
                for x in range(self.cfg.regions):
                    self.pending_faults[x].append(("watch", q, r, off))
                for x in f.affected_regions:
                    self.pending_faults[x].append((f.kind, q, r, off))
            where = ", ".join(f"dc-{x}" for x in f.affected_regions)
            self._started(
                f,
                f"dc-{r} p{q} RT offset {off}: "
                + {
                    "dropped": f"applied in dc-{r} only, dropped in {where}",
                    "poisoned": f"{where} writes a changed value",
                    "corrupt": "a value changed after its checksum",
                    "duplicate": "delivered twice",
                }[f.kind],
            )

    def _watch_after_loss(self, f: F.Fault, r: int, w: int, q: int, segment: int, rt: str, gap: bool) -> None:
        """Learn the offsets where DIV must notice a lost (gap) or corrupted record: the producer's next record
        in the partition (gap) and the EndOfSegment of that segment (both)."""
        state: dict[str, int | None] = {"next": None}

        def cb(rec, off: int) -> bool:
            if gap and state["next"] is None:
                state["next"] = off
                f.rt_offset = off
            if rec.key[0] == 2 and rec.segment == segment and rec.sequence > 0:  # this segment's EndOfSegment
                exp = []
                if gap:
                    exp.append(F.div_expect(r, rt, q, state["next"], "MISSING"))
                    if (
                        state["next"] != off
                    ):  # the resync after MISSING at the EOS itself tolerates its checksum
                        exp.append(F.div_expect(r, rt, q, off, "CORRUPT"))
                else:
                    exp.append(F.div_expect(r, rt, q, off, "CORRUPT"))
                f.expect = {"leapfrog": [], "div": exp}
                f.detail["eos_offset"] = off
                return True
            return False

        self.writer_watch.setdefault((r, w, q), []).append(cb)

    # ------------------------------------------------------------------------------------------ actions
    def _fail(self, f: F.Fault) -> None:
        self.alive[f.region][f.partition] = False
        self.workers[f.region].send("fail", f.id, f.partition, f.time_ms)
        self._started(f, f"dc-{f.region} p{f.partition}: the leader stops")

    def _take_over(self, f: F.Fault, t: int | None = None) -> None:
        x, q = f.region, f.partition
        f.end_ms = f.end_ms if t is None else t
        self.terms[x][q] += 1
        self.alive[x][q] = True
        self.workers[x].send("take_over", f.id, q, f.end_ms)
        f.expect = {"leapfrog": [], "div": []}
        self._ended(f, f"dc-{x} p{q}: a successor (term {self.terms[x][q]}) took over")

    def _redelivery(self, f: F.Fault) -> None:
        self.workers[f.region].send("redeliver", f.id, f.partition, f.time_ms)
        self._started(f, f"dc-{f.region} p{f.partition}: the leader's next VT record is written twice")

    def _swap(self, step: str, f: F.Fault, *args: Any) -> None:
        """A version swap's three moments, in every region: the re-push's snapshot, its End of Push (the new
        leaders start), the VersionSwap that ends version N.

        A live run creates the new version's topics in every region at the snapshot (it is placed only when its
        chunk is drawn), waits for every region at End of Push and at the VersionSwap so that truth.json and the
        console say so once the records are in the clusters, and holds the VersionSwap back while a failover of
        version N goes on (a failed leader writes none: it waits for the successor, as a planned run's placement
        does)."""
        cfg, d = self.cfg, f.detail
        live = cfg.live
        if step == "swap_end" and live and self._swap_waits_for_failover(f, args[0]):
            return
        if step == "swap_snapshot":  # the source region's state, the same bulk load everywhere
            source = d["source_region"]
            snapshot = self.workers[source].call("swap_state")
            d["snapshot_rt_positions"] = {str(q): c for q, c in enumerate(snapshot["cursor"])}
            args = (*args[:-1], snapshot)
            self.swap_fault = f
            if live:
                self._create_version_topics(d["to_topic"])
                plan = {
                    "to_version": d["to_version"],
                    "topic": d["to_topic"],
                    "rewind_from_ms": d["rewind_from_ms"],
                }
                args = (*args, plan)
        if not live or step == "swap_snapshot":
            for w in self.workers:
                w.send(step, *args)
        else:
            replies = self._ask_all(step, *args)
            for x, reply in enumerate(replies):
                self.swap_live_facts.setdefault(x, {}).update(reply)
        self.swap_step = {"swap_snapshot": "snapshot", "swap_start": "started", "swap_end": "ended"}[step]
        if step == "swap_snapshot":
            self._started(
                f, f"re-push of {d['to_topic']} starts (StartOfPush and the bulk load in every region)"
            )
            if live:
                self._announce("running")
        elif step == "swap_start":
            if live:
                d["end_of_push_at"] = _now_ms()
                self.truth_dirty = True
                self._say(f"version {d['to_version']} of {cfg.store}: End of Push written")
        else:
            self.current_version = d["to_version"]
            if live:
                d["version_swap_at"] = _now_ms()
                self._announce("running")
            self._ended(f, f"{d['from_topic']} ends with a VersionSwap; {d['to_topic']} serves")
            if live:
                self._say(
                    f"version {d['from_version']} ended with VersionSwap; version {d['to_version']} is current"
                )

    def _swap_waits_for_failover(self, f: F.Fault, t: int) -> bool:
        """A live run's VersionSwap due at `t` while a leader of version N has failed and its successor has not yet
        taken over: moved to just after the takeover (the run's stop brings that on too)."""
        going = [g for g in self.plan.of("failover") if g.at_ms is not None and g.end_at_ms is None]
        if not going:
            return False
        t_new = max(max(g.end_ms for g in going) + 1, t + 1)
        f.detail["version_swap_ms"] = f.end_ms = t_new
        f.detail["version_swap_waited_for_failover"] = sorted(g.id for g in going)
        self._at(t_new, lambda: self._swap("swap_end", f, t_new, f.detail["to_version"]))
        return True

    def _create_version_topics(self, topic: str) -> None:
        """A live run's new version topic, created in every region's cluster when its re-push starts (through the
        AdminClient, or the mock's own API), before any region writes it."""
        for region in self.regions:
            region.create_topics([topic], self.cfg.partitions)
        if topic not in self.vt_topics:
            self.vt_topics.append(topic)

    def _ask_all(self, cmd: str, *args: Any) -> list[Any]:
        """`cmd` in every region at once; their replies (earlier replies still waiting are read on the way)."""
        for w in self.workers:
            w.send(cmd, *args)
        replies = []
        for x, w in enumerate(self.workers):
            while w.outstanding() > 1:
                reply = w.recv()
                if isinstance(reply, dict) and "vt_records" in reply:
                    self.worker_progress[x] = reply
            replies.append(w.recv())
        return replies

    def _complete_swap(self, t: int) -> None:
        """A live run that stops during a swap completes it, as a planned run's does before its end: End of Push
        (if not yet written) and the VersionSwap at `t`, after the outages have ended."""
        f = self.swap_fault
        if f is None or self.swap_step not in ("snapshot", "started"):
            return
        d = f.detail
        d["completed_at_stop"] = True
        if self.swap_step == "snapshot":
            d["end_of_push_ms"] = t
            self._swap("swap_start", f, t)
        d["version_swap_ms"] = f.end_ms = t
        self._swap("swap_end", f, t, d["to_version"])

    def _silence(self, f: F.Fault) -> None:
        """The leader stops heartbeating: no RT heartbeat of its partition is written (its data still is)."""
        x, q = f.region, f.partition
        self.silent[x][q] = True
        f.detail = {
            "leader": leader_host(x, q, self.terms[x][q]),
            "rt_topic": self.cfg.rt_topic,
            "note": "no RT heartbeat from this leader between time_ms and end_ms; its data keeps flowing",
        }
        self._started(f, f"dc-{x} p{q}: the leader stops heartbeating")

    def _unsilence(self, f: F.Fault, t: int | None = None) -> None:
        x, q = f.region, f.partition
        f.end_ms = f.end_ms if t is None else t
        self.silent[x][q] = False
        self._ended(f, f"dc-{x} p{q}: the leader heartbeats again")

    def _isolate(self, f: F.Fault) -> None:
        """The region stops replicating: its leaders leave the other regions' RTs unread until it ends."""
        x = f.region
        self.workers[x].send("isolate", f.time_ms)
        f.detail = {"not_replicated": [r for r in range(self.cfg.regions) if r != x]}
        self._started(f, f"dc-{x} stops replicating the other regions")

    def _reconnect(self, f: F.Fault, t: int | None = None) -> None:
        f.end_ms = f.end_ms if t is None else t
        self.workers[f.region].send("reconnect", f.end_ms)
        self._ended(f, f"dc-{f.region} replicates again")

    def _broker_fault(self, f: F.Fault) -> None:
        region = self.regions[f.region]
        if region.brokers is not None:
            self._kill_broker(f, region.brokers)
            return
        if region.embedded is None:
            f.detail = {"skipped": "broker faults need a cluster started here (the mock, or --brokers real)"}
            self._started(f, "skipped (needs a cluster started here)")
            self._ended(f, "skipped")
            return
        from confluent_kafka import KafkaError

        embedded = region.embedded
        down_s = self.cfg.broker_down_s if f.end_ms is None else (f.end_ms - f.time_ms) / 1000
        embedded.broker_down(1)

        def up() -> None:
            embedded.push_produce_errors(3, KafkaError.NOT_LEADER_FOR_PARTITION)
            embedded.broker_up(1)
            self._ended(f, f"dc-{f.region}'s broker is back")

        self._back_after(f, down_s, up)
        f.detail = {
            "broker": 1,
            "down_wall_s": down_s,
            "then": "3 produce requests fail with NOT_LEADER_OR_FOLLOWER (retriable)",
        }
        self._started(f, f"dc-{f.region}'s broker goes down for {down_s:g} s")

    def _kill_broker(self, f: F.Fault, cluster: Any) -> None:
        """A real broker killed (SIGKILL, no controlled shutdown) and started again on its ports after the
        outage: clients see it vanish, the idempotent producers retry, and nothing acknowledged is lost (the
        machine keeps what the broker had written). With several nodes the one killed leads the version topic's
        partition 0, so that partition's leadership must move (an election) while the run writes on."""
        node = cluster.broker_ids[0]
        if len(cluster.broker_ids) > 1:
            try:
                node = cluster.partitions(self.cfg.vt_topic)[0]["leader"]
            except Exception as exc:  # noqa: BLE001 - metadata unavailable: any node will do, said in detail
                log.warning(
                    "[simulate] dc-%d: partition leader unknown (%s); killing broker %d", f.region, exc, node
                )
        down_s = self.cfg.broker_down_s if f.end_ms is None else (f.end_ms - f.time_ms) / 1000
        cluster.kill_broker(node)

        def up() -> None:
            cluster.restart_broker(node)  # until it serves again (a few seconds: a JVM, log recovery)
            self._ended(f, f"dc-{f.region}'s broker {node} is back")

        self._back_after(f, down_s, up)
        f.detail = {
            "broker": node,
            "down_wall_s": down_s,
            "then": "killed with SIGKILL; started again on its ports once the outage is over",
        }
        if len(cluster.broker_ids) > 1:
            f.detail["nodes"] = len(cluster.broker_ids)
            f.detail["led"] = f"{self.cfg.vt_topic}[0]"
            f.detail["elected"] = None
            watcher = threading.Thread(
                target=self._note_election, args=(f, cluster, node, time.monotonic(), down_s), daemon=True
            )
            watcher.start()
            self.election_watchers.append(watcher)
        self._started(f, f"dc-{f.region}'s broker {node} killed; back in {down_s:g} s")

    def _note_election(self, f: F.Fault, cluster: Any, killed: int, t0: float, down_s: float) -> None:
        """Which node the partition's leadership moved to, and how long that took, as the cluster's metadata
        says (truth.json's fault detail `elected`, `election_s`): the evidence that the run wrote on through an
        election, not through a node that was never needed. Watched past the outage (`ELECTION_WATCH_S` more):
        on a loaded host the controller may fence the dead node late, and leadership only returns to it by a
        preferred-leader election minutes later, so a leader other than the killed node is still the evidence."""
        deadline = t0 + max(down_s, 1.0) + ELECTION_WATCH_S
        while time.monotonic() < deadline:
            try:
                leader = cluster.partitions(self.cfg.vt_topic, timeout_s=2)[0]["leader"]
            except Exception:  # noqa: BLE001 - metadata in the middle of an election: asked again
                leader = -1
            if leader not in (killed, -1):
                f.detail["elected"] = leader
                f.detail["election_s"] = round(time.monotonic() - t0, 2)
                self.truth_dirty = True
                self._say(f"fault {f.id} broker: node {leader} leads {self.cfg.vt_topic}[0] now")
                return
            time.sleep(0.2)

    def _back_after(self, f: F.Fault, down_s: float, up: Callable[[], None]) -> None:
        """Run `up` once, after `down_s` seconds or when the run ends first (`_end_outages`), whichever comes
        first: the timer and the run's end may both call it."""
        lock = threading.Lock()
        done = [False]

        def once() -> None:
            with lock:
                if done[0]:
                    return
                done[0] = True
            up()

        timer = threading.Timer(down_s, once)
        timer.daemon = True
        timer.start()
        self.timers[f.id] = timer
        self.broker_up[f.id] = once

    def _end_outages(self) -> None:
        """A live run that stops ends the outages still going, so that it ends like a planned run: every leader
        back and heartbeating, every region replicating, every broker up."""
        t = self.t_close
        for f in self.plan.faults:
            if f.at_ms is None or f.end_at_ms is not None or f.kind not in STOP_RESUME_KINDS:
                continue
            if f.kind == "failover":
                self._take_over(f, t)
            elif f.kind == "silent":
                self._unsilence(f, t)
            elif f.kind == "isolated":
                self._reconnect(f, t)
            elif f.kind == "broker" and f.id in self.broker_up:
                self.timers[f.id].cancel()
                self.broker_up[f.id]()
        self._complete_swap(t)

    # -- a fault happens (a live run's truth.json lists it from then on) --------------------------------------
    def _started(self, f: F.Fault, what: str) -> None:
        if self.cfg.live:
            f.at_ms = _now_ms()
            self.truth_dirty = True
            self._say(f"fault {f.id} {f.kind}: {what}")

    def _ended(self, f: F.Fault, what: str) -> None:
        """(Also called from a broker's timer thread: it only sets fields; the main loop writes truth.json.)"""
        if self.cfg.live:
            f.end_at_ms = _now_ms()
            self.truth_dirty = True
            self._say(f"fault {f.id} {f.kind} over: {what}")

    def _say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(f"[simulate --live] {line}")

    def _close_writers(self) -> None:
        """Online producers close gracefully: a final EndOfSegment in every partition they wrote."""
        self.clock.now = self.t_close
        for x, row in enumerate(self.writers):
            for w, writer in enumerate(row):
                for rec in writer.close():
                    self._produce_rt(x, w, rec.partition, rec)

    def _final_heartbeats(self) -> None:
        self._grid_heartbeats(self.t_final_hb)

    def _rt_ends(self) -> dict[int, dict[int, int]]:
        """Per region and partition, the RT offset the next own record gets: what the workers read up to."""
        cfg = self.cfg
        return {
            r: {q: prod.next_offset(cfg.rt_topic, q) for q in range(cfg.partitions)}
            for r, prod in enumerate(self.producers)
        }

    def _close_leaders(self) -> None:
        for w in self.workers:
            w.send("close_leaders", self.t_done)

    def _repair_window(self) -> None:
        """Hold the run open after its last heartbeats, leaders up, for writes another producer makes into the
        RTs (`tidegauge repair apply`); then let every region's leaders apply them through DCR, heartbeat once
        more so that the VT heartbeats cover them, and step down.

        Everything before the window is processed and archived when it opens, so jobs run during the window (a
        `leapfrog` on the archives, the repair plan) see the whole history, every write covered by heartbeats.
        The cluster's end offsets say what was written meanwhile; the producers and the archive follow them.
        Those records are processed as written at the window's close in simulated time (`RtBuffer.restamp`):
        their own timestamps are the wall clock's. DCR orders them by their logical timestamps, as Venice does."""
        cfg = self.cfg
        self._collect(0)
        for w in self.workers:
            w.send("snapshot")
        self._collect(0)
        done_file = self.out / "repair-window.done"
        done_file.unlink(missing_ok=True)
        opened = _now_ms()
        self.repair_window = {"opened_at": opened, "closed_at": None, "closed_by": None, "rt_records": {}}
        self.clusters_up = True
        self._announce("repair-window")
        if self.progress:
            self.progress(
                f"[simulate] repair window open (up to {cfg.repair_window_s:g} s): leaders wait for writes into the "
                f"RTs; `touch {done_file}` closes it"
            )
        if self.on_repair_window is not None:
            self.on_repair_window(json.loads((self.out / "live.json").read_text()))
            closed_by = "stop requested" if self.stop.is_set() else "done"
        else:
            deadline = time.monotonic() + cfg.repair_window_s
            while not (done_file.exists() or self.stop.is_set() or time.monotonic() >= deadline):
                self.stop.wait(0.2)
            closed_by = (
                "done" if done_file.exists() else "stop requested" if self.stop.is_set() else "duration"
            )
        before = self._rt_ends()
        ends = {x: self.regions[x].end_offsets(cfg.rt_topic, cfg.partitions) for x in range(cfg.regions)}
        for x, prod in enumerate(self.producers):
            for q, end in ends[x].items():
                prod.skip_to(cfg.rt_topic, q, end)
        t_w = self.t_done + 1
        for w in self.workers:
            w.send("outside_writes", t_w, before, ends)
        self._collect(0)
        max_lag = max(max(row) for row in cfg.lag_matrix())
        self._grid_heartbeats(t_w)
        self._flush()
        t_end = t_w + max_lag + 1
        rt_ends = self._rt_ends()
        for w in self.workers:
            w.send("step", t_end, rt_ends, [])
        self._collect(0)
        self.t_now = self.t_done = t_end + 1
        self._close_leaders()
        written = {
            str(x): {
                str(q): ends[x][q] - before[x][q] for q in range(cfg.partitions) if ends[x][q] > before[x][q]
            }
            for x in range(cfg.regions)
        }
        self.repair_window.update(
            closed_at=_now_ms(), closed_by=closed_by, rt_records={x: n for x, n in written.items() if n}
        )
        self.clusters_up = False
        self._announce("stopping")
        if self.progress:
            n = sum(v for by_q in written.values() for v in by_q.values())
            self.progress(
                f"[simulate] repair window closed ({closed_by}): {n} records written to the RTs meanwhile"
            )

    # ------------------------------------------------------------------------------------------ ending
    def _finish(self) -> list[dict]:
        t = time.perf_counter()
        for w in self.workers:
            w.send("finish")
        reports = []
        for w in self.workers:
            while w.outstanding() > 1:
                w.recv()
            reports.append(w.recv())
        self.timings["wait_for_workers_s"] += time.perf_counter() - t
        for timer in self.timers.values():
            timer.join()
        for (
            watcher
        ) in self.election_watchers:  # truth.json names the elected node: each watch ends by its deadline
            watcher.join()
        cfg = self.cfg
        self.ends = {
            x: {
                (cfg.rt_topic, q): self.producers[x].next_offset(cfg.rt_topic, q)
                for q in range(cfg.partitions)
            }
            for x in range(cfg.regions)
        }
        for rep in reports:
            for topic, by_q in rep["vt_ends_by_topic"].items():
                for q, end in by_q.items():
                    self.ends[rep["region"]][(topic, int(q))] = end
        self.eop_offsets = {int(q): o for q, o in reports[0]["eop_offsets"].items()}
        self._report_progress(force=True)
        return reports

    def _compactions(self) -> None:
        cfg = self.cfg
        for f in self.plan.of("compaction"):
            x, q = f.region, f.partition
            end = self.ends[x].get((cfg.vt_topic, q), 0)
            lo = self.eop_offsets[q] + 2
            n = max(0, end - lo)
            first = lo + int(0.3 * n)
            last = min(end - 1, first + max(20, int(0.03 * n)))
            removed = compact_range(str(self.out / "archive" / f"dc-{x}"), cfg.vt_topic, q, first, last)
            f.vt_offsets = {x: [first, last]}
            f.detail = {
                "topic": cfg.vt_topic,
                "range": [first, last],
                "removed_records": len(removed),
                "removed_offsets": removed,
                "note": "validate with compaction tolerance (e.g. div validate --min-compaction-lag-ms 0)",
            }
            f.expect = {"leapfrog": [], "div": []}
            if cfg.live:
                f.at_ms = _now_ms()

    def _check_archives(self) -> dict[str, Any]:
        """Every offset of every topic partition is archived (except what a compaction fault removed)."""
        cfg = self.cfg
        removed: Counter = Counter()
        for f in self.plan.of("compaction"):
            removed[(f.region, f.partition)] += len(f.detail.get("removed_offsets", []))
        problems = []
        for x in range(cfg.regions):
            infos = {(i.topic, i.partition): i for i in archive.describe(self.out / "archive" / f"dc-{x}")}
            for (topic, q), end in sorted(self.ends[x].items()):
                info = infos.get((topic, q))
                expected = end - (removed[(x, q)] if topic == cfg.vt_topic else 0)
                if end == 0 and info is None:
                    continue
                if (
                    info is None
                    or info.first_offset != 0
                    or info.last_offset != end - 1
                    or info.records != expected
                ):
                    problems.append(
                        f"dc-{x} {topic}[{q}]: expected offsets 0..{end - 1} ({expected} records), "
                        f"archived {info}"
                    )
        if problems:
            raise SimulationError("archive incomplete: " + "; ".join(problems))
        return {"complete": True, "partitions_checked": sum(len(e) for e in self.ends.values())}

    def _write_truth(self, reports: list[dict]) -> str:
        watched: dict[str, dict[int, list[int]]] = {}
        failovers: dict[int, dict] = {}
        for rep in reports:
            for k, offs in rep["watched"].items():
                watched.setdefault(k, {})[rep["region"]] = offs
            failovers.update({int(k): v for k, v in rep["failovers"].items()})
        for f in self.plan.faults:
            if f.kind in ("dropped", "poisoned"):
                src = f.detail.get("origin_region", f.region) if f.kind == "poisoned" else f.region
                f.vt_offsets = watched.get(f"{f.partition}:{src}:{f.rt_offset}", {})
                f.detail["rt_offset"] = f.rt_offset
            elif f.kind == "failover":
                f.detail = failovers.get(f.id, {})
                f.vt_offsets = {f.region: f.detail.pop("reapplied_vt_offsets", [])}
            elif f.kind == "redelivery":
                rep = next((r["redeliveries"][f.id] for r in reports if f.id in r["redeliveries"]), None)
                if rep is None:
                    f.detail = {"note": "the leader wrote no VT record after its time"}
                    continue
                f.rt_offset = rep["coordinate"][1]
                f.vt_offsets = {f.region: rep["vt_offsets"]}
                f.detail = {**rep, "copy_offset": rep["vt_offsets"][1]}
                f.expect = {
                    "leapfrog": [],
                    "div": [
                        F.div_expect(f.region, rep["topic"], f.partition, rep["vt_offsets"][1], "DUPLICATE")
                    ],
                }
            elif f.kind == "swap":
                f.detail["changes"] = "truth.json changes: rewind points, End of Push and VersionSwap offsets"
                f.expect = {"leapfrog": [], "div": []}
        return self._save_truth(self._truth(final=True, reports=reports))

    def _swap_facts(self, reports: list[dict]) -> dict:
        """What the swap did in each region (from its worker): per partition the rewind point, End of Push, the
        VersionSwap and the hbw before it."""
        regions = {}
        for rep in reports:
            sw = rep["swap"]
            regions[rep["region"]] = {
                "bulk_records": sw.get("bulk_records"),
                "rewind": sw.get("rewind"),
                "eop_offsets": sw.get("eop_offsets"),
                "version_swap_offsets": sw.get("version_swap_offsets"),
                "hbw_at_version_swap": sw.get("hbw_at_version_swap"),
            }
        return {"regions": regions}

    def _publish_truth(self) -> None:
        """A live run's truth.json while it runs: the faults that have happened so far."""
        self.truth_dirty = False
        self._save_truth(self._truth(final=False))

    def _save_truth(self, truth: dict) -> str:
        path = self.out / "truth.json"
        changes = truth.pop("changes", None)
        text = json.dumps(truth, indent=2)
        if changes is not None:  # one region and version a line: its lists hold an int per write
            lines = ",\n".join(
                f"      {json.dumps(x)}: {json.dumps(v, separators=(',', ':'))}"
                for x, v in changes["regions"].items()
            )
            text = (
                text[:-2]
                + ',\n  "changes": {\n    "versions": '
                + json.dumps(changes["versions"])
                + ',\n    "regions": {\n'
                + lines
                + "\n    }\n  }\n}"
            )
            truth["changes"] = changes
        atomic_write(path, (text + "\n").encode())
        return str(path)

    def _happened(self) -> list[F.Fault]:
        """The faults of the run: a live run's are those that have happened, in that order (truth.json only
        ever appends to them); a planned run's all happen."""
        if not self.cfg.live:
            return self.plan.faults
        return sorted((f for f in self.plan.faults if f.at_ms is not None), key=lambda f: (f.at_ms, f.id))

    def _truth(self, final: bool, reports: list[dict] | None = None) -> dict:
        cfg, s = self.cfg, self.schedule
        live = cfg.live
        nominal = s.nominal_end_ms - s.start_ms
        truth = {
            "run": {
                "seed": cfg.seed,
                "store": cfg.store,
                "version": cfg.version,
                "regions": cfg.regions,
                "partitions": cfg.partitions,
                "records": int(self.writes_done.sum()),
                "batch_records": cfg.batch_records,
                "keys": cfg.keys,
                "key_skew": cfg.key_skew,
                "delete_ratio": cfg.delete_ratio,
                "value_size": {"min": cfg.value_size_min, "max": cfg.value_size_max},
                "rt_topic": cfg.rt_topic,
                "vt_topic": cfg.vt_topic,
                "vt_topics": self.vt_topics,
                "legacy_rmd": cfg.legacy_rmd,
                "start_ms": self.start_ms,
                "last_write_ms": self.last_write_ms,
                "end_ms": self.t_done if final else None,
                "heartbeat": {
                    "every_records": cfg.heartbeat_every_records,
                    "every_ms": cfg.heartbeat_every_ms,
                },
                "kafka": (
                    {str(k): v for k, v in cfg.kafka.items()}
                    if cfg.kafka is not None
                    else "real"
                    if cfg.brokers == "real"
                    else "embedded"
                ),
                **(
                    {
                        "kafka_version": self.started_brokers[0].version,
                        "brokers_per_region": cfg.brokers_per_region,
                    }
                    if self.started_brokers
                    else {}
                ),
                "eop_offsets": {str(q): o for q, o in self.eop_offsets.items()},
                "end_offsets": {
                    str(x): {f"{t}[{q}]": e for (t, q), e in sorted(ends.items())}
                    for x, ends in self.ends.items()
                }
                if final
                else None,
            },
            "regions": [
                {
                    "region": x,
                    "write_rate_per_s": cfg.rate(x),
                    "writes": int(self.writes_done[x]),
                    "quiet_periods": [
                        {
                            "from": q.start,
                            "to": q.end,
                            "partitions": None if q.partitions is None else list(q.partitions),
                            # a live run's quiet periods repeat in every chunk of its schedule
                            "from_ms": None if live else s.start_ms + int(q.start * nominal),
                            "to_ms": None if live else s.start_ms + int(q.end * nominal),
                        }
                        for q in cfg.quiet
                        if q.region == x
                    ],
                    "lag_ms_from": {str(r): cfg.lag(r, x) for r in range(cfg.regions)},
                    "producer_guids": [w.guid.hex() for w in self.writers[x]],
                }
                for x in range(cfg.regions)
            ],
            "faults_requested": self.plan.requested,
            "faults_shortfall": self.plan.shortfall,
            "faults": [f.to_json(live) for f in self._happened()],
        }
        if reports is not None:
            truth["changes"] = self._changes(reports)
        elif live:
            truth["changes"] = self._live_changes()
        if live:
            truth["live"] = self._live_info()
        if self.repair_window is not None:
            truth["repair_window"] = self.repair_window
        return truth

    def _changes(self, reports: list[dict]) -> dict:
        """truth.json `changes`: what a change-capture reader of each region's VTs must be able to get. Per region
        and version: per partition the VT offset of End of Push and of the VersionSwap that ends the version (null:
        none), the last `hbw` vector before it, the rewind point (per source region the first RT position the
        version's leaders replayed; null for the first version), and per partition and source region the sorted RT
        positions the version's leaders wrote (each once, however often the VT holds it)."""
        cfg = self.cfg
        swap = self._swap_facts(reports)["regions"] if self.swap_fault is not None else {}
        regions = {}
        for rep in sorted(reports, key=lambda r: r["region"]):
            x, sw = rep["region"], swap.get(rep["region"], {})
            per_version = {}
            for v, parts in sorted(rep["applied"].items()):
                first = v == cfg.version
                vs = sw.get("version_swap_offsets") if first else None
                hbw = sw.get("hbw_at_version_swap") if first else None
                rewind = None if first else sw.get("rewind")
                per_version[str(v)] = {
                    "topic": f"{cfg.store}_v{v}",
                    "eop_offsets": {str(q): o for q, o in sorted(rep["eop_by_version"].get(v, {}).items())},
                    "version_swap_offsets": None
                    if vs is None
                    else {str(q): o for q, o in sorted(vs.items())},
                    "hbw_at_version_swap": None
                    if hbw is None
                    else {str(q): m for q, m in sorted(hbw.items())},
                    "rewind": None
                    if rewind is None
                    else {
                        str(q): {str(r): pos for r, pos in enumerate(by_r)}
                        for q, by_r in sorted(rewind.items())
                    },
                    "applied": {
                        str(q): {str(r): pos for r, pos in sorted(by_r.items())}
                        for q, by_r in sorted(parts.items())
                    },
                }
            regions[str(x)] = per_version
        return {"versions": sorted(int(v) for v in reports[0]["applied"]), "regions": regions}

    def _live_changes(self) -> dict:
        """truth.json `changes` while a live run goes on: each version as soon as it exists, its End of Push,
        rewind point, VersionSwap and `hbw` there as they are written (the same fields as at the end); `applied`
        (the RT positions written) is null until the run stops."""
        cfg, p = self.cfg, self.cfg.partitions
        f = self.swap_fault if self.swap_step is not None else None
        versions = [cfg.version] + ([f.detail["to_version"]] if f is not None else [])
        regions = {}
        for x in range(cfg.regions):
            facts = self.swap_live_facts.get(x, {})
            vs, hbw, eop, rewind = (
                facts.get("version_swap_offsets"),
                facts.get("hbw_at_version_swap"),
                facts.get("eop_offsets"),
                facts.get("rewind"),
            )
            per = {
                str(cfg.version): {
                    "topic": cfg.vt_topic,
                    "eop_offsets": {str(q): self.eop_offsets[q] for q in range(p)},
                    "version_swap_offsets": None
                    if vs is None
                    else {str(q): o for q, o in sorted(vs.items())},
                    "hbw_at_version_swap": None
                    if hbw is None
                    else {str(q): m for q, m in sorted(hbw.items())},
                    "rewind": None,
                    "applied": None,
                }
            }
            if f is not None:
                per[str(f.detail["to_version"])] = {
                    "topic": f.detail["to_topic"],
                    "eop_offsets": None if eop is None else {str(q): o for q, o in sorted(eop.items())},
                    "version_swap_offsets": None,
                    "hbw_at_version_swap": None,
                    "rewind": None
                    if rewind is None
                    else {
                        str(q): {str(r): pos for r, pos in enumerate(by_r)}
                        for q, by_r in sorted(rewind.items())
                    },
                    "applied": None,
                }
            regions[str(x)] = per
        return {"versions": versions, "regions": regions}

    def _live_info(self) -> dict:
        cfg = self.cfg
        return {
            "started_at": self.start_ms,
            "stopped_at": self.stopped_at_ms,
            "stopped_by": self.stopped_by,
            "duration_s": cfg.duration_s,
            "step_ms": cfg.live_step_ms,
            "chunk_s": cfg.live_chunk_s,
            "behind_wall_clock_max_ms": self.behind_ms,
        }

    def _live_shortfall(self) -> None:
        """Faults a live run planned but never got to: it stopped first."""
        never = Counter(f.kind for f in self.plan.faults if f.at_ms is None and f.kind != "compaction")
        for kind, n in sorted(never.items()):
            self.plan.short(kind, f"{n} planned after the run stopped")
        for tf in self.plan.waiting + self.timed:
            self.plan.short(tf.kind, f"{tf}: the run stopped before it")

    def _summary(self, complete: dict, reports: list[dict]) -> dict:
        cfg = self.cfg
        elapsed = time.monotonic() - self.t_wall0
        topics: dict[str, Any] = {}
        total = 0
        for x in range(cfg.regions):
            per = {}
            for topic in (cfg.rt_topic, *self.vt_topics):
                parts = [self.ends[x].get((topic, q), 0) for q in range(cfg.partitions)]
                per[topic] = {"records": sum(parts), "by_partition": parts}
                total += sum(parts)
            topics[str(x)] = per
        leaders: dict[str, Any] = {}
        followers: dict[str, Any] = {}
        meta = MetadataBytes()
        for rep in reports:
            x = rep["region"]
            stats: Counter = Counter()
            findings: Counter = Counter()
            for lead in rep["leaders"]:
                stats.update(lead["stats"])
                for r, _off, typ, _fatal, _detail in lead["findings"]:
                    findings[f"rt{r}:{typ}"] += 1
            leaders[str(x)] = {"stats": dict(stats), "rt_div_findings": dict(sorted(findings.items()))}
            fc: Counter = Counter()
            region_meta = MetadataBytes()
            examples = []
            for fol in rep["followers"]:
                for off, typ, fatal, detail in fol["findings"]:
                    fc[typ] += 1
                    if len(examples) < 5:
                        examples.append(
                            {
                                "partition": fol["partition"],
                                "offset": off,
                                "type": typ,
                                "fatal": fatal,
                                "detail": detail,
                            }
                        )
                region_meta.add(MetadataBytes(**fol["meta"]))
            meta.add(region_meta)
            followers[str(x)] = {
                "div_findings": dict(fc),
                "examples": examples,
                "checkpoints": sum(f["checkpoints"] for f in rep["followers"]),
                "checkpoint_dir": str(self.out / "followers" / f"dc-{x}"),
                "metadata_bytes": region_meta.as_dict(),
            }
        return {
            "job": "simulate",
            "tidegauge_version": _version(),
            "started_at": self.started_at,
            "elapsed_s": round(elapsed, 3),
            "exit_code": 0,
            "sources": {str(x): str(self.out / "archive" / f"dc-{x}") for x in range(cfg.regions)},
            "seed": cfg.seed,
            "store": cfg.store,
            "version": cfg.version,
            "regions": cfg.regions,
            "partitions": cfg.partitions,
            "records": int(self.writes_done.sum()),
            "legacy_rmd": cfg.legacy_rmd,
            "workers": cfg.workers,
            "topics": topics,
            "vt_records_per_region": {x: topics[x][cfg.vt_topic]["records"] for x in topics},
            "records_per_s": round(total / max(elapsed, 1e-9)),
            "faults_injected": dict(Counter(f.kind for f in self._happened())),
            "faults_shortfall": self.plan.shortfall,
            "faults": [
                {
                    "id": f.id,
                    "kind": f.kind,
                    "region": f.region,
                    "partition": f.partition,
                    "key": None if f.key is None else f.key.hex(),
                    "rt_offset": f.rt_offset,
                }
                for f in self._happened()
            ],
            "leaders": leaders,
            "followers": followers,
            "metadata_bytes": meta.as_dict(),
            "archive": complete,
            "archives": {str(x): str(self.out / "archive" / f"dc-{x}") for x in range(cfg.regions)},
            "truth": str(self.out / "truth.json"),
            "timings": {k: round(v, 3) for k, v in sorted(self.timings.items())},
        } | ({"live": self._live_info()} if cfg.live else {})

    def _report_progress(self, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if not force and now - self.last_progress < 2.0:
            return
        self.last_progress = now
        cfg, s = self.cfg, self.schedule
        elapsed = max(now - self.t_wall0, 1e-9)
        rt = sum(sum(p.ends().values()) for p in self.producers)
        vt = [self.worker_progress.get(x, {}).get("vt_records", 0) for x in range(cfg.regions)]
        total = rt + sum(vt)
        vts = "VT " + " ".join(f"dc-{x}:{v:,}" for x, v in enumerate(vt))
        if cfg.live:
            self.progress(
                f"[simulate --live] t+{(self.t_now - self.start_ms) / 1000:.1f}s | "
                f"{int(self.writes_done.sum()):,} writes | RT {rt:,} | {vts} | "
                f"{len(self._happened())} fault(s) so far | behind the wall clock at most "
                f"{self.behind_ms / 1000:.1f}s"
            )
            return
        pct = 100.0 * self.write_ptr / max(1, len(s))
        self.progress(
            f"[simulate] {pct:5.1f}% of writes | sim t+{(self.clock.now - cfg.start_ms) / 1000:.1f}s | "
            f"RT {rt:,} | {vts} | {total / elapsed:,.0f} records/s | {elapsed:.0f}s"
        )

    def close(self) -> None:
        if self.announced == "running":  # the run failed: a watch must not wait for these clusters
            try:
                self._announce("failed")
            except OSError as exc:
                log.warning("writing live.json: %s", exc)
        for timer in self.timers.values():
            timer.cancel()
        for w in self.workers:
            try:
                w.close()
            except Exception as exc:  # noqa: BLE001 - closing must not hide the run's own error
                log.warning("closing a region worker: %s", exc)
        for prod in self.producers:
            try:
                prod.flush(10)
            except Exception:  # noqa: BLE001
                pass
        # Drop every client before the embedded clusters stop, so none of them sees its brokers vanish.
        self.workers, self.producers = [], []
        gc.collect()
        if (
            self.started_brokers
        ):  # Apache Kafka brokers: all stopped at once (each region's close is then a no-op)
            from .brokers import close_clusters

            close_clusters(self.started_brokers)
        for region in self.regions:
            try:
                if region.embedded is not None:
                    region.embedded.broker_up(1)
                region.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("closing region %d: %s", region.region, exc)


def _brokers_info(cluster: Any) -> dict:
    """live.json's word on a region's Apache Kafka cluster: version, directory, and each node's pid and ports (as
    they were when written: a restarted node has another pid)."""
    return {
        "kafka_version": cluster.version,
        "dir": str(cluster.dir),
        "nodes": [
            {"node_id": n.node_id, "roles": list(n.roles), "pid": None if n.proc is None else n.proc.pid}
            | ({"port": n.broker_port} if n.broker_port else {})
            for n in cluster.nodes
        ],
    }


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("tidegauge")
    except Exception:  # noqa: BLE001
        return "unknown"


__all__ = ["SimResult", "SimulationError", "run", "seeded_guid"]
