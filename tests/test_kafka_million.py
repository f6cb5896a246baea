"""A million version-topic records in one partition of a real Kafka broker: `leapfrog`, `div validate` and
`div restore` read them whole (issue 29, item 2).

Why: librdkafka's mock cluster keeps about 5 MiB per partition, so every other test of a `kafka://` source reads a
few thousand records, while a nightly job reads millions, fetch after fetch, from real log segments. Here two
regions' VTs of one store hold a partition of at least 1,000,000 records each, on real brokers: region 0 on the
test run's shared broker (`real_kafka`), region 1 on one of this module's own (every region's VT is `<store>_v1`,
and one cluster holds one topic of a name).

The history, built here and streamed straight to the brokers (no archive in between): online writes of two
regions, each key written by one region only (so no conflict resolution is involved and the regions must end
equal); each region's leader applies its own RT at once and the other region's `LAG` writes later, writes a
PUT/DELETE with a leader footer per write and a VT heartbeat (`hbw` vector, `hbd` DIV state) per RT heartbeat of
either region, after a push job's StartOfSegment, StartOfPush, EndOfPush and final EndOfSegment. The leader's
records form DIV segments of `SEGMENT` data records (StartOfSegment, sequence numbers, an ADHASH checksum checked
at each EndOfSegment); its last segment is still open at the end, as a live leader's is. One fault: region 1's
leader drops the second of the two writes of one key (its watermark still moves past it), the dropped-write
fault of the demo, so Leap Frog has exactly one divergence to find; "no findings" alone would also be what a
reader that read nothing says.

What must hold, for each job over the two `kafka://` sources:

- every record was read: summary.json's evidence counts, per partition, exactly the partition's end offset (every
  offset from 0 holds a record), and no partition was read short;
- `leapfrog`: exactly one finding, the dropped write (its key, both offsets, both value hashes), and the record
  and heartbeat counts the history has;
- `div validate`: no finding of any kind over both logs, both producers of each tracked;
- `div restore` at each partition's last offset, from the last heartbeat's `hbd` and the records after it: the
  state every producer holds when its last record has been written (segment, sequence, timestamp, checksum),
  which is what a follower that replayed the whole partition would hold.

The figures (records, seconds, records/s of the fill and of each job) are printed for the issue's closing note
(`pytest -s` not needed: printed past the capture); nothing here asserts a time.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from vt_builder import value_hash

from div import checksum as cks
from div import envelope as E
from div import keys as K
from div import partition_state as ps
from div.avro_bits import write_long
from div.heartbeat_headers import DivState, Watermarks
from div.writer import vtp_header_value
from heartbeat.records import vt_heartbeat
from pipelines.core.sources import SourceSpec
from sim.brokers import KafkaCluster

pytestmark = [pytest.mark.kafka_real, pytest.mark.spark, pytest.mark.slow]

STORE = "million"
TOPIC = f"{STORE}_v1"
WRITES = 1_000_000  # online writes of both regions together; region 0's VT holds a record for each
KEYS = 200_000
HB_EVERY = 1_000  # a region's leader heartbeats its RT after this many of the region's own writes
LAG = 500  # writes (of both regions) a leader applies the other region's writes after its own
SEGMENT = 300_000  # data records per leader segment
TS0 = 1_700_000_000_000
TS_RECORDS = 100  # records a leader writes in a millisecond (their producer and broker timestamps)
DROPPED_KEY = b"dropped-key"
VALUES = [b"value-%03d-" % i + bytes([i]) * (40 + i % 48) for i in range(256)]
PRODUCER_CONF = {
    # one partition per topic, written as fast as the broker takes it: large batches, few requests, ordered
    "linger.ms": 50,
    "batch.size": 1_000_000,  # at most message.max.bytes
    "batch.num.messages": 100_000,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1 << 20,
    "enable.idempotence": True,
}


# -- the history -----------------------------------------------------------------------------------------------
@dataclass
class Plan:
    """The online writes and each region's RT positions, as numpy arrays indexed by write."""

    key: np.ndarray  # key id (KEYS = the dropped key)
    origin: np.ndarray  # the region that wrote it (a key's writes all come from one region)
    deleted: np.ndarray
    value: np.ndarray  # index into VALUES
    rt_offset: np.ndarray  # its offset in its region's RT
    hb_after: dict[int, np.ndarray]  # region -> write index each RT heartbeat of the region follows
    hb_offset: dict[int, np.ndarray]  # region -> RT offset of each of its heartbeats
    first: int  # the dropped key's two writes
    second: int


def plan(writes: int = WRITES) -> Plan:
    rng = np.random.default_rng(29)
    key = rng.integers(0, KEYS, writes)
    deleted = rng.random(writes) < 0.05
    value = rng.integers(0, len(VALUES), writes)
    first, second = writes // 3, 2 * writes // 3
    key[[first, second]] = KEYS
    deleted[[first, second]] = False
    origin = key % 2  # the dropped key (KEYS, even) is region 0's
    rt_offset = np.zeros(writes, np.int64)
    hb_after, hb_offset = {}, {}
    for r in (0, 1):
        mine = np.flatnonzero(origin == r)
        j = np.arange(len(mine))
        # after every HB_EVERY writes of the region its RT gets a heartbeat, which takes the next offset
        rt_offset[mine] = j + j // HB_EVERY
        m = np.arange(len(mine) // HB_EVERY)
        hb_after[r] = mine[(m + 1) * HB_EVERY - 1]
        hb_offset[r] = (m + 1) * HB_EVERY + m
    return Plan(key, origin, deleted, value, rt_offset, hb_after, hb_offset, first, second)


def leader_order(p: Plan, x: int) -> tuple[list[int], list[int], list[int]]:
    """What region x's leader processes, in order: (write index or -1 for an RT heartbeat, source region, RT
    offset). Its own RT at once, the other region's LAG writes later; each RT in its own order."""
    writes = len(p.key)
    w = np.concatenate([np.arange(writes), np.full(len(p.hb_after[0]) + len(p.hb_after[1]), -1)])
    src = np.concatenate(
        [p.origin, np.zeros(len(p.hb_after[0]), np.int64), np.ones(len(p.hb_after[1]), np.int64)]
    )
    off = np.concatenate([p.rt_offset, p.hb_offset[0], p.hb_offset[1]])
    # a heartbeat is written right after the write it follows: time 2*i for write i, 2*i + 1 for it
    when = np.concatenate([2 * np.arange(writes), 2 * p.hb_after[0] + 1, 2 * p.hb_after[1] + 1])
    when = when + np.where(src == x, 0, 2 * LAG)
    order = np.lexsort((src != x, when))
    return w[order].tolist(), src[order].tolist(), off[order].tolist()


class DivProducer:
    """One producer GUID of a VT partition, on the producer side: its segment, sequence numbers and ADHASH, and
    the ProducerPartitionState a follower that read every record it wrote holds (venice-protocol-notes §2-3)."""

    def __init__(self, guid: bytes, host: str) -> None:
        self.guid, self.host = guid, host
        self.segment = -1
        self.seq = -1  # the last sequence number written
        self.adhash = 0
        self.status = 0
        self.last_ts = -1
        self.codec = E.EnvelopeCodec("fastavro")

    def control(self, ctype: int, body: dict, ts: int) -> tuple[bytes, bytes, list | None]:
        self.seq += 1
        env = {
            "messageType": 2,
            "producerMetadata": E.producer_metadata(self.guid, self.segment, self.seq, ts, -1),
            "payloadUnion": E.control_message(ctype, body),
            "leaderMetadataFooter": E.default_footer(self.host),
        }
        if ctype != E.END_OF_SEGMENT:  # every control message but an EndOfSegment feeds the checksum
            self.adhash += zlib.crc32(cks.int_bytes(2)) + zlib.crc32(cks.int_bytes(ctype))
        self.last_ts = ts
        headers = [("vtp", vtp_header_value())] if self.segment == 0 and self.seq == 0 else None
        return K.control_key(self.guid, self.segment, self.seq), self.codec.encode(env), headers

    def start_segment(self, ts: int) -> tuple[bytes, bytes, list | None]:
        self.segment += 1
        self.seq, self.adhash, self.status = -1, 0, 1
        return self.control(E.START_OF_SEGMENT, {"checksumType": cks.ADHASH, "upcomingAggregates": []}, ts)

    def end_segment(self, ts: int, final: bool) -> tuple[bytes, bytes, list | None]:
        body = {"checksumValue": self.checksum(), "computedAggregates": [], "finalSegment": final}
        record = self.control(E.END_OF_SEGMENT, body, ts)
        self.status = 3 if final else 2
        return record

    def checksum(self) -> bytes:
        return (self.adhash & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")

    def state(self) -> dict:
        return {
            "segmentNumber": self.segment,
            "segmentStatus": self.status,
            "isRegistered": True,
            "messageSequenceNumber": self.seq,
            "messageTimestamp": self.last_ts,
            "checksumType": cks.ADHASH,
            "checksumState": self.checksum(),
            "aggregates": {},
            "debugInfo": {},
        }


class DataEncoder:
    """PUT and DELETE envelopes (v14, leader footer) of one producer, written field by field from tables of their
    varints: about 1 µs a record where building the dict and encoding it costs 5-7 (a million records a region).
    `check` pins the bytes to fastavro's."""

    def __init__(self, producer: DivProducer) -> None:
        self.p = producer
        self.footer = b"\x02" + write_long(len(producer.host)) + producer.host.encode()
        self.codec = E.EnvelopeCodec("fastavro")
        self.seq = [write_long(i) for i in range(SEGMENT + 2)]  # sequence numbers within a segment
        # a Kafka offset's position blob (div.positions.encode_offset) by the length of the offset's varint
        self.pos = [bytes([34, 1]) + write_long(0) + write_long(n) for n in range(11)]
        self.length = [write_long(n) for n in range(64)]
        self.region = [write_long(r) for r in range(2)]
        # a PUT's value, schema id 1, no RMD (version -1, empty payload); a DELETE's schema id -1 and no RMD
        self.put_value = [
            write_long(len(v)) + v + write_long(1) + write_long(-1) + write_long(0) for v in VALUES
        ]
        self.delete_body = write_long(-1) + write_long(-1) + write_long(0)

    def heads(self) -> tuple[bytes, bytes]:
        """What precedes the sequence number in a PUT and a DELETE of the producer's current segment."""
        guid, seg = self.p.guid, write_long(self.p.segment)
        return tuple(bytes([E.MAGIC, E.CURRENT_VERSION]) + write_long(t) + guid + seg for t in (0, 1))

    def tail(self, rt_offset: int, region: int) -> bytes:
        """The footer: this leader, the RT offset (and its position blob) and region the record came from."""
        raw = write_long(rt_offset)
        pos = self.pos[len(raw)] + raw
        return b"".join((self.footer, raw, self.region[region], self.length[len(pos)], pos, b"\x01\x01"))

    def check(self, value: bytes, seq: int, ts: int, put: bytes | None, rt_offset: int, region: int) -> None:
        """The bytes written for these fields are fastavro's for the same envelope."""
        body = {"schemaId": -1, "replicationMetadataVersionId": -1, "replicationMetadataPayload": b""}
        payload = (E.DELETE, body)
        if put is not None:
            payload = (E.PUT, {"putValue": put, **body, "schemaId": 1})
        env = {
            "messageType": 0 if put is not None else 1,
            "producerMetadata": E.producer_metadata(self.p.guid, self.p.segment, seq, ts, -2),
            "payloadUnion": payload,
            "leaderMetadataFooter": E.leader_footer(self.p.host, rt_offset, region),
        }
        assert value == self.codec.encode_reference(env), "the hand-written envelope is not fastavro's"


@dataclass
class RegionFacts:
    """What was written to one region's VT partition."""

    region: int
    end: int = 0  # records written = the partition's end offset
    data: int = 0
    heartbeats: int = 0
    eop_offset: int = -1
    dropped_key_offsets: list[int] = field(default_factory=list)
    states: dict[bytes, dict] = field(default_factory=dict)  # producer GUID -> state after the last record
    fill_s: float = 0.0


def fill_region(p: Plan, x: int, bootstrap: str) -> RegionFacts:
    """Write region x's VT partition to the broker, record by record as its leader would, and say what it holds."""
    facts = RegionFacts(x)
    host = f"leader-dc{x}"
    push = DivProducer(bytes([0x50, x]) + bytes(range(14)), f"push-dc{x}")
    leader = DivProducer(bytes([0x4C, x]) + bytes(range(14)), host)
    enc = DataEncoder(leader)
    keys = [b"\x00key-%07d" % k for k in range(KEYS)] + [b"\x00" + DROPPED_KEY]
    # ADHASH feeds (venice-protocol-notes §2.3): a PUT's are its message type, key, schema id and value; a
    # DELETE's its message type and key. Their CRC32s are summed as the segment goes.
    key_crc = [zlib.crc32(k[1:]) for k in keys]
    put_crc = [zlib.crc32(cks.int_bytes(0)) + zlib.crc32(cks.int_bytes(1)) + zlib.crc32(v) for v in VALUES]
    delete_crc = zlib.crc32(cks.int_bytes(1))
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONF})
    send = producer.produce
    offset = 0

    def emit(key: bytes, value: bytes, headers: list | None, ts: int) -> None:
        nonlocal offset
        while True:
            try:
                send(TOPIC, value, key, timestamp=ts, headers=headers)
                break
            except BufferError:  # the client's queue is full: let it drain
                producer.poll(0.05)
        offset += 1

    t0 = time.perf_counter()
    emit(*push.start_segment(TS0), TS0)
    sop = {
        "sorted": False,
        "chunked": False,
        "compressionStrategy": 0,
        "compressionDictionary": None,
        "timestampPolicy": 0,
    }
    emit(*push.control(E.START_OF_PUSH, sop, TS0), TS0)
    facts.eop_offset = offset
    emit(*push.control(E.END_OF_PUSH, {}, TS0), TS0)
    emit(*push.end_segment(TS0, final=True), TS0)
    emit(*leader.start_segment(TS0), TS0)
    head_put, head_delete = enc.heads()
    hw = [-1, -1]
    key_of, deleted_of, value_of = (a.tolist() for a in (p.key, p.deleted, p.value))
    checked: set[bool] = set()
    last = len(key_of) - 1
    seq_bytes, put_values, delete_body = enc.seq, enc.put_value, enc.delete_body
    join = b"".join
    seq = 0
    adhash = 0  # the segment's feeds since the leader's state was last brought up to date
    ts = ts_bytes = None
    written_ts = TS0  # the timestamp of the leader's last record
    for w, src, rt in zip(*leader_order(p, x), strict=True):
        hw[src] = rt
        if ts != TS0 + offset // TS_RECORDS:  # the leader's clock: TS_RECORDS records a millisecond
            ts = TS0 + offset // TS_RECORDS
            ts_bytes = write_long(ts)
        if w < 0 or seq == SEGMENT or (x == 1 and w == p.second):
            leader.seq, leader.last_ts = seq, written_ts
            leader.adhash += adhash
            adhash = 0
            if w < 0:  # an RT heartbeat of region src: the VT heartbeat carries the marks and the DIV state
                div = DivState(vt_producers={push.guid: push.state(), leader.guid: leader.state()})
                mark = Watermarks(src, rt, list(hw), host, emit_ts_ms=ts)
                hb = vt_heartbeat(
                    host, origin_region=src, origin_rt_offset=rt, timestamp_ms=ts, hbw=mark, hbd=div
                )
                emit(hb.key, hb.value, list(hb.headers), ts)
                facts.heartbeats += 1
                continue
            if x == 1 and w == p.second:
                continue  # the dropped write: processed (the marks move past it), never written
            emit(*leader.end_segment(ts, final=False), ts)
            emit(*leader.start_segment(ts), ts)
            written_ts = ts
            head_put, head_delete = enc.heads()
            seq = 0
        k = key_of[w]
        seq += 1
        written_ts = ts
        if k == KEYS:
            facts.dropped_key_offsets.append(offset)
        if deleted_of[w]:
            put = None
            value = join((head_delete, seq_bytes[seq], ts_bytes, b"\x03\x04", delete_body, enc.tail(rt, src)))
            adhash += delete_crc + key_crc[k]
        else:
            v = value_of[w]
            put = VALUES[v]
            value = join((head_put, seq_bytes[seq], ts_bytes, b"\x03\x00", put_values[v], enc.tail(rt, src)))
            adhash += put_crc[v] + key_crc[k]
        if (put is None) not in checked or w >= last:  # the first PUT, the first DELETE and the last write
            checked.add(put is None)
            enc.check(value, seq, ts, put, rt, src)
        while True:
            try:
                send(TOPIC, value, keys[k], timestamp=ts)
                break
            except BufferError:
                producer.poll(0.05)
        offset += 1
        facts.data += 1
    leader.seq, leader.last_ts = seq, written_ts
    leader.adhash += adhash
    left = producer.flush(120)
    assert left == 0, f"{left} records of region {x} not acknowledged"
    facts.fill_s = time.perf_counter() - t0
    facts.end = offset
    facts.states = {push.guid: push.state(), leader.guid: leader.state()}
    return facts


def end_offset(bootstrap: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "million-check"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30, cached=False)
    finally:
        c.close()
    assert low == 0
    return high


@pytest.fixture(scope="module")
def regions(real_kafka, tmp_path_factory):
    """Both regions' VTs written; yields (cluster, facts) per region. Region 1's broker (this module's) is removed
    at the end and region 0's topic deleted from the shared one (about 200 MB on disk)."""
    t0 = time.perf_counter()
    own = KafkaCluster(name="million", root=tmp_path_factory.mktemp("million-broker"))
    own_start_s = time.perf_counter() - t0
    try:
        clusters = {0: real_kafka, 1: own}
        for c in clusters.values():
            c.create_topics({TOPIC: 1})
        t0 = time.perf_counter()
        p = plan()
        plan_s = time.perf_counter() - t0
        facts = {x: fill_region(p, x, c.bootstrap_servers) for x, c in clusters.items()}
        yield {"clusters": clusters, "facts": facts, "plan": p, "own_start_s": own_start_s, "plan_s": plan_s}
    finally:
        try:
            admin = real_kafka.admin()  # held until the answer is in: a client collected meanwhile cancels it
            for fut in admin.delete_topics([TOPIC], operation_timeout=30).values():
                fut.result(timeout=60)
        finally:
            own.close()


def _say(capsys, line: str) -> None:
    with capsys.disabled():
        print(f"\n[1M records, real Kafka] {line}", flush=True)


def _rate(records: int, seconds: float) -> str:
    return f"{records:,} records in {seconds:.1f} s ({records / seconds:,.0f} records/s)"


def _sources(regions) -> list[SourceSpec]:
    return [SourceSpec(x, c.uri) for x, c in regions["clusters"].items()]


def _whole(evidence: dict, regions, topic: str = TOPIC) -> None:
    """Every planned record was read: per partition, exactly the partition's end offset (every offset holds a
    record), and nothing was read short or left undecoded."""
    ends = {x: f.end for x, f in regions["facts"].items()}
    got = {
        e["region"]: (e["planned_offsets"], e["read_records"], e["short"], e["undecodable"])
        for e in evidence["by_partition"]
        if e["topic"] == topic
    }
    assert got == {x: ([0, end], end, False, 0) for x, end in ends.items()}
    assert evidence["partitions_read_short"] == 0 and evidence["undecodable_records"] == 0
    assert evidence["read_records"] == sum(ends.values())


def test_the_brokers_hold_every_record_written(regions, capsys):
    facts = regions["facts"]
    assert facts[0].end >= 1_000_000 and facts[1].end >= 1_000_000
    for x, c in regions["clusters"].items():
        assert end_offset(c.bootstrap_servers) == facts[x].end
    # the history as built: every write in region 0, all but the dropped one in region 1
    assert facts[0].data == WRITES and facts[1].data == WRITES - 1
    p = regions["plan"]
    assert facts[0].heartbeats == facts[1].heartbeats == len(p.hb_after[0]) + len(p.hb_after[1])
    assert len(facts[0].dropped_key_offsets) == 2 and len(facts[1].dropped_key_offsets) == 1
    total = sum(f.end for f in facts.values())
    fill_s = sum(f.fill_s for f in facts.values())
    _say(
        capsys,
        f"fill: {_rate(total, fill_s)}; per region "
        + ", ".join(f"{x}: {_rate(f.end, f.fill_s)}" for x, f in facts.items())
        + f"; plan {regions['plan_s']:.1f} s; region 1's broker started in {regions['own_start_s']:.1f} s",
    )


def test_leapfrog_reads_every_record_and_finds_exactly_the_dropped_write(regions, spark, tmp_path, capsys):
    from pipelines.leapfrog.job import LeapfrogOptions, run

    out = tmp_path / "leapfrog"
    t0 = time.perf_counter()
    code = run(LeapfrogOptions(STORE, 1, _sources(regions), str(out)), spark=spark)
    seconds = time.perf_counter() - t0
    summary = json.loads((out / "summary.json").read_text())
    facts, p = regions["facts"], regions["plan"]
    _whole(summary["evidence"], regions)
    assert (code, summary["verdict"]) == (1, "findings")
    totals = summary["totals"]
    assert totals["findings"] == {"VALUE_MISMATCH": 1, "MISSING_IN_A": 0, "MISSING_IN_B": 0}
    assert (totals["undecodable"], totals["unverified_keys"], totals["withheld_findings"]) == (0, 0, 0)
    found = pq.read_table(out / "inconsistencies").to_pylist()
    (row,) = found
    first_value, second_value = VALUES[int(p.value[p.first])], VALUES[int(p.value[p.second])]
    assert first_value != second_value
    assert {k: row[k] for k in ("partition", "region_a", "region_b", "type", "key")} == {
        "partition": 0,
        "region_a": 0,
        "region_b": 1,
        "type": "VALUE_MISMATCH",
        "key": DROPPED_KEY,
    }
    # region 0's second write of the key against region 1's first, the value that still stands there
    assert (row["a_vt_offset"], row["b_vt_offset"]) == (
        facts[0].dropped_key_offsets[1],
        facts[1].dropped_key_offsets[0],
    )
    assert (row["a_value_hash"], row["b_value_hash"]) == (value_hash(second_value), value_hash(first_value))
    by_region = {r["region"]: r for r in summary["by_region"]}
    for x, f in facts.items():
        r = by_region[x]
        assert (r["records"], r["heartbeats"], r["eop_offset"]) == (f.data, f.heartbeats, f.eop_offset)
        assert (r["undecodable"], r["out_of_range"], r["compacted_ranges"]) == (0, 0, [])
    total = sum(f.end for f in facts.values())
    _say(capsys, f"leapfrog: {_rate(total, seconds)}; timings {summary['timings']}")


def test_div_validate_finds_nothing_in_either_log(regions, spark, tmp_path, capsys):
    from pipelines.div.spark import run_spark
    from pipelines.div.validate import ValidateOptions

    out = tmp_path / "div"
    t0 = time.perf_counter()
    code = run_spark(ValidateOptions(_sources(regions), str(out), topics=[TOPIC]))
    seconds = time.perf_counter() - t0
    summary = json.loads((out / "summary.json").read_text())
    _whole(summary["evidence"], regions)
    total = sum(f.end for f in regions["facts"].values())
    assert (code, summary["verdict"]) == (0, "clean")
    assert (summary["records_read"], summary["findings"], summary["fatal_findings"]) == (total, 0, 0)
    assert summary["producers_tracked"] == 4  # a push job and a leader per region
    assert pq.read_table(out / "errors").num_rows == 0
    _say(capsys, f"div validate (spark engine): {_rate(total, seconds)}")


def test_div_restore_at_the_end_gives_the_producers_own_state(regions, tmp_path, capsys):
    from pipelines.div.restore import RestoreOptions, run_restore

    lines = []
    for x, c in regions["clusters"].items():
        f = regions["facts"][x]
        out = tmp_path / f"restore-{x}"
        t0 = time.perf_counter()
        code = run_restore(RestoreOptions(SourceSpec(x, c.uri), STORE, 1, 0, f.end - 1, str(out)))
        seconds = time.perf_counter() - t0
        summary = json.loads((out / "summary.json").read_text())
        assert (code, summary["verdict"]) == (0, "clean")
        # from a heartbeat near the end, not a replay of the whole partition
        assert summary["restored_from"] == "heartbeat"
        assert f.end - 1 - 2 * HB_EVERY <= summary["heartbeat_offset"] < f.end - 1
        replayed = f.end - 1 - summary["heartbeat_offset"]
        assert summary["vt_records_replayed"] == replayed
        state = ps.decode((out / "partition_state.bin").read_bytes())
        assert (state["offset"], state["endOfPush"]) == (f.end - 1, True)
        assert ps.producer_states(state) == f.states
        lines.append(f"region {x}: {seconds:.2f} s ({replayed} records replayed, {summary['search']})")
    _say(capsys, "div restore at the last offset: " + "; ".join(lines))
