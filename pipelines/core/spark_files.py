"""Parquet datasets that Spark tasks read and write through tidegauge's filesystem layer, not through Hadoop's.

A job's large results (findings, DIV errors, the incremental state's carried records) are written by executors,
and an incremental run reads them back in executors. Handing Spark the path would make Spark open it with its
Hadoop connectors: a relative or driver-only path means something else on each executor, and S3, GCS or Azure
need connector jars and their own credential settings. Instead the driver lists the files with
`pipelines.core.storage`, and each task opens its own files (or writes its own part file) with the same pyarrow
filesystem, resolved from the URI on the executor. One file per task, named by the task's partition, so a retried
task rewrites the same file with the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from pipelines.core.output import ParquetFileWriter, write_parquet_file
from pipelines.core.storage import Location, locate


class _ReadFiles:
    """`mapInArrow` over ids: task i reads file i, in batches, as `schema` (after `convert`); with `where`, only
    the rows it keeps, skipping the row groups whose statistics rule them out unread."""

    def __init__(
        self,
        uris: list[str],
        schema: pa.Schema,
        convert: Callable[[pa.Table], pa.Table] | None,
        where: pc.Expression | None,
    ) -> None:
        self.uris, self.schema, self.convert, self.where = uris, schema, convert, where

    def _batches(self, f: Location) -> Iterator[pa.RecordBatch]:
        if self.where is None:
            pf = pq.ParquetFile(f.path, filesystem=f.fs, coerce_int96_timestamp_unit="us")
            yield from pf.iter_batches(batch_size=65536)
            return
        fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit="us"))
        yield from ds.dataset(f.path, filesystem=f.fs, format=fmt).to_batches(
            filter=self.where, batch_size=65536
        )

    def __call__(self, ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in ids:
            for i in b.column(0).to_pylist():
                for batch in self._batches(locate(self.uris[i])):
                    t = pa.Table.from_batches([batch])
                    t = self.convert(t) if self.convert is not None else t.select(self.schema.names)
                    yield from t.cast(self.schema).to_batches()


def read_parquet(
    spark: SparkSession,
    directory: Location,
    schema: pa.Schema | None = None,
    convert: Callable[[pa.Table], pa.Table] | None = None,
    where: pc.Expression | None = None,
) -> DataFrame | None:
    """The Parquet files under `directory` (names starting with '.' or '_' skipped) as a DataFrame, one task per
    file; None when there are none. `schema`: the columns and types wanted (default: the first file's);
    `convert`: applied to each batch before the cast (e.g. `div.archive.conform` for foreign archives); `where`:
    a filter on the files' own columns, pushed down to their row-group statistics (so a damaged row group of
    rows not wanted is never read, as with Spark's own reader)."""
    files = directory.files(".parquet")
    if not files:
        return None
    if schema is None:
        schema = pq.read_schema(files[0].path, filesystem=files[0].fs).remove_metadata()
    n = len(files)
    return spark.range(0, n, 1, n).mapInArrow(
        _ReadFiles([f.uri for f in files], schema, convert, where), from_arrow_schema(schema)
    )


class _WriteFiles:
    def __init__(self, uri: str, schema: pa.Schema) -> None:
        self.uri, self.schema = uri, schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        part = TaskContext.get().partitionId()
        writer = ParquetFileWriter(locate(self.uri) / f"part-{part:05d}.parquet", self.schema)
        rows = 0
        for b in batches:
            if b.num_rows:
                writer.write(pa.Table.from_batches([b]).cast(self.schema))
                rows += b.num_rows
        writer.close()
        yield pa.RecordBatch.from_pylist([{"rows": rows}], schema=pa.schema([("rows", pa.int64())]))


def write_parquet(df: DataFrame, directory: Location) -> int:
    """Write `df` under `directory` (one file per Spark partition that has rows; one empty file with the schema
    when none has, so the dataset is readable) and return the row count."""
    schema = to_arrow_schema(df.schema)
    directory.makedirs()
    counts = df.mapInArrow(_WriteFiles(directory.uri, schema), "rows long").collect()
    rows = sum(r["rows"] for r in counts)
    if rows == 0:
        write_parquet_file(schema.empty_table(), directory / "part-00000.parquet")
    return rows
