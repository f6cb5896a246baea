"""The Spark job gives exactly the pure reference's findings on the same records (generated histories).

Histories with known truth (tests/support/leapfrog_histories.py) are written as real VT archives, one history per
partition, and the job's findings, counters and per-region facts must equal `leapfrog.reference.check_partition` on
the same logs — in every mode, including compaction gaps, mid-stream scans, duplicates, failovers and noise.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from leapfrog_histories import generated
from leapfrog_run import run_leapfrog
from vt_fixtures import STORE, spark_value_hash, write_archives

from leapfrog.reference import RegionLog, check_partition

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _reference(h, mode):
    logs = {x: RegionLog(log.entries, log.start, None) for x, log in h.logs.items()}  # what an archive shows
    return check_partition(logs, mode=mode, n_regions=h.n_regions)


def _ref_rows(histories, mode):
    rows = set()
    for p, h in enumerate(histories):
        for f in _reference(h, mode).findings:
            rows.add(
                (
                    p,
                    f.region_a,
                    f.region_b,
                    f.type,
                    f.key,
                    spark_value_hash(f.a_value_hash),
                    spark_value_hash(f.b_value_hash),
                    f.a_vt_offset,
                    f.b_vt_offset,
                    tuple(f.a_vector) if f.a_vector else None,
                    tuple(f.b_vector) if f.b_vector else None,
                    tuple(f.a_high_watermark) if f.a_high_watermark else None,
                    tuple(f.b_high_watermark) if f.b_high_watermark else None,
                    f.status,
                )
            )
    return rows


def _job_rows(out):
    t = pq.read_table(out / "inconsistencies").to_pylist()
    tup = lambda v: tuple(v) if v is not None else None  # noqa: E731
    return {
        (
            r["partition"],
            r["region_a"],
            r["region_b"],
            r["type"],
            r["key"],
            r["a_value_hash"],
            r["b_value_hash"],
            r["a_vt_offset"],
            r["b_vt_offset"],
            tup(r["a_vector"]),
            tup(r["b_vector"]),
            tup(r["a_high_watermark"]),
            tup(r["b_high_watermark"]),
            r["status"],
        )
        for r in t
    }


# Every mode, and every region count in heartbeat mode (the mode the watch and the incremental runs use); the other
# modes at the most regions, whose vectors are the longest. The pure reference is checked against the truth of
# every generated history, in every mode and at every region count, in tests/leapfrog/test_leapfrog_properties.py;
# the job's code does not branch on the region count, and each of the grid's four other cells cost about 30 s.
@pytest.mark.parametrize(
    ("mode", "n_regions"), [("heartbeat", 2), ("heartbeat", 3), ("heartbeat", 4), ("footer", 4), ("rmd", 4)]
)
def test_job_equals_reference(spark, tmp_path, n_regions, mode):
    histories = [h for h in generated(60) if h.n_regions == n_regions][:100]
    assert histories, "the generator produced no history with this many regions"
    dirs = write_archives(histories, tmp_path / "archives")
    out = tmp_path / "out"
    code = run_leapfrog(spark, STORE, dirs, out, mode=mode)
    expected = _ref_rows(histories, mode)
    got = _job_rows(out)
    assert got == expected
    # the exit code follows the open findings; healed ones stay in the output
    assert code == (1 if any(row[-1] == "open" for row in expected) else 0)
    summary = json.loads((out / "summary.json").read_text())
    ref_counts = {}
    for p, h in enumerate(histories):
        for (a, b), c in _reference(h, mode).pair_counters.items():
            ref_counts[(p, a, b)] = (c.keys, c.comparable_pairs, c.skipped_pairs, c.pending_keys)
    job_counts = {
        (e["partition"], e["region_a"], e["region_b"]): (
            e["keys"],
            e["comparable_pairs"],
            e["skipped_pairs"],
            e["pending_keys"],
        )
        for e in summary["by_pair"]
    }
    assert job_counts == ref_counts
