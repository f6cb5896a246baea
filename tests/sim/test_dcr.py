"""The simulator's conflict resolution (`sim.dcr`): Venice's merge rule, as `leapfrog.repair` states it, plus the
replay of the same RT write after a failover; and Venice's legacy per-key offset vector."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leapfrog.repair import DELETE, PUT, Record, dcr_apply, java_bytes_hash
from sim.dcr import ReplicaStore, Winner

# Two values whose Java hashes collide (h = 31**n + sum(b[i] * 31**i): 'a' + 31*'A' == 'B' + 31*'B'), at a short
# length (the loop) and past 32 bytes (numpy's dot product).
COLLIDE = (b"aA", b"BB")
COLLIDE_LONG = (b"aA" + bytes(range(40)), b"BB" + bytes(range(40)))


def _low_high() -> tuple[bytes, bytes]:
    a, b = b"value-1", b"value-2"
    return (a, b) if java_bytes_hash(a) < java_bytes_hash(b) else (b, a)


LOW, HIGH = _low_high()


def test_the_collisions_collide():
    for a, b in (COLLIDE, COLLIDE_LONG):
        assert a != b and java_bytes_hash(a) == java_bytes_hash(b)
    assert java_bytes_hash(LOW) < java_bytes_hash(HIGH)


def test_higher_timestamp_wins_whatever_the_op_hash_or_coordinate():
    s = ReplicaStore()
    assert s.resolve(b"k", 100, 2, 9, HIGH) == []
    assert s.resolve(b"k", 99, 2, 10, None) is None  # an older DELETE loses too
    assert s.resolve(b"k", 101, 0, 0, LOW) == []  # lower hash, lower region and offset: newer wins
    assert s.resolve(b"k", 102, 0, 1, None) == []
    assert s.resolve(b"k", 103, 0, 2, LOW) == []  # a newer PUT beats a stored DELETE
    assert s.winner(b"k") == Winner(103, False, java_bytes_hash(LOW), 0, 2)


def test_equal_timestamps_a_delete_wins():
    s = ReplicaStore()
    assert s.resolve(b"k", 100, 0, 1, HIGH) == []
    assert s.resolve(b"k", 100, 1, 0, None) == []  # DELETE beats a stored PUT
    assert s.resolve(b"k", 100, 0, 2, None) == []  # ... and a stored DELETE
    assert s.resolve(b"k", 100, 2, 5, HIGH) is None  # a stored DELETE stays against a PUT
    assert s.winner(b"k") == Winner(100, True, None, 0, 2)


def test_equal_timestamps_the_strictly_higher_hash_wins():
    s = ReplicaStore()
    assert s.resolve(b"k", 100, 2, 50, HIGH) == []
    assert s.resolve(b"k", 100, 0, 1, LOW) is None  # not by region or offset
    t = ReplicaStore()
    assert t.resolve(b"k", 100, 2, 50, LOW) == []
    assert t.resolve(b"k", 100, 0, 1, HIGH) == []
    assert t.winner(b"k") == Winner(100, False, java_bytes_hash(HIGH), 0, 1)


@pytest.mark.parametrize("pair", [COLLIDE, COLLIDE_LONG, (b"same", b"same")])
def test_equal_timestamps_equal_hashes_keep_the_stored_value(pair):
    s = ReplicaStore()
    assert s.resolve(b"k", 100, 0, 1, pair[0]) == []
    assert s.resolve(b"k", 100, 2, 9, pair[1]) is None
    assert s.winner(b"k") == Winner(100, False, java_bytes_hash(pair[0]), 0, 1)


@pytest.mark.parametrize("value", [HIGH, None])
def test_the_same_write_again_is_applied_again(value):
    # a new leader re-processing RT records after a failover: same timestamp, same (region, RT offset)
    s = ReplicaStore(legacy_vectors=True)
    assert s.resolve(b"k", 100, 1, 5, value) == [0, 5]
    assert s.resolve(b"k", 100, 1, 5, value) == [0, 5]
    assert s.resolve(b"k", 100, 1, 6, value) == ([0, 6] if value is None else None)  # another write: the rule
    assert s.resolve(b"k", 99, 1, 4, value) is None  # a replayed older write still loses


def test_a_poisoned_write_is_compared_as_written_and_stored_as_poisoned():
    s = ReplicaStore()
    # the RT write carries LOW; the poisoned leader stores HIGH: a later tie compares with HIGH's hash
    assert s.resolve(b"k", 100, 0, 1, LOW, stored_value=HIGH) == []
    assert s.winner(b"k").value_hash == java_bytes_hash(HIGH)
    assert s.resolve(b"k", 100, 1, 1, LOW) is None  # LOW's hash is below the stored (HIGH's)
    t = ReplicaStore()
    assert t.resolve(b"k", 100, 0, 1, HIGH, stored_value=LOW) == []
    assert t.resolve(b"k", 100, 1, 1, HIGH) == []  # the repair of a poisoned region: its stored hash is LOW's
    # the incoming write is judged by its RT value, not by what a poisoned leader would store
    u = ReplicaStore()
    assert u.resolve(b"k", 100, 0, 1, HIGH) == []
    assert u.resolve(b"k", 100, 1, 1, LOW, stored_value=HIGH + b"x") is None


def test_keys_are_independent_and_copy_is_deep():
    s = ReplicaStore(legacy_vectors=True, track_values=True)
    assert s.resolve(b"a", 5, 0, 0, LOW) == [0]
    assert s.resolve(b"b", 1, 1, 0, None) == [0, 0]
    assert len(s) == 2 and s.winner(b"c") is None
    c = s.copy()
    assert c.resolve(b"a", 5, 1, 3, HIGH) == [0, 3]
    assert s.winner(b"a") == Winner(5, False, java_bytes_hash(LOW), 0, 0)  # the original is untouched
    assert s.resolve(b"a", 6, 2, 1, LOW) == [0, 0, 1]  # ... and so is its vector
    assert c.winner(b"b") == s.winner(b"b") and c.values == {} and c.legacy


def test_out_of_range_coordinates_are_refused():
    s = ReplicaStore()
    with pytest.raises(ValueError):
        s.resolve(b"k", 1, 16, 0, LOW)
    with pytest.raises(ValueError):
        s.resolve(b"k", 1, 0, 1 << 40, LOW)
    with pytest.raises(ValueError):
        s.resolve(b"k", -1, 0, 0, LOW)
    s.resolve(b"k", (1 << 62) - 1, 15, (1 << 40) - 1, LOW)  # the edges fit
    assert s.winner(b"k") == Winner((1 << 62) - 1, False, java_bytes_hash(LOW), 15, (1 << 40) - 1)


def test_legacy_vector_follows_venices_old_rule():
    s = ReplicaStore(legacy_vectors=True)
    assert s.resolve(b"k", 1, 2, 40, LOW) == [0, 0, 40]  # fresh: zeros up to the region, then its offset
    assert s.resolve(b"k", 2, 0, 7, LOW) == [7, 0, 40]
    assert s.resolve(b"k", 1, 1, 9, HIGH) is None  # a loser leaves the vector alone
    assert s.resolve(b"k", 3, 1, 9, None) == [7, 9, 40]
    assert s.resolve(b"k", 3, 2, 41, HIGH) is None  # a tie lost to the stored DELETE leaves it alone too
    assert s.resolve(b"k", 3, 2, 42, None) == [7, 9, 42]


# ------------------------------------------------------------------- differential: the store is Venice's merge
VALUES = (LOW, HIGH, *COLLIDE, *COLLIDE_LONG, b"", b"\xff" * 33, b"\x80" * 7)

writes = st.lists(
    st.tuples(
        st.integers(0, 3),  # logical timestamp: few, so ties are common
        st.integers(0, 3),  # source region
        st.sampled_from((*VALUES, None)),  # None: a DELETE
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=600, deadline=None)
@given(writes)
def test_the_store_folds_writes_as_leapfrog_repair_dcr_apply(history):
    """Every write has its own coordinate (no replays): then every decision, and the final winner, are what
    `leapfrog.repair.dcr_apply` (Venice's merge, the repair planner's model) gives."""
    s = ReplicaStore()
    stored: Record | None = None
    next_offset = [0, 0, 0, 0]
    for ts, region, value in history:
        off = next_offset[region]
        next_offset[region] += 1
        rec = Record(DELETE if value is None else PUT, value, ts, region, off)
        stored = dcr_apply(stored, rec)
        applied = s.resolve(b"k", ts, region, off, value)
        assert (applied is not None) == (stored is rec)
        w = s.winner(b"k")
        assert w == Winner(
            stored.logical_ts,
            stored.op == DELETE,
            None if stored.op == DELETE else java_bytes_hash(stored.value),
            stored.region,
            stored.offset,
        )
