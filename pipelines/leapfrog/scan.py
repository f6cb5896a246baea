"""Stage A of Leap Frog: decode each VT split in offset order and keep its running marks, in one pass.

Inside `mapInArrow`, each task reads one split (one region's partition, an offset range, in order). For every
record it decodes what Leap Frog needs (`pipelines.leapfrog.decode`) and computes, with numpy running maxima, the split's
*local* running high-water mark. It emits one row per data record (with the local mark before it), the rows that
chunked values need, and at the end one summary row: counts, End of Push, heartbeats, gaps inside the split, and
the local maxima (and, when the split could not be read to its end, the error: see `pipelines.leapfrog.source`).
The driver turns the small summaries into each split's prefix mark (the mark the region had
reached before the split), so `true mark = max(local mark, prefix)` — no shuffle, no window, no second pass.

A split has up to two segment boundaries, right after its first End of Push and right after its first heartbeat
carrying a vector: the two places a scan can start. Local marks restart at each boundary, so whichever one the
driver picks as the start, the rows after it have marks that count only what follows the start.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from div import envelope as E
from div.envelope import learned_versions
from pipelines.leapfrog import decode as V
from pipelines.leapfrog import rows as R

SUMMARY = 10
READ_ERROR_OFFSET = (
    -1
)  # a source's row saying the split could not be read to its end (pipelines.leapfrog.source)
SCAN_SCHEMA = pa.schema(
    [
        ("order", pa.int8()),
        ("split", pa.int32()),
        ("seg", pa.int8()),
        ("region", pa.int32()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("kind", pa.int8()),
        ("key", pa.binary()),
        ("value_hash", pa.int64()),
        ("deleted", pa.bool_()),
        ("src", pa.int32()),
        ("src_offset", pa.int64()),
        ("rmd", pa.list_(pa.int64())),
        ("hw", pa.binary()),
        ("chunk_keys", pa.list_(pa.binary())),
        ("payload", pa.binary()),
        ("summary", pa.string()),
        ("carry", pa.binary()),
    ]
)
SCAN_DDL = (
    "order byte, split int, seg byte, region int, partition int, offset long, kind byte, "
    "key binary, value_hash long, deleted boolean, src int, src_offset long, rmd array<long>, hw binary, "
    "chunk_keys array<binary>, payload binary, summary string, carry binary"
)
MAX_LISTED = 100
# unreadable records with a readable key listed per split (each makes its key unverified); past this, the whole
# region partition is treated as unverified rather than sending an unbounded list around
MAX_UNVERIFIED = 10_000
_DATA = (V.PUT, V.DELETE)
_KEEP = (V.PUT, V.DELETE, V.MANIFEST, V.CHUNK)


class _Segment:
    """Counts and maxima of one segment of a split (the part between two boundaries)."""

    def __init__(self, n: int, first_offset: int | None, boundary_kind: str | None) -> None:
        self.first_offset = (
            first_offset  # offset of the row the boundary follows (None for the split's start)
        )
        self.boundary_kind = boundary_kind  # None, "eop" or "hbw"
        self.max = np.full(n, -1, np.int64)
        self.data = 0
        self.heartbeats: Counter[int] = Counter()
        self.out_of_range = 0
        self.out_of_range_offsets: list[int] = []
        self.gaps: list[list] = []  # [first, last, local mark before the gap]
        self.last_offset: int | None = None
        self.rows = 0

    def to_json(self) -> dict:
        return {
            "after": self.first_offset,
            "kind": self.boundary_kind,
            "max": self.max.tolist(),
            "data": self.data,
            "heartbeats": {str(k): v for k, v in self.heartbeats.items()},
            "out_of_range": self.out_of_range,
            "out_of_range_offsets": self.out_of_range_offsets,
            "gaps": self.gaps,
            "last_offset": self.last_offset,
            "rows": self.rows,
        }


class SplitScan:
    """Callable for `mapInArrow` over `tidegauge_vt` rows: decoded data rows + summary rows per split.

    `keep_chunks`: also emit the rows chunked values need (manifests, chunks); otherwise they are only counted.
    `buckets`: the fused job's reduce bucket count; the rows are then its narrow shuffle rows
    (`pipelines.leapfrog.rows`), each summary once per bucket so that every reduce task receives every summary
    before its data rows. Otherwise they are the two-phase job's rows (`SCAN_SCHEMA`).
    """

    def __init__(
        self,
        n_regions: int,
        mode: str,
        keep_chunks: bool = True,
        buckets: int | None = None,
        records=None,
        facts: dict[tuple[int, int], dict[str, Any]] | None = None,
    ) -> None:
        self.n = n_regions
        self.mode = mode
        self.keep_chunks = keep_chunks
        self.buckets = buckets
        self.records = records  # a Spark accumulator of the records read, for the driver's progress line
        # (region, partition) → what the run resumed from had learnt from `vtp` headers (`facts`: its state's rows);
        # each split's codec starts from it, and its summary says what the codec knows at the end
        self.learned = {k: f["learned"] for k, f in (facts or {}).items() if f.get("learned")}

    def __call__(self, batches, envelopes=None):
        """`envelopes`: an iterator of `div.envelope_columns.Heads`, one for each of `batches` in turn (what a
        reader before read of them with a new codec: only where `learned` keeps them right, `reads_as_new`), or
        None to read them here."""
        dec = None
        n = self.n
        split = region = partition = None
        segs: list[_Segment] = []
        carry = np.full(n, -1, np.int64)
        prev_offset: int | None = None  # last offset of the split so far
        first_offset: int | None = None
        eop_offset = hbw_boundary = None
        baseline = None
        chunked = False
        undecodable = 0
        undecodable_offsets: list[int] = []
        unverified: list[list] = []  # [key hex, offset] of undecodable records whose key is readable
        unverified_overflow = False
        chunk_rows = 0
        widest_hbw = 0  # a vector wider than n: the store has more regions than this run was planned with
        error: str | None = None
        for batch in batches:
            heads = next(envelopes) if envelopes is not None else None
            if batch.num_rows == 0:
                continue
            if split is None:
                split = batch.column("split")[0].as_py()
                region = batch.column("region")[0].as_py()
                partition = batch.column("partition")[0].as_py()
                segs.append(_Segment(n, None, None))
                dec = V.VtDecoder(
                    codec=E.EnvelopeCodec.knowing(learned_versions(self.learned.get((region, partition))))
                )
            failed = batch.column("offset").to_numpy() == READ_ERROR_OFFSET
            if failed.any():  # the source could not read the split to its end
                first = int(np.flatnonzero(failed)[0])
                error = error or batch.column("value")[first].as_py().decode(errors="replace")
                batch = batch.filter(pa.array(~failed))
                heads = heads.take(np.flatnonzero(~failed)) if heads is not None else None
                if batch.num_rows == 0:
                    continue
            if self.records is not None:
                self.records.add(batch.num_rows)
            d = dec.decode(batch, region, heads)
            kind = np.asarray(d.column("kind").to_numpy(zero_copy_only=False), np.int8)
            offsets = d.column("offset").to_numpy()
            src = d.column("src").fill_null(-1).to_numpy().astype(np.int64)
            src_off = d.column("src_offset").fill_null(-1).to_numpy()
            hbw_col = d.column("hbw")
            # the vectors of heartbeats only (the only rows that have one), not a Python list of every row's
            beats = np.flatnonzero(kind == V.HEARTBEAT)
            hbw = dict(zip(beats.tolist(), hbw_col.take(pa.array(beats)).to_pylist(), strict=True))
            if hbw_col.null_count < len(hbw_col):
                widest_hbw = max(widest_hbw, pc.max(pc.list_value_length(hbw_col)).as_py() or 0)
            if first_offset is None:
                first_offset = int(offsets[0])
            rows = len(kind)
            # where this batch's rows go: segment index of every row, boundaries right after a row
            seg_of = np.full(rows, len(segs) - 1, np.int8)
            cuts: list[int] = []
            for i in np.flatnonzero((kind == V.END_OF_PUSH) | (kind == V.HEARTBEAT)):
                k = kind[i]
                if k == V.END_OF_PUSH and eop_offset is None:
                    eop_offset = int(offsets[i])
                    cuts.append(i)
                    segs.append(_Segment(n, eop_offset, "eop"))
                elif (
                    k == V.HEARTBEAT
                    and hbw_boundary is None
                    and hbw[i] is not None
                    and len(hbw[i]) == n
                    and 0 <= src[i] < n
                ):
                    hbw_boundary = int(offsets[i])
                    baseline = list(hbw[i])
                    cuts.append(i)
                    segs.append(_Segment(n, hbw_boundary, "hbw"))
            for c in cuts:
                seg_of[c + 1 :] += 1
            for i in np.flatnonzero(kind == V.START_OF_PUSH):
                chunked = chunked or bool(d.column("chunked")[int(i)].as_py())
            bad = np.flatnonzero(kind == V.UNDECODABLE)
            undecodable += len(bad)
            undecodable_offsets.extend(
                int(o) for o in offsets[bad][: max(0, MAX_LISTED - len(undecodable_offsets))]
            )
            if len(bad):
                bad_keys = d.column("key").take(pa.array(bad)).to_pylist()
                for o, k in zip(offsets[bad].tolist(), bad_keys, strict=True):
                    if k is None:
                        # no readable key: it may have replaced any key's value, so every key of this region
                        # partition is unverified
                        unverified_overflow = True
                    elif len(unverified) < MAX_UNVERIFIED:
                        unverified.append([k.hex(), o])
                    else:
                        unverified_overflow = True
            # contributions of each row to the running mark
            contrib = np.full((rows, n), -1, np.int64)
            in_range = (src >= 0) & (src < n)
            is_data = (kind == V.PUT) | (kind == V.DELETE) | (kind == V.MANIFEST)
            data_ok = np.flatnonzero(is_data & in_range)
            contrib[data_ok, src[data_ok]] = src_off[data_ok]
            hb_ok = np.flatnonzero((kind == V.HEARTBEAT) & in_range)
            if self.mode == "heartbeat":
                for i in hb_ok:
                    if hbw[i] is not None and len(hbw[i]) == n:
                        contrib[i] = hbw[i]
                    contrib[i, src[i]] = max(contrib[i, src[i]], src_off[i])
            hw_before = np.empty((rows, n), np.int64)
            start = 0
            for stop, boundary in [(c + 1, True) for c in cuts] + [(rows, False)]:
                if stop > start:
                    block = np.maximum.accumulate(np.vstack([carry, contrib[start:stop]]), axis=0)
                    hw_before[start:stop] = block[:-1]
                    carry = block[-1]
                    seg = segs[seg_of[start]]
                    seg.max = np.maximum(seg.max, carry)
                if boundary:
                    carry = np.full(n, -1, np.int64)  # the next segment starts from nothing
                start = stop
            # gaps: offsets missing between consecutive records (compaction), marked with the local mark
            prev = np.concatenate(
                [[prev_offset if prev_offset is not None else offsets[0] - 1], offsets[:-1]]
            )
            for i in np.flatnonzero(offsets > prev + 1):
                segs[seg_of[i]].gaps.append([int(prev[i]) + 1, int(offsets[i]) - 1, hw_before[i].tolist()])
            prev_offset = int(offsets[-1])
            is_hb = kind == V.HEARTBEAT
            # out of range: data and heartbeats whose footer names no known region, or that have no footer
            counted = is_data | is_hb
            for si in np.unique(seg_of):
                s = segs[si]
                in_seg = seg_of == si
                s.rows += int(np.count_nonzero(in_seg))
                s.last_offset = int(offsets[in_seg][-1])
                s.data += int(np.count_nonzero(in_seg & is_data & in_range))
                for origin, count in zip(
                    *np.unique(src[in_seg & is_hb & in_range], return_counts=True), strict=True
                ):
                    s.heartbeats[int(origin)] += int(count)
                oor = np.flatnonzero(in_seg & counted & ~in_range)
                s.out_of_range += len(oor)
                room = MAX_LISTED - len(s.out_of_range_offsets)
                s.out_of_range_offsets.extend(int(o) for o in offsets[oor][: max(room, 0)])
            chunky = (kind == V.MANIFEST) | (kind == V.CHUNK)
            chunk_rows += int(np.count_nonzero(chunky))
            wanted = np.isin(kind, _KEEP if self.keep_chunks else _DATA)
            keep = np.flatnonzero(wanted & (in_range | (kind == V.CHUNK)))
            if len(keep):
                yield self._rows(d, keep, split, region, partition, seg_of, offsets, kind, hw_before)
        if split is None:
            return
        summary = {
            "split": split,
            "region": region,
            "partition": partition,
            "first_offset": first_offset,
            "last_offset": prev_offset,
            "eop_offset": eop_offset,
            "hbw_boundary": hbw_boundary,
            "baseline": baseline,
            "chunked": chunked,
            "chunk_rows": chunk_rows,
            "widest_hbw": widest_hbw,
            "undecodable": undecodable,
            "undecodable_offsets": undecodable_offsets,
            "unverified": unverified,
            "unverified_overflow": unverified_overflow,
            "segments": [s.to_json() for s in segs],
            "error": error,
            "learned": {str(v): s for v, s in dec.codec.learned().items()},
        }
        if self.buckets is not None:
            yield R.summary_batch(summary, self.buckets)
            return
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([0], pa.int8()),
                pa.array([split], pa.int32()),
                pa.array([-1], pa.int8()),
                pa.array([region], pa.int32()),
                pa.array([partition], pa.int32()),
                pa.array([prev_offset], pa.int64()),
                pa.array([SUMMARY], pa.int8()),
                *[pa.nulls(1, SCAN_SCHEMA.field(i).type) for i in range(7, 16)],
                pa.array([json.dumps(summary)], pa.string()),
                pa.nulls(1, pa.binary()),
            ],
            schema=SCAN_SCHEMA,
        )

    def _rows(
        self,
        d: pa.RecordBatch,
        keep: np.ndarray,
        split: int,
        region: int,
        partition: int,
        seg_of: np.ndarray,
        offsets: np.ndarray,
        kind: np.ndarray,
        hw_before: np.ndarray,
    ) -> pa.RecordBatch:
        """The kept rows of a decoded batch, as the job's path wants them."""
        idx = pa.array(keep)
        if self.buckets is not None:
            return R.data_batch(
                self.n,
                partition,
                region,
                split,
                seg_of[keep],
                d.column("key").take(idx),
                offsets[keep],
                d.column("value_hash").take(idx),
                d.column("src").take(idx),
                d.column("src_offset").take(idx),
                hw_before[keep],
                d.column("rmd").take(idx) if self.mode == "rmd" else None,
            )
        m = len(keep)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(np.ones(m, np.int8)),
                pa.array(np.full(m, split, np.int32)),
                pa.array(seg_of[keep], pa.int8()),
                pa.array(np.full(m, region, np.int32)),
                pa.array(np.full(m, partition, np.int32)),
                pa.array(offsets[keep], pa.int64()),
                pa.array(kind[keep], pa.int8()),
                d.column("key").take(idx),
                d.column("value_hash").take(idx),
                d.column("deleted").take(idx),
                d.column("src").take(idx),
                d.column("src_offset").take(idx),
                d.column("rmd").take(idx),
                R.pack_marks(hw_before[keep]),
                d.column("chunk_keys").take(idx),
                d.column("payload").take(idx),
                pa.nulls(m, pa.string()),
                pa.nulls(m, pa.binary()),
            ],
            schema=SCAN_SCHEMA,
        )
