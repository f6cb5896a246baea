"""The Spark reader of archives (`pipelines.core.archive_source`): it reads what `div.archive` writes, and archives
Spark itself wrote, in offset order. The archive format alone is tested in tests/div/test_archive.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
from archive_samples import make_records, read_all

from div import archive
from div.archive import ArchiveWriter


@pytest.mark.spark
def test_archive_written_by_spark_reads_in_offset_order(spark, tmp_path):
    from pipelines.core.archive_source import read_archive

    src = tmp_path / "ours"
    recs = make_records("s_v1", 0, range(500)) + make_records("s_v1", 1, range(200))
    with ArchiveWriter(src) as w:
        w.append(archive.records_to_batch(recs))
    foreign = tmp_path / "spark"
    # Spark writes mixed, shuffled partitions, its own timestamp encoding and a _SUCCESS marker.
    read_archive(spark, src).repartition(3).write.parquet(str(foreign))
    assert any(n.startswith("_SUCCESS") for n in os.listdir(foreign))
    for p, n in ((0, 500), (1, 200)):
        table = read_all(foreign, "s_v1", p)
        assert table.to_pylist() == read_all(src, "s_v1", p).to_pylist()
        assert table.column("offset").to_pylist() == list(range(n))

    def rows(df):
        return sorted(map(tuple, df.collect()), key=lambda r: (r[2], r[3], r[4]))

    a = rows(read_archive(spark, src))
    b = rows(read_archive(spark, foreign, "s_v1"))
    assert a == b and len(a) == 700
    assert read_archive(spark, src, ["other"]).count() == 0
    offs = np.array([r.offset for r in read_archive(spark, src, "s_v1").where("partition = 1").collect()])
    assert sorted(offs.tolist()) == list(range(200))
