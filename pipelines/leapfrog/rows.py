"""The fused Leap Frog job's shuffle rows: six columns instead of fifteen.

Spark moves every shuffled row as an UnsafeRow (8 bytes per column, plus the variable-length parts) and converts
it column by column on the way into and out of Python, so the cost of the fused job's shuffle and of its reduce
side grows with the number of columns, not only with the bytes. The reduce side needs the sort columns as
columns — `bucket`, `sortkey`, `key`, `region`, `offset` — and everything else only in Python, so everything else
travels as one binary column, `rec`, packed and unpacked here with numpy:

- a data row: a fixed little-endian record (`rec_dtype`) of flags, segment, split, origin region, value hash,
  origin offset and the local running mark; in mode rmd followed by the record's RMD vector;
- a carried record of an incremental run that goes through the shuffle: the same record, flagged, followed by
  its `carry` bytes (`pipelines.leapfrog.state.pack_carry_array`);
- a split summary (sortkey -1, so it sorts first): the summary's JSON.

`unpack` gives the reduce side the columns the key stages read (`pipelines.leapfrog.keys`), so they work the same
on either path of the job.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from leapfrog.vectorized import inside

HAS_VALUE = 1  # the value hash is set (a tombstone has none)
HAS_RMD = 2  # an RMD vector follows the fixed record
CARRIED = 4  # a carried record: its carry bytes follow the fixed record

# before keying (the scan's output), and the shuffle itself
SCAN_DDL = "bucket int, partition int, key binary, region int, offset long, rec binary"
SHUFFLE_COLUMNS = ["bucket", "sortkey", "key", "region", "offset", "rec"]
SCAN_SCHEMA = pa.schema(
    [
        ("bucket", pa.int32()),
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("region", pa.int32()),
        ("offset", pa.int64()),
        ("rec", pa.binary()),
    ]
)


def pack_marks(marks: np.ndarray) -> pa.Array:
    """(rows, N) int64 marks as fixed-width binary (N little-endian longs): cheaper to move than arrays."""
    rows, n = marks.shape
    data = np.ascontiguousarray(marks, dtype="<i8").view(np.uint8).ravel()
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(8 * n), rows, [None, pa.py_buffer(data)]).cast(
        pa.binary()
    )


def unpack_marks(col: pa.Array, n: int) -> np.ndarray:
    """Inverse of `pack_marks`."""
    fixed = col.cast(pa.binary(8 * n))
    return np.frombuffer(
        fixed.buffers()[1], dtype="<i8", count=len(col) * n, offset=fixed.offset * 8 * n
    ).reshape(len(col), n)


def rec_dtype(n_regions: int) -> np.dtype:
    """The fixed part of `rec` (packed, little-endian)."""
    return np.dtype(
        [
            ("flags", "u1"),
            ("seg", "i1"),
            ("split", "<i4"),
            ("src", "<i4"),
            ("value_hash", "<i8"),
            ("src_offset", "<i8"),
            ("hw", "<i8", (n_regions,)),
        ]
    )


def _offsets_and_bytes(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary array's value offsets (rows + 1) and its bytes, without copying (Spark hands over large_binary
    when spark.sql.execution.arrow.useLargeVarTypes is set)."""
    width = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.frombuffer(
        arr.buffers()[1], width, count=len(arr) + 1, offset=arr.offset * np.dtype(width).itemsize
    )
    return offsets, np.frombuffer(arr.buffers()[2] or b"", np.uint8)


def _windows(buf: np.ndarray, width: int, writeable: bool = False) -> np.ndarray:
    """Every `width`-byte window of `buf` as the rows of a 2-D view (row i starts at byte i): picking rows by their
    start offsets then moves `width` bytes a row, where an index of every byte (rows x width int64s) would cost
    eight times the bytes moved, and more in time than the rest of the stage."""
    if buf.size < width:
        return np.empty((0, width), np.uint8)
    step = buf.strides[0]
    return np.lib.stride_tricks.as_strided(
        buf, shape=(buf.size - width + 1, width), strides=(step, step), writeable=writeable
    )


def _binary(fixed: np.ndarray, tail: pa.Array | None = None) -> pa.Array:
    """Binary array of each fixed record followed by its tail (a binary or list<long> array, null = nothing)."""
    m, width = len(fixed), fixed.dtype.itemsize
    raw = np.ascontiguousarray(fixed).view(np.uint8)
    if tail is None or tail.null_count == len(tail):
        return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), m, [None, pa.py_buffer(raw)]).cast(
            pa.binary()
        )
    if pa.types.is_list(tail.type):
        values = tail.flatten().fill_null(0).to_numpy().astype("<i8").view(np.uint8)
        tail_len = pc.list_value_length(tail).fill_null(0).to_numpy().astype(np.int64) * 8
    else:
        offsets, data = _offsets_and_bytes(tail.cast(pa.binary()).fill_null(b""))
        values = data[offsets[0] : offsets[-1]]
        tail_len = np.diff(offsets).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(width + tail_len)])
    out = np.empty(int(offsets[-1]), np.uint8)
    # the rows' windows never overlap (each is followed by its own tail), so writing through the views is safe
    _windows(out, width, writeable=True)[offsets[:-1]] = raw.reshape(m, width)
    out[inside(out.size, offsets[:-1] + width, offsets[1:])] = values
    return pa.BinaryArray.from_buffers(
        pa.binary(), m, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(out)]
    )


def data_batch(
    n_regions: int,
    partition: int,
    region: int,
    split: int,
    seg: np.ndarray,
    key: pa.Array,
    offset: np.ndarray,
    value_hash: pa.Array,
    src: pa.Array,
    src_offset: pa.Array,
    hw: np.ndarray,
    rmd: pa.Array | None = None,
) -> pa.RecordBatch:
    """A scan's data rows as shuffle-ready rows (bucket null: `keyed` assigns it)."""
    m = len(offset)
    fixed = np.zeros(m, rec_dtype(n_regions))
    has_value = ~value_hash.is_null().to_numpy(zero_copy_only=False)
    fixed["flags"] = np.where(has_value, HAS_VALUE, 0)
    if rmd is not None:
        fixed["flags"] |= np.where(rmd.is_null().to_numpy(zero_copy_only=False), 0, HAS_RMD).astype(np.uint8)
    fixed["seg"] = seg
    fixed["split"] = split
    fixed["src"] = src.fill_null(-1).to_numpy()
    fixed["value_hash"] = value_hash.fill_null(0).to_numpy()
    fixed["src_offset"] = src_offset.fill_null(-1).to_numpy()
    fixed["hw"] = hw
    return pa.RecordBatch.from_arrays(
        [
            pa.nulls(m, pa.int32()),
            pa.array(np.full(m, partition, np.int32)),
            key.cast(pa.binary()),
            pa.array(np.full(m, region, np.int32)),
            pa.array(offset, pa.int64()),
            _binary(fixed, rmd),
        ],
        schema=SCAN_SCHEMA,
    )


def summary_batch(summary: dict, buckets: int) -> pa.RecordBatch:
    """A split's summary, once for every reduce bucket: each reduce task plans from all of them."""
    text = json.dumps(summary).encode()
    return pa.RecordBatch.from_arrays(
        [
            pa.array(bucket_labels(buckets), pa.int32()),
            pa.array(np.full(buckets, summary["partition"], np.int32)),
            pa.nulls(buckets, pa.binary()),
            pa.array(np.full(buckets, summary["region"], np.int32)),
            pa.array(np.full(buckets, -1, np.int64)),
            pa.array([text] * buckets, pa.binary()),
        ],
        schema=SCAN_SCHEMA,
    )


def carried_batches(n_regions: int):
    """Callable for `mapInArrow` over a state's carried records: the rows that join the shuffle when the reduce
    tasks cannot read their own (`pipelines.leapfrog.carried`)."""

    def fn(batches):
        for b in batches:
            m = b.num_rows
            fixed = np.zeros(m, rec_dtype(n_regions))
            vh = b.column("value_hash")
            fixed["flags"] = np.where(vh.is_null().to_numpy(zero_copy_only=False), 0, HAS_VALUE) | CARRIED
            fixed["seg"], fixed["split"], fixed["src"], fixed["src_offset"] = -1, -1, -1, -1
            fixed["value_hash"] = vh.fill_null(0).to_numpy()
            yield pa.RecordBatch.from_arrays(
                [
                    pa.nulls(m, pa.int32()),
                    b.column("partition").cast(pa.int32()),
                    b.column("key").cast(pa.binary()),
                    b.column("region").cast(pa.int32()),
                    b.column("offset").cast(pa.int64()),
                    _binary(fixed, b.column("carry")),
                ],
                schema=SCAN_SCHEMA,
            )

    return fn


def _murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's hash of an int (Murmur3_x86_32.hashInt, seed 42), which picks a row's shuffle partition."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k = (rotl((value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF, 15) * 0x1B873593) & 0xFFFFFFFF
    h = (rotl(seed ^ k, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= 4
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h - (1 << 32) if h >= 1 << 31 else h


@functools.cache
def bucket_labels(buckets: int) -> tuple[int, ...]:
    """The value each reduce bucket carries in the `bucket` column, chosen so that bucket i lands in shuffle
    partition i. Spark places a row by the Murmur3 hash of the column, so the plain numbers 0..B-1 would share
    partitions (with 8 buckets, 3 of the 8 reduce tasks got nothing and one got three buckets)."""
    labels: dict[int, int] = {}
    value = 0
    while len(labels) < buckets:
        labels.setdefault(_murmur3_int(value) % buckets, value)
        value += 1
    return tuple(labels[i] for i in range(buckets))


def keyed(rows, buckets: int):
    """Spark: the scan's rows with their reduce bucket and `sortkey`, in the shuffle's columns. A data row's bucket
    comes from its (partition, key); a summary row already has one and sorts first."""
    from pyspark.sql import functions as F

    is_data = F.col("bucket").isNull()
    index = F.pmod(F.crc32("key") + F.col("partition"), F.lit(buckets)).cast("int")
    bucket = F.element_at(F.array(*[F.lit(v) for v in bucket_labels(buckets)]), index + 1)
    return rows.select(
        F.when(is_data, bucket).otherwise(F.col("bucket")).alias("bucket"),
        F.when(is_data, sortkey_column()).otherwise(F.lit(-1).cast("long")).alias("sortkey"),
        "key",
        "region",
        "offset",
        "rec",
    )


def sortkey_column():
    """(partition << 32) | crc32(key): the reduce side's first sort column. Spark sorts on a 64-bit prefix of the
    first sort column and compares whole rows only where prefixes tie; with (partition, key) first, nearly every
    comparison went on to the binary key. Rows of one key stay together (then by key, region, offset); key groups
    come in this order instead of the keys' (`pipelines.leapfrog.carried.sortkeys` computes it in Python)."""
    from pyspark.sql import functions as F

    return F.shiftleft(F.col("partition").cast("long"), 32) + F.crc32("key")


def _tails(rec: pa.Array, width: int) -> pa.Array:
    """What follows each row's fixed record, as a binary array. Arrow's kernel copies the bytes; a mask over the
    batch's bytes built with numpy (`leapfrog.vectorized.inside`, a cumulative sum per byte) took a quarter of an
    incremental one-pass run, whose carried rows all have tails. The explicit stop: pyarrow 26 fails on
    `binary_slice` without one ("Negative buffer resize")."""
    return pc.binary_slice(rec, width, 2**31 - 1).cast(pa.binary())


def unpacked_schema(n_regions: int, with_rmd: bool) -> pa.Schema:
    """The columns `unpack` gives."""
    fields = [
        ("bucket", pa.int32()),
        ("sortkey", pa.int64()),
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("region", pa.int32()),
        ("offset", pa.int64()),
        ("value_hash", pa.int64()),
        ("src", pa.int32()),
        ("src_offset", pa.int64()),
        ("split", pa.int32()),
        ("seg", pa.int8()),
        ("hw", pa.binary()),
        ("carry", pa.binary()),
    ]
    return pa.schema(fields + ([("rmd", pa.list_(pa.int64()))] if with_rmd else []))


def unpack(batch: pa.RecordBatch, n_regions: int, with_rmd: bool) -> pa.RecordBatch:
    """Shuffle rows (data and carried, no summaries) back into the columns the key stages read."""
    m = batch.num_rows
    dtype = rec_dtype(n_regions)
    width = dtype.itemsize
    rec = batch.column("rec")
    offsets, data = _offsets_and_bytes(rec)
    lengths = np.diff(offsets)
    if m and (lengths == width).all():  # no tails: the records lie back to back
        fixed = np.frombuffer(data, dtype, count=m, offset=int(offsets[0]))
    else:
        fixed = _windows(data, width)[offsets[:-1]].ravel().view(dtype)
    flags = fixed["flags"]
    tails = _tails(rec, width) if (lengths > width).any() else None
    carry = (
        pa.nulls(m, pa.binary())
        if tails is None or not (flags & CARRIED).any()
        else pc.if_else(pa.array((flags & CARRIED) != 0), tails, pa.scalar(None, pa.binary()))
    )
    sortkey = batch.column("sortkey").to_numpy()
    cols = {
        "bucket": batch.column("bucket"),
        "sortkey": batch.column("sortkey"),
        "partition": pa.array((sortkey >> 32).astype(np.int32)),
        "key": batch.column("key"),
        "region": batch.column("region"),
        "offset": batch.column("offset"),
        "value_hash": pa.array(_column(fixed, "value_hash"), pa.int64(), mask=(flags & HAS_VALUE) == 0),
        "src": pa.array(_column(fixed, "src"), pa.int32()),
        "src_offset": pa.array(_column(fixed, "src_offset"), pa.int64()),
        "split": pa.array(_column(fixed, "split"), pa.int32()),
        "seg": pa.array(_column(fixed, "seg"), pa.int8()),
        "hw": pack_marks(fixed["hw"]),
        "carry": carry,
    }
    if with_rmd:
        has = (flags & HAS_RMD) != 0
        blobs = tails.to_pylist() if tails is not None else [None] * m
        cols["rmd"] = pa.array(
            [np.frombuffer(b, "<i8").tolist() if h else None for b, h in zip(blobs, has, strict=True)],
            pa.list_(pa.int64()),
        )
    schema = unpacked_schema(n_regions, with_rmd)
    return pa.RecordBatch.from_arrays([cols[f.name] for f in schema], schema=schema)


def _column(fixed: np.ndarray, name: str) -> np.ndarray:
    return np.ascontiguousarray(fixed[name]).astype(fixed.dtype[name].newbyteorder("="), copy=False)


def summaries(batch: pa.RecordBatch) -> tuple[list[dict], set[int], int]:
    """(summaries, their buckets, how many leading rows they are) of a reduce batch: summaries sort first."""
    k = int(np.count_nonzero(batch.column("sortkey").to_numpy() == -1))
    texts = batch.column("rec").slice(0, k).to_pylist()
    return [json.loads(t) for t in texts], set(batch.column("bucket").slice(0, k).to_pylist()), k


REDUCE_ORDER = [
    ("sortkey", "ascending"),
    ("key", "ascending"),
    ("region", "ascending"),
    ("offset", "ascending"),
]


def is_summary(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    """A scan row is a split summary when it has a bucket (`summary_batch`)."""
    return table.column("bucket").is_valid().to_numpy(zero_copy_only=False)


def with_sortkeys(batches: list[pa.RecordBatch], carried_sortkeys: pa.ChunkedArray | None = None) -> pa.Table:
    """Scan rows (`SCAN_SCHEMA`) in the shuffle's columns, unsorted: summaries with sortkey -1, the others with
    their (partition, key)'s sortkey (`sortkey_column`). `carried_sortkeys`: the sortkeys of the last rows, the
    carried records, as the state keeps them (computed when they were new rows); a crc32 per row in Python is
    computed only for the others (and for a carried record without one)."""
    from pipelines.leapfrog.carried import sortkeys

    table = pa.Table.from_batches(batches, SCAN_SCHEMA) if batches else SCAN_SCHEMA.empty_table()
    summary = is_summary(table)
    kept = 0 if carried_sortkeys is None else len(carried_sortkeys)
    fresh = table.num_rows - kept
    keys = sortkeys(
        table.column("partition").slice(0, fresh), table.column("key").slice(0, fresh).fill_null(b"")
    )
    sortkey = keys.to_numpy()
    if kept:
        known = carried_sortkeys.combine_chunks()
        if known.null_count:
            missing = known.is_null().to_numpy(zero_copy_only=False)
            computed = sortkeys(
                table.column("partition").slice(fresh), table.column("key").slice(fresh)
            ).to_numpy()
            old = np.where(missing, computed, known.fill_null(0).to_numpy())
        else:
            old = known.to_numpy()
        sortkey = np.concatenate([sortkey, old.astype(np.int64)])
    sortkey = np.where(summary, -1, sortkey)
    bucket = np.full(table.num_rows, bucket_labels(1)[0], np.int32)
    return pa.table(
        {
            "bucket": bucket,
            "sortkey": sortkey,
            "key": table.column("key"),
            "region": table.column("region"),
            "offset": table.column("offset"),
            "rec": table.column("rec"),
        }
    )


def reduce_order(batches: list[pa.RecordBatch], carried_sortkeys: pa.ChunkedArray | None = None) -> pa.Table:
    """The rows as the fused job's reduce task receives them, from one Python process's scan rows: summaries
    first, then by (sortkey, key, region, offset) (`keyed`), in the shuffle's columns (`with_sortkeys`)."""
    return with_sortkeys(batches, carried_sortkeys).sort_by(REDUCE_ORDER)
