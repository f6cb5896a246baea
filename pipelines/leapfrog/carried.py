"""Incremental runs without sending the carried state through the shuffle.

The fused job shuffles every row to a reduce bucket by (partition, key), and each reduce task writes the records
the next run must carry as one Parquet file (`keys.StateSink`), tagged with the buckets it held. When
the next run has the same number of buckets, a key lands in the same bucket again, so each reduce task reads the
files of its own buckets straight from the state directory and merges their rows into its sorted input here:
the carried records — often as many as a day's new records — skip the read into Spark, the shuffle and the sort.
With another bucket count (or a state written by the two-phase path) the job unions them into the shuffle
instead (`job._Job._carried_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.core.storage import locate

BUCKETS_KEY = b"tidegauge.buckets"  # Parquet schema metadata: the reduce buckets a carried file holds
# A record carried to the next run, as the state keeps it (pipelines.leapfrog.state.pack_carry_array packs carry).
# `sortkey` is kept so that the next run need not compute a crc32 per carried row in Python (null from the
# two-phase path, whose untagged files the reduce tasks never read themselves); a state written before it was
# kept lacks it, and `read_carried` computes it then.
CARRIED_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("region", pa.int32()),
        ("offset", pa.int64()),
        ("value_hash", pa.int64()),
        ("carry", pa.binary()),
        ("bucket", pa.int32()),  # the fused job's reduce bucket, -1 from the two-phase path
        ("sortkey", pa.int64()),
    ]
)
# the fused reduce input's order (pipelines.leapfrog.rows.sortkey_column)
_SORT = [("sortkey", "ascending"), ("key", "ascending"), ("region", "ascending"), ("offset", "ascending")]


def sortkeys(partition: pa.Array, key: pa.Array) -> pa.Array:
    """`pipelines.leapfrog.rows.sortkey_column` in Python: (partition << 32) | crc32(key)."""
    crc = crc32_column(key).astype(np.int64)
    return pa.array((partition.to_numpy(zero_copy_only=False).astype(np.int64) << 32) + crc)


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0xEDB88320), table >> 1).astype(np.uint32)
    return table


_CRC_TABLE = _crc_table()


def crc32_column(key: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """`zlib.crc32` (Spark's `crc32`, java.util.zip.CRC32) of every value of a binary array, as uint32, a byte
    position at a time over all rows still that long: about 20 times faster than a `zlib.crc32` call per row
    (the call and its bytes object cost more than the checksum). Nulls count as empty."""
    if isinstance(key, pa.ChunkedArray):
        key = key.combine_chunks() if key.num_chunks != 1 else key.chunk(0)
    key = key.cast(pa.large_binary()).fill_null(b"")
    m = len(key)
    offsets = np.frombuffer(key.buffers()[1], np.int64, count=m + 1, offset=key.offset * 8)
    data = np.frombuffer(key.buffers()[2] or b"", np.uint8)
    lengths = np.diff(offsets)
    order = np.argsort(-lengths, kind="stable")  # longest first: the rows a position reaches are a prefix
    longest = lengths[order]
    width = int(longest[0]) if m else 0
    # byte j of every row as one contiguous row of a (width, rows) matrix: each step reads its bytes in order
    padded = np.concatenate([data, np.zeros(width, np.uint8)])
    step = padded.strides[0]
    windows = np.lib.stride_tricks.as_strided(padded, shape=(len(data) + 1, width), strides=(step, step))
    columns = np.ascontiguousarray(windows[offsets[:-1][order]].T)
    crc = np.full(m, 0xFFFFFFFF, np.uint32)
    shorter = -longest  # ascending: how many rows are longer than j is a binary search
    for j in range(width):
        k = int(np.searchsorted(shorter, -j, side="left"))
        c = crc[:k]
        crc[:k] = np.take(_CRC_TABLE, (c ^ columns[j, :k]) & 0xFF) ^ (c >> 8)
    crc ^= np.uint32(0xFFFFFFFF)
    out = np.empty(m, np.uint32)
    out[order] = crc
    return out


def buckets_tag(buckets: Iterable[int]) -> dict[bytes, bytes]:
    return {BUCKETS_KEY: ",".join(str(b) for b in sorted(buckets)).encode()}


def file_buckets(path: str) -> list[int] | None:
    """The buckets a carried file (a path or URI) holds (None: written without them, by the two-phase path or an
    older run)."""
    loc = locate(path)
    meta = pq.read_schema(loc.path, filesystem=loc.fs).metadata or {}
    tag = meta.get(BUCKETS_KEY)
    return None if tag is None else [int(b) for b in tag.decode().split(",") if b]


def read_carried(
    directory: str, files: Mapping[str, Sequence[int]], buckets: Iterable[int]
) -> pa.Table | None:
    """The carried records (`directory` a path or URI) of `buckets`, sorted as the reduce input is: the files (name → buckets) that hold any
    of them, filtered when a file also holds buckets of another task. None when there are none."""
    want = set(buckets)
    tables = []
    for name, held in sorted(files.items()):
        held = set(held)
        if not held & want:
            continue
        f = locate(directory) / name
        t = pq.read_table(f.path, filesystem=f.fs)
        if not held <= want:
            t = t.filter(pc.is_in(t.column("bucket"), pa.array(sorted(want), pa.int32())))
        if "sortkey" not in t.schema.names:
            t = t.combine_chunks()
            t = t.append_column(
                "sortkey", sortkeys(t.column("partition").combine_chunks(), t.column("key").combine_chunks())
            )
        tables.append(t.select(CARRIED_SCHEMA.names))
    if not tables:
        return None
    t = pa.concat_tables(tables)
    if not t.num_rows:
        return None
    return t.sort_by(_SORT).combine_chunks()


def _conform(carried: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    """Carried rows in the shape of the stream's rows (columns they lack are filled as `_carried_rows` fills
    them in the shuffle path)."""
    m = carried.num_rows
    fill = {
        "order": pa.array(np.ones(m, np.int8)),
        "split": pa.array(np.full(m, -1, np.int32)),
        "seg": pa.array(np.full(m, -1, np.int8)),
        "src": pa.array(np.full(m, -1, np.int32)),
        "src_offset": pa.array(np.full(m, -1, np.int64)),
    }
    cols = []
    for f in schema:
        if f.name in carried.schema.names:
            cols.append(carried.column(f.name).combine_chunks().cast(f.type))
        elif f.name in fill:
            cols.append(fill[f.name].cast(f.type))
        else:
            cols.append(pa.nulls(m, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def merge_carried(
    pairs: Iterator[tuple[pa.RecordBatch, np.ndarray]],
    carried: pa.Table | None,
    schema: pa.Schema,
    n_regions: int,
    untouched: Callable[[pa.RecordBatch], None] | None = None,
) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """Merge the carried rows into the stream of (sorted batch, marks) pairs, keeping it sorted as the input is
    (`_SORT`): each batch takes the carried rows up to its last (sortkey, key); the rest follow the stream (rows
    of `schema`). A carried row's marks are zeros (it carries its own, in `carry`).

    `untouched`: where the *settled* carried rows of keys no new row has go instead (as carried records, for the
    next state): they need no comparison (`keys.pass_untouched` says why), and on a night that leaves
    many keys alone they are most of the state. A settled row whose sortkey a new row shares still joins the
    stream (the key decides, and pass_untouched sorts out a shared crc)."""
    if carried is None or carried.num_rows == 0:
        yield from pairs
        return
    from pipelines.leapfrog.state import carry_flags

    keys = carried.column("key").combine_chunks()
    n, pos = carried.num_rows, 0
    settled = (
        (carry_flags(carried.column("carry").chunk(0)) & 4) != 0
        if untouched is not None
        else np.zeros(n, bool)
    )
    sk_np = carried.column("sortkey").to_numpy()

    def upto(sortkey: int, key: bytes) -> int:
        """The end of the carried rows at or before (sortkey, key): a binary search on the sortkey, then the
        keys of the few rows that share it (a crc32 collision, or the key itself) in Python."""
        lo = int(np.searchsorted(sk_np, sortkey, "left"))
        hi = int(np.searchsorted(sk_np, sortkey, "right"))
        return lo + sum(1 for i in range(lo, hi) if keys[i].as_py() <= key)

    def split(lo: int, hi: int, new_sortkeys: np.ndarray) -> pa.Table:
        """Rows lo..hi to merge; the untouched settled ones go to `untouched`."""
        direct = settled[lo:hi] & ~np.isin(sk_np[lo:hi], new_sortkeys)
        part = carried.slice(lo, hi - lo)
        if direct.any():
            untouched(part.filter(pa.array(direct)).combine_chunks().to_batches()[0])
            part = part.filter(pa.array(~direct))
        return part

    for batch, marks in pairs:
        if pos < n and batch.num_rows:
            end = max(pos, upto(batch.column("sortkey")[-1].as_py(), batch.column("key")[-1].as_py()))
            if end > pos:
                part = split(pos, end, batch.column("sortkey").to_numpy())
                pos = end
                if part.num_rows:
                    merged = pa.concat_batches([batch, _conform(part, schema)])
                    order = pc.sort_indices(merged, sort_keys=_SORT)
                    marks = np.concatenate([marks, np.zeros((part.num_rows, marks.shape[1]), marks.dtype)])
                    batch = merged.take(order)
                    marks = marks[order.to_numpy()]
        yield batch, marks
    if pos < n:
        rest = split(pos, n, np.zeros(0, np.int64))
        if rest.num_rows:
            yield _conform(rest, schema), np.zeros((rest.num_rows, n_regions), np.int64)
