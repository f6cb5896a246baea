"""The one-pass job (`--plan one-pass`, pipelines.leapfrog.onepass) gives the shuffle job's answers, on the same
generated histories: findings, summary.json's counters and facts, the exit code — also when its tasks spill
(a budget far below their rows), and over incremental nights whose state either job wrote."""

from __future__ import annotations

import json
import random
import shutil

import pyarrow.parquet as pq
import pytest
from leapfrog_histories import day_cuts, generated
from leapfrog_run import run_leapfrog
from vt_fixtures import STORE, write_archives

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _run(spark, dirs, out, plan, state=None, mode="heartbeat", memory_mb=None):
    code = run_leapfrog(
        spark,
        STORE,
        dirs,
        out,
        mode=mode,
        state_dir=str(state) if state else None,
        plan=plan,
        task_memory_mb=memory_mb,
    )
    summary = json.loads((out / "summary.json").read_text())
    findings = sorted(
        tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(r.items()))
        for r in pq.read_table(out / "inconsistencies").to_pylist()
    )
    answers = {k: summary[k] for k in ("totals", "by_pair", "by_region", "failed_partitions", "exit_code")}
    return code, findings, answers, summary["timings"]["plan"]


@pytest.fixture(scope="module")
def histories():
    return [h for h in generated(30) if h.n_regions == 3][:30:2]


def test_one_pass_equals_shuffle(spark, tmp_path, histories):
    dirs = write_archives(histories, tmp_path / "archives")
    code, findings, answers, plan = _run(spark, dirs, tmp_path / "shuffle", "shuffle")
    assert plan == "fused" and findings, "no finding: the comparison would prove nothing"
    one = _run(spark, dirs, tmp_path / "one-pass", "one-pass")
    assert one == (code, findings, answers, "one-pass")
    # a budget of a few hundred rows: every task spills its rows into ranges and compares them one by one
    assert _run(spark, dirs, tmp_path / "spilled", "one-pass", memory_mb=0.02) == one


def test_one_pass_incremental_night(spark, tmp_path, histories):
    """Day 2 in one pass (spilling), from a state day 1 wrote with either job, names what day 2 of the shuffle
    job names."""
    cuts = day_cuts(histories, random.Random(3))
    day1 = write_archives(histories, tmp_path / "day1", keep=lambda p, x, off: off <= cuts[(p, x)])
    day2 = write_archives(histories, tmp_path / "day2", keep=lambda p, x, off: off > cuts[(p, x)])
    shuffled, one_pass = tmp_path / "state-shuffle", tmp_path / "state-one-pass"
    _run(spark, day1, tmp_path / "day1-shuffle", "shuffle", shuffled)
    shutil.copytree(shuffled, tmp_path / "state-copy")
    _run(spark, day1, tmp_path / "day1-one-pass", "one-pass", one_pass)
    expected = _run(spark, day2, tmp_path / "day2-shuffle", "shuffle", shuffled)
    assert expected[1], "no finding: the comparison would prove nothing"
    for state in (tmp_path / "state-copy", one_pass):
        got = _run(spark, day2, tmp_path / f"day2-{state.name}", "one-pass", state, memory_mb=0.02)
        assert got[:3] == expected[:3], state.name
        assert got[3] == "one-pass"


def test_rows_past_the_budget_spill_and_come_back_in_reduce_order(tmp_path, monkeypatch):
    """`SortedRows` past its budget writes ranges of sortkey to disk and reads them back in the order an in-memory
    sort gives: by (sortkey, key, region, offset), every key's rows together."""
    import numpy as np
    import pyarrow as pa

    from pipelines.leapfrog import rows as R
    from pipelines.leapfrog.onepass import SortedRows

    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    rng = np.random.default_rng(1)
    m = 5_000
    keys = [b"k%d" % k for k in rng.integers(0, 700, m)]
    partition = rng.integers(3, 5, m).astype(np.int32)
    offsets = rng.permutation(m).astype(np.int64)  # unique: the order has no ties
    batches = [
        pa.RecordBatch.from_arrays(
            [
                pa.nulls(len(part), pa.int32()),
                pa.array(part),
                pa.array(key, pa.binary()),
                pa.array(rng.integers(0, 3, len(part)).astype(np.int32)),
                pa.array(offset),
                pa.array([b"r%d" % i for i in range(len(part))], pa.binary()),
            ],
            schema=R.SCAN_SCHEMA,
        )
        for part, key, offset in (
            (partition[i : i + 1000], keys[i : i + 1000], offsets[i : i + 1000]) for i in range(0, m, 1000)
        )
    ]
    whole = R.reduce_order(batches)
    spilled = SortedRows(budget_rows=400, planned_rows=m)
    for b in batches:
        spilled.add(R.with_sortkeys([b]))
    assert spilled.ranges == 13 and spilled.dir is not None
    assert len(list((tmp_path).glob("tidegauge-onepass-*/*.arrows"))) == 2 * 13
    got = pa.Table.from_batches(list(spilled.batches()))
    assert got.equals(whole)
    assert not list(tmp_path.glob("tidegauge-onepass-*")), "the spill files are removed"
