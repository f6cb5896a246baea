"""The archive contract: a directory of Parquet files with Spark's Kafka source schema.

Every job reads either a live Kafka cluster or an archive of it and must give the same answer for the same
records, so an archive stores records exactly as Kafka returned them (no decoding) in the schema Spark's own
Kafka source produces. Archives written by `ArchiveWriter` have a fixed shape that readers can exploit: one
partition per file, records in offset order, no duplicates, files named so that a directory listing sorts by
(topic, partition, first offset), written atomically. Archives written by anything else (a Spark job, a
hand-rolled pyarrow script) may mix partitions in a file, be unsorted or repeat records; the readers here accept
those too, only more slowly.

Readers skip names starting with `.` or `_` (as Spark does), which is how a half-written temporary file stays
invisible: the writer creates `.<name>.<random>.tmp`, fsyncs it and renames it into place.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])

# Field names, order and types are Spark's Kafka source schema; the list item is named "element" because that
# is what Spark's Arrow conversion and compliant Parquet both call it. Everything is nullable, as in Spark.
KAFKA_ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", pa.list_(pa.field("element", HEADER_TYPE))),
    ]
)
COLUMNS: tuple[str, ...] = tuple(KAFKA_ARROW_SCHEMA.names)

# Set in the Parquet key-value metadata of files ArchiveWriter wrote: such a file holds one partition, sorted
# by offset without duplicates, so readers can trust its statistics instead of reading its offsets.
_OURS_KEY = b"tidegauge.archive"
_OURS_VALUE = b"1"
_SUFFIX = ".parquet"

# A batch a reader yields holds at most this many bytes as well as at most `batch_size` rows. Records of chunked
# values are about 1 MiB each, so 65,536 of them would make one batch of 64 GiB: more than a Python worker should
# hold, and past 2 GiB more than Spark's JVM can take from a data source at all (the job dies with no result).
# 64 MiB is what Spark itself puts in one Arrow batch for Python (spark.sql.execution.arrow.maxBytesPerBatch).
MAX_BATCH_BYTES = 64 << 20


class ArchiveError(Exception):
    """An archive directory or file is missing, unreadable, or not in the archive schema."""


@dataclass(frozen=True)
class PartitionInfo:
    """What an archive holds for one partition. `records` counts distinct offsets."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    records: int


def offset_order(records: pa.RecordBatch | pa.Table) -> np.ndarray | None:
    """The row order (stable) that puts records in offset order, or None when they are in it already: a stream's
    records nearly always are, and taking them in the same order would copy every value for nothing."""
    offsets = records.column("offset").to_numpy(zero_copy_only=False)
    if len(offsets) < 2 or bool((offsets[1:] >= offsets[:-1]).all()):
        return None
    return np.argsort(offsets, kind="stable")


def timestamps_ms(batch: pa.RecordBatch | pa.Table) -> list[int | None]:
    """The broker timestamps of an archive-schema batch in epoch milliseconds, as every reader takes them: the
    archive keeps Kafka's milliseconds as microseconds, and this is the one conversion back."""
    us = batch.column(batch.schema.get_field_index("timestamp")).cast(pa.int64())
    return pc.divide(us, 1000).to_pylist()


def file_name(topic: str, partition: int, first_offset: int) -> str:
    """The name ArchiveWriter gives a file. '+' cannot occur in a Kafka topic name and sorts before every
    character that can, so a plain listing sorts by (topic, partition, first offset)."""
    return f"{topic}+{partition:05d}+{first_offset:020d}{_SUFFIX}"


def empty_batch(schema: pa.Schema = KAFKA_ARROW_SCHEMA) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def split_by_partition(batch: pa.RecordBatch) -> list[tuple[tuple[str, int], pa.RecordBatch]]:
    """Split a batch into one batch per (topic, partition), keeping each partition's rows in their order."""
    n = batch.num_rows
    if n == 0:
        return []
    topic_col = batch.column("topic")
    part = batch.column("partition").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    encoded = pc.dictionary_encode(topic_col)
    topic_idx = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    dictionary = encoded.dictionary.to_pylist()
    group = (topic_idx << 32) | part
    if (group == group[0]).all():
        return [((dictionary[int(topic_idx[0])], int(part[0])), batch)]
    order = np.argsort(group, kind="stable")
    sorted_group = group[order]
    cuts = np.flatnonzero(np.diff(sorted_group)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [n]))
    taken = batch.take(pa.array(order))
    out = []
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        g = int(sorted_group[s])
        out.append(((dictionary[g >> 32], g & 0xFFFFFFFF), taken.slice(s, e - s)))
    return out


def records_to_batch(
    records: Sequence[tuple[str, int, int, bytes | None, bytes | None, int, int, list | None]],
) -> pa.RecordBatch:
    """Build an archive batch from (topic, partition, offset, key, value, timestamp_ms, timestamp_type, headers)
    tuples. Kafka timestamps are milliseconds; the archive holds microseconds."""
    if not records:
        return empty_batch()
    topic, partition, offset, key, value, ts_ms, ts_type, headers = zip(*records, strict=True)
    ts_us = np.asarray(ts_ms, dtype=np.int64) * 1000
    arrays = [
        pa.array(key, pa.binary()),
        pa.array(value, pa.binary()),
        pa.array(topic, pa.string()),
        pa.array(partition, pa.int32()),
        pa.array(offset, pa.int64()),
        pa.array(ts_us, pa.timestamp("us", tz="UTC")),
        pa.array(ts_type, pa.int32()),
        pa.array(headers, KAFKA_ARROW_SCHEMA.field("headers").type),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=KAFKA_ARROW_SCHEMA)


def conform(table: pa.Table | pa.RecordBatch, columns: Sequence[str] | None = None) -> pa.Table:
    """Cast a table read from any Kafka-schema Parquet file to KAFKA_ARROW_SCHEMA (or its `columns`).

    Foreign writers differ in details that do not change the records: INT96 or millisecond timestamps, int64
    partitions, large_binary, and no `headers` column at all (Spark's Kafka source without includeHeaders).
    """
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    wanted = list(columns) if columns is not None else list(COLUMNS)
    arrays, fields = [], []
    for name in wanted:
        target = KAFKA_ARROW_SCHEMA.field(name)
        if name in table.column_names:
            col = table.column(name)
            if not col.type.equals(target.type):
                col = _cast_column(col, target.type, name)
        elif name == "headers":
            col = pa.nulls(table.num_rows, target.type)
        else:
            raise ArchiveError(f"column {name!r} is missing (have {table.column_names})")
        arrays.append(col)
        fields.append(target)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _cast_column(col: pa.ChunkedArray, target: pa.DataType, name: str) -> pa.ChunkedArray:
    if pa.types.is_timestamp(col.type) and col.type.tz is None:
        # Spark and Parquet store instants as UTC; a zone-less timestamp here is UTC wall time.
        col = pc.assume_timezone(col, "UTC")
    try:
        return col.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ArchiveError(f"column {name!r} of type {col.type} cannot be read as {target}: {e}") from e


# --------------------------------------------------------------------------------------------- writing


class _PartitionBuffer:
    __slots__ = ("batches", "rows", "nbytes", "records")

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []
        self.rows = 0
        self.nbytes = 0
        self.records: list[tuple] = []


class ArchiveWriter:
    """Buffers records per (topic, partition) and writes each partition's buffer as one Parquet file.

    A file is written when `flush()` or `close()` is called, or when a partition's buffer passes `file_rows`
    rows or `file_bytes` bytes. Each file holds consecutive records of one partition in offset order; records
    appended out of order are sorted before writing. Files are written atomically, so a crash leaves either the
    whole file or nothing a reader can see.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        row_group_size: int = 65536,
        file_rows: int = 1 << 20,
        file_bytes: int = 128 << 20,
        compression: str = "snappy",
    ) -> None:
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.row_group_size = row_group_size
        self.file_rows = file_rows
        self.file_bytes = file_bytes
        self.compression = compression
        self._buffers: dict[tuple[str, int], _PartitionBuffer] = defaultdict(_PartitionBuffer)
        self._last_offsets: dict[tuple[str, int], int] = {}
        self._closed = False
        self.files_written: list[str] = []
        self.records_written = 0

    def __enter__(self) -> ArchiveWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def append(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Add records in the archive schema (any mix of topics and partitions)."""
        self._check_open()
        if isinstance(batch, pa.Table):
            for b in batch.to_batches():
                self.append(b)
            return
        if batch.num_rows == 0:
            return
        if not batch.schema.equals(KAFKA_ARROW_SCHEMA):
            batch = conform(batch).combine_chunks().to_batches()[0]
        for tp, part in split_by_partition(batch):
            _check_topic(tp[0])
            buf = self._buffers[tp]
            if buf.records:
                self._materialize(buf)
            buf.batches.append(part)
            buf.rows += part.num_rows
            buf.nbytes += part.nbytes
            last = part.column("offset")[-1].as_py()
            self._last_offsets[tp] = max(last, self._last_offsets.get(tp, last))
            if buf.rows >= self.file_rows or buf.nbytes >= self.file_bytes:
                self._write_partition(tp, buf)

    def append_record(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int = -1,
        timestamp_type: int = 0,
        headers: Iterable[tuple[str, bytes | None]] | None = None,
    ) -> None:
        """Add one record. `timestamp_ms` is Kafka's millisecond timestamp (-1: none); `timestamp_type` is
        Spark's code (0 CreateTime, 1 LogAppendTime, -1 none)."""
        self._check_open()
        _check_topic(topic)
        tp = (topic, int(partition))
        buf = self._buffers[tp]
        buf.records.append(
            (
                topic,
                int(partition),
                int(offset),
                key,
                value,
                int(timestamp_ms),
                int(timestamp_type),
                None if headers is None else list(headers),
            )
        )
        self._last_offsets[tp] = max(int(offset), self._last_offsets.get(tp, int(offset)))
        if len(buf.records) >= self.row_group_size:
            self._materialize(buf)
            if buf.rows >= self.file_rows or buf.nbytes >= self.file_bytes:
                self._write_partition(tp, buf)

    def last_offsets(self) -> dict[tuple[str, int], int]:
        """Highest offset appended so far per (topic, partition), written or still buffered."""
        return dict(self._last_offsets)

    def buffered_records(self) -> int:
        return sum(b.rows + len(b.records) for b in self._buffers.values())

    def flush(self) -> None:
        """Write every partition's buffered records to its own new file."""
        self._check_open()
        for tp, buf in list(self._buffers.items()):
            self._materialize(buf)
            if buf.rows:
                self._write_partition(tp, buf)

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise ArchiveError(f"archive writer for {self.directory} is closed")

    @staticmethod
    def _materialize(buf: _PartitionBuffer) -> None:
        if buf.records:
            batch = records_to_batch(buf.records)
            buf.records = []
            buf.batches.append(batch)
            buf.rows += batch.num_rows
            buf.nbytes += batch.nbytes

    def _write_partition(self, tp: tuple[str, int], buf: _PartitionBuffer) -> None:
        table = pa.Table.from_batches(buf.batches, schema=KAFKA_ARROW_SCHEMA)
        buf.batches, buf.rows, buf.nbytes = [], 0, 0
        offsets = table.column("offset").to_numpy()
        if offsets.size > 1 and not (np.diff(offsets) > 0).all():
            order = np.argsort(offsets, kind="stable")
            offsets = offsets[order]
            keep = np.concatenate(([True], np.diff(offsets) != 0))  # a re-appended offset is kept once
            table = table.take(pa.array(order[keep]))
        name = file_name(tp[0], tp[1], int(table.column("offset")[0].as_py()))
        final = os.path.join(self.directory, name)
        if os.path.exists(final):
            raise ArchiveError(
                f"{final} already exists: records from offset {table.column('offset')[0]} "
                f"of {tp[0]}[{tp[1]}] were archived before"
            )
        table = table.replace_schema_metadata({_OURS_KEY: _OURS_VALUE})
        tmp = os.path.join(self.directory, f".{name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            pq.write_table(table, tmp, row_group_size=self.row_group_size, compression=self.compression)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, final)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        _fsync_dir(self.directory)
        self.files_written.append(final)
        self.records_written += table.num_rows


def _check_topic(topic: str) -> None:
    if not topic or topic[0] in "._":
        # Spark (and our readers) skip files whose names start with '.' or '_', so such a topic's archive
        # would silently read as empty.
        raise ArchiveError(
            f"topic {topic!r}: names starting with '.' or '_' cannot be archived (Spark ignores such files)"
        )


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Chunk:
    """The rows of one partition inside one Parquet row group."""

    path: str
    row_group: int
    topic: str
    partition: int
    min_offset: int
    max_offset: int
    rows: int
    mixed: bool  # the row group also holds other partitions: rows must be filtered
    trusted: bool  # written by ArchiveWriter: sorted, unique
    fs: pafs.FileSystem = field(default=None, compare=False)  # where `path` is (None: local disk)


def _list_files(directory: str, fs: pafs.FileSystem) -> list[pafs.FileInfo]:
    """The archive's Parquet files, sorted by path; names starting with '.' or '_' (and what they hold) skipped."""
    try:
        if fs.get_file_info(directory).type != pafs.FileType.Directory:
            raise ArchiveError(f"archive {directory}: no such directory")
        infos = fs.get_file_info(pafs.FileSelector(directory, recursive=True))
    except OSError as e:
        raise ArchiveError(f"archive {directory}: cannot list: {e}") from e
    out = []
    for i in infos:
        rel = posixpath.relpath(i.path, directory)
        if (
            i.type == pafs.FileType.File
            and i.path.endswith(_SUFFIX)
            and not any(part.startswith((".", "_")) for part in rel.split("/"))
        ):
            out.append(i)
    return sorted(out, key=lambda i: i.path)


def _open(path: str, fs: pafs.FileSystem | None) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path, filesystem=fs, coerce_int96_timestamp_unit="us")
    except (OSError, pa.ArrowException) as e:
        raise ArchiveError(f"{path}: unreadable Parquet file: {e}") from e


def _stat(rg: pq.RowGroupMetaData, idx: int) -> tuple[object, object] | None:
    st = rg.column(idx).statistics
    if st is None or not st.has_min_max:
        return None
    return st.min, st.max


def _index_file(path: str, fs: pafs.FileSystem) -> list[_Chunk]:
    pf = _open(path, fs)
    md = pf.metadata
    names = pf.schema_arrow.names
    for required in ("topic", "partition", "offset"):
        if required not in names:
            raise ArchiveError(
                f"{path}: not in the Kafka archive schema (no {required!r} column; has {names})"
            )
    trusted = (md.metadata or {}).get(_OURS_KEY) == _OURS_VALUE
    leaf = {md.schema.column(i).path: i for i in range(md.num_columns)}
    ti, pi, oi = leaf["topic"], leaf["partition"], leaf["offset"]
    chunks: list[_Chunk] = []
    for r in range(md.num_row_groups):
        rg = md.row_group(r)
        if rg.num_rows == 0:
            continue
        ts, ps, os_ = _stat(rg, ti), _stat(rg, pi), _stat(rg, oi)
        if (
            ts
            and ps
            and os_
            and ts[0] == ts[1]
            and ps[0] == ps[1]
            and rg.column(oi).statistics.null_count == 0
        ):
            topic = ts[0].decode() if isinstance(ts[0], bytes) else ts[0]
            chunks.append(
                _Chunk(
                    path,
                    r,
                    topic,
                    int(ps[0]),
                    int(os_[0]),
                    int(os_[1]),
                    rg.num_rows,
                    mixed=False,
                    trusted=trusted,
                    fs=fs,
                )
            )
            continue
        # Statistics cannot tell which partitions are in here: read the three small columns once.
        try:
            t = pf.read_row_group(r, columns=["topic", "partition", "offset"])
        except (OSError, pa.ArrowException) as e:
            raise ArchiveError(f"{path}: unreadable row group {r}: {e}") from e
        t = t.filter(pc.is_valid(t.column("offset")))
        if t.num_rows == 0:
            continue
        grouped = t.group_by(["topic", "partition"]).aggregate(
            [("offset", "min"), ("offset", "max"), ("offset", "count")]
        )
        for row in grouped.to_pylist():
            chunks.append(
                _Chunk(
                    path,
                    r,
                    row["topic"],
                    int(row["partition"]),
                    int(row["offset_min"]),
                    int(row["offset_max"]),
                    int(row["offset_count"]),
                    mixed=True,
                    trusted=False,
                    fs=fs,
                )
            )
    return chunks


# Footers parsed before, by (filesystem, path, size, mtime): reading one partition of a long archive must not
# re-read the footers of every file each time. Files are never rewritten in place, so a changed file gets a new key.
_FOOTER_CACHE: dict[tuple[str, str, int, int | None], list[_Chunk]] = {}
_FOOTER_CACHE_MAX = 20000
_LOCAL = pafs.LocalFileSystem()


def _index_file_cached(info: pafs.FileInfo, fs: pafs.FileSystem) -> list[_Chunk]:
    key = (fs.type_name, info.path, info.size, info.mtime_ns)
    chunks = _FOOTER_CACHE.get(key)
    if chunks is None:
        chunks = _index_file(info.path, fs)
        if len(_FOOTER_CACHE) >= _FOOTER_CACHE_MAX:
            _FOOTER_CACHE.clear()
        _FOOTER_CACHE[key] = chunks
    return chunks


def _index(
    directory: str | os.PathLike, filesystem: pafs.FileSystem | None
) -> dict[tuple[str, int], list[_Chunk]]:
    fs = filesystem or _LOCAL
    where = os.fspath(directory)
    if filesystem is None:
        where = os.path.abspath(where)
    by_tp: dict[tuple[str, int], list[_Chunk]] = defaultdict(list)
    for info in _list_files(where, fs):
        for c in _index_file_cached(info, fs):
            by_tp[(c.topic, c.partition)].append(c)
    for chunks in by_tp.values():
        chunks.sort(key=lambda c: (c.min_offset, c.max_offset, c.path, c.row_group))
    return dict(by_tp)


def _clean(chunks: list[_Chunk]) -> bool:
    """True when the chunks can be concatenated as they are: each sorted and unique, none overlapping."""
    if not all(c.trusted for c in chunks):
        return False
    return all(a.max_offset < b.min_offset for a, b in zip(chunks, chunks[1:], strict=False))


def topics(directory: str | os.PathLike, filesystem: pafs.FileSystem | None = None) -> list[str]:
    """The topics an archive holds, sorted. `filesystem`: where `directory` is (pyarrow's; default local disk)."""
    return sorted({t for t, _ in _index(directory, filesystem)})


def describe(directory: str | os.PathLike, filesystem: pafs.FileSystem | None = None) -> list[PartitionInfo]:
    """One PartitionInfo per (topic, partition) in the archive, sorted. Uses Parquet statistics when the files
    allow it; otherwise reads the offset column to count distinct offsets."""
    out = []
    for (topic, partition), chunks in sorted(_index(directory, filesystem).items()):
        if _clean(chunks):
            out.append(
                PartitionInfo(
                    topic, partition, chunks[0].min_offset, chunks[-1].max_offset, sum(c.rows for c in chunks)
                )
            )
            continue
        _check_no_conflicting_repeats(chunks, topic, partition)
        offsets = [
            b.column("offset").to_numpy()
            for b in _iter_chunks(chunks, topic, partition, None, None, ["offset"], 1 << 20)
        ]
        if not offsets:
            continue
        arr = np.concatenate(offsets)
        out.append(PartitionInfo(topic, partition, int(arr[0]), int(arr[-1]), int(arr.size)))
    return out


def _check_no_conflicting_repeats(chunks: list[_Chunk], topic: str, partition: int) -> None:
    """Raise ArchiveError when one offset holds two different records.

    An archive may repeat a record (a writer that retried): the same offset with the same key and value is read
    once. The same offset with another record cannot be one log: it is what two regions' archives under
    one directory look like, and merging them would compare a region with a mix of two."""
    files: dict[str, pq.ParquetFile] = {}
    for cluster in _clusters(chunks):
        if len(cluster) == 1 and cluster[0].trusted:
            continue
        offsets = np.concatenate(
            [
                _read_chunk(files, c, topic, partition, None, None, ["offset"]).column("offset").to_numpy()
                for c in cluster
            ]
        )
        s = np.sort(offsets)
        repeated = np.unique(s[1:][s[1:] == s[:-1]])
        if repeated.size == 0:
            continue
        wanted = pa.array(repeated)
        seen: dict[int, tuple] = {}
        for c in cluster:
            # key and value decide (a writer without a headers column loses headers, not the record)
            t = _read_chunk(files, c, topic, partition, None, None, ["offset", "key", "value"])
            t = t.filter(pc.is_in(t.column("offset"), value_set=wanted))
            for row in t.to_pylist():
                content = (row["key"], row["value"])
                first = seen.setdefault(row["offset"], content)
                if first != content:
                    raise ArchiveError(
                        f"holds offset {row['offset']} of {topic}[{partition}] twice, with different "
                        "records (several regions' archives under one directory?)"
                    )


def iter_partition(
    directory: str | os.PathLike,
    topic: str,
    partition: int,
    start: int | None = None,
    end: int | None = None,
    columns: Sequence[str] | None = None,
    batch_size: int = 65536,
    filesystem: pafs.FileSystem | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield one partition's records with offsets in [start, end) in offset order, each offset once, in
    batches of at most `batch_size` rows and MAX_BATCH_BYTES bytes in KAFKA_ARROW_SCHEMA (or only `columns` of
    it)."""
    if columns is not None:
        unknown = [c for c in columns if c not in COLUMNS]
        if unknown:
            raise ValueError(f"unknown archive columns {unknown}; the archive has {list(COLUMNS)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    chunks = _index(directory, filesystem).get((topic, int(partition)), [])
    chunks = [
        c for c in chunks if (start is None or c.max_offset >= start) and (end is None or c.min_offset < end)
    ]
    yield from _iter_chunks(chunks, topic, int(partition), start, end, columns, batch_size)


def _iter_chunks(
    chunks: list[_Chunk],
    topic: str,
    partition: int,
    start: int | None,
    end: int | None,
    columns: Sequence[str] | None,
    batch_size: int,
) -> Iterator[pa.RecordBatch]:
    out_cols = list(columns) if columns is not None else list(COLUMNS)
    files: dict[str, pq.ParquetFile] = {}
    rebatch = _Rebatcher(batch_size)
    for cluster in _clusters(chunks):
        if len(cluster) == 1 and cluster[0].trusted:
            table = _read_chunk(files, cluster[0], topic, partition, start, end, out_cols)
        else:
            parts = [
                _read_chunk(files, c, topic, partition, start, end, out_cols + ["offset"]) for c in cluster
            ]
            table = _sort_unique(pa.concat_tables(parts)).select(out_cols)
        yield from rebatch.add(table)
    yield from rebatch.finish()


def _clusters(chunks: list[_Chunk]) -> Iterator[list[_Chunk]]:
    """Group chunks (sorted by min offset) into runs whose offset ranges overlap; runs are disjoint."""
    cur: list[_Chunk] = []
    cur_max = -1
    for c in chunks:
        if cur and c.min_offset <= cur_max:
            cur.append(c)
            cur_max = max(cur_max, c.max_offset)
        else:
            if cur:
                yield cur
            cur, cur_max = [c], c.max_offset
    if cur:
        yield cur


def _read_chunk(
    files: dict[str, pq.ParquetFile],
    c: _Chunk,
    topic: str,
    partition: int,
    start: int | None,
    end: int | None,
    out_cols: list[str],
) -> pa.Table:
    pf = files.get(c.path)
    if pf is None:
        pf = files[c.path] = _open(c.path, c.fs)
    need_filter = (
        c.mixed or (start is not None and c.min_offset < start) or (end is not None and c.max_offset >= end)
    )
    present = set(pf.schema_arrow.names)
    read_cols = list(
        dict.fromkeys(
            [col for col in out_cols if col in present]
            + (["topic", "partition", "offset"] if need_filter else [])
        )
    )
    try:
        t = pf.read_row_group(c.row_group, columns=read_cols)
    except (OSError, pa.ArrowException) as e:
        raise ArchiveError(f"{c.path}: unreadable row group {c.row_group}: {e}") from e
    if need_filter:
        mask = pc.is_valid(t.column("offset"))
        if c.mixed:
            mask = pc.and_(
                mask, pc.and_(pc.equal(t.column("topic"), topic), pc.equal(t.column("partition"), partition))
            )
        if start is not None:
            mask = pc.and_(mask, pc.greater_equal(t.column("offset"), start))
        if end is not None:
            mask = pc.and_(mask, pc.less(t.column("offset"), end))
        t = t.filter(mask)
    try:
        return conform(t, list(dict.fromkeys(out_cols)))
    except ArchiveError as e:
        raise ArchiveError(f"{c.path}: {e}") from e


def _sort_unique(table: pa.Table) -> pa.Table:
    offsets = table.column("offset").to_numpy()
    if offsets.size == 0:
        return table
    order = np.argsort(offsets, kind="stable")
    s = offsets[order]
    keep = np.concatenate(([True], s[1:] != s[:-1]))
    if keep.all() and (order == np.arange(order.size)).all():
        return table
    return table.take(pa.array(order[keep]))


def bounded_batches(
    table: pa.Table | pa.RecordBatch, max_rows: int, max_bytes: int | None = None
) -> Iterator[pa.RecordBatch]:
    """`table` cut, in order, into batches of at most `max_rows` rows and `max_bytes` (default MAX_BATCH_BYTES)
    bytes; a single record larger than that makes a batch of its own."""
    max_bytes = MAX_BATCH_BYTES if max_bytes is None else max_bytes
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    start = 0
    for end in _cuts(_row_bytes(table), max_rows, max_bytes):
        # Each piece is made contiguous on its own: the whole table in one chunk could pass 2 GiB of values,
        # which a binary column's 32-bit offsets cannot address.
        yield from table.slice(start, end - start).combine_chunks().to_batches(max_chunksize=end - start)
        start = end


def _row_bytes(table: pa.Table) -> np.ndarray:
    """Each row's size: the exact length of its binary and string values plus an equal share of the rest."""
    n = table.num_rows
    sizes = np.zeros(n, dtype=np.int64)
    rest = 0
    for col in table.columns:
        if pa.types.is_binary(col.type) or pa.types.is_string(col.type):
            lengths = pc.fill_null(pc.binary_length(col), 0)
            sizes += lengths.to_numpy().astype(np.int64, copy=False) + 4  # + its 32-bit offset
        else:
            rest += col.nbytes
    if n:
        sizes += -(-rest // n)
    return sizes


def _cuts(sizes: np.ndarray, max_rows: int, max_bytes: int) -> list[int]:
    """End indices of consecutive slices of rows with these sizes, each within both limits."""
    ends: list[int] = []
    total = np.cumsum(sizes)
    start, before = 0, 0
    while start < len(sizes):
        end = int(np.searchsorted(total, before + max_bytes, side="right"))
        end = min(max(end, start + 1), start + max_rows, len(sizes))
        ends.append(end)
        before, start = int(total[end - 1]), end
    return ends


class _Rebatcher:
    """Turns tables of any size into batches of at most `batch_size` rows and `max_bytes` bytes."""

    def __init__(self, batch_size: int, max_bytes: int | None = None) -> None:
        self.batch_size = batch_size
        self.max_bytes = MAX_BATCH_BYTES if max_bytes is None else max_bytes
        self.pending: list[pa.Table] = []
        self.rows = 0
        self.nbytes = 0

    def add(self, table: pa.Table) -> Iterator[pa.RecordBatch]:
        if table.num_rows == 0:
            return
        self.pending.append(table)
        self.rows += table.num_rows
        self.nbytes += table.nbytes
        if self.rows < self.batch_size and self.nbytes < self.max_bytes:
            return
        merged = pa.concat_tables(self.pending)
        ends = _cuts(_row_bytes(merged), self.batch_size, self.max_bytes)
        # every slice but the last is full; the last waits for the rows that may fill it
        full = ends[-2] if len(ends) > 1 else 0
        if full:
            yield from bounded_batches(merged.slice(0, full), self.batch_size, self.max_bytes)
        rest = merged.slice(full)
        self.pending = [rest] if rest.num_rows else []
        self.rows = rest.num_rows
        self.nbytes = rest.nbytes

    def finish(self) -> Iterator[pa.RecordBatch]:
        if self.rows:
            yield from bounded_batches(pa.concat_tables(self.pending), self.batch_size, self.max_bytes)
        self.pending, self.rows, self.nbytes = [], 0, 0


def iter_archive(
    directory: str | os.PathLike,
    topic_names: Iterable[str] | None = None,
    columns: Sequence[str] | None = None,
    batch_size: int = 65536,
    filesystem: pafs.FileSystem | None = None,
) -> Iterator[pa.RecordBatch]:
    """Every partition of the given topics (default: all), partition by partition, each in offset order."""
    wanted = None if topic_names is None else set(topic_names)
    for info in describe(directory, filesystem):
        if wanted is None or info.topic in wanted:
            yield from iter_partition(
                directory,
                info.topic,
                info.partition,
                columns=columns,
                batch_size=batch_size,
                filesystem=filesystem,
            )
