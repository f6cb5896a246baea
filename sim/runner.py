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
"""

from __future__ import annotations

import datetime as _dt
import gc
import hashlib
import json
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from div import archive
from div import checksum as cks
from div.checkpoint import atomic_write
from div.writer import SegmentWriter, deterministic_guid
from heartbeat.records import rt_heartbeat

from . import faults as F
from .cluster import Region, RegionProducer, SimClock
from .compaction import compact_range
from .config import ConfigError, SimConfig
from .follower import MetadataBytes
from .traffic import PUT, KeySpace, Values, build_schedule
from .worker import InlineWorker, ProcessWorker, WorkerSpec, leader_host

log = logging.getLogger(__name__)

PUSH_LEAD_MS = 60_000  # the push job runs this long before the first online write
MAX_STEPS_AHEAD = 2


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


def run(cfg: SimConfig, progress: Callable[[str], None] | None = None) -> SimResult:
    """Run a simulation; `progress` receives one-line progress reports (default: stderr when cfg.progress)."""
    cfg.validate()
    if progress is None and cfg.progress:

        def progress(line: str) -> None:
            print(line, file=sys.stderr, flush=True)

    sim = _Simulation(cfg, progress)
    try:
        return sim.run()
    finally:
        sim.close()


def seeded_guid(seed: int, *parts: int) -> bytes:
    """A producer GUID derived from the seed (Venice's deterministic GUID layout)."""
    h = hashlib.sha256(repr((seed,) + parts).encode()).digest()
    return deterministic_guid(int.from_bytes(h[:8], "big"), int.from_bytes(h[8:16], "big"))


class _Simulation:
    def __init__(self, cfg: SimConfig, progress: Callable[[str], None] | None) -> None:
        self.cfg = cfg
        self.progress = progress
        self.out = Path(cfg.out)
        self.clock = SimClock(cfg.start_ms)
        self.regions: list[Region] = []
        self.producers: list[RegionProducer] = []
        self.workers: list[Any] = []
        self.timers: list[threading.Timer] = []
        self.t_wall0 = time.monotonic()
        self.started_at = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        self.timings: Counter = Counter()
        self.worker_progress: dict[int, dict] = {}
        self.last_progress = 0.0

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
        self.schedule = build_schedule(cfg, self.keyspace, np.random.default_rng([cfg.seed, 1]))
        self.values = Values(np.random.default_rng([cfg.seed, 2]), cfg.value_size_max)
        self.plan = F.plan_faults(
            cfg, self.schedule, self.keyspace.keys, np.random.default_rng([cfg.seed, 3])
        )
        self.timings["plan_s"] += time.perf_counter() - t0
        n, p = cfg.regions, cfg.partitions
        confs = {}
        for x in range(n):
            conf = dict(cfg.kafka_conf)
            conf.update(cfg.kafka_conf_by_region.get(x, {}))
            if cfg.kafka is None:
                # Embedded brokers go down on purpose (broker faults) and at the end of the run: keep
                # librdkafka's connection-refused/disconnected lines off stderr unless the caller asks.
                conf.setdefault("log_level", 2)
            confs[x] = conf
            region = Region(x, None if cfg.kafka is None else cfg.kafka[x], conf, self.clock)
            self.regions.append(region)
            region.create_topics([cfg.rt_topic, cfg.vt_topic], p)
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
        self.terms = [[1] * p for _ in range(n)]
        self.pending_faults: list[list[tuple]] = [[] for _ in range(n)]
        self.writer_watch: dict[tuple[int, int, int], list[Callable]] = {}
        failovers = Counter((f.region, f.partition) for f in self.plan.of("failover"))
        push = self._push_records()
        t0 = time.perf_counter()
        for x in range(n):
            guids = {
                (q, term): seeded_guid(cfg.seed, 2, x, q, term)
                for q in range(p)
                for term in range(1, 2 + failovers[(x, q)])
            }
            spec = WorkerSpec(
                cfg,
                x,
                {r.region: r.bootstrap for r in self.regions},
                confs,
                str(self.out / "archive" / f"dc-{x}"),
                str(self.out / "followers" / f"dc-{x}"),
                push,
                cfg.start_ms - PUSH_LEAD_MS,
                guids,
            )
            self.workers.append(ProcessWorker(spec) if cfg.workers == "process" else InlineWorker(spec))
        self.timings["start_workers_s"] += time.perf_counter() - t0

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

    # ------------------------------------------------------------------------------------------ run
    def run(self) -> SimResult:
        self._prepare_out()
        self._setup()
        self._main_loop()
        reports = self._finish()
        self._compactions()
        complete = self._check_archives()
        truth = self._write_truth(reports)
        summary = self._summary(complete, reports)
        summary_path = self.out / "summary.json"
        atomic_write(summary_path, (json.dumps(summary, indent=2) + "\n").encode())
        return SimResult(
            str(self.out),
            truth,
            str(summary_path),
            {x: str(self.out / "archive" / f"dc-{x}") for x in range(self.cfg.regions)},
            summary,
        )

    def _boundaries(self) -> list[tuple[int, list[Callable[[], None]]]]:
        """Step ends, each with the actions that run once everything before it is done."""
        cfg, s = self.cfg, self.schedule
        max_lag = max(max(row) for row in cfg.lag_matrix())
        self.t_close = s.end_ms + 1
        self.t_final_hb = self.t_close + max_lag + 1
        self.t_done = self.t_final_hb + max_lag + 1
        actions: dict[int, list[Callable[[], None]]] = {}

        def at(t: int, fn: Callable[[], None]) -> None:
            actions.setdefault(int(t), []).append(fn)

        for i in range(cfg.step_records, len(s), cfg.step_records):
            actions.setdefault(int(s.time_ms[i]), [])
        for f in self.plan.of("failover"):
            at(f.time_ms, lambda f=f: self._fail(f))
            at(f.end_ms, lambda f=f: self._take_over(f))
        for f in self.plan.of("broker"):
            at(f.time_ms, lambda f=f: self._broker_fault(f))
        at(self.t_close, self._close_writers)
        at(self.t_final_hb, self._final_heartbeats)
        at(self.t_done, self._close_leaders)
        return sorted(actions.items())

    def _main_loop(self) -> None:
        cfg = self.cfg
        self.write_ptr = 0
        self.next_grid_hb = cfg.start_ms + cfg.heartbeat_every_ms
        for t1, actions in self._boundaries():
            t = time.perf_counter()
            self._produce_until(t1)
            self.timings["produce_s"] += time.perf_counter() - t
            self._flush()
            ends = {
                r: {q: prod.next_offset(cfg.rt_topic, q) for q in range(cfg.partitions)}
                for r, prod in enumerate(self.producers)
            }
            for x, w in enumerate(self.workers):
                w.send("step", t1, ends, self.pending_faults[x])
                self.pending_faults[x] = []
            for action in actions:
                action()
            self._collect(MAX_STEPS_AHEAD)
            self._report_progress()

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
        j = int(np.searchsorted(s.time_ms, t1, side="left"))
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
        grid_end = self.t_close
        for n in range(j - i):
            now = times[n]
            while self.next_grid_hb < now and self.next_grid_hb < grid_end:
                self._grid_heartbeats(self.next_grid_hb)
            idx = i + n
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
            if hb_after[n] and alive[r][q]:
                self._rt_heartbeat(r, q, now)
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
                if self.alive[x][q]:
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
            return
        if "corrupt" in by_kind:
            f = by_kind["corrupt"]
            value = self.values.write(f.write, r, int(self.schedule.size[f.write]))
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

    def _take_over(self, f: F.Fault) -> None:
        x, q = f.region, f.partition
        self.terms[x][q] += 1
        self.alive[x][q] = True
        self.workers[x].send("take_over", f.id, q, f.end_ms)
        f.expect = {"leapfrog": [], "div": []}

    def _broker_fault(self, f: F.Fault) -> None:
        region = self.regions[f.region]
        if region.embedded is None:
            f.detail = {"skipped": "broker faults need the embedded cluster"}
            return
        from confluent_kafka import KafkaError

        embedded = region.embedded
        embedded.broker_down(1)

        def up() -> None:
            embedded.push_produce_errors(3, KafkaError.NOT_LEADER_FOR_PARTITION)
            embedded.broker_up(1)

        timer = threading.Timer(self.cfg.broker_down_s, up)
        timer.daemon = True
        timer.start()
        self.timers.append(timer)
        f.detail = {
            "broker": 1,
            "down_wall_s": self.cfg.broker_down_s,
            "then": "3 produce requests fail with NOT_LEADER_OR_FOLLOWER (retriable)",
        }

    def _close_writers(self) -> None:
        """Online producers close gracefully: a final EndOfSegment in every partition they wrote."""
        self.clock.now = self.t_close
        for x, row in enumerate(self.writers):
            for w, writer in enumerate(row):
                for rec in writer.close():
                    self._produce_rt(x, w, rec.partition, rec)

    def _final_heartbeats(self) -> None:
        self._grid_heartbeats(self.t_final_hb)

    def _close_leaders(self) -> None:
        for w in self.workers:
            w.send("close_leaders", self.t_done)

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
        for timer in self.timers:
            timer.join()
        cfg = self.cfg
        self.ends = {
            x: {
                (cfg.rt_topic, q): self.producers[x].next_offset(cfg.rt_topic, q)
                for q in range(cfg.partitions)
            }
            for x in range(cfg.regions)
        }
        for rep in reports:
            for q, end in rep["vt_ends"].items():
                self.ends[rep["region"]][(cfg.vt_topic, int(q))] = end
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
        cfg, s = self.cfg, self.schedule
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
        nominal = s.nominal_end_ms - s.start_ms
        truth = {
            "run": {
                "seed": cfg.seed,
                "store": cfg.store,
                "version": cfg.version,
                "regions": cfg.regions,
                "partitions": cfg.partitions,
                "records": cfg.records,
                "batch_records": cfg.batch_records,
                "keys": cfg.keys,
                "key_skew": cfg.key_skew,
                "delete_ratio": cfg.delete_ratio,
                "value_size": {"min": cfg.value_size_min, "max": cfg.value_size_max},
                "rt_topic": cfg.rt_topic,
                "vt_topic": cfg.vt_topic,
                "legacy_rmd": cfg.legacy_rmd,
                "start_ms": s.start_ms,
                "last_write_ms": s.end_ms,
                "end_ms": self.t_done,
                "heartbeat": {
                    "every_records": cfg.heartbeat_every_records,
                    "every_ms": cfg.heartbeat_every_ms,
                },
                "kafka": "embedded" if cfg.kafka is None else {str(k): v for k, v in cfg.kafka.items()},
                "eop_offsets": {str(q): o for q, o in self.eop_offsets.items()},
                "end_offsets": {
                    str(x): {f"{t}[{q}]": e for (t, q), e in sorted(ends.items())}
                    for x, ends in self.ends.items()
                },
            },
            "regions": [
                {
                    "region": x,
                    "write_rate_per_s": cfg.rate(x),
                    "writes": int((s.region == x).sum()),
                    "quiet_periods": [
                        {
                            "from": q.start,
                            "to": q.end,
                            "partitions": None if q.partitions is None else list(q.partitions),
                            "from_ms": s.start_ms + int(q.start * nominal),
                            "to_ms": s.start_ms + int(q.end * nominal),
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
            "faults": [f.to_json() for f in self.plan.faults],
        }
        path = self.out / "truth.json"
        atomic_write(path, (json.dumps(truth, indent=2) + "\n").encode())
        return str(path)

    def _summary(self, complete: dict, reports: list[dict]) -> dict:
        cfg = self.cfg
        elapsed = time.monotonic() - self.t_wall0
        topics: dict[str, Any] = {}
        total = 0
        for x in range(cfg.regions):
            per = {}
            for topic in (cfg.rt_topic, cfg.vt_topic):
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
            "records": cfg.records,
            "legacy_rmd": cfg.legacy_rmd,
            "workers": cfg.workers,
            "topics": topics,
            "vt_records_per_region": {x: topics[x][cfg.vt_topic]["records"] for x in topics},
            "records_per_s": round(total / max(elapsed, 1e-9)),
            "faults_injected": self.plan.injected(),
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
                for f in self.plan.faults
            ],
            "leaders": leaders,
            "followers": followers,
            "metadata_bytes": meta.as_dict(),
            "archive": complete,
            "archives": {str(x): str(self.out / "archive" / f"dc-{x}") for x in range(cfg.regions)},
            "truth": str(self.out / "truth.json"),
            "timings": {k: round(v, 3) for k, v in sorted(self.timings.items())},
        }

    def _report_progress(self, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if not force and now - self.last_progress < 2.0:
            return
        self.last_progress = now
        cfg, s = self.cfg, self.schedule
        elapsed = max(now - self.t_wall0, 1e-9)
        pct = 100.0 * self.write_ptr / max(1, len(s))
        rt = sum(sum(p.ends().values()) for p in self.producers)
        vt = [self.worker_progress.get(x, {}).get("vt_records", 0) for x in range(cfg.regions)]
        total = rt + sum(vt)
        self.progress(
            f"[simulate] {pct:5.1f}% of writes | sim t+{(self.clock.now - cfg.start_ms) / 1000:.1f}s | "
            f"RT {rt:,} | VT "
            + " ".join(f"dc-{x}:{v:,}" for x, v in enumerate(vt))
            + f" | {total / elapsed:,.0f} records/s | {elapsed:.0f}s"
        )

    def close(self) -> None:
        for timer in self.timers:
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
        for region in self.regions:
            try:
                if region.embedded is not None:
                    region.embedded.broker_up(1)
                region.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("closing region %d: %s", region.region, exc)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("tidegauge")
    except Exception:  # noqa: BLE001
        return "unknown"


__all__ = ["SimResult", "SimulationError", "run", "seeded_guid"]
