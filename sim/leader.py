"""A region's partition leader: consume every region's RT partition, resolve conflicts, write the local VT.

Everything that must be right for readers to trust heartbeats is done by `heartbeat.HeartbeatLeader` (VT DIV,
leader footers, RT DIV per region, acknowledged watermarks, `hbw`/`hbd` heartbeats); this module decides *what*
to write and *when*:

* when: a record of RT[r] written at simulated time t is processed at t + lag(r → this region) (or when the
  region's isolation ends, for another region's record due while it is isolated); records of the N regions are
  merged in (arrival time, region, offset) order, so the outcome does not depend on Kafka timing.
* what: DCR (`sim.dcr`) picks winners; losers and DIV duplicates are dropped; the RMD payload carries the
  write's timestamp and, in legacy mode, Venice's per-key offset vector (`div.rmd.encode_value_level_rmd`).
* heartbeats: before handing an RT heartbeat to the library the leader flushes its producer, so every VT send
  before it is acknowledged and the watermark vector is exactly "everything processed so far" — deterministic,
  and never more than what Kafka has acknowledged (docs/design.md, rule 3).

Faults that act inside a leader (a write dropped or poisoned in this region) are looked up by the RT
coordinates of the record, so a successor after a failover repeats them instead of healing them.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from div import keys
from div.rmd import RMD_PROTOCOL_VERSION, encode_value_level_rmd
from div.validator import Finding
from heartbeat import HeartbeatLeader

from .cluster import RegionProducer, SimClock
from .dcr import ReplicaStore
from .traffic import poison

VALUE_SCHEMA_ID = 1


class RtBuffer:
    """RT records of one region's partition as consumed from Kafka, shared by every region's leader of that
    partition (one consumption, many readers). Offsets are contiguous from `base`; timestamps (the simulated
    write time) never decrease."""

    __slots__ = ("base", "ts", "keys", "values", "headers")

    def __init__(self) -> None:
        self.base = 0
        self.ts: list[int] = []
        self.keys: list[bytes] = []
        self.values: list[bytes] = []
        self.headers: list = []

    @property
    def end(self) -> int:
        return self.base + len(self.ts)

    def extend(self, msgs: list) -> None:
        self.ts.extend(m.timestamp()[1] for m in msgs)
        self.keys.extend(m.key() for m in msgs)
        self.values.extend(m.value() for m in msgs)
        self.headers.extend(m.headers() for m in msgs)

    def restamp(self, start: int, ts: int) -> None:
        """Records from offset `start` on count as written at simulated time `ts`: writes another producer made
        during a repair window carry its wall-clock time, which means nothing on the simulated clock."""
        i = max(0, start - self.base)
        self.ts[i:] = [ts] * (len(self.ts) - i)

    def trim(self, upto: int) -> None:
        """Forget records below offset `upto` (every leader has processed them)."""
        n = upto - self.base
        if n > 0:
            del self.ts[:n], self.keys[:n], self.values[:n], self.headers[:n]
            self.base = upto


@dataclass
class LeaderFaults:
    """Leader-side faults of one region's partition: RT coordinates (source region, offset) of writes it must
    drop or poison, and of writes whose VT offsets the truth file wants (reported through `on_watch`).
    They belong to the partition, not to a leader, so a successor after a failover repeats them."""

    drop: set[tuple[int, int]] = field(default_factory=set)
    poison: set[tuple[int, int]] = field(default_factory=set)
    watch: set[tuple[int, int]] = field(default_factory=set)
    # Isolations of the region: [start, end) in simulated ms (end None: not over yet). A record of another
    # region's RT that would arrive inside one arrives at its end instead.
    isolated: list[list[int | None]] = field(default_factory=list)

    def arrival(self, t: int) -> int:
        """When a record of another region's RT due at `t` is processed (isolations delay it)."""
        for start, end in self.isolated:
            if start <= t and (end is None or t < end):
                return _NEVER if end is None else end
        return t

    def cut(self, t_end: int) -> int:
        """Records of another region's RT due before the returned time arrive before `t_end`: the ones due
        inside an isolation that is still going at `t_end` wait."""
        for start, end in self.isolated:
            if start < t_end and (end is None or end >= t_end):
                t_end = min(t_end, start)
        return t_end


_NEVER = 1 << 62


@dataclass
class LeaderStats:
    rt_records: int = 0
    vt_writes: int = 0
    dcr_losers: int = 0
    div_duplicates: int = 0
    dropped_by_fault: int = 0
    poisoned_by_fault: int = 0
    heartbeats: int = 0
    reapplied: int = 0  # writes a successor applied again after a failover
    redelivered: int = 0  # VT records written twice (redelivery faults)


class SimLeader:
    """Leader of VT partition `partition` of region `region` for one term."""

    def __init__(
        self,
        *,
        region: int,
        partition: int,
        term: int,
        host: str,
        n_regions: int,
        vt_topic: str,
        rt_topic: str,
        lags: list[int],
        producer: RegionProducer,
        clock: SimClock,
        store: ReplicaStore,
        faults: LeaderFaults,
        guid: bytes,
        segment_max_age_ms: int,
        on_watch: Callable[[int, int, int, int], None] | None = None,
        applied: list[list[int]] | None = None,
        redeliver: list[list[int]] | None = None,
        on_redeliver: Callable[[int, int, int, int, int, int], None] | None = None,
    ) -> None:
        self.region = region
        self.partition = partition
        self.term = term
        self.n_regions = n_regions
        self.host = host
        self.on_watch = on_watch
        self.vt_topic = vt_topic
        # per source region, the RT positions of the writes this partition's leaders wrote to the VT (shared by
        # the terms of one version: truth.json's `changes`)
        self.applied = applied if applied is not None else [[] for _ in range(n_regions)]
        # [fault id, time]: VT records to write twice (a producer retry after a lost acknowledgement), the first
        # write at or after the time; shared by the terms of one version, so a successor does what is left
        self.redeliver = redeliver if redeliver is not None else []
        self.on_redeliver = on_redeliver
        self.lags = lags
        self.producer = producer
        self.clock = clock
        self.store = store
        self.faults = faults
        self.hl = HeartbeatLeader(
            producer,
            vt_topic=vt_topic,
            rt_topic=rt_topic,
            partition=partition,
            region=region,
            n_regions=n_regions,
            host=self.host,
            term_id=term,
            interval_ms=0,
            clock=clock,
            guid=guid,
            max_segment_age_ms=segment_max_age_ms,
        )
        self.cursor = [0] * n_regions  # next offset of each region's shared RT buffer to process
        self.backlog: list[list[tuple]] = [[] for _ in range(n_regions)]  # re-read at takeover
        # a new version's replay from its rewind point: events (arrival, region, offset, key, value, headers, ts)
        # in the order its leader catches up, processed first
        self.catchup: list[tuple] = []
        self.reprocess_below = [0] * n_regions  # RT offsets a predecessor already handled
        self.resume_ms = 0
        self.reapplied_offsets: list[int] = []  # VT offsets of the writes a successor applied again
        self.alive = True
        self.stats = LeaderStats()
        self.findings: list[tuple[int, Finding]] = []  # (source region, finding)
        self.finding_counts: Counter = Counter()

    def events_until(self, t_end: int, buffers: list[RtBuffer]) -> list[tuple]:
        """RT records whose arrival time is before `t_end`, in processing order:
        (arrival, region, offset, key, value, headers, write ts)."""
        events: list[tuple] = self.catchup
        self.catchup = []
        faults = self.faults
        for r in range(self.n_regions):
            lag = self.lags[r]
            # Arrival times never decrease along an RT (an isolation holds records back to its end), so the
            # records that arrive before t_end are a prefix of what is buffered.
            isolated = bool(faults.isolated) and r != self.region
            if self.backlog[r]:
                events.extend(
                    (faults.arrival(ts + lag) if isolated else ts + lag, r, off, k, v, h, ts)
                    for off, k, v, h, ts in self.backlog[r]
                )
                self.backlog[r] = []
            buf = buffers[r]
            i = self.cursor[r] - buf.base
            if i < 0:
                raise RuntimeError(
                    f"leader {self.host}: RT buffer of region {r} was trimmed past its position "
                    f"{self.cursor[r]} (base {buf.base})"
                )
            j = bisect.bisect_left(buf.ts, (faults.cut(t_end) if isolated else t_end) - lag, lo=i)
            if j > i:
                base = buf.base
                ts = buf.ts[i:j]
                events.extend(
                    zip(
                        [faults.arrival(t + lag) for t in ts] if isolated else [t + lag for t in ts],
                        [r] * (j - i),
                        range(base + i, base + j),
                        buf.keys[i:j],
                        buf.values[i:j],
                        buf.headers[i:j],
                        ts,
                        strict=True,
                    )
                )
                self.cursor[r] = base + j
        events.sort(key=_order)
        return events

    def process(self, events: list[tuple]) -> None:
        """Handle RT records in order: DIV, DCR, VT writes, heartbeats."""
        hl = self.hl
        clock = self.clock
        store = self.store
        stats = self.stats
        drop, poison_set, watch = self.faults.drop, self.faults.poison, self.faults.watch
        producer = self.producer
        hb_key = keys.HEARTBEAT_KEY
        resume = self.resume_ms
        reprocess_below = self.reprocess_below
        on_rt_record, put, delete, done = hl.on_rt_record, hl.put, hl.delete, hl.done
        applied, values, redeliver = self.applied, store.values, self.redeliver
        for arrival, r, off, key, value, headers, ts in events:
            clock.now = arrival if arrival > resume else resume
            stats.rt_records += 1
            if key == hb_key:
                hl.flush()  # every VT send so far acknowledged: the vector is exactly what was processed
                rec = on_rt_record(r, off, key, value, headers, ts)
                if rec.is_heartbeat:
                    if hl.pending_heartbeats:
                        raise RuntimeError(
                            f"leader {self.host}: VT heartbeat for RT[{r}] offset {off} is still "
                            f"waiting for acknowledgements after a flush"
                        )
                    stats.heartbeats += 1
                    continue
            else:
                rec = on_rt_record(r, off, key, value, headers, ts)
            if rec.findings:
                for f in rec.findings:
                    self.findings.append((r, f))
                    self.finding_counts[(r, f.type)] += 1
            if rec.is_data:
                if rec.is_duplicate:
                    stats.div_duplicates += 1
                elif (r, off) in drop:
                    stats.dropped_by_fault += 1
                else:
                    env = rec.env
                    pm = env["producerMetadata"]
                    lts = pm["logicalTimestamp"]
                    wts = lts if lts >= 0 else pm["messageTimestamp"]
                    body = env["payloadUnion"][1]
                    rt_value = body["putValue"] if rec.kind == "PUT" else None
                    # a poisoned write is compared as the RT write it is, but what the replica stores (and a
                    # later tie compares with) is the poisoned value
                    bad = poison(rt_value) if rt_value is not None and (r, off) in poison_set else None
                    vector = store.resolve(rec.key, wts, r, off, rt_value, bad)
                    if vector is None:
                        stats.dcr_losers += 1
                    else:
                        rmd = encode_value_level_rmd(wts, vector) if vector else _empty_rmd(wts)
                        if rec.kind == "PUT":
                            v = rt_value
                            if bad is not None:
                                v = bad
                                stats.poisoned_by_fault += 1
                            put(
                                rec.key, v, VALUE_SCHEMA_ID, rmd_version=RMD_PROTOCOL_VERSION, rmd_payload=rmd
                            )
                        else:
                            v = None
                            delete(
                                rec.key, VALUE_SCHEMA_ID, rmd_version=RMD_PROTOCOL_VERSION, rmd_payload=rmd
                            )
                        stats.vt_writes += 1
                        applied[r].append(off)
                        if values is not None:
                            values[rec.key] = v
                        if off < reprocess_below[r]:
                            stats.reapplied += 1
                            self.reapplied_offsets.append(producer.last_offset)
                        if watch and (r, off) in watch and self.on_watch is not None:
                            self.on_watch(self.partition, r, off, producer.last_offset)
                        if redeliver and redeliver[0][1] <= clock.now:
                            self._redeliver(r, off)
            done()

    def _redeliver(self, r: int, off: int) -> None:
        """Write the VT record just written once more, byte for byte (same key, value, headers, producer segment
        and sequence, footer coordinate): a producer retry after a lost acknowledgement."""
        fault_id, _ = self.redeliver.pop(0)
        producer = self.producer
        first = producer.last_offset
        topic, value, key, partition, headers = producer.last_record
        producer.produce(topic, value, key, partition, headers)
        self.stats.redelivered += 1
        if self.on_redeliver is not None:
            self.on_redeliver(fault_id, self.partition, r, off, first, producer.last_offset)


def _order(e: tuple) -> tuple:
    return e[0], e[1], e[2]


_EMPTY_RMD_CACHE: dict[int, bytes] = {}


def _empty_rmd(ts: int) -> bytes:
    """`encode_value_level_rmd(ts, [])`, memoised for the last timestamps (writes often share a millisecond)."""
    b = _EMPTY_RMD_CACHE.get(ts)
    if b is None:
        if len(_EMPTY_RMD_CACHE) > 4096:
            _EMPTY_RMD_CACHE.clear()
        b = _EMPTY_RMD_CACHE[ts] = encode_value_level_rmd(ts, [])
    return b
