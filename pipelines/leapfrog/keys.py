"""The per-key stage of the Leap Frog job: runs inside `mapInArrow` on rows sorted by (partition, key, region, offset).

Rows arrive as stage A left them (`pipelines.leapfrog.scan`): each with its split, segment and *local* running mark.
The stage drops rows that lie before their region's scan start, raises each local mark by its (split, segment)
prefix, cuts the rows into key groups (a group may straddle batches) and applies the mode's rule to every
requested region pair:

- heartbeat mode: `VectorKeyStage`, the band rule over whole batches of keys in numpy (`leapfrog.vectorized`),
  with the finding types, the records carried to the next run and the settled keys decided by `leapfrog.settle`;
- footer and rmd modes: `KeyStage`, Venice's lily-pad walk key by key (`leapfrog.compare`).

`ScanReduce` wraps either one when the job runs fused (scan and compare in one Spark job): it reads the split
summaries that stage A sent ahead of the data rows, plans from them (`leapfrog.plan`) and reports the
plan's facts in one "S" row. Output: finding rows ("F", each with its status: open or healed), one counter row
per (partition, pair) ("C"), and for the (pair, key)s an earlier run reported (`CompareContext.watched`) that
yield no finding this time, their status now ("H": a repair or a newer write may have healed them).
Memory is bounded by the largest single key's history, never by a partition's.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from div.keys import fnv1a_64
from leapfrog import vectorized as vz
from leapfrog.compare import FINDING_TYPES, lily_pad_walk, status_of
from leapfrog.history import KeyRow, RegionView, key_history
from leapfrog.plan import failed_reads, mark_latest_kept, plan_marks, views
from leapfrog.settle import (
    carried_last,
    carried_records,
    comparable_before,
    finding_type,
    settled_groups,
    untouched_rows,
)
from pipelines.core.output import ParquetFileWriter
from pipelines.core.storage import locate
from pipelines.leapfrog.carried import CARRIED_SCHEMA, buckets_tag, merge_carried, read_carried
from pipelines.leapfrog.rows import unpack_marks

OUT_SCHEMA = pa.schema(
    [
        ("row", pa.string()),  # "F" finding, "C" counters, "S" the plan's facts (fused runs), "H" status
        ("partition", pa.int32()),
        ("region_a", pa.int32()),
        ("region_b", pa.int32()),
        ("type", pa.string()),
        ("key", pa.binary()),
        ("key_hash", pa.int64()),
        ("a_value_hash", pa.int64()),
        ("b_value_hash", pa.int64()),
        ("a_deleted", pa.bool_()),
        ("b_deleted", pa.bool_()),
        ("a_vt_offset", pa.int64()),
        ("b_vt_offset", pa.int64()),
        ("a_vector", pa.list_(pa.int64())),
        ("b_vector", pa.list_(pa.int64())),
        ("a_high_watermark", pa.list_(pa.int64())),
        ("b_high_watermark", pa.list_(pa.int64())),
        ("keys", pa.int64()),
        ("comparable_pairs", pa.int64()),
        ("skipped_pairs", pa.int64()),
        ("pending_keys", pa.int64()),
        ("value_mismatch", pa.int64()),
        ("missing_in_a", pa.int64()),
        ("missing_in_b", pa.int64()),
        ("settled_touched", pa.int64()),  # "C" rows with --state: settled keys this run's records touched
        ("settled_new", pa.int64()),  # ... and keys settled at the end of this run
        ("info", pa.string()),
        ("status", pa.string()),  # "F" and "H" rows: open or healed (leapfrog.compare.status_of)
    ]
)
OUT_DDL = (
    "row string, partition int, region_a int, region_b int, type string, key binary, key_hash long, "
    "a_value_hash long, b_value_hash long, a_deleted boolean, b_deleted boolean, a_vt_offset long, "
    "b_vt_offset long, a_vector array<long>, b_vector array<long>, a_high_watermark array<long>, "
    "b_high_watermark array<long>, keys long, comparable_pairs long, skipped_pairs long, pending_keys long, "
    "value_mismatch long, missing_in_a long, missing_in_b long, settled_touched long, settled_new long, "
    "info string, status string"
)
ROW_COLUMNS = [
    "partition",
    "key",
    "region",
    "offset",
    "value_hash",
    "deleted",
    "src",
    "src_offset",
    "rmd",
    "split",
    "seg",
    "hw",
    "carry",
]
SORT_COLUMNS = ["partition", "key", "region", "offset"]
_NONE7 = (None,) * 7


@dataclass(frozen=True)
class CompareContext:
    """Everything the per-key rules need besides the rows."""

    mode: str
    pairs: tuple[tuple[int, int], ...]
    views: dict[tuple[int, int], RegionView]  # (region, partition) → view
    prefixes: dict[
        tuple[int, int], list[int]
    ]  # (split, segment) → prefix mark; absent = before the scan start
    n_regions: int
    state_out: str | None = None  # incremental runs: where each task writes the records the next run needs
    buckets: tuple[int, ...] | None = (
        None  # the fused job's reduce buckets this task holds (tags its state file)
    )

    # the records the next run needs go to a sink the caller gives instead (the watch keeps them in Spark's
    # state store)
    keep_state: bool = False
    # (partition, region A, region B) → keys of the findings earlier runs reported: a key of these that yields
    # no finding this run gets an "H" row with its status now (healed when its current records agree)
    watched: dict[tuple[int, int, int], tuple[bytes, ...]] = field(default_factory=dict)

    @property
    def emit_state(self) -> bool:
        return self.state_out is not None or self.keep_state

    def regions(self) -> list[int]:
        return sorted({r for p in self.pairs for r in p})


class _Counters:
    __slots__ = ("keys", "comparable", "skipped", "pending", "by_type", "settled_touched", "settled_new")

    def __init__(self) -> None:
        self.keys = self.comparable = self.skipped = self.pending = 0
        self.settled_touched = self.settled_new = 0
        self.by_type = dict.fromkeys(FINDING_TYPES, 0)


def _batch(rows: list[tuple]) -> pa.RecordBatch:
    cols = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(c, f.type) for c, f in zip(cols, OUT_SCHEMA, strict=True)], schema=OUT_SCHEMA
    )


def _counter_rows(counters: dict[tuple[int, int, int], _Counters]) -> list[tuple]:
    return [
        ("C", p, x, y)
        + (None,) * 13
        + (
            c.keys,
            c.comparable,
            c.skipped,
            c.pending,
            c.by_type["VALUE_MISMATCH"],
            c.by_type["MISSING_IN_A"],
            c.by_type["MISSING_IN_B"],
            c.settled_touched,
            c.settled_new,
            None,
            None,
        )
        for (p, x, y), c in sorted(counters.items())
    ]


def _finding_row(p, x, y, ftype, key, a, b, status: str) -> tuple:
    a = a or (None,) * 5
    b = b or (None,) * 5
    return (
        "F",
        p,
        x,
        y,
        ftype,
        key,
        fnv1a_64(key),
        a[0],
        b[0],
        a[1],
        b[1],
        a[2],
        b[2],
        a[3],
        b[3],
        a[4],
        b[4],
        *_NONE7,
        None,
        None,
        None,
        status,
    )


def _status_row(p, x, y, key, status: str) -> tuple:
    """The status now of a (pair, key) an earlier run reported, which this run's records yield no finding for."""
    return ("H", p, x, y, None, key, fnv1a_64(key)) + (None,) * 20 + (status,)


class _Marks:
    """Raises stage A's local marks by their (split, segment) prefix; rows before the scan start are dropped."""

    def __init__(self, ctx: CompareContext) -> None:
        n = ctx.n_regions
        self.n = n
        keys = sorted(ctx.prefixes)
        max_split = max((k[0] for k in keys), default=0)
        # dense lookup: row index of (split, segment + 1); -1 = a segment before the scan start
        self.lookup = np.full((max_split + 2, 4), -1, np.int64)
        for i, (split, seg) in enumerate(keys):
            self.lookup[split, seg + 1] = i
        self.matrix = np.array([ctx.prefixes[k] for k in keys], np.int64).reshape(len(keys), n)

    def apply(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
        """(rows after their scan start, their hw_before as an (rows, N) array). Carried rows (from --state)
        are kept with their own marks."""
        split = batch.column("split").to_numpy().astype(np.int64)
        seg = batch.column("seg").to_numpy().astype(np.int64)
        known = (split >= 0) & (split < len(self.lookup) - 1)
        idx = np.full(len(split), -1, np.int64)
        idx[known] = self.lookup[split[known], seg[known] + 1]
        if "carry" in batch.schema.names:
            idx[~batch.column("carry").is_null().to_numpy(zero_copy_only=False)] = -2
        keep = np.flatnonzero(idx != -1)
        if len(keep) < batch.num_rows:
            batch = batch.take(pa.array(keep))
            idx = idx[keep]
        out = np.zeros((len(idx), self.n), np.int64)
        new = np.flatnonzero(idx >= 0)
        if len(new):
            local = unpack_marks(batch.column("hw").take(pa.array(new)), self.n)
            out[new] = np.maximum(local, self.matrix[idx[new]])
        return batch, out


def _group_ends(t: pa.Table) -> int:
    """Index where the table's last (partition, key) group starts: rows from there may continue in the next batch."""
    n = t.num_rows
    if n == 0:
        return 0
    keys = t.column("key").combine_chunks()
    parts = t.column("partition").combine_chunks()
    last_key, last_part = keys[n - 1], parts[n - 1]
    same = pc.and_(pc.equal(keys, last_key), pc.equal(parts, last_part)).to_numpy(zero_copy_only=False)
    differs = np.flatnonzero(~same)
    return int(differs[-1]) + 1 if len(differs) else 0


def _regroup(batches: Iterator[tuple[pa.RecordBatch, np.ndarray]]) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """Re-cut (batch, marks) pairs so that no key group straddles two chunks."""
    held: pa.Table | None = None
    held_marks = None
    for batch, marks in batches:
        t = pa.Table.from_batches([batch])
        if held is not None:
            t = pa.concat_tables([held, t])
            marks = np.concatenate([held_marks, marks])
        cut = _group_ends(t)
        if cut:
            yield t.slice(0, cut).combine_chunks(), marks[:cut]
        held, held_marks = t.slice(cut), marks[cut:]
    if held is not None and held.num_rows:
        yield held.combine_chunks(), held_marks


def _tags_of(t: pa.Table, rows: np.ndarray) -> list[pa.Array]:
    """The `bucket` and `sortkey` of carried records made from `rows` of `t`. The two-phase path's rows have
    neither: bucket -1 and a null sortkey, since only the fused path reads sortkeys back, from files it tagged."""
    idx = pa.array(rows, pa.int64())
    if "bucket" in t.schema.names:
        bucket = t.column("bucket").take(idx).combine_chunks().cast(pa.int32())
    else:
        bucket = pa.array(np.full(len(rows), -1, np.int32))
    if "sortkey" in t.schema.names:
        sortkey = t.column("sortkey").take(idx).combine_chunks().cast(pa.int64())
    else:
        sortkey = pa.nulls(len(rows), pa.int64())
    return [bucket, sortkey]


def pass_untouched(t: pa.Table, hwb: np.ndarray) -> tuple[pa.Table, np.ndarray, pa.RecordBatch | None]:
    """Split off the keys that only the previous run's *settled* state holds — no new record touches them — as
    carried records for the next state, unchanged and not compared again; return the rest of the chunk with its
    marks."""
    from pipelines.leapfrog.state import carry_flags

    m = t.num_rows
    if m == 0 or "carry" not in t.schema.names:
        return t, hwb, None
    settled_row = (carry_flags(t.column("carry").combine_chunks()) & 4) != 0
    if not settled_row.any():
        return t, hwb, None
    part = t.column("partition").to_numpy()
    keys = t.column("key").combine_chunks()
    same = (
        pc.equal(keys.slice(1), keys.slice(0, m - 1)).to_numpy(zero_copy_only=False)
        if m > 1
        else np.zeros(0, bool)
    )
    new_group = np.concatenate([[True], ~same | (part[1:] != part[:-1])])
    passed = untouched_rows(new_group, settled_row)
    if not passed.any():
        return t, hwb, None
    rows = np.flatnonzero(passed)
    sub = t.take(pa.array(rows))
    batch = pa.RecordBatch.from_arrays(
        [sub.column(f.name).combine_chunks().cast(f.type) for f in list(CARRIED_SCHEMA)[:-2]]
        + _tags_of(t, rows),
        schema=CARRIED_SCHEMA,
    )
    keep = np.flatnonzero(~passed)
    return t.take(pa.array(keep)), hwb[keep], batch


class StateSink:
    """One reduce task's carried records, written straight into the next state's staging directory
    as one Parquet file per task. Only the next run reads them, so they skip the trip back through Spark (Arrow
    to the JVM, the cache, a write job). A task that runs again (a retry, a recomputed cache block) rewrites
    the same file with the same content; the file appears by rename, whole or not at all."""

    ROW_GROUP = 1 << 16  # rows gathered per write: the stage hands over a few thousand at a time

    def __init__(self, directory: str, buckets: tuple[int, ...] | None = None) -> None:
        schema = CARRIED_SCHEMA.with_metadata(buckets_tag(buckets)) if buckets else CARRIED_SCHEMA
        self.schema = schema
        # `directory` is a path or URI: the task opens it with the filesystem layer. No dictionaries: keys and
        # carry bytes are nearly all distinct, so one costs time (the write took 1.6× as long on a bench state
        # file) and saves about 4 % of the bytes
        self.file = ParquetFileWriter(locate(directory) / self._name(), schema, use_dictionary=False)
        self.held: list[pa.RecordBatch] = []
        self.rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self.held.append(batch.replace_schema_metadata(self.schema.metadata))
        self.rows += batch.num_rows
        if self.rows >= self.ROW_GROUP:
            self._write()

    def _write(self) -> None:
        self.file.write(pa.Table.from_batches(self.held, self.schema))
        self.held, self.rows = [], 0

    def close(self) -> None:
        if self.held:
            self._write()
        self.file.close()

    @staticmethod
    def _name() -> str:
        from pyspark import TaskContext

        tc = TaskContext.get()
        return f"part-{tc.partitionId() if tc is not None else 0:05d}.parquet"


class MemorySink:
    """The records the next run needs, kept in memory for a caller that stores them itself (`tidegauge watch`)."""

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self.batches.append(batch)

    def close(self) -> None:
        pass

    def table(self) -> pa.Table:
        return pa.Table.from_batches(self.batches, CARRIED_SCHEMA)


class VectorKeyStage:
    """Heartbeat mode: the band rule over whole chunks of keys in numpy (same verdicts as `KeyStage`, tested)."""

    def __init__(
        self,
        ctx: CompareContext,
        carried: pa.Table | None = None,
        schema: pa.Schema | None = None,
        sink: StateSink | MemorySink | None = None,
    ) -> None:
        """`carried`: this task's records from the previous run's state, read here rather than shuffled in
        (`pipelines.leapfrog.carried`), to merge into the input rows (of `schema`). `sink`: where the records the
        next run needs go (default: a `StateSink` file in `ctx.state_out`)."""
        self.ctx = ctx
        self.carried, self.schema = carried, schema
        self.sink = sink

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        marks = _Marks(self.ctx)
        counters: dict[tuple[int, int, int], _Counters] = defaultdict(_Counters)
        self.state_batches: list[pa.RecordBatch] = []
        sink = self.sink
        if sink is None and self.ctx.state_out is not None:
            sink = StateSink(self.ctx.state_out, self.ctx.buckets)
        stream = (marks.apply(b) for b in batches)
        if self.carried is not None:
            stream = merge_carried(
                stream, self.carried, self.schema, self.ctx.n_regions, sink.add if sink is not None else None
            )
        for table, hwb in _regroup(stream):
            if sink is not None:
                table, hwb, passed = pass_untouched(table, hwb)
                if passed is not None:
                    sink.add(passed)
            rows = self._chunk(table, hwb, counters)
            if rows:
                yield _batch(rows)
            if sink is not None:
                for b in self.state_batches:
                    sink.add(b)
            self.state_batches = []
        if sink is not None:
            sink.close()
        if counters:
            yield _batch(_counter_rows(counters))

    def _chunk(self, t: pa.Table, hwb: np.ndarray, counters) -> list[tuple]:
        m = t.num_rows
        if m == 0:
            return []
        part = t.column("partition").to_numpy()
        keys = (
            t.column("key").chunk(0) if t.column("key").num_chunks == 1 else t.column("key").combine_chunks()
        )
        same = (
            pc.equal(keys.slice(1), keys.slice(0, m - 1)).to_numpy(zero_copy_only=False)
            if m > 1
            else np.zeros(0, bool)
        )
        new_group = np.concatenate([[True], ~same | (part[1:] != part[:-1])])
        gid = np.cumsum(new_group) - 1
        group_first = np.flatnonzero(new_group)
        region = t.column("region").to_numpy()
        offset = t.column("offset").to_numpy()
        vh = t.column("value_hash")
        cls = np.where(
            vh.is_null().to_numpy(zero_copy_only=False), vz.NULL_CLASS, vh.fill_null(0).to_numpy()
        ).astype(np.int64)
        src = t.column("src").fill_null(-1).to_numpy().astype(np.int64)
        src_off = t.column("src_offset").fill_null(-1).to_numpy()
        carry_col = t.column("carry") if "carry" in t.schema.names else None
        is_carried = (
            ~carry_col.is_null().to_numpy(zero_copy_only=False)
            if carry_col is not None
            else np.zeros(m, bool)
        )
        out: list[tuple] = []
        ctx = self.ctx
        bounds = np.flatnonzero(np.concatenate([[True], part[1:] != part[:-1], [True]]))
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            p = int(part[lo])
            groups = np.unique(gid[lo:hi])
            hist, present, carried, had_open = {}, {}, {}, {}
            touched = []
            for x in ctx.regions():
                view = ctx.views.get((x, p))
                if view is None:
                    continue  # that region has no such partition: reported as failed by the driver
                in_region = region[lo:hi] == x
                sel = lo + np.flatnonzero(in_region & ~is_carried[lo:hi])
                csel = lo + np.flatnonzero(in_region & is_carried[lo:hi])
                carried[x], was_settled = (
                    _carried(carry_col, csel, gid, offset, cls, ctx.n_regions) if len(csel) else (None, None)
                )
                if was_settled is not None:
                    touched.append(carried[x].gid[was_settled])
                had_open[x] = carried_last(carried[x])
                hist[x] = vz.build(
                    view,
                    gid[sel],
                    offset[sel],
                    cls[sel],
                    src[sel],
                    src_off[sel],
                    hwb[sel],
                    groups,
                    carried[x],
                )
                present[x] = np.unique(gid[lo + np.flatnonzero(in_region)])
            touched_settled = np.unique(np.concatenate(touched)) if touched else np.zeros(0, np.int64)
            unsettled = []
            pair_groups: dict[tuple[int, int], np.ndarray] = {}
            for x, y in ctx.pairs:
                if x not in hist or y not in hist:
                    continue
                in_pair = np.union1d(present[x], present[y])
                if not len(in_pair):
                    continue
                res = vz.compare(hist[x], hist[y], in_pair)
                unsettled.append(in_pair[res.pending])
                pair_groups[(x, y)] = in_pair
                c = counters[(p, x, y)]
                if len(touched_settled):
                    c.settled_touched += int(np.isin(in_pair, touched_settled).sum())
                c.keys += len(in_pair)
                # pairs the previous run already found comparable are not counted again (counts add up over runs)
                c.comparable += int(res.comparable_pairs.sum()) - comparable_before(
                    ctx.views[(x, p)], carried.get(x), ctx.views[(y, p)], carried.get(y), in_pair
                )
                c.skipped += int(res.skipped.sum())
                c.pending += int(res.pending.sum())
                for gi in np.flatnonzero(res.find_b >= 0):
                    ha, hb = hist[x], hist[y]
                    ia, ib = int(res.find_a[gi]), int(res.find_b[gi])
                    key = keys[int(group_first[int(in_pair[gi])])].as_py()
                    a = None if ha.absent[ia] else _vector_side(ha, ia)
                    b = None if hb.absent[ib] else _vector_side(hb, ib)
                    ftype = finding_type(a is None, b is None)
                    c.by_type[ftype] += 1
                    status = status_of(bool(res.converged[gi]))
                    out.append(_finding_row(p, x, y, ftype, key, a, b, status))
                if ctx.watched:
                    out.extend(_watched_rows(ctx.watched, p, x, y, res, keys, group_first, in_pair))
            if ctx.emit_state:
                batches, settled = self._state_rows(
                    p, hist, present, had_open, groups, keys, group_first, unsettled, t
                )
                self.state_batches.extend(batches)
                for (x, y), in_pair in pair_groups.items():
                    counters[(p, x, y)].settled_new += int(np.isin(in_pair, settled).sum())
        return out

    def _state_rows(
        self, p, hist, present, had_open, groups, keys, group_first, pending: list[np.ndarray], t: pa.Table
    ) -> tuple[list[pa.RecordBatch], np.ndarray]:
        """The records the next run needs, as batches of carried records built column-wise (settled ones flagged
        in `carry`), and the settled groups; which records and which keys is `leapfrog.settle`'s rule."""
        from pipelines.leapfrog.state import pack_carry_array

        region_views = {x: self.ctx.views[(x, p)] for x in hist}
        kept = carried_records(hist, region_views, self.ctx.pairs, present, had_open, groups)
        settled = settled_groups(hist, kept, present, pending)
        out = []
        for x, (keep, last_open, marks) in kept.items():
            if not len(keep):
                continue
            h = hist[x]
            cls = h.cls[keep]
            m = len(keep)
            is_settled = np.isin(h.gid[keep], settled)
            out.append(
                pa.RecordBatch.from_arrays(
                    [
                        pa.array(np.full(m, p, np.int32)),
                        keys.take(pa.array(group_first[h.gid[keep]])).cast(pa.binary()),
                        pa.array(np.full(m, x, np.int32)),
                        pa.array(h.offset[keep], pa.int64()),
                        pa.array(cls, pa.int64(), mask=cls == vz.NULL_CLASS),
                        pack_carry_array(h.absent[keep], last_open, h.vector[keep], marks, is_settled),
                        *_tags_of(t, group_first[h.gid[keep]]),
                    ],
                    schema=CARRIED_SCHEMA,
                )
            )
        return out, settled


def _watched_rows(
    watched: dict, p: int, x: int, y: int, res: vz.PairResult, keys: pa.Array, group_first, in_pair
) -> list[tuple]:
    """ "H" rows: the status now of the watched (pair, key)s among the groups without a finding this run."""
    quiet = np.flatnonzero(res.find_b < 0)
    mine = watched.get((p, x, y))
    if not len(quiet) or not mine:
        return []
    watched_keys = pa.array(mine, pa.binary())
    first_rows = pa.array(group_first[in_pair[quiet]])
    hit = pc.is_in(keys.take(first_rows).cast(pa.binary()), value_set=watched_keys).to_numpy(
        zero_copy_only=False
    )
    out = []
    for gi in quiet[hit]:
        key = keys[int(group_first[int(in_pair[gi])])].as_py()
        out.append(_status_row(p, x, y, key, status_of(bool(res.converged[gi]))))
    return out


def _carried(carry_col, sel: np.ndarray, gid, offset, cls, n: int) -> tuple[vz.Carried, np.ndarray]:
    """Carried records of one region (and which of them came from the settled part of the state)."""
    from pipelines.leapfrog.state import unpack_carry_array

    col = carry_col.take(pa.array(sel))
    absent, last_open, settled, vectors, marks = unpack_carry_array(
        col.combine_chunks() if hasattr(col, "combine_chunks") else col, n
    )
    return vz.Carried(
        gid[sel].astype(np.int64), cls[sel], absent, offset[sel], vectors, marks, last_open
    ), settled


def _vector_side(h: vz.Histories, i: int) -> tuple:
    cls = int(h.cls[i])
    tomb = cls == int(vz.NULL_CLASS)
    return (None if tomb else cls, tomb, int(h.offset[i]), h.vector[i].tolist(), h.mark[i].tolist())


class KeyStage:
    """Footer and rmd modes (and the reference path): Venice's lily-pad walk, key by key."""

    def __init__(self, ctx: CompareContext) -> None:
        self.ctx = ctx

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        marks = _Marks(self.ctx)
        counters: dict[tuple[int, int, int], _Counters] = defaultdict(_Counters)
        for table, hwb in _regroup(marks.apply(b) for b in batches):
            names = table.schema.names
            cols = {
                c: table.column(c).to_pylist()
                for c in ("partition", "key", "region", "offset", "value_hash", "src", "src_offset")
            }
            cols["rmd"] = table.column("rmd").to_pylist() if "rmd" in names else [None] * table.num_rows
            findings: list[tuple] = []
            start = 0
            m = table.num_rows
            for i in range(1, m + 1):
                if (
                    i == m
                    or cols["key"][i] != cols["key"][start]
                    or cols["partition"][i] != cols["partition"][start]
                ):
                    self._key(cols, hwb, start, i, counters, findings)
                    start = i
            if findings:
                yield _batch(findings)
        if counters:
            yield _batch(_counter_rows(counters))

    def _key(self, cols, hwb, lo: int, hi: int, counters, findings: list[tuple]) -> None:
        ctx = self.ctx
        partition, key = cols["partition"][lo], cols["key"][lo]
        by_region: dict[int, list[KeyRow]] = defaultdict(list)
        for i in range(lo, hi):
            src, src_off = cols["src"][i], cols["src_offset"][i]
            before = tuple(hwb[i].tolist())
            at = before[:src] + (max(before[src], src_off),) + before[src + 1 :]
            by_region[cols["region"][i]].append(
                KeyRow(cols["offset"][i], cols["value_hash"][i], src, src_off, before, at, cols["rmd"][i])
            )
        histories = {}
        for x in ctx.regions():
            view = ctx.views.get((x, partition))
            if view is not None:
                histories[x] = key_history(view, by_region.get(x, ()))
        for x, y in ctx.pairs:
            if (x not in by_region and y not in by_region) or x not in histories or y not in histories:
                continue
            vx, vy = ctx.views[(x, partition)], ctx.views[(y, partition)]
            verdict = lily_pad_walk(
                histories[x],
                histories[y],
                vx.final_hw,
                vy.final_hw,
                a_known_absent=vx.prefix_known,
                b_known_absent=vy.prefix_known,
            )
            c = counters[(partition, x, y)]
            c.keys += 1
            c.comparable += verdict.comparable_pairs
            c.skipped += verdict.skipped_pairs
            c.pending += verdict.pending
            f = verdict.finding
            if f is not None:
                c.by_type[f.type] += 1
                findings.append(
                    _finding_row(partition, x, y, f.type, key, _side(f.a), _side(f.b), verdict.status)
                )


def _side(rec) -> tuple | None:
    if rec is None:
        return None
    return (rec.value_hash, rec.value_hash is None, rec.vt_offset, list(rec.vector), list(rec.high_watermark))


def stage_for(
    ctx: CompareContext,
    carried: pa.Table | None = None,
    schema: pa.Schema | None = None,
    sink: StateSink | MemorySink | None = None,
):
    return VectorKeyStage(ctx, carried, schema, sink) if ctx.mode == "heartbeat" else KeyStage(ctx)


class ScanReduce:
    """The fused job's reduce side, over its shuffle rows (`pipelines.leapfrog.rows`): summaries first (sortkey -1),
    then the data rows of this task's buckets."""

    def __init__(
        self,
        mode: str,
        pairs: tuple[tuple[int, int], ...],
        n_regions: int,
        ends: dict[tuple[int, int], int],
        carried: dict[tuple[int, int], dict] | None = None,
        state_out: str | None = None,
        deadlines: dict[int, int] | None = None,
        carried_files: tuple[str, dict[str, list[int]]] | None = None,
        sink: MemorySink | None = None,
        watched: dict[tuple[int, int, int], tuple[bytes, ...]] | None = None,
        always_plan: bool = False,
    ) -> None:
        """`carried_files`: (directory, file name → buckets) of the previous state's carried records when each
        task reads its own (`pipelines.leapfrog.carried`) instead of receiving them through the shuffle.
        `sink`: receives the records the next run needs, instead of files in `state_out`. `always_plan`: report
        the plan's facts (of `carried`) even without any row (`pipelines.leapfrog.onepass`: a task's partitions
        may have nothing new, and no other task reports their facts)."""
        self.mode, self.pairs, self.n, self.ends = mode, pairs, n_regions, ends
        self.carried, self.state_out, self.deadlines = carried or {}, state_out, deadlines or {}
        self.carried_files = carried_files
        self.sink = sink
        self.watched = watched or {}
        self.always_plan = always_plan

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pipelines.leapfrog import rows as R

        summaries: dict[int, dict] = {}
        buckets: set[int] = set()  # every summary comes once per bucket: they name this task's buckets
        it = iter(batches)
        first_data: pa.RecordBatch | None = None
        for batch in it:
            found, their_buckets, k = R.summaries(batch)
            buckets |= their_buckets
            summaries.update((sm["split"], sm) for sm in found)
            if k < batch.num_rows:
                first_data = batch.slice(k)
                break
        if not summaries and first_data is None and not (self.always_plan and self.carried):
            return  # this task received nothing (its buckets are empty): it has nothing to plan or report
        facts, prefixes = plan_marks(list(summaries.values()), self.ends, self.n, self.carried)
        # the shuffle is a barrier: every split has been read by now
        mark_latest_kept(facts, self.deadlines, int(time.time() * 1000))
        failed = [
            {"region": r, "partition": p, "error": e}
            for (r, p), e in failed_reads(list(summaries.values())).items()
        ]
        info = json.dumps({"facts": [rp.to_json() for rp in facts.values()], "failed": failed})
        yield _batch([("S",) + (None,) * 25 + (info, None)])
        ctx = CompareContext(
            self.mode,
            self.pairs,
            views(facts, self.n, self.mode),
            prefixes,
            self.n,
            self.state_out,
            tuple(sorted(buckets)) or None,
            keep_state=self.sink is not None,
            watched=self.watched,
        )
        carried = None
        if self.carried_files is not None and buckets:
            carried = read_carried(*self.carried_files, buckets)
        with_rmd = self.mode == "rmd"

        def data():
            if first_data is not None:
                yield R.unpack(first_data, self.n, with_rmd)
            for b in it:
                yield R.unpack(b, self.n, with_rmd)

        schema = R.unpacked_schema(self.n, with_rmd)
        yield from stage_for(ctx, carried, schema, self.sink)(data())
