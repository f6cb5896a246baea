"""heartbeat.changes on hand-written cases: each verdict, the counterexamples docs/design.md gives, records read
through div's record loop, the two entry points against each other on random input, and the state's bytes (a
strict decoder, and their size). The property over generated histories is in test_changes_properties.py."""

from __future__ import annotations

import random
import zlib
from dataclasses import replace

import numpy as np
import pytest
from vt_builder import RegionVt

from div import envelope as E
from div import keys as K
from div.archive import records_to_batch
from div.records import Kind, iter_records
from heartbeat.changes import (
    DELIVERED,
    MAGIC,
    ROLE_BY_KIND,
    ChangeFilter,
    ChangeState,
    Item,
    LogId,
    PartitionState,
    Phase,
    Role,
    StateError,
    Verdict,
    item,
    restore,
    role_of,
    swap_start,
    vector_matrix,
)

C, HB, EOP, PART, BAD, OTHER = (
    Role.CHANGE,
    Role.HEARTBEAT,
    Role.END_OF_PUSH,
    Role.PART,
    Role.UNDECODABLE,
    Role.OTHER,
)


def _items(*specs) -> list[Item]:
    """Items at consecutive positions from (role, region, rt_position, vector) prefixes."""
    return [Item(i, *spec) for i, spec in enumerate(specs)]


def _verdicts(f: ChangeFilter, items: list[Item]) -> list[Verdict]:
    return [f.step(it) for it in items]


def test_each_verdict():
    f = ChangeFilter.fresh(2)
    got = _verdicts(
        f,
        _items(
            (C,),  # bulk load, read with no earlier state: the snapshot
            (C, 1, 40),  # a bulk-load record's stray footer is not a coordinate
            (EOP,),
            (C, 0, 5),
            (C, 0, 5),  # redelivered
            (PART, 0, 5),  # a chunk cleanup with its change's footer
            (HB, -1, -1, (7, 2)),
            (C, 0, 6),  # position 6 of region 0 had no change: the heartbeat covered it
            (C, 1, 3),
            (C, 0, 8),
            (C, 2, 1),  # a region the store does not have
            (C, 0, -1),  # a footer without a position
            (BAD,),
            (OTHER,),
        ),
    )
    assert got == [
        Verdict.SNAPSHOT,
        Verdict.SNAPSHOT,
        Verdict.PASS,
        Verdict.NEW,
        Verdict.BELOW_RECORD,
        Verdict.PART,
        Verdict.PASS,
        Verdict.BELOW_HEARTBEAT,
        Verdict.NEW,
        Verdict.NEW,
        Verdict.NO_COORDINATE,
        Verdict.NO_COORDINATE,
        Verdict.UNDECODABLE,
        Verdict.PASS,
    ]
    assert f.state() == PartitionState(14, Phase.ONLINE, (8, 3), (8, 3))
    assert (
        f.counts[Verdict.NEW] == 3
        and f.counts[Verdict.SNAPSHOT] == 2
        and Verdict.BULK_SKIPPED not in f.counts
    )


def test_a_heartbeat_covers_only_its_regions_and_never_lowers_a_mark():
    f = ChangeFilter(PartitionState(10, Phase.ONLINE, (5, 9, -1), (5, 9, -1)))
    f.step(Item(10, HB, vector=(7, 3)))  # shorter than the store: region 2 untouched
    f.step(Item(11, HB, vector=(1, 1, 4, 99)))  # longer: region 3 is no region of this store
    f.step(Item(12, HB))  # a plain Venice heartbeat claims nothing
    assert f.marks == (7, 9, 4)


def test_the_regions_are_never_compared_with_each_other():
    # docs/design.md: W = (4, 9) from version N. Version N+1 writes (1, 10) having reached position 3 of region 0
    # (record vector (3, 10)), or replays (1, 7) having reached position 5 (vector (5, 7)). A lexicographic
    # comparison with (4, 9) drops the first, a new change, and delivers the second again; the rule does the opposite.
    assert (3, 10) < (4, 9) and (5, 7) > (4, 9)
    state = PartitionState(0, Phase.SKIP_BULK, (4, 9), (4, 9))
    assert _verdicts(ChangeFilter(state), _items((EOP,), (C, 0, 3), (C, 1, 10)))[1:] == [
        Verdict.BELOW_RECORD,
        Verdict.NEW,
    ]
    assert _verdicts(ChangeFilter(state), _items((EOP,), (C, 0, 5), (C, 1, 7)))[1:] == [
        Verdict.NEW,
        Verdict.BELOW_RECORD,
    ]


def test_a_followed_version_skips_its_bulk_load_and_keeps_the_marks():
    old = PartitionState(33, Phase.ONLINE, (4, 9), (4, 8))
    new = old.follow()
    assert new == PartitionState(0, Phase.SKIP_BULK, (4, 9), (4, 8))
    got = _verdicts(ChangeFilter(new), _items((C,), (PART,), (C,), (EOP,), (C, 1, 9), (C, 1, 10)))
    # seen (4, 8) came along: position 9 of region 1 was covered by a heartbeat of the old version, not a change
    assert got == [Verdict.BULK_SKIPPED, Verdict.PART, Verdict.BULK_SKIPPED, Verdict.PASS] + [
        Verdict.BELOW_HEARTBEAT,
        Verdict.NEW,
    ]
    # a reader still in the old version's snapshot has nothing to keep: it takes the new version's snapshot
    assert PartitionState(3, Phase.SNAPSHOT, (-1, -1), (-1, -1)).follow() == PartitionState.fresh(2)
    state = ChangeState("s", 4, 2, {0: old})
    assert state.follow(5) == ChangeState("s", 5, 2, {0: new})
    with pytest.raises(ValueError, match="not newer"):
        state.follow(4)


def test_swap_start_skips_to_the_first_change_the_reader_lacks_not_to_a_heartbeat():
    # docs/design.md: W = (5, 2, 2). In the new version the leader wrote (2, 3) before its heartbeat, whose vector
    # (5, 2, 1) holds only acknowledged positions. That heartbeat is the last one ≤ W, yet (2, 3) lies before it.
    new = _items((C,), (EOP,), (C, 2, 0), (C, 2, 2), (C, 2, 3), (HB, -1, -1, (5, 2, 1)), (C, 1, 3))
    state = PartitionState(50, Phase.ONLINE, (5, 2, 2), (5, 2, 2))
    start, skipped = swap_start(new, state)
    assert start == PartitionState(4, Phase.ONLINE, (5, 2, 2), (5, 2, 2))
    assert skipped == {Verdict.BULK_SKIPPED: 1, Verdict.PASS: 1, Verdict.BELOW_RECORD: 2}
    f = ChangeFilter(start)
    assert [(it.position, f.step(it)) for it in new[4:]] == [
        (4, Verdict.NEW),
        (5, Verdict.PASS),
        (6, Verdict.NEW),
    ]
    # nothing new yet: the start is past everything the new version holds, with the heartbeats folded in
    start, _ = swap_start(new[:4], PartitionState(50, Phase.ONLINE, (5, 2, 9), (5, 2, 9)))
    assert start.position == 4 and start.phase is Phase.ONLINE
    # not even End of Push yet: from the start, the bulk load still to skip
    assert swap_start(new[:1], state)[0] == PartitionState(1, Phase.SKIP_BULK, (5, 2, 2), (5, 2, 2))


def test_a_replay_that_resolves_conflicts_in_another_order():
    # Pinned, not endorsed: the rule delivers coordinates exactly once, not a serialisation of the store. Version N
    # wrote w* = (0, 5), the newest write of key k, before it processed w_old = (1, 3), an older write of k that
    # then lost conflict resolution and was never written to N. The reader had W = (5, 2) when it followed N+1,
    # whose replay processed w_old first: it won there (N+1 did not have w* yet) and was written, then w*.
    f = ChangeFilter(PartitionState(90, Phase.ONLINE, (5, 2), (5, 2)).follow())
    got = _verdicts(f, _items((C,), (EOP,), (C, 1, 3), (C, 0, 5)))
    assert got[2:] == [Verdict.NEW, Verdict.BELOW_RECORD]
    # A client that applies the events in this order holds w_old for k; one that applies an event only when its
    # logical timestamp is not older than the key's (Venice's own rule) keeps w*. Had a heartbeat of N covered
    # (1, 3) while no change was there, w_old would be a duplicate below that heartbeat:
    f = ChangeFilter(PartitionState(90, Phase.ONLINE, (5, 3), (5, 2)).follow())
    assert _verdicts(f, _items((EOP,), (C, 1, 3)))[1] is Verdict.BELOW_HEARTBEAT


def test_restore_is_the_state_a_reader_from_the_start_had():
    log = _items((C,), (EOP,), (C, 0, 4), (C, 1, 2), (HB, -1, -1, (3, 2)), (C, 0, 5), (C, 0, 5), (C, 1, 3))
    f = ChangeFilter.fresh(2)
    for it in log:
        assert restore(log, it.position, 2) == f.state()
        f.step(it)
    assert restore(log, len(log), 2) == f.state()
    # the record at (0, 4) is above the heartbeat's vector (3, 2): a restore from the heartbeat alone would miss it
    assert restore(log, 5, 2).marks == (4, 2)


def test_records_must_come_once_in_vt_order():
    f = ChangeFilter(PartitionState(10, Phase.ONLINE, (1,), (1,)))
    with pytest.raises(ValueError, match="position 9 is before the next one to read"):
        f.step(Item(9, C, 0, 5))
    with pytest.raises(ValueError, match="position 12 follows 12"):
        f.step_batch([11, 12, 12], [C, C, C], [0, 0, 0], [2, 3, 4])
    assert f.step(Item(14, C, 0, 5)) is Verdict.NEW  # gaps (compaction, transaction markers) are fine


# -- records through div's one record loop ---------------------------------------------------------------------------


def test_items_of_real_venice_records():
    vt = RegionVt(region=1, chunked=True)
    at = {
        "sop": vt.start_of_push(),
        "eop": vt.end_of_push(),
        "put": vt.put(b"k1", b"v1", src=0, rt_offset=10),
        "heartbeat": vt.heartbeat(origin=1, origin_offset=12, vector=[10, 12, 11]),
        "manifest": vt.put(b"k1", b"x" * 25, src=2, rt_offset=13, chunk_size=10),
        "delete": vt.delete(b"k1", src=2, rt_offset=14),  # also cleans up the manifest's chunks
        "bad_hbw": vt.raw(K.HEARTBEAT_KEY, vt.records[3].value, [("hbw", b"\x48\x01\xff")]),
        "garbage": vt.raw(K.data_key(b"k3"), b"\x00\x0e garbage"),
    }
    batch = records_to_batch(
        [("store_v1", 0, off, r.key, r.value, 0, 0, r.headers) for off, r in enumerate(vt.records)]
    )
    items = [item(rec, chunked=True) for rec in iter_records(batch, E.EnvelopeCodec())]
    by_position = {it.position: it for it in items}
    assert by_position[at["sop"]].role is Role.OTHER and by_position[at["eop"]].role is Role.END_OF_PUSH
    assert by_position[at["put"]] == Item(at["put"], Role.CHANGE, 0, 10)
    assert by_position[at["heartbeat"]] == Item(at["heartbeat"], Role.HEARTBEAT, vector=(10, 12, 11))
    assert by_position[at["manifest"]] == Item(at["manifest"], Role.CHANGE, 2, 13)
    assert [it.role for it in items[at["heartbeat"] + 1 : at["manifest"]]] == [Role.PART] * 3  # the chunks
    assert by_position[at["delete"]] == Item(at["delete"], Role.CHANGE, 2, 14)
    cleanup = items[at["delete"] + 1 : at["bad_hbw"]]
    assert [(it.role, it.region, it.rt_position) for it in cleanup] == [(Role.PART, 2, 14)] * 3
    assert by_position[at["bad_hbw"]].role is Role.UNDECODABLE
    assert by_position[at["garbage"]].role is Role.UNDECODABLE
    f = ChangeFilter.fresh(3)
    verdicts = [f.step(it) for it in items]
    assert [v for v in verdicts if v in DELIVERED] == [Verdict.NEW] * 3
    assert (
        Verdict.BELOW_RECORD not in f.counts
    )  # the chunk cleanups are parts of their change, not copies of it
    # the same records in a version that is not chunked: a key is a key, whatever bytes it ends with
    assert item(next(iter_records(batch.slice(at["put"], 1), E.EnvelopeCodec()))).role is Role.CHANGE


def test_every_kind_has_a_role():
    assert {Kind(k): Role(r) for k, r in enumerate(ROLE_BY_KIND)} == {
        **{k: Role.OTHER for k in Kind},
        Kind.PUT: Role.CHANGE,
        Kind.DELETE: Role.CHANGE,
        Kind.UPDATE: Role.CHANGE,
        Kind.MANIFEST: Role.CHANGE,
        Kind.CHUNK: Role.PART,
        Kind.HEARTBEAT: Role.HEARTBEAT,
        Kind.END_OF_PUSH: Role.END_OF_PUSH,
        Kind.UNDECODABLE: Role.UNDECODABLE,
    }
    value_key, chunk_key = K.data_key(b"k" + K.NON_CHUNK_SUFFIX), K.data_key(b"k\x00\x01")
    assert role_of(Kind.DELETE, chunk_key, chunked=True) is Role.PART
    assert role_of(Kind.PUT, value_key, chunked=True) is Role.CHANGE
    assert role_of(Kind.DELETE, chunk_key, chunked=False) is Role.CHANGE


# -- the two entry points --------------------------------------------------------------------------------------------


def _random_items(rng: random.Random, n_regions: int, start: int) -> list[Item]:
    out, position = [], start
    for _ in range(rng.randint(0, 60)):
        position += rng.choice([1, 1, 1, 2, 5])
        role = rng.choice([C, C, C, C, HB, HB, EOP, PART, BAD, OTHER])
        if role == C:
            out.append(Item(position, role, rng.randint(-1, n_regions), rng.randint(-2, 12)))
        elif role == HB:
            vector = (
                None if rng.random() < 0.2 else tuple(rng.randint(-1, 12) for _ in range(rng.randint(1, 6)))
            )
            out.append(Item(position, role, vector=vector))
        else:
            out.append(Item(position, role, rng.randint(-1, 2), rng.randint(-1, 9)))
    return out


@pytest.mark.parametrize("seed", range(200))
def test_step_batch_gives_the_verdicts_and_state_of_step(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 5)
    state = PartitionState.fresh(n)
    if rng.random() < 0.5:
        marks = tuple(rng.randint(-1, 6) for _ in range(n))
        state = PartitionState(3, rng.choice(list(Phase)), marks, tuple(rng.randint(-1, m) for m in marks))
    one, many = ChangeFilter(state), ChangeFilter(state)
    for _ in range(rng.randint(1, 4)):
        items = _random_items(rng, n, one.position - 1)
        expect = [int(one.step(it)) for it in items]
        # the matrix may be wider than the store (ignored columns); without any vector it may be left out
        vectors = vector_matrix([it.vector for it in items], n + rng.randint(0, 2))
        if not any(it.vector for it in items) and rng.random() < 0.5:
            vectors = None
        got = many.step_batch(
            np.array([it.position for it in items], dtype=np.int64),
            np.array([it.role for it in items], dtype=np.int8),
            np.array([it.region for it in items], dtype=np.int32),
            np.array([it.rt_position for it in items], dtype=np.int64),
            vectors,
        )
        assert got.dtype == np.int8 and got.tolist() == expect
        assert many.state() == one.state() and many.counts == one.counts


# -- the state as bytes ----------------------------------------------------------------------------------------------


def _state(n_regions: int = 3, partitions: int = 2, big: bool = True) -> ChangeState:
    base = 1_000_000_000 if big else 0
    return ChangeState(
        "orders",
        7,
        n_regions,
        {
            p: PartitionState(
                base + 1234 * p,
                Phase.ONLINE,
                tuple(base + 17 * r + p for r in range(n_regions)),
                tuple(base + 17 * r + p - (r == 1) for r in range(n_regions)),
            )
            for p in range(partitions)
        },
    )


def test_state_bytes_round_trip():
    for state in (
        _state(),
        _state(1, 0),
        _state(5, 3, big=False),
        ChangeState("s", 2, 2, {9: PartitionState.fresh(2)}),
        ChangeState(
            "s", 2, 2, {1: PartitionState(4, Phase.ONLINE, (3, 4), (3, 2), chunked=True, ended=True)}
        ),
        ChangeState("s", 2, 2, {1: PartitionState(4, Phase.SKIP_BULK, (3, 4), (3, 2), ended=True)}),
        ChangeState(
            "s",
            2,
            2,
            {1: PartitionState(4, Phase.ONLINE, (3, 4), (3, 2), log_id=LogId(3, bytes(range(8))))},
            region=4,
        ),
        _state().with_region(0),
    ):
        data = state.to_bytes()
        assert data[:4] == MAGIC and data[4] == 2
        assert ChangeState.from_bytes(data) == state
    assert _state().partition(5) == PartitionState.fresh(3)  # a partition never read starts fresh


def _with_crc(body: bytes) -> bytes:
    return body + zlib.crc32(body).to_bytes(4, "big")


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda b: b[:6], "truncated"),
        (lambda b: b"PAR1" + b[4:], "not a tidegauge change-capture state"),
        (
            lambda b: _with_crc(b[:4] + b"\x03" + b[5:-4]),
            "format version 3 .written by a newer tidegauge.: this tidegauge reads versions 1, 2",
        ),
        (lambda b: b[:-5] + bytes([b[-5] ^ 1]) + b[-4:], "damaged .CRC32 mismatch."),
        (lambda b: b[:20] + b[21:], "damaged .CRC32 mismatch."),
        (lambda b: _with_crc(b[:-4] + b"\x00"), "1 bytes after the last partition"),
        (lambda b: _with_crc(b[:-6]), "invalid: truncated"),
    ],
)
def test_the_decoder_refuses_damaged_bytes(damage, message):
    with pytest.raises(StateError, match=message):
        ChangeState.from_bytes(damage(_state().to_bytes()))


def _body(*longs: int, store: bytes = b"s") -> bytes:
    from div.avro_bits import write_long

    return MAGIC + b"\x01" + write_long(len(store)) + store + b"".join(write_long(x) for x in longs)


def test_a_format_1_state_is_read_with_no_region_and_no_log_identity():
    """States written before format 2 resume as before (unchecked); the flag bit 16 meant nothing then."""
    state = ChangeState.from_bytes(_with_crc(_body(1, 1, 1, 0, 5, 2, 3, 0)))
    assert state.region is None and state.partitions == {0: PartitionState(5, Phase.ONLINE, (3,), (3,))}


@pytest.mark.parametrize(
    "longs,message",
    [
        (
            (1, 1, 1, 0, 5, 19, 3, 0),
            "unknown phase 19",
        ),  # version 1, 1 region, 1 partition: p0 position 5 phase 19 (3 + the two flags' bits 4 and 16)
        ((1, 1, 2, 3, 5, 2, 3, 0, 3, 5, 2, 3, 0), "partition 3 after 3"),
        ((1, 1, 1, 0, 5, 2, 3, 5), "seen .-2,. must lie between -1 and marks"),
        ((1, 1, 1, 0, 5, 2, -2, 0), "seen .-2,. must lie between"),
        ((1, 0, 0), "n_regions 0 out of range"),
        ((-1, 1, 0), "version -1 is negative"),
    ],
)
def test_the_decoder_refuses_well_framed_nonsense(longs, message):
    with pytest.raises(StateError, match=message):
        ChangeState.from_bytes(_with_crc(_body(*longs)))
    with pytest.raises(StateError, match="a change-capture state names its store"):
        ChangeState.from_bytes(_with_crc(_body(1, 1, 0, store=b"")))


def test_state_size_per_partition():
    # What a reader stores per VT partition, with positions and RT positions around 10^9 (5-byte varints): the
    # partition id, the next position, the phase, W (5 bytes a region) and W - seen (1 byte a region).
    # 1 + 5 + 1 + 5n + n bytes
    for n, expect in ((3, 25), (5, 37)):
        one, many = _state(n, 1).to_bytes(), _state(n, 11).to_bytes()
        assert (len(many) - len(one)) / 10 == expect
    # positions below 64 (a young topic) take a byte each: 3 + 2n
    young = PartitionState(40, Phase.ONLINE, (5, 6, 7), (5, 6, 7))
    assert (
        len(ChangeState("orders", 7, 3, {1: young}).to_bytes()) - len(ChangeState("orders", 7, 3).to_bytes())
        == 9
    )
    # the whole state of a 3-region store with one partition: magic, format, the store name, version, region and
    # partition counts, the partition, CRC32
    assert len(_state(3, 1).to_bytes()) == 4 + 1 + 1 + len("orders") + 1 + 1 + 1 + 1 + 25 + 4
    # the log identity (format 2): its offset and 8 digest bytes, 13 bytes near 10^9
    ids = ChangeState("orders", 7, 3, {1: replace(young, log_id=LogId(1_000_000_000, bytes(8)))})
    assert len(ids.to_bytes()) - len(ChangeState("orders", 7, 3, {1: young}).to_bytes()) == 13
