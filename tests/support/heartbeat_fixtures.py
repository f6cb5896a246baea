"""Helpers for the heartbeat tests: RT streams with known content, a leader loop, producers that record what
happened, and checks of the heartbeat invariant (docs/design.md, rules 3 and 4) on a VT read back."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from div import envelope as E
from div import keys
from div.validator import PartitionValidator
from div.writer import SegmentWriter
from heartbeat import HeartbeatLeader, RtRecord, parse_vt_heartbeat
from heartbeat.records import rt_heartbeat


@dataclass
class RtIn:
    """One RT record as a consumer hands it over."""

    offset: int
    key: bytes
    value: bytes
    headers: list
    broker_ts: int


def rt_streams(
    n_regions: int,
    records: int,
    seed: int,
    *,
    hb_every: int = 40,
    producers: int = 2,
    start_ms: int = 1_700_000_000_000,
    anomalies: bool = True,
) -> list[list[RtIn]]:
    """Per region an RT partition: `producers` online producers writing PUT/DELETE records in segments, and the
    region leader's RT heartbeats every ~`hb_every` records. With `anomalies`, region 1 (when present) holds one
    duplicate and one gap, so the RT DIV state goes through resyncs."""
    rng = random.Random(seed)
    streams = []
    for r in range(n_regions):
        clock = [start_ms + r]

        def tick(clock=clock) -> int:
            clock[0] += rng.randint(1, 5)
            return clock[0]

        writers = [
            SegmentWriter(bytes([r, i]) * 8, host_name=f"p{r}-{i}", clock=tick, max_segment_age_ms=-1)
            for i in range(producers)
        ]
        out: list[RtIn] = []

        def add(key, value, headers, ts, out=out):
            out.append(RtIn(len(out), key, value, list(headers), ts))

        for n in range(records):
            if n and n % hb_every == 0:
                ts = tick()
                hb = rt_heartbeat(f"leader-{r}:1", ts)
                add(hb.key, hb.value, hb.headers, ts + 1)
            w = rng.choice(writers)
            key = b"key-%d" % rng.randrange(records // 3 + 1)
            recs = w.delete(0, key) if rng.random() < 0.1 else w.put(0, key, b"v%d-%d" % (r, n))
            if rng.random() < 0.03:
                recs += w.end_segment(0, final=False)
            for rec in recs:
                add(rec.key, rec.value, rec.headers, clock[0])
        if anomalies and r == 1 and len(out) > 20:
            dup = out[10]
            out.insert(15, RtIn(0, dup.key, dup.value, dup.headers, dup.broker_ts))
            del out[25]  # a gap: the validator sees MISSING there
            for i, rec in enumerate(out):
                rec.offset = i
        streams.append(out)
    return streams


@dataclass
class LoopResult:
    steps: int = 0
    puts: int = 0
    deletes: int = 0
    dropped: int = 0
    positions: list[int] = field(default_factory=list)  # next index to feed, per region


def dcr_decision(rec: RtRecord, rng: random.Random) -> str:
    """A stand-in for conflict resolution: drop some records, write one or two VT records for others."""
    if not rec.is_data or rec.is_duplicate:
        return "none"
    x = rng.random()
    if x < 0.2:
        return "drop"
    return "put" if x < 0.85 else "put+delete"


def feed_one(leader: HeartbeatLeader, region: int, r: RtIn, rng: random.Random, result: LoopResult) -> None:
    rec = leader.on_rt_record(region, r.offset, r.key, r.value, r.headers, r.broker_ts)
    if rec.is_heartbeat:
        return
    decision = dcr_decision(rec, rng)
    if decision in ("put", "put+delete"):
        if rec.kind == "DELETE":
            leader.delete(rec.key)
            result.deletes += 1
        else:
            leader.put(rec.key, b"resolved:" + E.payload(rec.env)["putValue"], 1)
            result.puts += 1
        if decision == "put+delete":
            leader.delete(rec.key + b"-old")
            result.deletes += 1
    elif decision == "drop":
        result.dropped += 1
    leader.done()


def run_loop(
    leader: HeartbeatLeader,
    streams: list[list[RtIn]],
    rng: random.Random,
    *,
    steps: int | None = None,
    positions: list[int] | None = None,
    poll_every: int = 7,
    poll_timeout: float = 0,
    on_step=None,
) -> LoopResult:
    """Feed RT records of every region in a random interleaving (each region in order), polling now and then.
    `on_step(i)` runs before step i (to inject faults)."""
    result = LoopResult(positions=list(positions or [0] * len(streams)))
    total = sum(len(s) for s in streams) if steps is None else steps
    for i in range(total):
        live = [r for r in range(len(streams)) if result.positions[r] < len(streams[r])]
        if not live:
            break
        if on_step is not None:
            on_step(i)
        region = rng.choice(live)
        feed_one(leader, region, streams[region][result.positions[region]], rng, result)
        result.positions[region] += 1
        result.steps += 1
        if i % poll_every == 0:
            leader.poll(poll_timeout)
    return result


# -- producers -------------------------------------------------------------------------------------------
@dataclass
class FakeMessage:
    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: list
    timestamp_ms: int
    failed: bool = False


class FakeProducer:
    """An in-memory producer: offsets are assigned at produce time (one log per topic partition), delivery
    reports come on poll/flush — all of them, or with `shuffle` a random subset in random order, or none while
    `hold` is set. `fail_when(pred)` makes the next message matching pred fail (it leaves a hole in the log)."""

    def __init__(self, seed: int | None = None, clock=None) -> None:
        self.logs: dict[tuple[str, int], list[FakeMessage]] = {}
        self._pending: list[tuple] = []
        self.rng = random.Random(seed) if seed is not None else None
        self.hold = False
        self._fail_preds: list = []
        self.clock = clock or (lambda: 0)

    def produce(self, topic, value=None, key=None, partition=-1, headers=None, on_delivery=None, **_):
        log = self.logs.setdefault((topic, partition), [])
        msg = FakeMessage(topic, partition, len(log), key, value, list(headers or []), self.clock())
        log.append(msg)
        fail = False
        for pred in list(self._fail_preds):
            if pred(msg):
                self._fail_preds.remove(pred)
                fail = True
                break
        self._pending.append((on_delivery, msg, fail))

    def fail_when(self, pred) -> None:
        self._fail_preds.append(pred)

    def _deliver(self, batch) -> None:
        for cb, msg, fail in batch:
            if fail:
                msg.failed = True
            if cb is not None:
                cb("injected failure" if fail else None, msg)

    def poll(self, timeout: float = 0) -> int:
        if self.hold or not self._pending:
            return 0
        if self.rng is None:
            batch, self._pending = self._pending, []
        else:
            k = self.rng.randint(0, len(self._pending))
            idx = sorted(self.rng.sample(range(len(self._pending)), k))
            chosen = set(idx)
            batch = [self._pending[i] for i in idx]
            self._pending = [p for i, p in enumerate(self._pending) if i not in chosen]
            self.rng.shuffle(batch)
        self._deliver(batch)
        return len(batch)

    def flush(self, timeout: float = 0) -> int:
        if not self.hold:
            batch, self._pending = self._pending, []
            if self.rng is not None:
                self.rng.shuffle(batch)
            self._deliver(batch)
        return len(self._pending)

    def records(self, topic: str, partition: int = 0) -> list[tuple[int, bytes, bytes, list, int]]:
        """(offset, key, value, headers, timestamp) of the records in the log (failed sends are holes)."""
        return [
            (m.offset, m.key, m.value, m.headers, m.timestamp_ms)
            for m in self.logs.get((topic, partition), [])
            if not m.failed
        ]


class RecordingProducer:
    """Wraps a producer and logs, in order, every produce and every delivery report (for claim checks)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.events: list[tuple] = []  # ("produce", n, topic, key, value, headers) | ("report", n, ok)
        self._n = 0

    def produce(self, topic, value=None, key=None, partition=-1, headers=None, on_delivery=None, **kw):
        n = self._n

        def report(err, msg, n=n, cb=on_delivery):
            self.events.append(("report", n, err is None))
            if cb is not None:
                cb(err, msg)

        self.inner.produce(
            topic, value=value, key=key, partition=partition, headers=headers, on_delivery=report, **kw
        )
        self._n += 1  # only once produce() accepted it (BufferError leaves no trace)
        self.events.append(("produce", n, topic, key, value, list(headers or [])))

    def poll(self, timeout: float = 0):
        return self.inner.poll(timeout)

    def flush(self, timeout: float = 0):
        return self.inner.flush(timeout)


# -- checks ----------------------------------------------------------------------------------------------
_CODEC = E.EnvelopeCodec()


def check_claims_acked(events: list[tuple], vt_topic: str) -> int:
    """No heartbeat claims an unacknowledged offset: when a VT heartbeat with vector V was produced, every VT
    data record derived from RT[r] offset ≤ V[r] produced so far had been acknowledged, and none is produced
    later by the same leader. Returns the number of heartbeats checked."""
    data: list[tuple[int, int, int]] = []  # (n, region, rt offset)
    acked: set[int] = set()
    claimed: list[int] | None = None
    checked = 0
    for ev in events:
        if ev[0] == "report":
            if ev[2]:
                acked.add(ev[1])
            continue
        _, n, topic, key, value, headers = ev
        if topic != vt_topic:
            continue
        env = _CODEC.decode(value, headers)
        hb = parse_vt_heartbeat(key, env, headers)
        if hb is not None:
            if hb.watermarks is None:
                continue
            v = hb.watermarks.high_watermarks
            for dn, r, o in data:
                assert o > v[r] or dn in acked, (
                    f"heartbeat claims RT[{r}] offset {v[r]} but the VT send for RT offset {o} is not acked"
                )
            claimed = v if claimed is None else [max(a, b) for a, b in zip(claimed, v, strict=True)]
            checked += 1
        elif key[0] == keys.HEADER_PUT_OR_DELETE:
            f = E.footer(env)
            r, o = f["upstreamKafkaClusterId"], f["upstreamOffset"]
            assert claimed is None or o > claimed[r], (
                f"VT record for RT[{r}] offset {o} produced after a heartbeat claimed up to {claimed[r]}"
            )
            data.append((n, r, o))
    return checked


@dataclass
class VtRead:
    offset: int
    key: bytes
    env: dict
    headers: list
    timestamp_ms: int


def decode_vt(records) -> list[VtRead]:
    return [VtRead(o, k, _CODEC.decode(v, h), h, ts) for o, k, v, h, ts in records]


def check_invariant(vt: list[VtRead], term_guids: dict[int, bytes]) -> list[tuple[VtRead, object]]:
    """Rules 3 (a)–(d) on a VT read back. `term_guids[term]` = VT producer GUID of that term's leader.
    Returns the heartbeats with hbw, as (record, VtHeartbeat)."""
    data = []  # (vt offset, region, rt offset, guid)
    hbs = []
    for rec in vt:
        hb = parse_vt_heartbeat(rec.key, rec.env, rec.headers)
        if hb is not None:
            if hb.watermarks is not None:
                hbs.append((rec, hb))
        elif rec.key[0] == keys.HEADER_PUT_OR_DELETE:
            f = E.footer(rec.env)
            data.append(
                (
                    rec.offset,
                    f["upstreamKafkaClusterId"],
                    f["upstreamOffset"],
                    rec.env["producerMetadata"]["producerGUID"],
                )
            )
    prev: list[int] | None = None
    for rec, hb in hbs:
        w = hb.watermarks
        v = w.high_watermarks
        assert w.origin_region == hb.origin_region and w.origin_rt_offset == hb.origin_rt_offset
        assert v[hb.origin_region] >= hb.origin_rt_offset, f"(d) V={v} below its origin offset"
        if prev is not None:
            assert all(a >= b for a, b in zip(v, prev, strict=True)), f"(c) V decreased: {prev} -> {v}"
        prev = v
        guid = term_guids[w.term_id]
        for vt_off, r, o, g in data:
            if o <= v[r]:
                assert vt_off < rec.offset, (
                    f"(a) VT record {vt_off} for RT[{r}] offset {o} lies after the "
                    f"heartbeat at {rec.offset} claiming {v}"
                )
            if vt_off > rec.offset and g == guid:
                assert o > v[r], (
                    f"(b) VT record {vt_off} of the same term for RT[{r}] offset {o} follows the "
                    f"heartbeat at {rec.offset} claiming {v[r]}"
                )
    return hbs


def check_div_states(vt: list[VtRead], streams: list[list[RtIn]], hbs, *, vt_from_offset: int = 0) -> None:
    """Rule 4: each heartbeat's hbd equals a replay — RT[r] up to V[r] and the VT up to the heartbeat (the VT
    part only for heartbeats at VT offset ≥ `vt_from_offset`), both replayed from the start."""
    rt_validators = [PartitionValidator(is_realtime=True) for _ in streams]
    rt_pos = [0] * len(streams)
    vt_validator = PartitionValidator()
    vt_pos = 0
    for rec, hb in hbs:
        st = hb.div_state
        assert st is not None and not st.truncated
        for r, stream in enumerate(streams):
            while rt_pos[r] < len(stream) and stream[rt_pos[r]].offset <= hb.watermarks.high_watermarks[r]:
                x = stream[rt_pos[r]]
                rt_validators[r].process(x.offset, x.key, _CODEC.decode(x.value, x.headers), x.broker_ts)
                rt_pos[r] += 1
            assert st.rt_producers[r] == rt_validators[r].producer_states(), (
                f"hbd RT state of region {r} at V={hb.watermarks.high_watermarks} differs from a replay"
            )
        if rec.offset >= vt_from_offset:
            while vt[vt_pos].offset < rec.offset:
                x = vt[vt_pos]
                vt_validator.process(x.offset, x.key, x.env, x.timestamp_ms)
                vt_pos += 1
            assert st.vt_producers == vt_validator.producer_states(), (
                f"hbd VT state of the heartbeat at VT offset {rec.offset} differs from a replay of the VT"
            )


def read_topic(bootstrap: str, topic: str, partition: int = 0) -> list[tuple[int, bytes, bytes, list, int]]:
    """Every record of a topic partition on a live cluster: (offset, key, value, headers, timestamp ms)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "hb-test",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        c.assign([TopicPartition(topic, partition, low)])
        out = []
        for _ in range(600):
            if not out or out[-1][0] < high - 1:
                for m in c.consume(1000, timeout=0.2):
                    if m.error() is None:
                        out.append(
                            (m.offset(), m.key(), m.value(), list(m.headers() or []), m.timestamp()[1])
                        )
            else:
                break
        assert not out or out[-1][0] == high - 1, f"read {topic}[{partition}] up to {out[-1][0]}, end {high}"
        return out
    finally:
        c.close()
