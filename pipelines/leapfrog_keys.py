"""The per-key stage of the Leap Frog job: runs inside `mapInArrow` on rows sorted by (partition, key, region, offset).

Each task streams its sorted batches, cuts them into key groups (a group may straddle batches), builds every
region's history of the key with `leapfrog.history`, and applies the mode's per-key rule from `leapfrog.compare`
to every requested region pair. It yields finding rows and, at the end, one counter row per (partition, pair).
Memory is bounded by the largest single key's history, never by a partition's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from div.keys import fnv1a_64
from leapfrog.compare import FINDING_TYPES, compare_standing, lily_pad_walk
from leapfrog.history import KeyRow, RegionView, key_history

OUT_SCHEMA = pa.schema([
    ("row", pa.string()),  # "F" finding, "C" counters
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
])
OUT_DDL = ("row string, partition int, region_a int, region_b int, type string, key binary, key_hash long, "
           "a_value_hash long, b_value_hash long, a_deleted boolean, b_deleted boolean, a_vt_offset long, "
           "b_vt_offset long, a_vector array<long>, b_vector array<long>, a_high_watermark array<long>, "
           "b_high_watermark array<long>, keys long, comparable_pairs long, skipped_pairs long, pending_keys long, "
           "value_mismatch long, missing_in_a long, missing_in_b long")
IN_COLUMNS = ["partition", "key", "region", "offset", "value_hash", "deleted", "src", "src_offset", "rmd",
              "hw_before", "hw_at"]


@dataclass(frozen=True)
class CompareContext:
    """Everything the executors need besides the rows: small, shipped with the function."""

    mode: str
    pairs: tuple[tuple[int, int], ...]
    views: dict[tuple[int, int], RegionView]  # (region, partition) → view

    def regions(self) -> list[int]:
        return sorted({r for p in self.pairs for r in p})


class _Counters:
    __slots__ = ("keys", "comparable", "skipped", "pending", "by_type")

    def __init__(self) -> None:
        self.keys = self.comparable = self.skipped = self.pending = 0
        self.by_type = dict.fromkeys(FINDING_TYPES, 0)


def _side(rec) -> tuple:
    if rec is None:
        return (None, None, None, None, None)
    return (rec.value_hash, rec.value_hash is None, rec.vt_offset, list(rec.vector), list(rec.high_watermark))


class KeyStage:
    """Callable for `mapInArrow`: iterator of sorted input batches → iterator of OUT_SCHEMA batches."""

    def __init__(self, ctx: CompareContext) -> None:
        self.ctx = ctx

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counters: dict[tuple[int, int, int], _Counters] = defaultdict(_Counters)
        findings: list[tuple] = []
        group: list[tuple] = []
        group_id: tuple | None = None
        for batch in batches:
            cols = [batch.column(batch.schema.get_field_index(c)).to_pylist() for c in IN_COLUMNS]
            for row in zip(*cols, strict=True):
                gid = (row[0], row[1])
                if gid != group_id:
                    if group:
                        self._key(group, counters, findings)
                    group = []
                    group_id = gid
                group.append(row)
            if len(findings) >= 4096:
                yield self._finding_batch(findings)
                findings = []
        if group:
            self._key(group, counters, findings)
        if findings:
            yield self._finding_batch(findings)
        if counters:
            yield self._counter_batch(counters)

    def _key(self, rows: list[tuple], counters, findings: list[tuple]) -> None:
        partition, key = rows[0][0], rows[0][1]
        by_region: dict[int, list[KeyRow]] = defaultdict(list)
        for (_p, _k, region, offset, vhash, deleted, src, src_off, rmd, hwb, hwa) in rows:
            by_region[region].append(KeyRow(offset, None if deleted else vhash, src, src_off, tuple(hwb), tuple(hwa),
                                            rmd))
        ctx = self.ctx
        histories = {}
        for x in ctx.regions():
            view = ctx.views.get((x, partition))
            if view is not None:
                histories[x] = key_history(view, by_region.get(x, ()))
        for x, y in ctx.pairs:
            if x not in by_region and y not in by_region:
                continue
            if x not in histories or y not in histories:
                continue  # that region has no such partition: reported as a failed partition by the driver
            a, b = histories[x], histories[y]
            if ctx.mode == "heartbeat":
                verdict = compare_standing(a, b)
            else:
                vx, vy = ctx.views[(x, partition)], ctx.views[(y, partition)]
                verdict = lily_pad_walk(a, b, vx.final_hw, vy.final_hw, a_known_absent=vx.prefix_known,
                                        b_known_absent=vy.prefix_known)
            c = counters[(partition, x, y)]
            c.keys += 1
            c.comparable += verdict.comparable_pairs
            c.skipped += verdict.skipped_pairs
            c.pending += verdict.pending
            f = verdict.finding
            if f is not None:
                c.by_type[f.type] += 1
                findings.append(("F", partition, x, y, f.type, key, fnv1a_64(key), *_pair_sides(f)) + (None,) * 7)

    @staticmethod
    def _finding_batch(rows: list[tuple]) -> pa.RecordBatch:
        cols = list(zip(*rows, strict=True))
        return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(cols, OUT_SCHEMA, strict=True)],
                                          schema=OUT_SCHEMA)

    @staticmethod
    def _counter_batch(counters) -> pa.RecordBatch:
        rows = []
        for (p, x, y), c in sorted(counters.items()):
            rows.append(("C", p, x, y) + (None,) * 13 + (c.keys, c.comparable, c.skipped, c.pending,
                                                          c.by_type["VALUE_MISMATCH"], c.by_type["MISSING_IN_A"],
                                                          c.by_type["MISSING_IN_B"]))
        return KeyStage._finding_batch(rows)


def _pair_sides(f) -> tuple:
    a = _side(f.a)
    b = _side(f.b)
    # column order: a_value_hash, b_value_hash, a_deleted, b_deleted, a_vt_offset, b_vt_offset, a_vector,
    # b_vector, a_high_watermark, b_high_watermark
    return (a[0], b[0], a[1], b[1], a[2], b[2], a[3], b[3], a[4], b[4])
