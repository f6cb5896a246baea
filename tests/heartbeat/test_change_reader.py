"""ChangeReader (heartbeat.change_reader) on a real Apache Kafka broker (issue 30, item 2): a client's change capture
from a region's VT, each change once, across kills, restarts from older states, Kafka re-reads and version swaps.

The one rule decides: a small simulation with a leader failover (region 2's VT, whose partition 0 holds the records
the new leader re-produced) is produced into the session's broker record for record, so Kafka offsets are the
archive's; the reader's events must equal what `PartitionChanges` gives over the archive's records. The version
swap uses hand-built VTs (tests/support/vt_builder.py) whose second version restates the first's changes (its bulk
load and a replay from a rewind point) before new ones.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pytest
from confluent_kafka import TopicPartition
from kafka_copy import produce_archive
from small_sim import small_sim
from vt_builder import RegionVt, produce

from div import archive
from heartbeat import ChangeReader, ChangeReaderError, ChangeState, StateError, UnendedVersionError
from heartbeat.change_events import PartitionChanges
from heartbeat.changes import PartitionState, Phase, Verdict
from heartbeat.cuts import FROM_HEARTBEATS, Cut, CutPartition

pytestmark = pytest.mark.slow

N_REGIONS = 3
FAILOVER_REGION = 2  # small_sim(seed 7, failover 1) fails region 2's leader of partition 0 over
# A drain gives up after this long without a change (a healthy one stops at the log's end, at once).
DRAIN_S = 15.0


@dataclass
class Vt:
    """A simulated region's VT in the broker, and what the rule gives over its archive."""

    store: str
    conf: dict
    expected: dict[int, list]  # partition -> events
    final: dict[int, PartitionState]  # partition -> state after its last record
    duplicates: int
    archives: dict[int, str] | None = None  # the simulation's regions' VT archives
    topic: str = ""

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.expected.values())


@pytest.fixture(scope="module")
def vt(real_kafka, tmp_path_factory) -> Vt:
    sim = small_sim(tmp_path_factory.mktemp("sim"), faults={"failover": 1}, records=1200)
    failover = [f for f in sim.result.truth["faults"] if f["kind"] == "failover"]
    assert [(f["region"], f["partition"]) for f in failover] == [(FAILOVER_REGION, 0)]
    directory = sim.archives[FAILOVER_REGION]
    store = f"cc{uuid.uuid4().hex[:8]}"
    real_kafka.create_topics({f"{store}_v1": 2})
    produce_archive(real_kafka.bootstrap_servers, directory, sim.topic, f"{store}_v1", range(2))
    expected, final, duplicates = {}, {}, 0
    for p in range(2):
        table = pa.Table.from_batches(list(archive.iter_partition(directory, sim.topic, p)))
        assert table.column("offset").to_pylist() == list(range(table.num_rows))  # Kafka's offsets will match
        stream = PartitionChanges(p, PartitionState.fresh(N_REGIONS))
        expected[p] = stream.feed(table)
        final[p] = stream.state()
        duplicates += sum(stream.counts.get(v, 0) for v in (Verdict.BELOW_RECORD, Verdict.BELOW_HEARTBEAT))
        assert not stream.problems
    assert duplicates > 0, "the failover re-produced nothing: the test would not test the filter"
    conf = {"bootstrap.servers": real_kafka.bootstrap_servers, "log_level": 0}
    return Vt(store, conf, expected, final, duplicates, sim.archives, sim.topic)


def _per_partition(events) -> dict[int, list]:
    out: dict[int, list] = {0: [], 1: []}
    for e in events:
        out[e.partition].append(e)
    return out


def _drain(reader: ChangeReader) -> list:
    return list(reader.events(timeout=DRAIN_S, to_end=True))


def test_the_events_are_what_the_rule_gives_over_the_same_records(vt):
    with ChangeReader(vt.store, 1, vt.conf, n_regions=N_REGIONS) as reader:
        first = reader.poll(DRAIN_S)
        # the state covers the one event returned, not the ones read with it and still buffered
        assert reader.stats().buffered > 0
        assert reader.change_state().partitions[first.partition].position == first.vt_offset + 1
        events = [first, *_drain(reader)]
        assert reader.caught_up()
        assert _per_partition(events) == vt.expected
        assert dict(reader.change_state().partitions) == vt.final
        counts = reader.counts()
    assert counts["delivered"] == vt.total and counts["bulk_load"] > 0
    assert counts["duplicates_dropped"] == vt.duplicates and counts["undecodable"] == counts["buffered"] == 0
    state = ChangeState.from_bytes(reader.state())  # state() still answers after close
    assert (state.store, state.version, state.n_regions) == (vt.store, 1, N_REGIONS)


@pytest.mark.parametrize("k", [1, 13])
def test_a_client_killed_anywhere_and_restarted_from_any_stored_state_gets_each_change_once(vt, k):
    """The client applies each event and stores (state, what it applied) together after every k-th event; it is
    killed after a random number of events (the reader dropped without close: what it applied since its last store
    is lost with it), once restarted from an older stored pair (a backup), and finally reads to the end."""
    rng = random.Random(k)
    saved: list[tuple[bytes | None, int]] = [(None, 0)]  # (state, number of events applied) stored together
    applied: list = []
    sessions = 0
    while True:
        if sessions == 2:  # restart from an older backup of the client, not its last stored pair
            assert len(saved) > 2
            saved = saved[: len(saved) // 2 + 1]
        state, n_applied = saved[-1]
        del applied[n_applied:]
        reader = ChangeReader(vt.store, 1, vt.conf, state=state, n_regions=N_REGIONS, batch_size=200)
        stop_after, got, caught_up = rng.randint(20, 250), 0, True
        for event in reader.events(timeout=DRAIN_S, to_end=True):
            applied.append(event)
            got += 1
            if got % k == 0:
                saved.append((reader.state(), len(applied)))
            if got == stop_after:
                caught_up = False
                break
        if caught_up:
            saved.append((reader.state(), len(applied)))
        del reader  # killed: no close()
        sessions += 1
        if caught_up:
            break
    assert sessions >= 4
    assert _per_partition(applied[: saved[-1][1]]) == vt.expected


def test_a_consumer_that_reads_records_again_delivers_no_duplicate(vt):
    with ChangeReader(vt.store, 1, vt.conf, n_regions=N_REGIONS, batch_size=50) as reader:
        events = [reader.poll(DRAIN_S) for _ in range(200)]
        for p in reader.partitions:  # Kafka gives the partitions again from their start
            reader._consumer.seek(TopicPartition(reader.topic, p, 0))
        events += _drain(reader)
        assert reader.counts()["reread"] > 0
    assert _per_partition(events) == vt.expected


def _versions(partition: int) -> tuple[RegionVt, RegionVt, list[tuple[int, int]]]:
    """Version 1 and 2 of a two-region store's VT partition, and the coordinates only version 2 holds.

    Version 1: a bulk load, End of Push, region 0's writes 0..9 and region 1's 0..4 interleaved, a heartbeat.
    Version 2: a bulk load restating everything, End of Push, a replay from a rewind point (region 0 from 5, region
    1 from 2) in another interleaving, a heartbeat, then new writes (region 0 10..14, region 1 5..7) and a broker's
    redelivery of one of them."""

    def write(vt: RegionVt, r: int, q: int) -> None:
        key = b"p%d-k%d" % (partition, (r * 7 + q) % 6)
        if q % 5 == 4:
            vt.delete(key, r, q)
        else:
            vt.put(key, b"r%d-%d" % (r, q), r, q)

    v1, v2 = RegionVt(0, partition), RegionVt(0, partition)
    v1.start_of_push()
    for i in range(5):
        v1.put(b"p%d-k%d" % (partition, i), b"bulk", 0, 0)
    v1.end_of_push()
    for q in range(10):
        write(v1, 0, q)
        if q % 2:
            write(v1, 1, q // 2)
    v1.heartbeat(0, 100, [9, 4])
    v1.version_swap("s_v1", "s_v2")  # version 1 ends here: a reader may follow version 2 once it has read it
    v2.start_of_push()
    for i in range(6):
        v2.put(b"p%d-k%d" % (partition, i), b"restated", 0, 0)
    v2.end_of_push()
    for q in range(2, 5):
        write(v2, 1, q)
    for q in range(5, 10):
        write(v2, 0, q)
    v2.heartbeat(1, 50, [9, 4])
    new = [(0, 10), (1, 5), (0, 11), (0, 12), (1, 6), (0, 13), (1, 7), (0, 14)]
    for r, q in new:
        write(v2, r, q)
    write(v2, *new[2])  # the broker delivers one of them again
    return v1, v2, new


def test_following_a_version_delivers_only_the_changes_the_old_one_did_not_have(real_kafka):
    store = f"sw{uuid.uuid4().hex[:8]}"
    built = [_versions(p) for p in range(2)]
    real_kafka.create_topics({f"{store}_v1": 2, f"{store}_v2": 2})
    produce([b[0] for b in built], real_kafka.bootstrap_servers, f"{store}_v1")
    produce([b[1] for b in built], real_kafka.bootstrap_servers, f"{store}_v2")
    conf = {"bootstrap.servers": real_kafka.bootstrap_servers, "log_level": 0}
    with ChangeReader(store, 1, conf, n_regions=2, partitions=[0, 1]) as reader:
        v1 = _drain(reader)
        assert len(v1) == 2 * (5 + 15) and sum(e.upstream_region is None for e in v1) == 10
        assert reader.version_ended()
        old_state = reader.state()
        reader.follow(2)
        assert reader.topic == f"{store}_v2"
        v2 = _drain(reader)
        counts = reader.counts()
        with pytest.raises(ValueError, match="cannot follow version 2 .* from version 2"):
            reader.follow(2)
        with pytest.raises(ChangeReaderError, match=f"{store}_v5 on {real_kafka.bootstrap_servers} does not"):
            reader.follow(5, unended_ok=True)
        assert reader.version == 2 and reader.poll(0.2) is None  # still reading version 2
    for p, (_, _, new) in enumerate(built):
        assert [(e.upstream_region, e.upstream_offset) for e in v2 if e.partition == p] == new
    assert all(e.value == b"r%d-%d" % (e.upstream_region, e.upstream_offset) for e in v2 if e.op == "PUT")
    assert counts["bulk_skipped"] == 2 * 6
    assert counts["duplicates_dropped"] == 2 * (3 + 5 + 1)
    # a reader started on version 2 with version 1's state is the same swap; order is a per-partition
    # contract (the consumer interleaves partitions as fetches arrive)
    with ChangeReader(store, 2, conf, state=old_state) as restarted:
        assert _per_partition(_drain(restarted)) == _per_partition(v2)


def test_usage_errors_name_both_sides(vt):
    state = ChangeState(vt.store, 1, N_REGIONS).to_bytes()
    with pytest.raises(ValueError, match=f"store {vt.store!r}, not of store 'other'"):
        ChangeReader("other", 1, vt.conf, state=state)
    with pytest.raises(ValueError, match="version 1 of store .* reader of version 3"):
        ChangeReader(vt.store, 3, vt.conf, state=state)
    with pytest.raises(ValueError, match="n_regions 2 differs from the state's 3"):
        ChangeReader(vt.store, 1, vt.conf, state=state, n_regions=2)
    with pytest.raises(ValueError, match="needs n_regions"):
        ChangeReader(vt.store, 1, vt.conf)
    with pytest.raises(StateError, match="CRC32"):
        ChangeReader(vt.store, 1, vt.conf, state=state[:-1] + bytes([state[-1] ^ 1]))
    with pytest.raises(ValueError, match="bootstrap.servers"):
        ChangeReader(vt.store, 1, {}, n_regions=3)
    bootstrap = vt.conf["bootstrap.servers"]
    with pytest.raises(ChangeReaderError, match=f"version topic nostore_v1 on {bootstrap} does not exist"):
        ChangeReader("nostore", 1, vt.conf, n_regions=3)
    with pytest.raises(ChangeReaderError, match=r"has no partition \[7\] \(it has 2 partitions\)"):
        ChangeReader(vt.store, 1, vt.conf, partitions=[1, 7], n_regions=3)
    with ChangeReader(vt.store, 1, vt.conf, partitions=[1], n_regions=3) as one:
        assert {e.partition for e in _drain(one)} == {1}
        assert set(one.change_state().partitions) == {1}
        # this version has no VersionSwap: following it would skip a bulk load that may hold unread changes
        assert not one.version_ended()
        with pytest.raises(
            UnendedVersionError, match=r"version 1 of store .* has not ended in partition\(s\) 1"
        ):
            one.follow(2)
        assert one.version == 1
        unended = one.state()
    with pytest.raises(UnendedVersionError, match="has not ended"):
        ChangeReader(vt.store, 2, vt.conf, state=unended)


def test_a_cluster_that_cannot_be_reached_is_named_and_no_secret_is_told(caplog):
    secret = "hunter2-do-not-print"
    conf = {
        "bootstrap.servers": "127.0.0.1:1",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "client",
        "sasl.password": secret,
    }
    with (
        caplog.at_level(logging.DEBUG),
        pytest.raises(ChangeReaderError, match="store_v1 on 127.0.0.1:1") as e,
    ):
        ChangeReader("store", 1, conf, n_regions=3, timeout_s=1.0)
    assert secret not in str(e.value) and secret not in caplog.text
    # what to check: librdkafka's own reason (its error callback), the time waited, the settings that matter
    assert "Connection refused" in str(e.value) and "waited 1." in str(e.value)
    assert "security.protocol=SASL_PLAINTEXT, sasl.mechanisms=PLAIN, sasl.username=client" in str(e.value)


def test_records_gone_before_they_were_read_are_a_problem_and_a_state_past_the_end_is_refused(real_kafka):
    from confluent_kafka.admin import AdminClient

    store = f"gone{uuid.uuid4().hex[:8]}"
    v1 = [_versions(p)[0] for p in range(2)]
    real_kafka.create_topics({f"{store}_v1": 2, f"{store}_v2": 2})
    produce(v1, real_kafka.bootstrap_servers, f"{store}_v1")
    admin = AdminClient({"bootstrap.servers": real_kafka.bootstrap_servers, "log_level": 0})
    for fut in admin.delete_records([TopicPartition(f"{store}_v1", 0, 4)]).values():
        fut.result(
            30
        )  # retention took partition 0's offsets 0..3 (the StartOfPush and three of the bulk load)
    conf = {"bootstrap.servers": real_kafka.bootstrap_servers, "log_level": 0}
    with ChangeReader(store, 1, conf, n_regions=2) as reader:
        events = _drain(reader)
        problems = reader.stats().problems
        reader.follow(2)  # an empty version: read to its end at once, nothing delivered
        started = time.monotonic()
        assert _drain(reader) == [] and reader.caught_up() and time.monotonic() - started < DRAIN_S / 2
    assert [(p.partition, p.offset) for p in problems] == [(0, 0)]
    assert "offsets 0..3 are no longer in the topic" in problems[0].reason
    assert min(e.vt_offset for e in events if e.partition == 0) == 4
    assert len(events) == 2 * 20 - 3
    ahead = ChangeState(store, 1, 2, {1: PartitionState(10_000, Phase.ONLINE, (5, 5), (5, 5))})
    with pytest.raises(
        ChangeReaderError, match=r"partition 1 ends at offset \d+, before the state's position 10000"
    ):
        ChangeReader(store, 1, conf, state=ahead)


# -- from a cut; a state belongs to one region's VT (issue 40) --------------------------------------------------------


def _cut_in_the_middle(vt) -> tuple[Cut, dict[int, list]]:
    """A cut at each region's median RT position per partition, and the events above it (the rule's, from the
    start: the first copy of each lies after the reader's start, so the events are equal whole)."""
    parts, above = {}, {}
    for p, events in vt.expected.items():
        rt = {}
        for r in range(N_REGIONS):
            qs = sorted(e.upstream_offset for e in events if e.upstream_region == r)
            rt[r] = qs[len(qs) // 2] if qs else -1
        parts[p] = CutPartition(p, rt)
        above[p] = [
            e for e in events if e.upstream_region is not None and e.upstream_offset > rt[e.upstream_region]
        ]
    return Cut(vt.store, 1, 0, FROM_HEARTBEATS, parts), above


def test_a_reader_from_a_cut_gets_exactly_the_changes_above_it_and_resumes_from_any_state_it_stored(vt):
    cut, above = _cut_in_the_middle(vt)
    assert all(len(v) > 10 for v in above.values())
    with ChangeReader(vt.store, 1, vt.conf, cut=cut, region=FAILOVER_REGION) as reader:
        assert _per_partition(_drain(reader)) == above
        counts = reader.counts()
        state = reader.change_state()
    assert counts["bulk_load"] == 0 and state.region == FAILOVER_REGION
    assert all(ps.log_id is not None for ps in state.partitions.values())
    # stopped after its first event (the other partition may still be folding towards its start), resumed
    with ChangeReader(vt.store, 1, vt.conf, cut=cut, batch_size=20) as reader:
        first = reader.poll(DRAIN_S)
        stored = reader.state()
    with ChangeReader(vt.store, 1, vt.conf, state=stored) as reader:
        assert _per_partition([first, *_drain(reader)]) == above
    with pytest.raises(ValueError, match="a state or from a cut, not both"):
        ChangeReader(vt.store, 1, vt.conf, cut=cut, state=stored)
    with pytest.raises(ValueError, match="cut is of store .* not of store 'other'"):
        ChangeReader("other", 1, vt.conf, cut=cut)


def test_a_state_given_with_another_region_s_vt_is_refused_naming_both(vt, real_kafka):
    """Issue 40's defect: a state of region 2's VT resumed silently with region 0's."""
    with ChangeReader(vt.store, 1, vt.conf, n_regions=N_REGIONS, region=FAILOVER_REGION) as reader:
        _drain(reader)
        state = reader.change_state()
    with pytest.raises(ValueError, match=f"region {FAILOVER_REGION}'s version topic, not region 0's"):
        ChangeReader(vt.store, 1, vt.conf, state=state, region=0)
    # the same store in region 0's cluster (here: another topic holding region 0's VT, the state renamed to it)
    other = f"cc{uuid.uuid4().hex[:8]}"
    real_kafka.create_topics({f"{other}_v1": 2})
    produce_archive(real_kafka.bootstrap_servers, vt.archives[0], vt.topic, f"{other}_v1", range(2))
    moved = ChangeState(other, 1, N_REGIONS, state.partitions, state.region)
    with pytest.raises(ChangeReaderError, match=f"written for region {FAILOVER_REGION}'s version topic"):
        ChangeReader(other, 1, vt.conf, state=moved.to_bytes())
    with ChangeReader(vt.store, 1, vt.conf, state=state.to_bytes()) as same:  # its own VT: resumes
        assert _drain(same) == []
