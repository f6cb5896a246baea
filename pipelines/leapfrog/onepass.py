"""One pass per partition: the nightly Leap Frog job without a shuffle of records (`--plan one-pass`).

A store's key is partitioned the same way in every region, and Leap Frog never compares records of different
partitions. So one Spark task can read VT partition p of every region, each in offset order
(`pipelines.leapfrog.source.split_batches`), scan it as the fused job's map side does (`scan.SplitScan`, narrow
rows), put the rows in the order the fused job's reduce side receives them — the split summaries first, then by
(sortkey, key, region, offset) (`rows.with_sortkeys`) — and hand them to the same reduce side in the same Python
process (`keys.ScanReduce`: the plan from its own summaries by `leapfrog.plan`, the per-key stage of the mode).
No record crosses into the JVM and none is shuffled; Spark schedules the tasks (one per partition, or per group of
small partitions), retries them and keeps their output rows for the driver (`job._Job.one_pass`).

With `--state`, each task reads the carried records of its own partitions from the previous state's files
(whichever path wrote them) and sorts them in with the new rows, as the watch's step does.

Memory: a task sorts the rows of its partitions itself. When the records planned for it (the splits' offset
ranges and the carried records) exceed its budget (`task_memory_mb`), the rows are spilled as they are scanned
into ranges of sortkey (Arrow IPC files in a local directory), and the ranges are sorted and compared one after
another in sortkey order, which is the order the reduce side needs: memory follows the budget, not the partition
(within a range, as everywhere in Leap Frog, a single key's history is held whole).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.ipc as ipc

from pipelines.core.storage import locate
from pipelines.leapfrog import rows as R
from pipelines.leapfrog.carried import CARRIED_SCHEMA
from pipelines.leapfrog.keys import ScanReduce
from pipelines.leapfrog.scan import SplitScan
from pipelines.leapfrog.source import VtSplit, split_batches

# bytes a narrow row costs a task while its rows are held and sorted (the row, its sorted copy, the unpacked
# batch in the key stage), for turning `task_memory_mb` into rows
ROW_BYTES = 200
DEFAULT_TASK_MEMORY_MB = 256.0
# records per task past which partitions are not grouped further, however few the cores
GROUP_RECORDS = 4_000_000
BATCH_ROWS = 1 << 16  # rows per batch handed to the key stage


def partition_groups(
    splits: list[VtSplit], carried: Mapping[tuple[int, int], Any], parallelism: int
) -> list[tuple[int, ...]]:
    """The partitions each task handles: every partition with new records or carried facts, in about two groups
    per core (more when that would put more than `GROUP_RECORDS` records in a task), each partition whole, the
    largest placed first into the lightest group."""
    size: dict[int, int] = defaultdict(int)
    for sp in splits:
        size[sp.partition] += max(sp.end - sp.start, 0)
    for _, p in carried:
        size.setdefault(p, 0)
    if not size:
        return []
    count = min(len(size), max(2 * parallelism, math.ceil(sum(size.values()) / GROUP_RECORDS), 1))
    groups: list[list[int]] = [[] for _ in range(count)]
    load = [0] * count
    for p in sorted(size, key=lambda p: (-size[p], p)):
        i = int(np.argmin(load))
        groups[i].append(p)
        load[i] += size[p]
    return [tuple(sorted(g)) for g in groups if g]


def _local_dir() -> str:
    """Where a task spills: the executor's local directories (as Spark's own spills), else the temp directory."""
    for var in ("SPARK_LOCAL_DIRS", "LOCAL_DIRS"):  # standalone/local; YARN
        value = os.environ.get(var)
        if value:
            return value.split(",")[0]
    return tempfile.gettempdir()


def in_reduce_order(table: pa.Table) -> pa.Table:
    """Rows in the reduce side's order (`rows.REDUCE_ORDER`: sortkey, key, region, offset), but for keys that share
    a sortkey (a crc32 collision), which come one whole key after the other in no particular order: that is all the
    key stages need. Sorted with numpy on integers (each key's number in a dictionary of the keys), several times
    faster than Arrow's sort on the binary key column."""
    if table.num_rows == 0:
        return table
    key_ids = pc.dictionary_encode(table.column("key").combine_chunks()).indices.to_numpy()
    order = np.lexsort(
        (
            table.column("offset").to_numpy(),
            table.column("region").to_numpy(),
            key_ids,
            table.column("sortkey").to_numpy(),
        )
    )
    return table.take(pa.array(order))


class SortedRows:
    """A task's rows (the shuffle's columns with sortkeys), given in any order, handed back in reduce order.

    Within `budget_rows` they are held and sorted at the end. Past it (judged from the rows planned, before the
    first is read), each row goes to the spill file of its partition and sortkey range: `ranges` equal ranges of
    the key's crc32 per partition, so each range holds about `budget_rows` rows and every key lies in one range.
    Ranges in (partition, crc32) order are sortkey order, so sorting each in turn gives the whole in order."""

    def __init__(self, budget_rows: int, planned_rows: int) -> None:
        self.ranges = max(1, math.ceil(planned_rows / max(budget_rows, 1)))
        self.held: list[pa.Table] = []
        self.spilled = 0
        self.dir: str | None = None
        self.writers: dict[tuple[int, int], ipc.RecordBatchStreamWriter] = {}

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self.ranges == 1:
            self.held.append(table)
            return
        if self.dir is None:
            self.dir = tempfile.mkdtemp(prefix="tidegauge-onepass-", dir=_local_dir())
        sortkey = table.column("sortkey").to_numpy()
        part = sortkey >> 32
        rng = ((sortkey & 0xFFFFFFFF) * self.ranges) >> 32
        where = part * self.ranges + rng
        order = np.argsort(where, kind="stable")
        where = where[order]
        table = table.take(pa.array(order))
        cuts = np.flatnonzero(np.diff(where)) + 1
        for lo, hi in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(where)]]), strict=True):
            k = (int(part[order[lo]]), int(rng[order[lo]]))
            w = self.writers.get(k)
            if w is None:
                path = os.path.join(self.dir, f"{k[0]}-{k[1]}.arrows")
                w = self.writers[k] = ipc.new_stream(path, table.schema)
            w.write_table(table.slice(lo, hi - lo))
        self.spilled += table.num_rows

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Every row, in reduce order (`rows.REDUCE_ORDER`); spill files are removed as they are read."""
        try:
            if self.ranges == 1:
                if self.held:
                    whole = in_reduce_order(pa.concat_tables(self.held))
                    self.held = []
                    yield from whole.to_batches(max_chunksize=BATCH_ROWS)
                return
            for w in self.writers.values():
                w.close()
            for k in sorted(self.writers):
                path = os.path.join(self.dir, f"{k[0]}-{k[1]}.arrows")
                with pa.memory_map(path) as f:
                    part = in_reduce_order(ipc.open_stream(f).read_all())
                os.remove(path)
                yield from part.to_batches(max_chunksize=BATCH_ROWS)
        finally:
            if self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)


class PartitionPass:
    """`mapInArrow` over group numbers (`partition_groups`): each task reads, orders and compares its partitions
    of every region, and yields the reduce side's rows (`keys.OUT_SCHEMA`)."""

    def __init__(
        self,
        groups: list[tuple[int, ...]],
        splits: list[VtSplit],
        topic: str,
        kafka_conf: Mapping[int, Mapping] | None,
        mode: str,
        n_regions: int,
        reduce_args: dict[str, Any],
        carried: dict[tuple[int, int], dict] | None = None,
        carried_dir: str | None = None,
        carried_files: tuple[str, ...] = (),
        task_memory_mb: float = DEFAULT_TASK_MEMORY_MB,
        records=None,
    ) -> None:
        """`reduce_args`: `keys.ScanReduce`'s arguments but the carried facts, which each task takes for its own
        partitions from `carried` (the previous state's facts). `carried_dir`/`carried_files`: the previous
        state's carried records."""
        self.groups, self.splits, self.topic = groups, splits, topic
        self.kafka_conf = dict(kafka_conf or {})
        self.mode, self.n, self.reduce_args = mode, n_regions, reduce_args
        self.carried = carried or {}
        self.carried_dir, self.carried_files = carried_dir, carried_files
        self.budget_rows = max(1, int(task_memory_mb * (1 << 20) / ROW_BYTES))
        self.records = records

    def __call__(self, ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in ids:
            for i in b.column(0).to_pylist():
                yield from self.group(self.groups[i])

    def group(self, partitions: tuple[int, ...]) -> Iterator[pa.RecordBatch]:
        """The reduce side's rows for `partitions`."""
        mine = set(partitions)
        splits = sorted(
            (sp for sp in self.splits if sp.partition in mine),
            key=lambda sp: (sp.partition, sp.region, sp.start),
        )
        facts = {k: v for k, v in self.carried.items() if k[1] in mine}
        old = self._carried()
        only_mine = pc.field("partition").isin(pa.array(partitions, pa.int32()))
        planned = sum(max(sp.end - sp.start, 0) for sp in splits)
        if old is not None:
            planned += old.count_rows(filter=only_mine)
        rows = SortedRows(self.budget_rows, planned)
        summaries: list[pa.RecordBatch] = []
        scan = SplitScan(self.n, self.mode, keep_chunks=False, buckets=1, records=self.records, facts=facts)
        for sp in splits:
            for b in scan(split_batches(sp, self.topic, self.kafka_conf)):
                if R.is_summary(b).any():
                    summaries.append(b)
                else:
                    rows.add(R.with_sortkeys([b]))
        if old is not None:
            to_rows = R.carried_batches(self.n)
            for b in old.to_batches(columns=CARRIED_SCHEMA.names[:-2] + ["sortkey"], filter=only_mine):
                if b.num_rows:
                    rows.add(
                        R.with_sortkeys(list(to_rows(iter([b]))), pa.chunked_array([b.column("sortkey")]))
                    )

        def stream() -> Iterator[pa.RecordBatch]:
            if summaries:
                yield from R.with_sortkeys(summaries).to_batches()
            yield from rows.batches()

        reduce = ScanReduce(carried=facts, always_plan=True, **self.reduce_args)
        yield from reduce(stream())

    def _carried(self) -> ds.Dataset | None:
        """The previous state's carried records, as a dataset to read this task's partitions from (whichever
        path wrote them; a one-pass run's files hold their task's partitions only, so their row groups'
        statistics spare the other tasks most of the reading). A file written before carried records kept
        their sortkey reads it as null: `rows.with_sortkeys` computes it."""
        if self.carried_dir is None or not self.carried_files:
            return None
        where = locate(self.carried_dir)
        paths = [(where / name).path for name in self.carried_files]
        return ds.dataset(paths, schema=CARRIED_SCHEMA, filesystem=where.fs, format="parquet")
