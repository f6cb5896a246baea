"""Starting change capture at a consistent cut (`heartbeat.changes.from_cut`), checked on generated histories.

The property: a reader that starts a version at cut C (W = C, the start `from_cut` folds out of the records'
coordinates) and reads on with the rule delivers every change above the cut exactly once and nothing at or below
it, whatever the lag of the heartbeats' vectors, failovers (lost tails, re-produced copies), redeliveries, chunked
values (a delivered change's chunks are never before the start) and noise; and a fold stopped anywhere and resumed
with the plain rule (a `ChangeReader` that stored its state while seeking) delivers the same.

Truth comes from the generator (tests/support/change_histories.py): the coordinates of the writes that won
conflict resolution. The cut is RT positions drawn per region (random, or a heartbeat's vector: an exact cut) at or
above the version's rewind point (the precondition: a replay that starts above the cut cannot deliver what lies
between). Two broken variants show the property can fail: starting at the floor (the last heartbeat whose vector is
<= C) when vectors lag skips changes in flight before it; starting at the floor with W empty delivers changes at or
below the cut.
"""

from __future__ import annotations

import random

import pytest
from change_histories import ChangeHistory, VersionLog, generated

from heartbeat.changes import (
    ChangeFilter,
    CutStart,
    Item,
    PartitionState,
    Phase,
    Role,
    Verdict,
    cut_marks,
    cut_state,
    from_cut,
)

SEEDS_PER_MIX = 25
CUTS_PER_VERSION = 4


def _heartbeats(log: VersionLog) -> list[Item]:
    return [it for it in log.items if it.role == Role.HEARTBEAT and it.vector]


def _cuts(h: ChangeHistory, log: VersionLog, rng: random.Random) -> list[tuple[int, ...]]:
    """Cuts at or above the version's rewind point: random positions, and heartbeat vectors (exact cuts)."""
    n = h.n_regions
    top = [
        max([q for t in log.tags if t and t[0] == "c" and t[1] == r for q in (t[2],)] + [log.rewind[r]]) + 2
        for r in range(n)
    ]
    out = []
    for _ in range(CUTS_PER_VERSION):
        out.append(tuple(rng.randint(log.rewind[r] - 1, top[r]) for r in range(n)))
    hbs = [hb.vector for hb in _heartbeats(log) if all(hb.vector[r] >= log.rewind[r] - 1 for r in range(n))]
    out += rng.sample(hbs, min(2, len(hbs)))
    return out


def _read(items: list[Item], state: PartitionState) -> list[Item]:
    """The changes the rule delivers reading `items` from `state`."""
    f = ChangeFilter(state)
    return [
        it for it in items if it.position >= state.position and f.step(it) in (Verdict.NEW, Verdict.SNAPSHOT)
    ]


def _floor(log: VersionLog, cut: tuple[int, ...]) -> int | None:
    below = [
        hb.position for hb in _heartbeats(log) if all(v <= c for v, c in zip(hb.vector, cut, strict=False))
    ]
    return below[-1] if below else None


def _violations(h, ph, log: VersionLog, cut, delivered: list[Item], start: int) -> list[str]:
    """What the delivered changes get wrong: truth is every written change above the cut, once."""
    want = {(r, q) for r, q in ph.changes if q > cut[r] and q >= log.rewind[r]}
    got = [(it.region, it.rt_position) for it in delivered]
    out = []
    if len(got) != len(set(got)):
        out.append(f"duplicates delivered: {sorted(g for g in set(got) if got.count(g) > 1)}")
    if missing := sorted(want - set(got)):
        out.append(f"never delivered: {missing}")
    if extra := sorted(set(got) - want):
        out.append(f"delivered at or below the cut (or never written): {extra}")
    for (
        it
    ) in delivered:  # a chunked value's chunks lie right before its change: none of them before the start
        i = it.position
        while i > 0 and log.items[i - 1].role == Role.PART and log.items[i - 1].region == -1:
            i -= 1
        if i < start:
            out.append(
                f"change ({it.region}, {it.rt_position}) at {it.position}: its chunks from {i}, start {start}"
            )
    if out:
        out.insert(0, f"seed {h.seed} mix {h.mix.name} partition {ph.partition} v{log.version} cut {cut}:")
    return out


def _cases():
    """(history, partition, the version read, cut, rng): the last version of each partition (caught up with
    every RT), and version 1 when it is the only one."""
    for h in generated(SEEDS_PER_MIX):
        rng = random.Random(f"cut:{h.mix.name}:{h.seed}")
        for ph in h.partitions:
            log = ph.versions[-1]
            for cut in _cuts(h, log, rng):
                yield h, ph, log, cut, rng


def test_from_a_cut_every_change_above_it_is_delivered_once_and_nothing_at_or_below_it():
    failures, cases, lagging, resumed = [], 0, 0, 0
    for h, ph, log, cut, rng in _cases():
        cases += 1
        state, _ = from_cut(log.items, cut, h.n_regions)
        assert state.marks == cut_marks(cut, h.n_regions) and state.seen == (-1,) * h.n_regions  # W = C
        assert state.phase is Phase.ONLINE or state.position <= log.eop  # no bulk load delivered
        delivered = _read(log.items, state)
        failures += _violations(h, ph, log, cut, delivered, state.position)
        floor = _floor(log, cut)
        lagging += floor is not None and state.position < floor
        # a fold stopped anywhere, stored, and resumed with the plain rule (what a reader does that stores its state
        # while it seeks) delivers the same
        k = rng.randint(0, len(log.items))
        fold = CutStart(cut, h.n_regions)
        done = any(fold.step(it) for it in log.items[:k])
        if not done:
            resumed += 1
            again = _read(log.items, fold.state())
            if again != delivered:
                failures.append(f"seed {h.seed} {h.mix.name} cut {cut}: resumed at {k} delivered {again}")
    assert not failures, "\n".join(failures[:20])
    assert cases > 500 and resumed > 100
    # vectors lag often enough that the start lies before the floor: the fold is needed, not the floor
    assert lagging > 20, lagging


def _broken(kind: str, log: VersionLog, cut, n: int) -> tuple[PartitionState, int]:
    floor = _floor(log, cut)
    position = (floor + 1) if floor is not None else log.eop + 1
    marks = cut_marks(cut, n) if kind == "floor" else (-1,) * n
    return PartitionState(position, Phase.ONLINE, marks, (-1,) * n), position


@pytest.mark.parametrize(
    "kind, says",
    [("floor", "never delivered"), ("empty W at the floor", "delivered at or below the cut")],
)
def test_the_property_fails_for_a_start_taken_from_heartbeats_alone(kind, says):
    """Ablations: the floor as the start where vectors lag (changes in flight before it are skipped), and the floor
    with W empty (changes between the floor's vector and the cut come again)."""
    failures = []
    for h, ph, log, cut, _ in _cases():
        state, start = _broken(kind, log, cut, h.n_regions)
        failures += [
            line for line in _violations(h, ph, log, cut, _read(log.items, state), start) if says in line
        ]
    assert len(failures) > 10, failures


def test_a_record_that_cannot_be_placed_is_where_the_reader_starts_and_chunks_go_with_their_change():
    cut = (5, 5)
    items = [
        Item(0, Role.CHANGE),  # bulk load
        Item(1, Role.END_OF_PUSH),
        Item(2, Role.CHANGE, 0, 3),  # at or below the cut: folded
        Item(3, Role.HEARTBEAT, vector=(9, 5)),  # above the cut in region 0: the state keeps W = C
        Item(4, Role.PART),  # a chunk of the next change
        Item(5, Role.CHANGE, 1, 6),  # above the cut: the reader starts at its chunk
    ]
    state, counts = from_cut(items, cut, 2)
    assert (state.position, state.phase, state.marks) == (4, Phase.ONLINE, (5, 5))
    assert counts == {Verdict.BULK_SKIPPED: 1, Verdict.PASS: 2, Verdict.BELOW_HEARTBEAT: 1, Verdict.PART: 1}
    noise = [*items[:3], Item(3, Role.CHANGE, 7, 1), *items[3:]]  # a region outside the store: maybe above
    noise = [it._replace(position=i) for i, it in enumerate(noise)]
    assert from_cut(noise, cut, 2)[0].position == 3
    undecodable = [
        *items[:2],
        Item(2, Role.UNDECODABLE),
        *[it._replace(position=i + 1) for i, it in enumerate(items[2:], 2)],
    ]
    assert from_cut(undecodable, cut, 2)[0].position == 2
    # nothing above the cut yet: a state to resume from after what was folded, the waiting chunk kept
    assert from_cut(items[:5], cut, 2)[0].position == 4
    assert from_cut(items[:4], cut, 2)[0].position == 4
    with pytest.raises(ValueError, match="outside a store of 2 regions"):
        cut_state((1, 2, 3), 2)
    assert cut_state((1,), 3).marks == (1, -1, -1)  # a region the cut does not name has nothing in it
