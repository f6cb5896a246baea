"""Everything one region runs: its partition leaders, its followers, its VT producer, readers of every region's
RT, and its archive — in its own process, so that the regions of a run use every core.

The coordinator (`sim.runner`) produces the online traffic and the RT heartbeats, then tells each region's
worker to advance to the end of a step. A worker then:

1. flushes its VT producer and reads its own cluster (its RT and VT: archived, VT records to its followers)
   and every other region's RT up to the offsets the coordinator handed out;
2. lets each of its leaders process the RT records that arrive before the step's end (write time + lag);
3. replies with its counters.

Commands run in order; the coordinator may send the next step's command before the reply to the previous one
arrives (it bounds how far it runs ahead). `InlineWorker` runs the same object in the calling process, which is
what tests use to look inside and what `workers: inline` selects.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import signal
import traceback
from dataclasses import asdict, dataclass
from typing import Any

from div.checkpoint import CheckpointStore
from div.kafka_log import iter_partition as kafka_iter_partition
from div.writer import deterministic_guid
from heartbeat import decode_hbd, decode_hbw

from .cluster import Reader, RegionProducer, SimClock
from .config import SimConfig
from .dcr import ReplicaStore
from .follower import Follower
from .leader import LeaderFaults, RtBuffer, SimLeader

log = logging.getLogger(__name__)


class WorkerError(RuntimeError):
    """A region worker failed; the message carries its traceback."""


@dataclass
class WorkerSpec:
    """What a region worker needs to start (picklable: it crosses a process boundary)."""

    cfg: SimConfig
    region: int
    bootstraps: dict[int, str]
    confs: dict[int, dict[str, Any]]
    archive_dir: str
    followers_dir: str
    push_records: list[tuple[bytes, bytes, list | None, int]]  # (key, value, headers, partition)
    push_ms: int


def leader_host(region: int, partition: int, term: int) -> str:
    """Writer id of a leader (footers, heartbeats); the coordinator names RT heartbeats with it too."""
    return f"dc{region}-p{partition}-leader-t{term}"


def seeded_guid(seed: int, *parts: int) -> bytes:
    """A producer GUID derived from the seed (Venice's deterministic GUID layout)."""
    h = hashlib.sha256(repr((seed,) + parts).encode()).digest()
    return deterministic_guid(int.from_bytes(h[:8], "big"), int.from_bytes(h[8:16], "big"))


class RegionWorker:
    """Leaders, followers, VT producer, RT readers and archive of one region."""

    def __init__(self, spec: WorkerSpec) -> None:
        cfg = spec.cfg
        self.spec = spec
        self.cfg = cfg
        self.x = x = spec.region
        self.clock = SimClock(spec.push_ms)
        n, p = cfg.regions, cfg.partitions
        self.producer = RegionProducer(spec.bootstraps[x], spec.confs[x], self.clock)
        self.rt_buffers = [[RtBuffer() for _ in range(p)] for _ in range(n)]
        store = CheckpointStore(spec.followers_dir)
        self.followers = [
            Follower(x, q, cfg.vt_topic, store, cfg.follower_checkpoint_every, self.clock) for q in range(p)
        ]
        self.readers: list[Reader] = []
        for r in range(n):
            parts = [(cfg.rt_topic, q) for q in range(p)]
            if r == x:
                parts += [(cfg.vt_topic, q) for q in range(p)]
            self.readers.append(
                Reader(
                    f"region {x} reading region {r}",
                    spec.bootstraps[r],
                    spec.confs[r],
                    parts,
                    self._handler(r),
                    spec.archive_dir if r == x else None,
                )
            )
        self.stores = [ReplicaStore(cfg.legacy_rmd) for _ in range(p)]
        self.faults = [LeaderFaults() for _ in range(p)]
        self.watched: dict[
            tuple[int, int, int], list[int]
        ] = {}  # (partition, region, rt offset) -> VT offsets
        self.retired: list[SimLeader] = []
        self.failovers: dict[int, dict] = {}
        self._successors: dict[int, SimLeader] = {}
        self._push(spec.push_records)
        # First leaders start after End of Push with the VT DIV state a follower holds there (the push job's
        # producer), so that their heartbeats' hbd.vtProducerStates is the complete state before each heartbeat.
        self.leaders = [self._make_leader(q, 1) for q in range(p)]
        for q, leader in enumerate(self.leaders):
            leader.hl.take_over(self.followers[q].validator.producer_states())

    def _handler(self, r: int):
        rt_topic = self.cfg.rt_topic
        buffers = self.rt_buffers[r]
        followers = self.followers

        def handle(topic: str, partition: int, msgs: list) -> None:
            if topic == rt_topic:
                buffers[partition].extend(msgs)
            else:
                followers[partition].consume(msgs)

        return handle

    def _make_leader(self, q: int, term: int) -> SimLeader:
        cfg, x = self.cfg, self.x
        return SimLeader(
            region=x,
            partition=q,
            term=term,
            host=leader_host(x, q, term),
            n_regions=cfg.regions,
            vt_topic=cfg.vt_topic,
            rt_topic=cfg.rt_topic,
            lags=[cfg.lag(r, x) for r in range(cfg.regions)],
            producer=self.producer,
            clock=self.clock,
            store=self.stores[q],
            faults=self.faults[q],
            guid=seeded_guid(cfg.seed, 2, x, q, term),
            segment_max_age_ms=cfg.segment_max_age_ms,
            on_watch=self._on_watch,
        )

    def _on_watch(self, partition: int, r: int, rt_offset: int, vt_offset: int) -> None:
        self.watched.setdefault((partition, r, rt_offset), []).append(vt_offset)

    def _push(self, records: list) -> None:
        """The push job's records, identical in every region, written before any leader writes."""
        self.clock.now = self.spec.push_ms
        for key, value, headers, q in records:
            self.producer.produce(self.cfg.vt_topic, value, key, q, headers)
        self.eop_offsets = {
            q: self.producer.next_offset(self.cfg.vt_topic, q) - 2 for q in range(self.cfg.partitions)
        }
        self._sync()

    # -- commands --------------------------------------------------------------------------------------
    def step(self, t1: int, rt_ends: dict[int, dict[int, int]], faults: list[tuple]) -> dict:
        """Read everything up to `rt_ends`, then lead until simulated time `t1`."""
        for kind, q, r, off in faults:
            lf = self.faults[q]
            if kind == "dropped":
                lf.drop.add((r, off))
            elif kind == "poisoned":
                lf.poison.add((r, off))
            else:
                lf.watch.add((r, off))
        self._sync(rt_ends)
        cfg = self.cfg
        for q, leader in enumerate(self.leaders):
            if not leader.alive:
                continue
            buffers = [self.rt_buffers[r][q] for r in range(cfg.regions)]
            leader.process(leader.events_until(t1, buffers))
            for r in range(cfg.regions):
                if leader.cursor[r] - buffers[r].base > 20_000:
                    buffers[r].trim(leader.cursor[r])
        return self.progress()

    def _sync(self, rt_ends: dict[int, dict[int, int]] | None = None) -> None:
        """Flush the VT producer; read every RT up to `rt_ends` and the own VT up to what was produced."""
        cfg, x = self.cfg, self.x
        left = self.producer.flush(300)
        if left:
            raise WorkerError(f"region {x}: {left} VT records not delivered after 300 s")
        for r, reader in enumerate(self.readers):
            ends = {(cfg.rt_topic, q): e for q, e in (rt_ends or {}).get(r, {}).items()}
            if r == x:
                ends.update(
                    {
                        (cfg.vt_topic, q): self.producer.next_offset(cfg.vt_topic, q)
                        for q in range(cfg.partitions)
                    }
                )
            if ends:
                reader.drain(ends)

    def isolate(self, t: int) -> None:
        """The region stops replicating at simulated time `t`: its leaders leave the other regions' RTs unread
        until `reconnect`."""
        for lf in self.faults:
            lf.isolated.append([t, None])

    def reconnect(self, t: int) -> None:
        """The isolation ends at `t`: what the other regions wrote meanwhile arrives then, in order."""
        for lf in self.faults:
            if lf.isolated and lf.isolated[-1][1] is None:
                lf.isolated[-1][1] = t

    def fail(self, fault_id: int, q: int, t: int) -> None:
        """The leader of partition q stops (a crash: no final EndOfSegment)."""
        leader = self.leaders[q]
        leader.alive = False
        self.failovers[fault_id] = {
            "old_leader": {"host": leader.host, "guid": leader.hl.guid.hex(), "term": leader.term},
            "failed_at_ms": t,
            "old_leader_rt_positions": list(leader.cursor),
        }

    def take_over(self, fault_id: int, q: int, t: int) -> None:
        """A follower becomes leader: state from the last VT heartbeat it consumed, RT re-read from Kafka."""
        cfg = self.cfg
        self._sync()  # the follower has consumed the whole VT
        old = self.leaders[q]
        fol = self.followers[q]
        marks = [-1] * cfg.regions
        rt_states: dict[int, dict] = {}
        hb_offset = None
        term = old.term + 1
        if fol.last_heartbeat is not None:
            hb_offset, headers = fol.last_heartbeat
            hdr = dict(headers or [])
            hbw = decode_hbw(hdr["hbw"])
            marks = list(hbw.high_watermarks)
            rt_states = decode_hbd(hdr["hbd"]).rt_producers
            if hbw.term_id + 1 > term:
                raise WorkerError(
                    f"region {self.x} partition {q}: the last VT heartbeat has term {hbw.term_id}, "
                    f"newer than the failed leader's {old.term}"
                )
        new = self._make_leader(q, term)
        self.clock.now = t
        new.hl.take_over(fol.validator.producer_states(), rt_states, marks)
        for r in range(cfg.regions):
            new.backlog[r] = self._reread_rt(r, q, marks[r] + 1, old.cursor[r])
        new.cursor = list(old.cursor)
        new.reprocess_below = list(old.cursor)
        new.resume_ms = t
        self.retired.append(old)
        self.leaders[q] = new
        self.failovers[fault_id].update(
            {
                "new_leader": {"host": new.host, "guid": new.hl.guid.hex(), "term": term},
                "takeover_at_ms": t,
                "resumed_from_vt_heartbeat_offset": hb_offset,
                "resume_rt_positions": [m + 1 for m in marks],
                "first_vt_offset_of_new_term": self.producer.next_offset(cfg.vt_topic, q),
            }
        )
        self._successors[fault_id] = new

    def _reread_rt(self, r: int, q: int, start: int, end: int) -> list[tuple]:
        """RT[r] partition q, offsets [start, end), read back from Kafka (a new leader's catch-up)."""
        if start >= end:
            return []
        out: list[tuple] = []
        reader = self.readers[r]
        for batch in kafka_iter_partition(
            reader.bootstrap, self.spec.confs[r], self.cfg.rt_topic, q, start, end
        ):
            cols = batch.to_pydict()
            stamps = batch.column("timestamp").cast("int64").to_pylist()
            for off, k, v, h, ts in zip(
                cols["offset"], cols["key"], cols["value"], cols["headers"], stamps, strict=True
            ):
                out.append((off, k, v, [(e["key"], e["value"]) for e in h] if h else None, ts // 1000))
        if len(out) != end - start or out[0][0] != start:
            raise WorkerError(
                f"region {self.x} takeover of partition {q}: RT[{r}] offsets {start}..{end - 1} are "
                f"no longer all in the cluster (read {len(out)}); heartbeat more often"
            )
        return out

    def close_leaders(self, t: int) -> None:
        """Leaders step down gracefully: a final EndOfSegment in the VT, everything acknowledged."""
        self.clock.now = t
        for leader in self.leaders:
            if leader.alive:
                left = leader.hl.close()
                if left:
                    raise WorkerError(f"leader {leader.host}: {left} VT records not delivered")

    def progress(self) -> dict:
        return {
            "vt_records": sum(self.producer.ends().values()),
            "rt_read": sum(r.records for r in self.readers),
        }

    def finish(self) -> dict:
        """Read the rest, checkpoint the followers, close the archive; report what the coordinator needs."""
        self._sync()
        for fol in self.followers:
            fol.checkpoint()
        for reader in self.readers:
            reader.close()
        cfg = self.cfg
        for fid, new in self._successors.items():
            self.failovers[fid]["reapplied_vt_records"] = new.stats.reapplied
        leaders = []
        for leader in self.leaders + self.retired:
            leaders.append(
                {
                    "partition": leader.partition,
                    "term": leader.term,
                    "host": leader.host,
                    "stats": asdict(leader.stats),
                    "rt_heartbeats_seen": leader.stats.heartbeats,
                    "findings": [(r, f.offset, f.type, f.fatal, f.detail) for r, f in leader.findings],
                }
            )
        followers = []
        for fol in self.followers:
            followers.append(
                {
                    "partition": fol.partition,
                    "counts": dict(fol.counts),
                    "meta": asdict(fol.meta),
                    "checkpoints": fol.checkpoints,
                    "findings": [(f.offset, f.type, f.fatal, f.detail) for f in fol.findings],
                }
            )
        return {
            "region": self.x,
            "vt_ends": {q: self.producer.next_offset(cfg.vt_topic, q) for q in range(cfg.partitions)},
            "eop_offsets": self.eop_offsets,
            "leaders": leaders,
            "followers": followers,
            "watched": {f"{q}:{r}:{o}": offs for (q, r, o), offs in self.watched.items()},
            "failovers": self.failovers,
        }

    def close(self) -> None:
        for reader in self.readers:
            try:
                reader.close()
            except Exception as exc:  # noqa: BLE001 - closing must not hide the run's own error
                log.warning("region %d: closing a reader: %s", self.x, exc)
        try:
            self.producer.flush(10)
        except Exception:  # noqa: BLE001
            pass


# ---------------------------------------------------------------------------------------------- transports
class InlineWorker:
    """A RegionWorker in the calling process (tests, debugging, `workers: inline`)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.worker = RegionWorker(spec)
        self._replies: list[Any] = []

    def send(self, cmd: str, *args: Any) -> None:
        self._replies.append(getattr(self.worker, cmd)(*args))

    def outstanding(self) -> int:
        return len(self._replies)

    def recv(self) -> Any:
        return self._replies.pop(0)

    def call(self, cmd: str, *args: Any) -> Any:
        self.send(cmd, *args)
        return self.recv()

    def close(self) -> None:
        self.worker.close()


class ProcessWorker:
    """A RegionWorker in a child process (spawned: no librdkafka state is inherited). Commands are pipelined;
    replies come back in order."""

    def __init__(self, spec: WorkerSpec) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child,), name=f"tidegauge-sim-dc{spec.region}", daemon=True
        )
        # born with SIGINT blocked (the mask is inherited): a Ctrl-C while the worker still imports, before
        # `_serve` ignores it, would otherwise end it with a KeyboardInterrupt traceback of its own. This thread
        # gets a Ctrl-C that arrives meanwhile as soon as the mask is restored.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self._proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        child.close()
        self._pending = 0
        self.region = spec.region
        self.send("__init__", spec)

    def send(self, cmd: str, *args: Any) -> None:
        try:
            self._conn.send((cmd, args))
        except (BrokenPipeError, ConnectionResetError):
            while self._pending:  # the worker stopped: its last reply says why
                self.recv()
            raise WorkerError(
                f"region {self.region} worker is gone (exit code {self._proc.exitcode})"
            ) from None
        self._pending += 1

    def outstanding(self) -> int:
        return self._pending

    def recv(self) -> Any:
        try:
            status, payload = self._conn.recv()
        except EOFError:
            raise WorkerError(f"region {self.region} worker died (exit code {self._proc.exitcode})") from None
        self._pending -= 1
        if status == "error":
            raise WorkerError(f"region {self.region} worker failed:\n{payload}")
        return payload

    def call(self, cmd: str, *args: Any) -> Any:
        self.send(cmd, *args)
        while self._pending > 1:
            self.recv()
        return self.recv()

    def close(self) -> None:
        try:
            if self._proc.is_alive():
                self._conn.send(("__exit__", ()))
                self._proc.join(30)
        except (BrokenPipeError, OSError):
            pass
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._conn.close()


def _serve(conn) -> None:
    # Ctrl-C reaches every process of the terminal's group: the coordinator alone decides how to stop (a
    # live run stops cleanly through its workers), and tells them. (Ignoring it also drops one that arrived while
    # the worker started, blocked until now.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    worker: RegionWorker | None = None
    try:
        while True:
            cmd, args = conn.recv()
            if cmd == "__exit__":
                break
            try:
                if cmd == "__init__":
                    worker = RegionWorker(*args)
                    reply: Any = None
                else:
                    reply = getattr(worker, cmd)(*args)
            except BaseException:  # noqa: BLE001 - every failure goes back to the coordinator
                conn.send(("error", traceback.format_exc()))
                break
            conn.send(("ok", reply))
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        if worker is not None:
            worker.close()
        conn.close()


__all__ = [
    "InlineWorker",
    "ProcessWorker",
    "RegionWorker",
    "WorkerError",
    "WorkerSpec",
    "leader_host",
    "seeded_guid",
]
