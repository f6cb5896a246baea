"""WatermarkTracker: random interleavings of processed/acked/failed against a brute-force model, and the RT DIV
state it keeps at the watermark."""

from __future__ import annotations

import random

import pytest
from heartbeat_fixtures import rt_streams

from div import envelope as E
from div.validator import PartitionValidator
from heartbeat.watermarks import WatermarkTracker


def _truth(records: list[tuple[int, list[int]]], acked: set[int], initial: int) -> int:
    """Highest offset o with every send of every processed record ≤ o acked (brute force)."""
    mark = initial
    for offset, sends in records:
        if all(s in acked for s in sends):
            mark = offset
        else:
            break
    return mark


@pytest.mark.parametrize("seed", range(40))
def test_random_interleavings_match_the_model(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 4)
    initial = [rng.choice([-1, -1, 5, 40]) for _ in range(n)]
    tracker = WatermarkTracker(n, initial)
    processed: list[list[tuple[int, list[int]]]] = [[] for _ in range(n)]
    next_offset = [i + 1 + rng.randint(0, 2) for i in initial]
    unacked: list[int] = []  # tokens sent, not yet reported
    acked: set[int] = set()
    failed_at: dict[int, int] = {}  # region -> lowest failed offset
    token_region: dict[int, tuple[int, int]] = {}
    tokens = iter(range(1, 10**9))
    previous = list(initial)
    n_failed = 0
    for _ in range(rng.randint(50, 400)):
        action = rng.random()
        if action < 0.45:
            r = rng.randrange(n)
            sends = [next(tokens) for _ in range(rng.choice([0, 0, 1, 1, 1, 2, 3]))]
            offset = next_offset[r]
            next_offset[r] += rng.choice([1, 1, 1, 2, 5])  # RT offsets may have holes
            for s in sends:
                token_region[s] = (r, offset)
                if rng.random() < 0.1:  # the delivery report is served before done()
                    tracker.acked(s)
                    acked.add(s)
                else:
                    unacked.append(s)
            tracker.processed(r, offset, sends)
            processed[r].append((offset, sends))
        elif action < 0.97 and unacked:
            s = unacked.pop(rng.randrange(len(unacked)))  # any order
            tracker.acked(s)
            acked.add(s)
        elif unacked and rng.random() < 0.3:
            s = unacked.pop(rng.randrange(len(unacked)))
            tracker.failed(s)
            n_failed += 1
            r, o = token_region[s]
            failed_at[r] = min(o, failed_at.get(r, o))
        marks = tracker.watermarks()
        for r in range(n):
            assert marks[r] == _truth(processed[r], acked, initial[r])
            assert marks[r] >= previous[r], "a watermark went backwards"
            if r in failed_at:
                assert marks[r] < failed_at[r], "a watermark passed a failed send"
        previous = marks
        assert tracker.pending_sends == len(unacked) + n_failed  # a failed send is never acknowledged
    assert tracker.broken == bool(failed_at)
    # Acknowledge the rest: without failures every region reaches its last processed record.
    for s in unacked:
        tracker.acked(s)
    for r in range(n):
        if r not in failed_at:
            assert tracker.watermark(r) == (processed[r][-1][0] if processed[r] else initial[r])
        else:
            assert tracker.watermark(r) < failed_at[r]


def test_processing_out_of_order_or_twice_is_refused():
    t = WatermarkTracker(2, [3, -1])
    with pytest.raises(ValueError, match="not after"):
        t.processed(0, 3)
    t.processed(1, 0, ["a"])
    with pytest.raises(ValueError, match="not after"):
        t.processed(1, 0)
    with pytest.raises(ValueError, match="region 2"):
        t.processed(2, 0)
    with pytest.raises(ValueError, match="one entry per region"):
        WatermarkTracker(2, [1])


def test_rt_div_state_is_the_state_at_the_watermark():
    streams = rt_streams(2, 300, seed=17)
    codec = E.EnvelopeCodec()
    rng = random.Random(3)
    t = WatermarkTracker(2)
    unacked: list[int] = []
    tokens = iter(range(1, 10**9))
    pos = [0, 0]
    checked = 0
    while pos[0] < len(streams[0]) or pos[1] < len(streams[1]) or unacked:
        r = rng.randrange(2)
        if pos[r] < len(streams[r]) and rng.random() < 0.6:
            x = streams[r][pos[r]]
            sends = [next(tokens) for _ in range(rng.choice([0, 1, 2]))]
            unacked += sends
            t.processed(r, x.offset, sends, (x.key, codec.decode(x.value), x.broker_ts))
            pos[r] += 1
        elif unacked:
            t.acked(unacked.pop(rng.randrange(len(unacked))))
        if rng.random() < 0.05:
            for region in range(2):
                replay = PartitionValidator(is_realtime=True)
                for x in streams[region]:
                    if x.offset > t.watermark(region):
                        break
                    replay.process(x.offset, x.key, codec.decode(x.value), x.broker_ts)
                assert t.rt_producer_states(region) == replay.producer_states()
                checked += 1
    assert checked > 10
    assert t.watermarks() == [len(s) - 1 for s in streams]


def test_restored_rt_state_continues_from_the_takeover():
    streams = rt_streams(2, 100, seed=2)
    codec = E.EnvelopeCodec()
    full = PartitionValidator(is_realtime=True)
    for x in streams[1][:50]:
        full.process(x.offset, x.key, codec.decode(x.value), x.broker_ts)
    t = WatermarkTracker(2, [-1, 49], {1: full.producer_states()})
    for x in streams[1][50:]:
        t.processed(1, x.offset, [], (x.key, codec.decode(x.value), x.broker_ts))
        full.process(x.offset, x.key, codec.decode(x.value), x.broker_ts)
    assert t.rt_producer_states(1) == full.producer_states()
