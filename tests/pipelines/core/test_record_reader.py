"""The one reader of records (`pipelines.core.record_reader`): every data source's columns, from one range read.

The data sources themselves are tested with Spark and Kafka in test_kafka_source.py, test_stream_source.py and
tests/pipelines/leapfrog/; here, without either, that a range reads into each layout with the same records and
each layout's Spark schema is its Arrow schema."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from div import archive
from div.archive import ArchiveWriter
from pipelines.core import record_reader
from pipelines.core.record_reader import KAFKA, STREAM, STREAM_RECORDS, VT, Layout

TOPIC = "store_v1"


@pytest.fixture(scope="module")
def arc(tmp_path_factory):
    where = tmp_path_factory.mktemp("records")
    with ArchiveWriter(where) as w:
        for p in (0, 1):
            for o in range(40):
                w.append_record(
                    TOPIC, p, o, b"k%d" % o, b"v%d.%d" % (p, o), 1_700_000_000_000 + o, 0, [("h", b"x")]
                )
    return str(where)


def _read(layout: Layout, arc: str, start: int, end: int, **fill) -> pa.Table:
    batches = list(layout.read(arc, None, TOPIC, 1, start, end, batch_size=16, **fill))
    return pa.Table.from_batches(batches, schema=layout.arrow)


def test_every_layout_reads_the_same_records_with_its_constants(arc):
    kafka = _read(KAFKA, arc, 5, 30)
    assert kafka.column("offset").to_pylist() == list(range(5, 30))
    assert kafka.column("value").to_pylist() == [b"v1.%d" % o for o in range(5, 30)]
    assert set(kafka.column("topic").to_pylist()) == {TOPIC}
    assert set(kafka.column("partition").to_pylist()) == {1}
    vt = _read(VT, arc, 5, 30, region=2, split=7)
    assert vt.schema.names == list(VT.names)
    assert set(vt.column("region").to_pylist()) == {2} and set(vt.column("split").to_pylist()) == {7}
    stream = _read(STREAM, arc, 5, 30, region=3)
    for layout, table in ((VT, vt), (STREAM, stream), (STREAM_RECORDS, _read(STREAM_RECORDS, arc, 5, 30))):
        shared = [n for n in layout.names if n in KAFKA.names]
        assert table.select(shared).to_pylist() == kafka.select(shared).to_pylist(), layout


def test_an_empty_range_reads_nothing_and_a_missing_constant_is_refused(arc):
    assert list(VT.read(arc, None, TOPIC, 1, 9, 9, region=0, split=0)) == []
    with pytest.raises(ValueError, match="no split"):
        next(VT.read(arc, None, TOPIC, 1, 0, 9, region=0))
    with pytest.raises(ValueError, match="no record column 'colour'"):
        Layout(("offset", "colour"))


def test_a_layouts_spark_schema_is_its_arrow_schema():
    for layout in (KAFKA, VT, STREAM, STREAM_RECORDS):
        assert to_arrow_schema(layout.spark, timezone="UTC").equals(layout.arrow), layout
    assert KAFKA.arrow.equals(archive.KAFKA_ARROW_SCHEMA)


def test_a_damaged_archive_raises_a_read_error(tmp_path):
    where = tmp_path / "bad"
    with ArchiveWriter(where) as w:
        w.append_record(TOPIC, 0, 0, b"k", b"v", 1_700_000_000_000, 0, [])
    for f in where.rglob("*.parquet"):
        f.write_bytes(b"not parquet")
    with pytest.raises(record_reader.READ_ERRORS):
        list(KAFKA.read(str(where), None, TOPIC, 0, 0, 1))
