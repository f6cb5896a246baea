"""The oracle of the watch's tests: what a nightly `leapfrog` run over whole archives names."""

from __future__ import annotations

import pyarrow.parquet as pq
from leapfrog_run import run_leapfrog
from vt_fixtures import STORE


def named(rows) -> list[tuple]:
    """Findings as what both a nightly run and the watch must name: (partition, pair, key, type)."""
    return sorted((r["partition"], r["region_a"], r["region_b"], r["key"], r["type"]) for r in rows)


def nightly(spark, dirs: dict[int, str], out) -> list[tuple]:
    """`named` findings of the batch job over the archives `dirs` (region → directory), written to `out`."""
    run_leapfrog(spark, STORE, dirs, out)
    return named(pq.read_table(out / "inconsistencies").to_pylist())
