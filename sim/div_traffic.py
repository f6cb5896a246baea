"""Synthetic DIV traffic: producers writing Venice segments into one topic, with faults whose truth is known.

The replication simulator builds full multi-region stores; this smaller generator exists for DIV tests and
benchmarks, where what matters is many producers, segments, retries and gaps in one log, written quickly and
deterministically (seeded).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from div import checksum as cks
from div.writer import OutRecord, SegmentWriter


@dataclass
class TrafficSpec:
    topic: str = "store_v1"
    partitions: int = 4
    producers: int = 8
    records: int = 100_000
    batch_records: int = 2_000  # push job records before EndOfPush (per partition)
    value_size: int = 100
    keys: int = 50_000
    segment_every: int = (
        5_000  # end a segment after this many data records of a producer (time rolling stand-in)
    )
    checksum_type: int = cks.ADHASH
    seed: int = 7
    start_ms: int = 1_700_000_000_000


@dataclass
class TrafficRecord:
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: tuple
    timestamp_ms: int


@dataclass
class Traffic:
    records: list[TrafficRecord] = field(default_factory=list)
    eop_offsets: dict[int, int] = field(default_factory=dict)


def generate(spec: TrafficSpec) -> Iterator[TrafficRecord]:
    """Yield records in per-partition offset order (offsets assigned as a broker would)."""
    rng = random.Random(spec.seed)
    clock = [spec.start_ms]

    def tick() -> int:
        clock[0] += 1
        return clock[0]

    next_offset = [0] * spec.partitions

    def emit(recs: list[OutRecord]) -> Iterator[TrafficRecord]:
        for r in recs:
            off = next_offset[r.partition]
            next_offset[r.partition] += 1
            yield TrafficRecord(r.partition, off, r.key, r.value, r.headers, clock[0])

    push = SegmentWriter(
        rng.randbytes(16),
        checksum_type=spec.checksum_type,
        clock=tick,
        host_name="push-job",
        max_segment_age_ms=-1,
    )
    for p in range(spec.partitions):
        yield from emit(push.start_of_push(p))
        for i in range(spec.batch_records):
            yield from emit(push.put(p, b"batch-%d" % i, rng.randbytes(spec.value_size)))
        yield from emit(push.end_of_push(p))
    writers = [
        SegmentWriter(
            rng.randbytes(16),
            checksum_type=spec.checksum_type,
            clock=tick,
            host_name=f"producer-{i}",
            max_segment_age_ms=-1,
        )
        for i in range(spec.producers)
    ]
    counts = [0] * spec.producers
    value = rng.randbytes(spec.value_size)
    for n in range(spec.records):
        w = rng.randrange(spec.producers)
        p = rng.randrange(spec.partitions)
        key = b"key-%d" % rng.randrange(spec.keys)
        if n % 10 == 9:
            recs = writers[w].delete(p, key)
        else:
            recs = writers[w].put(p, key, value[: spec.value_size - 8] + n.to_bytes(8, "big"))
        yield from emit(recs)
        counts[w] += 1
        if counts[w] % spec.segment_every == 0:
            for part in range(spec.partitions):
                yield from emit(writers[w].end_segment(part, final=False))
    for w in writers:
        yield from emit(w.close())
