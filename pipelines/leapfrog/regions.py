"""The store's regions, as the jobs that compare regions need them before they read a record.

Leap Frog's vectors and marks are indexed by the *store's* region ids, not by the sources given: a heartbeat's
`hbw` vector and a footer's source region name every region of the store. A run over some of the regions must
still count the others' records, or their positions raise no mark and their values do not stand, and the pairs
it compares see false divergences and miss true ones. So a job needs the store's region count up front, and
learns it (in this order) from:

1. `--regions N` (or `regions:` in `--conf`): the operator says;
2. `heartbeats`: the length of an `hbw` vector, which a leader writes for every region of the store, read from
   the tail of the sources' partitions (a few thousand records each: the newest heartbeats are the likeliest to
   be there);
3. `sources`: the highest source id + 1, when no heartbeat carries a vector (footer-only stores); records that
   name a higher region are then out of range, and the job says what that costs.

The scan checks the choice: the widest `hbw` vector it meets is in its split summaries, and the nightly job runs
again with that width when the probe missed it (`leapfrog.plan.RegionPartition.widest_hbw`).

The same tails also show an operator's slip that would pass for a clean run: one log given for two regions, by
the same path or by two paths (copies, links) holding byte-identical records that only one region's leader can
have written (`same_logs`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from div.heartbeat_headers import header_value
from div.heartbeat_headers import widest_hbw as hbw_width
from pipelines.core.errors import UsageError
from pipelines.core.sources import is_kafka, read_range
from pipelines.leapfrog.source import _READ_ERRORS, VtSplit

# records read from the end of each probed partition, and partitions probed per region
PROBE_RECORDS = 4096
PROBE_PARTITIONS = 4
FROM_FLAG, FROM_HEARTBEATS, FROM_SOURCES = "--regions", "heartbeats", "sources"


@dataclass(frozen=True)
class StoreRegions:
    """How many regions the store has (ids 0..count-1), and where that figure came from."""

    count: int
    learned_from: str  # FROM_FLAG, FROM_HEARTBEATS or FROM_SOURCES


def tails(
    splits: Sequence[VtSplit], topic: str, kafka_conf: Mapping[int, Mapping] | None = None
) -> dict[tuple[int, int], pa.Table]:
    """The last `PROBE_RECORDS` records of every region's partitions, keyed by (region, partition): a partition
    of every region at a time, up to `PROBE_PARTITIONS`, until one holds a heartbeat vector. A range that cannot
    be read is left out (the job reports it when it reads it)."""
    last: dict[tuple[int, int], VtSplit] = {}
    for s in splits:
        k = (s.region, s.partition)
        if k not in last or s.end > last[k].end:
            last[k] = s
    out: dict[tuple[int, int], pa.Table] = {}
    for partition in sorted({p for _, p in last})[:PROBE_PARTITIONS]:
        for (region, p), s in sorted(last.items()):
            if p != partition:
                continue
            conf = (kafka_conf or {}).get(region)
            columns = ["offset", "key", "value", "headers"]
            try:
                batches = list(
                    read_range(s.uri, conf, topic, p, max(s.end - PROBE_RECORDS, 0), s.end, columns)
                )
            except _READ_ERRORS:
                continue
            if batches:
                out[(region, p)] = pa.Table.from_batches(batches)
        if any(widest_hbw(t) for (_, p), t in out.items() if p == partition):
            break
    return out


def widest_hbw(table: pa.Table) -> int:
    """The length of the longest `hbw` vector among `table`'s records (0: none)."""
    return hbw_width(table.column("headers").to_pylist())


def store_regions(
    source_ids: Sequence[int], probed: Mapping[tuple[int, int], pa.Table], given: int | None = None
) -> StoreRegions:
    """The store's region count: `given`, else the widest heartbeat vector in `probed`, else the sources'.

    Raises UsageError when `given` leaves out a source's region."""
    top = max(source_ids)
    if given is not None:
        if given <= top:
            raise UsageError(
                f"--regions {given}: the store's regions are 0..{given - 1}, but a --source names region {top}"
            )
        return StoreRegions(given, FROM_FLAG)
    widest = max((widest_hbw(t) for t in probed.values()), default=0)
    if widest > top:
        return StoreRegions(widest, FROM_HEARTBEATS)
    # no vector, or vectors narrower than a source's id (its records are out of range: the scan counts them)
    return StoreRegions(top + 1, FROM_SOURCES)


def _same_place(a: str, b: str) -> bool:
    if is_kafka(a) or is_kafka(b):
        norm = lambda u: sorted(h.strip().lower() for h in u.split("://", 1)[-1].split(","))  # noqa: E731
        return is_kafka(a) and is_kafka(b) and norm(a) == norm(b)
    if "://" in a.replace("file://", "") or "://" in b.replace("file://", ""):
        return a.rstrip("/") == b.rstrip("/")
    strip = lambda u: u[len("file://") :] if u.startswith("file://") else u  # noqa: E731
    return os.path.realpath(strip(a)) == os.path.realpath(strip(b))


def _leaders_own(table: pa.Table) -> bool:
    """Whether `table` holds a record only its region's leader writes: a VT heartbeat with a vector. (Records
    of the bulk load can be byte-identical in every region, copied as they are by native replication.)"""
    return any(header_value(h, "hbw") is not None for h in table.column("headers").to_pylist())


def same_logs(
    sources: Mapping[int, str], probed: Mapping[tuple[int, int], pa.Table]
) -> list[tuple[int, int]]:
    """Pairs of regions (a < b) whose sources are one log: the same path, or a partition whose tails hold
    the same records, byte for byte, including one that only a region's own leader writes."""
    out = []
    ids = sorted(sources)
    for i, a in enumerate(ids):
        for b in ids[i + 1 :]:
            if _same_place(sources[a], sources[b]):
                out.append((a, b))
                continue
            for (r, p), t in probed.items():
                other = probed.get((b, p))
                if r != a or other is None or t.num_rows == 0 or not _leaders_own(t):
                    continue
                if t.equals(other):  # offsets, keys, values and headers
                    out.append((a, b))
                    break
    return out


def check_distinct(sources: Mapping[int, str], probed: Mapping[tuple[int, int], pa.Table]) -> None:
    """Raise UsageError naming both regions when one log is given for two of them: comparing a log with itself
    finds nothing, and that would read as a clean run."""
    for a, b in same_logs(sources, probed):
        how = (
            "the same location"
            if _same_place(sources[a], sources[b])
            else "byte-identical records, heartbeats included, which only one region's leader writes"
        )
        raise UsageError(
            f"--source {a}={sources[a]} and --source {b}={sources[b]} are one log ({how}): "
            "give each region its own VT"
        )
