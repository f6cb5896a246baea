"""heartbeat.cuts: a time, the cut of a time, floor / ceil / exact of a cut in a VT, and cut.json."""

from __future__ import annotations

import numpy as np
import pytest

from heartbeat.cuts import (
    FROM_RT,
    Cut,
    CutError,
    CutPartition,
    HeartbeatMark,
    PositionFinder,
    Positions,
    above,
    aligned_cut,
    exact_cut,
    format_time,
    parse_time,
    positions,
)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1764374400000", 1764374400000),
        ("2025-11-29T00:00:00Z", 1764374400000),
        ("2025-11-29T02:00:00+02:00", 1764374400000),
        ("2025-11-29T00:00:00.123Z", 1764374400123),
        (" 0 ", 0),
    ],
)
def test_parse_time(text: str, ms: int) -> None:
    assert parse_time(text) == ms


def test_a_time_without_a_zone_or_not_a_time_is_refused_by_name() -> None:
    with pytest.raises(CutError, match="no zone"):
        parse_time("2025-11-29T00:00:00")
    with pytest.raises(CutError, match="not a time"):
        parse_time("yesterday")
    assert format_time(1764374400123) == "2025-11-29T00:00:00.123Z"


def test_exact_cut_takes_the_highest_offset_at_or_before_the_time_not_the_first() -> None:
    # CreateTime need not rise with offsets: offset 3 (t=5) is inside although offset 2 (t=20) is not
    assert exact_cut([0, 1, 2, 3, 4], [1, 2, 20, 5, 30], 10) == 3
    assert exact_cut([0, 1], [11, 12], 10) == -1
    assert exact_cut([7, 8], [11, 12], 10, current=5) == 5  # fed batch after batch


def test_aligned_cut_uses_heartbeats_at_or_before_the_time_from_every_vt() -> None:
    marks = [
        HeartbeatMark(10, 0, 100, 1_000),
        HeartbeatMark(11, 1, 40, 1_000),
        HeartbeatMark(20, 0, 200, 2_000),  # after T
        HeartbeatMark(5, 1, 60, 1_500),  # another region's VT, earlier offset there
        HeartbeatMark(6, 7, 60, 1_500),  # a region the store does not have
    ]
    assert aligned_cut(marks, 1_500, 3) == (100, 60, -1)
    assert aligned_cut(marks[2:3], 5_000, 3, current=(100, 60, -1)) == (200, 60, -1)


def _heartbeats() -> list[tuple[int, tuple[int, ...]]]:
    return [(10, (5, 3)), (20, (8, 3)), (30, (8, 9)), (40, (12, 9)), (50, (20, 20))]


@pytest.mark.parametrize(
    ("cut", "expected"),
    [
        ((8, 3), Positions(20, 20, True)),
        ((9, 5), Positions(20, 40, False)),  # between heartbeats
        ((4, 2), Positions(None, 10, False)),  # before the first
        ((25, 25), Positions(50, None, False)),  # the region is behind
        ((12, 2), Positions(None, 40, False)),  # no heartbeat <= C componentwise
    ],
)
def test_floor_ceil_exact(cut: tuple[int, int], expected: Positions) -> None:
    assert positions(_heartbeats(), cut) == expected
    finder = PositionFinder(cut)
    hbs = _heartbeats()
    offsets = np.array([o for o, _ in hbs])
    vectors = np.array([v for _, v in hbs])
    finder.feed_batch(offsets[:2], vectors[:2])
    finder.feed_batch(offsets[2:], vectors[2:])
    assert finder.positions == expected


def test_a_short_vector_names_nothing_of_the_regions_it_leaves_out() -> None:
    assert positions([(3, (4,))], (4, -1)) == Positions(3, 3, True)
    assert positions([(3, (4,))], (4, 0)) == Positions(3, None, False)


def test_floor_and_ceil_never_decrease_as_the_cut_grows() -> None:
    rng = np.random.default_rng(7)
    vectors = np.maximum.accumulate(rng.integers(0, 5, size=(60, 3)), axis=0)
    hbs = [(i * 3, tuple(int(x) for x in v)) for i, v in enumerate(vectors)]
    last = Positions(-1, -1, False)
    for t in range(0, int(vectors.max()) + 2):
        pos = positions(hbs, (t, t, t))
        assert (pos.floor if pos.floor is not None else -1) >= last.floor
        assert (pos.ceil if pos.ceil is not None else 10**9) >= last.ceil
        last = Positions(
            pos.floor if pos.floor is not None else -1, pos.ceil if pos.ceil is not None else 10**9, False
        )


def test_above() -> None:
    assert not above(0, 5, (5, 1))
    assert above(0, 6, (5, 1))
    assert above(2, 0, (5, 1))  # a region the cut does not name


def test_cut_json_round_trip_and_strict_reading() -> None:
    cut = Cut(
        "s",
        3,
        1764374400000,
        FROM_RT,
        {1: CutPartition(1, {0: 10, 1: -1}, {0: Positions(4, 9, False), 1: Positions(None, None, False)})},
    )
    back = Cut.from_json(cut.to_json())
    assert back == cut
    assert back.vector(1) == (10, -1)
    assert back.vector(1, 3) == (10, -1, -1)
    with pytest.raises(CutError, match="no partition 2"):
        back.vector(2)
    doc = cut.to_dict()
    doc["partitions"][0]["rt"]["0"] = "ten"
    import json

    with pytest.raises(CutError, match=r"x\.json: partitions\[0\]: rt\[0\] is 'ten'"):
        Cut.from_json(json.dumps(doc), "x.json")
    with pytest.raises(CutError, match="'from' is missing"):
        Cut.from_json('{"store": "s", "version": 1, "at_ms": 0, "partitions": []}')
    with pytest.raises(CutError, match="not JSON"):
        Cut.from_json("{")


def test_above_many_is_above_for_every_coordinate():
    from heartbeat.cuts import above, above_many

    cut = (3, -1, 7)
    coords = [(r, o) for r in (-1, 0, 1, 2, 3) for o in (-1, 0, 3, 4, 7, 8)]
    got = above_many(np.array([r for r, _ in coords]), np.array([o for _, o in coords]), cut)
    assert got.tolist() == [above(r, o, cut) for r, o in coords]
