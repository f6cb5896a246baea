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

import bisect
import hashlib
import logging
import multiprocessing as mp
import signal
import traceback
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from div import envelope as E
from div import keys as K
from div.checkpoint import CheckpointStore
from div.kafka_log import iter_partition as kafka_iter_partition
from div.writer import SegmentWriter, deterministic_guid
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
    # a version swap: {"to_version", "topic", "rewind_from_ms"} (None: no swap in this run). A live run's swap is
    # placed once the clock runs: then "live" is true, "rewind_from_ms" None, and the topic is created, the RT records
    # kept (`swap_keep`) and the rewind point known at the re-push (`swap_snapshot`)
    swap: dict[str, Any] | None = None


def leader_host(region: int, partition: int, term: int, version: int | None = None) -> str:
    """Writer id of a leader (footers, heartbeats); the coordinator names RT heartbeats with it too. A version
    created by a swap names its leaders with it (`-v<N>`)."""
    return f"dc{region}-p{partition}-leader-t{term}" + ("" if version is None else f"-v{version}")


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
        self.checkpoints = store
        self.followers = [
            Follower(x, q, cfg.vt_topic, store, cfg.follower_checkpoint_every, self.clock) for q in range(p)
        ]
        self.swap = spec.swap
        self.version = cfg.version  # the version the leaders in self.leaders write
        self.vt_topic = cfg.vt_topic
        later = bool(spec.swap and spec.swap.get("live"))  # a live run's new VT exists from the re-push on
        self.vt_topics = [cfg.vt_topic] + ([spec.swap["topic"]] if spec.swap and not later else [])
        # the RT records from the swap's rewind time on are kept until its new leaders start (they replay them)
        self.keep_from_ts: int | None = spec.swap["rewind_from_ms"] if spec.swap else None
        self.next: dict[str, Any] | None = None  # the new version while both are written (swap_snapshot..end)
        self.next_followers: list[Follower] = []
        self.swap_report: dict[str, Any] = {}
        self.redeliveries: dict[int, dict] = {}
        self.readers: list[Reader] = []
        for r in range(n):
            parts = [(cfg.rt_topic, q) for q in range(p)]
            if r == x:
                parts += [(t, q) for t in self.vt_topics for q in range(p)]
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
        self.stores = [ReplicaStore(cfg.legacy_rmd, track_values=spec.swap is not None) for _ in range(p)]
        self.faults = [LeaderFaults() for _ in range(p)]
        # per version, partition and source region: RT positions written (truth.json `changes`)
        self.applied: dict[int, list[list[list[int]]]] = {
            cfg.version: [[[] for _ in range(n)] for _ in range(p)]
        }
        self.pending_redeliveries: dict[int, list[list[list[int]]]] = {cfg.version: [[] for _ in range(p)]}
        self.eop_by_version: dict[int, dict[int, int]] = {}
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
        first_vt = self.cfg.vt_topic

        def handle(topic: str, partition: int, msgs: list) -> None:
            if topic == rt_topic:
                buffers[partition].extend(msgs)
            elif topic == first_vt:
                self.first_followers[partition].consume(msgs)
            else:
                self.next_followers[partition].consume(msgs)

        self.first_followers = self.followers
        return handle

    def _make_leader(self, q: int, term: int, version: int | None = None, store: ReplicaStore | None = None):
        cfg, x = self.cfg, self.x
        version = self.version if version is None else version
        first = version == cfg.version
        return SimLeader(
            region=x,
            partition=q,
            term=term,
            host=leader_host(x, q, term, None if first else version),
            n_regions=cfg.regions,
            vt_topic=f"{cfg.store}_v{version}",
            rt_topic=cfg.rt_topic,
            lags=[cfg.lag(r, x) for r in range(cfg.regions)],
            producer=self.producer,
            clock=self.clock,
            store=self.stores[q] if store is None else store,
            faults=self.faults[q],
            guid=seeded_guid(cfg.seed, 2, x, q, term)
            if first
            else seeded_guid(cfg.seed, 2, x, q, term, version),
            segment_max_age_ms=cfg.segment_max_age_ms,
            on_watch=self._on_watch if first else None,  # dropped/poisoned VT offsets are version N's
            applied=self.applied[version][q],
            redeliver=self.pending_redeliveries[version][q],
            on_redeliver=self._on_redeliver,
        )

    def _on_redeliver(self, fault_id: int, q: int, r: int, rt_offset: int, first: int, copy: int) -> None:
        topic = self.producer.last_record[0]
        self.redeliveries[fault_id] = {
            "topic": topic,
            "partition": q,
            "coordinate": [r, rt_offset],
            "vt_offsets": [first, copy],
            "time_ms": self.clock.now,
        }

    def redeliver(self, fault_id: int, q: int, t: int) -> None:
        """The leader of partition q writes its first VT data record at or after `t` twice. A version being
        replayed (between a swap's End of Push and its VersionSwap) takes it: it is the newest."""
        version = self.next["version"] if self.next is not None and self.next["leaders"] else self.version
        self.pending_redeliveries[version][q].append([fault_id, t])

    def _on_watch(self, partition: int, r: int, rt_offset: int, vt_offset: int) -> None:
        self.watched.setdefault((partition, r, rt_offset), []).append(vt_offset)

    def _push(self, records: list) -> None:
        """The push job's records, identical in every region, written before any leader writes."""
        self.clock.now = self.spec.push_ms
        codec = E.EnvelopeCodec() if self.swap else None
        for key, value, headers, q in records:
            self.producer.produce(self.cfg.vt_topic, value, key, q, headers)
            if codec is not None and key[0] == K.HEADER_PUT_OR_DELETE:
                branch, body = codec.decode(value, headers)["payloadUnion"]
                if branch == E.PUT:
                    self.stores[q].values[key[1:]] = body["putValue"]
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
        replaying = self.next["leaders"] if self.next is not None else []
        for q, leader in enumerate(self.leaders):
            buffers = [self.rt_buffers[r][q] for r in range(cfg.regions)]
            both = [leader, replaying[q]] if replaying else [leader]
            for lead in both:
                if lead.alive:
                    lead.process(lead.events_until(t1, buffers))
            for r in range(cfg.regions):
                buf = buffers[r]
                upto = min(lead.cursor[r] for lead in both)
                if upto - buf.base > 20_000:
                    if self.keep_from_ts is not None:  # a swap's replay reads these again
                        upto = min(upto, buf.base + bisect.bisect_left(buf.ts, self.keep_from_ts))
                    buf.trim(upto)
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
                        (t, q): self.producer.next_offset(t, q)
                        for t in self.vt_topics
                        for q in range(cfg.partitions)
                    }
                )
            if ends:
                reader.drain(ends)

    def snapshot(self) -> dict:
        """Read the own VT up to what was produced and write every buffered archive record to its files (the
        archive then holds the run so far, for jobs run during a repair window)."""
        self._sync()
        for reader in self.readers:
            if reader.writer is not None:
                reader.writer.flush()
        return self.progress()

    def outside_writes(
        self, t: int, before: dict[int, dict[int, int]], ends: dict[int, dict[int, int]]
    ) -> dict:
        """Read the records another producer wrote to the RTs during a repair window (from `before` up to
        `ends`, per region and partition) and stamp them with simulated time `t`, the window's close: the
        leaders process them at the next step as written then."""
        self._sync(ends)
        for r, by_q in before.items():
            for q, start in by_q.items():
                self.rt_buffers[int(r)][int(q)].restamp(int(start), t)
        return self.progress()

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
            "version": self.version,
            "topic": self.vt_topic,
            "old_leader": {"host": leader.host, "guid": leader.hl.guid.hex(), "term": leader.term},
            "failed_at_ms": t,
            "old_leader_rt_positions": list(leader.cursor),
        }

    def take_over(self, fault_id: int, q: int, t: int) -> None:
        """A follower becomes leader: state from the last VT heartbeat it consumed, RT re-read from Kafka."""
        cfg = self.cfg
        if self.failovers[fault_id]["version"] != self.version:
            self.failovers[fault_id]["note"] = (
                "its version ended (VersionSwap) before the takeover: no successor"
            )
            return
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
                "first_vt_offset_of_new_term": self.producer.next_offset(self.vt_topic, q),
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

    # -- a version swap: a re-push of version N+1 while N goes on ---------------------------------------------
    def swap_state(self) -> dict[str, Any]:
        """This region's replica state now (values and DCR metadata per partition) and its leaders' RT positions:
        what a re-push whose source region this is snapshots."""
        return {
            "stores": [store.copy() for store in self.stores],
            "cursor": [list(lead.cursor) for lead in self.leaders],
        }

    def swap_keep(self, ts: int) -> None:
        """A live run's swap is coming: keep the RT records written from `ts` on (at or before its earliest possible
        rewind point) until its new leaders have replayed them."""
        self.keep_from_ts = ts

    def swap_snapshot(
        self, t: int, to_version: int, snapshot: dict[str, Any], plan: dict[str, Any] | None = None
    ) -> None:
        """The re-push job starts at `t`: in every partition StartOfPush, then the source region's value of every
        key it holds at `t` (`snapshot`, from `swap_state`: Puts and Deletes, no leader footer), with its replica
        state (values and DCR metadata: Venice re-pushes the RMD along). As in Venice, where a push reaches the other
        regions through native replication from one source region, every region gets the same bulk load. End of
        Push follows in `swap_start`. A live run's swap comes with its `plan` (topic, rewind point): the coordinator
        has just created the topic, and this region's reader starts archiving and following it."""
        cfg, x, p = self.cfg, self.x, self.cfg.partitions
        topic = f"{cfg.store}_v{to_version}"
        if plan is not None:
            self.swap = {**(self.swap or {}), **plan}
            if self.keep_from_ts is None or plan["rewind_from_ms"] < self.keep_from_ts:
                self.keep_from_ts = plan["rewind_from_ms"]
        if topic not in self.vt_topics:
            self.vt_topics.append(topic)
            self.readers[x].add_partitions([(topic, q) for q in range(p)])
        self._sync()
        self.clock.now = t
        push = SegmentWriter(
            seeded_guid(cfg.seed, 0, to_version, x),
            clock=self.clock,
            host_name=f"dc{x}-repush-v{to_version}",
            max_segment_age_ms=-1,
        )
        stores = [store.copy() for store in snapshot["stores"]]
        self.next_followers = [
            Follower(x, q, topic, self.checkpoints, cfg.follower_checkpoint_every, self.clock)
            for q in range(p)
        ]
        self.applied[to_version] = [[[] for _ in range(cfg.regions)] for _ in range(p)]
        self.pending_redeliveries[to_version] = [[] for _ in range(p)]
        bulk = [0] * p
        for q in range(p):
            recs = push.start_of_push(q)
            for key, value in sorted(stores[q].values.items()):
                recs.extend(push.put(q, key, value) if value is not None else push.delete(q, key))
                bulk[q] += 1
            for rec in recs:
                self.producer.produce(topic, rec.value, rec.key, q, list(rec.headers) or None)
        self.next = {
            "version": to_version,
            "topic": topic,
            "push": push,
            "stores": stores,
            "leaders": [],
            "snapshot_cursor": [list(c) for c in snapshot["cursor"]],
        }
        self.swap_report = {"bulk_records": bulk}

    def swap_start(self, t: int) -> dict[str, Any]:
        """End of Push at `t`, and the new version's leaders start: each replays every RT from the first record
        written at or after the rewind time (never later than where the snapshot stood), the
        backlog up to where the old leader stands now in an interleaving of its own (drawn from the seed; Venice's
        catch-up consumes the RTs side by side), then in step with the old one. They resolve conflicts against the
        carried-over state and heartbeat like any leader."""
        cfg, x, nxt = self.cfg, self.x, self.next
        topic, version = nxt["topic"], nxt["version"]
        self.clock.now = t
        push = nxt["push"]
        for q in range(cfg.partitions):
            for rec in push.end_of_push(q):
                self.producer.produce(topic, rec.value, rec.key, q, list(rec.headers) or None)
        eop = {q: self.producer.next_offset(topic, q) - 2 for q in range(cfg.partitions)}
        self.eop_by_version[version] = eop
        self._sync()  # the new version's followers have read its push
        rng = np.random.default_rng([cfg.seed, 7, x])
        rewind_from = self.swap["rewind_from_ms"]
        rewinds, leaders = {}, []
        for q, old in enumerate(self.leaders):
            lead = self._make_leader(q, 1, version, nxt["stores"][q])
            start = []
            merged: list[list[tuple]] = []
            for r in range(cfg.regions):
                buf = self.rt_buffers[r][q]
                first = buf.base + bisect.bisect_left(buf.ts, rewind_from)
                first = min(first, nxt["snapshot_cursor"][q][r])
                if first < buf.base:
                    raise WorkerError(
                        f"region {x}: RT[{r}] partition {q} was trimmed past the swap's rewind point"
                    )
                start.append(first)
                i, j = first - buf.base, old.cursor[r] - buf.base
                merged.append(
                    list(
                        zip(
                            range(first, old.cursor[r]),
                            buf.keys[i:j],
                            buf.values[i:j],
                            buf.headers[i:j],
                            buf.ts[i:j],
                            strict=True,
                        )
                    )
                )
            order = np.repeat(np.arange(cfg.regions), [len(m) for m in merged])
            rng.shuffle(order)
            taken = [0] * cfg.regions
            n = len(order)
            for k, r in enumerate(order.tolist()):
                off, key, value, headers, ts = merged[r][taken[r]]
                taken[r] += 1
                lead.catchup.append((k - n, r, off, key, value, headers, ts))  # before anything due
            lead.hl.take_over(self.next_followers[q].validator.producer_states(), {}, [s - 1 for s in start])
            lead.cursor = list(old.cursor)
            lead.resume_ms = t
            rewinds[q] = start
            leaders.append(lead)
        nxt["leaders"] = leaders
        self.keep_from_ts = None
        self.swap_report.update({"eop_offsets": eop, "rewind": rewinds})
        return {"eop_offsets": eop, "rewind": rewinds}

    def swap_end(self, t: int, to_version: int) -> dict[str, Any]:
        """Version N ends at `t`: each of its leaders writes a VersionSwap control message (old and new topic, its
        RT positions processed as localHighWatermarks) and steps down; from now on only the new version is
        written. Notes the last heartbeat vector before each VersionSwap (what a reader's marks reach there)."""
        nxt = self.next
        self._sync()
        self.clock.now = t
        vs_offsets: dict[int, int | None] = {}
        marks: dict[int, list[int] | None] = {}
        for q, old in enumerate(self.leaders):
            fol = self.followers[q]
            marks[q] = (
                None
                if fol.last_heartbeat is None
                else list(decode_hbw(dict(fol.last_heartbeat[1] or [])["hbw"]).high_watermarks)
            )
            if not old.alive:  # failed and not yet taken over: no leader to write it
                vs_offsets[q] = None
                continue
            old.hl.flush()
            body = {
                "oldServingVersionTopic": self.vt_topic,
                "newServingVersionTopic": nxt["topic"],
                "localHighWatermarks": [c - 1 for c in old.cursor],
                "localHighWatermarkPubSubPositions": [],
                "isRepush": True,
                "isLastVersionSwapMessageFromRealTimeTopic": False,
                "sourceRegion": f"dc-{self.x}",
                "destinationRegion": f"dc-{self.x}",
                "generationId": t,
            }
            for rec in old.hl.writer.control(q, E.VERSION_SWAP, body):
                self.producer.produce(self.vt_topic, rec.value, rec.key, q, list(rec.headers) or None)
            vs_offsets[q] = self.producer.last_offset
            left = old.hl.close()
            if left:
                raise WorkerError(f"leader {old.host}: {left} VT records not delivered")
            old.alive = False
            self.retired.append(old)
        self.swap_report.update({"version_swap_offsets": vs_offsets, "hbw_at_version_swap": marks})
        self.version, self.vt_topic = to_version, nxt["topic"]
        self.leaders, self.stores, self.followers = nxt["leaders"], nxt["stores"], self.next_followers
        self.next = None
        self._sync()
        return {"version_swap_offsets": vs_offsets, "hbw_at_version_swap": marks}

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
        every_follower = self.first_followers + (self.next_followers if self.swap else [])
        for fol in every_follower:
            fol.checkpoint()
        for reader in self.readers:
            reader.close()
        cfg = self.cfg
        for fid, new in self._successors.items():
            self.failovers[fid]["reapplied_vt_records"] = new.stats.reapplied
            self.failovers[fid]["reapplied_vt_offsets"] = new.reapplied_offsets
        leaders = []
        for leader in self.leaders + self.retired:
            leaders.append(
                {
                    "partition": leader.partition,
                    "term": leader.term,
                    "topic": leader.vt_topic,
                    "host": leader.host,
                    "stats": asdict(leader.stats),
                    "rt_heartbeats_seen": leader.stats.heartbeats,
                    "findings": [(r, f.offset, f.type, f.fatal, f.detail) for r, f in leader.findings],
                }
            )
        followers = []
        for fol in every_follower:
            followers.append(
                {
                    "topic": fol.topic,
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
            "vt_ends_by_topic": {
                t: {q: self.producer.next_offset(t, q) for q in range(cfg.partitions)} for t in self.vt_topics
            },
            "eop_offsets": self.eop_offsets,
            "eop_by_version": {cfg.version: self.eop_offsets, **self.eop_by_version},
            "applied": {
                v: {q: {r: sorted(set(pos)) for r, pos in enumerate(by_r)} for q, by_r in enumerate(parts)}
                for v, parts in self.applied.items()
            },
            "swap": self.swap_report,
            "redeliveries": self.redeliveries,
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
        """The reply to `cmd` (replies to earlier commands still waiting are dropped, as ProcessWorker.call does)."""
        self.send(cmd, *args)
        del self._replies[:-1]
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
