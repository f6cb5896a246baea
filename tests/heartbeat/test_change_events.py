"""Change events from real VT records (heartbeat.change_events): what each delivered change carries, chunked values
put back together, and a reader stopped anywhere (its state through bytes) delivering what one pass delivers.

Truth is read off the records themselves, not through the rule: a simulated region's VT after End of Push holds each
written coordinate one or more times (a failover re-produces), so the events are its distinct coordinates, each
with the first record's key and value; the bulk load is the snapshot.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from chunked_histories import chunked, write_chunked_archives
from leapfrog_histories import Mix, generate
from small_sim import small_sim
from vt_fixtures import TOPIC, value_bytes

from div import archive
from div.envelope import EnvelopeCodec
from div.records import Kind, footer_source, iter_records
from heartbeat.change_events import CHANGES_SCHEMA, PartitionChanges, events_table, logical_timestamp
from heartbeat.changes import ChangeState, PartitionState, Verdict
from leapfrog.reference import DataEntry


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    return small_sim(tmp_path_factory.mktemp("sim"), faults={"failover": 1, "dropped": 1}, records=1200)


def _table(directory, topic, partition) -> pa.Table:
    return pa.Table.from_batches(list(archive.iter_partition(directory, topic, partition)))


def _one_pass(table, partition, n_regions):
    s = PartitionChanges(partition, PartitionState.fresh(n_regions))
    return s.feed(table), s


def _stopped_and_resumed(table, partition, n_regions, rng, store="s"):
    """The stream read in random slices, the reader stopped after each and started again from its state's bytes
    (re-reading from the stored position: records already read come again, as after a crash)."""
    events, state, start = [], PartitionState.fresh(n_regions), 0
    while start < table.num_rows:
        end = min(table.num_rows, start + rng.randint(1, 40))
        s = PartitionChanges(partition, state)
        offsets = table.column("offset").to_pylist()
        first = (
            next(i for i, o in enumerate(offsets) if o >= state.position)
            if state.position <= offsets[-1]
            else end
        )
        events += s.feed(table.slice(min(first, start), end - min(first, start)))
        data = ChangeState(store, 1, n_regions, {partition: s.state()}).to_bytes()
        state = ChangeState.from_bytes(data).partition(partition)
        start = end
    return events


def test_events_are_the_distinct_coordinates_with_their_first_record(sim):
    n = 3
    codec = EnvelopeCodec()
    for p in range(2):
        table = _table(sim.archives[0], sim.topic, p)
        events, stream = _one_pass(table, p, n)
        first: dict[tuple[int, int], tuple] = {}
        snapshot, online = [], False
        for rec in iter_records(table, codec):
            k = rec.kind
            if k is Kind.END_OF_PUSH:
                online = True
            if k not in (Kind.PUT, Kind.DELETE):
                continue
            if not online:
                snapshot.append(rec.offset)
                continue
            coord = footer_source(rec.env)
            first.setdefault(coord, rec)
        delivered = [e for e in events if e.upstream_region is not None]
        assert [e.vt_offset for e in events if e.upstream_region is None] == snapshot
        assert {(e.upstream_region, e.upstream_offset) for e in delivered} == set(first)
        assert len(delivered) == len(first), "a coordinate delivered twice"
        for e in delivered:
            rec = first[(e.upstream_region, e.upstream_offset)]
            assert e.vt_offset == rec.offset and e.key == rec.key[1:]
            body = rec.env["payloadUnion"][1]
            assert e.op == ("PUT" if rec.kind is Kind.PUT else "DELETE")
            assert e.value == (body["putValue"] if rec.kind is Kind.PUT else None)
            assert e.logical_ts == logical_timestamp(body, rec.env["producerMetadata"]) > 1_000_000_000_000
        # the failover's re-produced records are the duplicates, each below a record already delivered
        assert stream.counts.get(Verdict.NEW, 0) == len(first)
        assert not stream.problems


def test_failover_duplicates_are_dropped(sim):
    """The region whose leader failed over holds the successor's re-produced records: each is dropped as a
    duplicate, as many as truth.json says the successor re-applied."""
    (failover,) = [f for f in sim.result.truth["faults"] if f["kind"] == "failover"]
    x, p = failover["region"], failover["partition"]
    _, stream = _one_pass(_table(sim.archives[x], sim.topic, p), p, 3)
    dups = stream.counts.get(Verdict.BELOW_RECORD, 0) + stream.counts.get(Verdict.BELOW_HEARTBEAT, 0)
    assert dups == len(failover["vt_offsets"][str(x)]) > 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_reader_stopped_anywhere_delivers_what_one_pass_delivers(sim, seed):
    rng = random.Random(seed)
    for p in range(2):
        table = _table(sim.archives[1], sim.topic, p)
        once, _ = _one_pass(table, p, 3)
        assert _stopped_and_resumed(table, p, 3, rng) == once


@pytest.fixture(scope="module")
def chunked_archives(tmp_path_factory):
    histories = [generate(s, Mix("clean")) for s in (11, 12)]
    dirs, manifests = write_chunked_archives(histories, tmp_path_factory.mktemp("chunked"))
    return histories, dirs, manifests


def test_chunked_values_are_put_back_together(chunked_archives):
    histories, dirs, manifests = chunked_archives
    seen_chunked = 0
    for p, h in enumerate(histories):
        for x in range(h.n_regions):
            table = _table(dirs[x], TOPIC, p)
            events, stream = _one_pass(table, p, h.n_regions)
            assert not stream.problems
            by_coord = {(e.upstream_region, e.upstream_offset): e for e in events}
            for entry in h.vt[x]:
                if (
                    not isinstance(entry, DataEntry)
                    or (entry.source_region, entry.source_offset) not in by_coord
                ):
                    continue
                e = by_coord[(entry.source_region, entry.source_offset)]
                if entry.value_hash is None:
                    assert e.op == "DELETE" and e.value is None
                else:
                    assert e.op == "PUT" and e.value == value_bytes(entry.value_hash)
                    seen_chunked += chunked(entry.value_hash)
                assert not e.key.endswith(b"\x02\x00"), "the chunk suffix is not part of the user key"
            delivered_manifests = {e.vt_offset for e in events} & set(manifests[(x, p)])
            assert len(delivered_manifests) == sum(
                e.value is not None and len(e.value) > 3 for e in events if e.vt_offset in delivered_manifests
            )
    assert seen_chunked > 10


@pytest.mark.parametrize("seed", [4, 5])
def test_a_reader_stopped_between_chunks_and_their_manifest_loses_no_value(chunked_archives, seed):
    histories, dirs, _ = chunked_archives
    rng = random.Random(seed)
    for p, h in enumerate(histories):
        table = _table(dirs[0], TOPIC, p)
        once, _ = _one_pass(table, p, h.n_regions)
        assert _stopped_and_resumed(table, p, h.n_regions, rng) == once


def test_events_table_has_the_contract_schema(sim):
    events, _ = _one_pass(_table(sim.archives[2], sim.topic, 0), 0, 3)
    t = events_table(events)
    assert t.schema == CHANGES_SCHEMA and t.num_rows == len(events)
    assert t.column("upstream_region").null_count == sum(e.upstream_region is None for e in events) > 0
    assert events_table([]).schema == CHANGES_SCHEMA
