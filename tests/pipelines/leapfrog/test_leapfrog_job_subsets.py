"""Safe and Live on any subset of regions, for the nightly job, its incremental runs and the watch.

Generated histories of stores with 3 and 5 regions (tests/support/leapfrog_histories.py: failovers, compaction,
lag, duplicates, noise) are written as one archive per region, one history per partition. The nightly job over all
the archives is the oracle; over a random subset S of at least two regions, each job must report exactly the full
run's findings for the pairs inside S, with the same counters, vectors and marks. Region ids are the store's: a
record of a region outside S still raises the marks and its value stands, so nothing is left out of range.

The pure rule is stated over many more histories in tests/leapfrog/test_leapfrog_subsets.py.
"""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from leapfrog_histories import generated, subsets
from vt_fixtures import STORE, TOPIC, write_archives

from div import archive
from pipelines.core.sources import SourceSpec
from pipelines.leapfrog.job import FINDING_COLUMNS, LeapfrogOptions, run
from pipelines.watch.job import WatchOptions, store_regions_of
from pipelines.watch.leapfrog_step import RECORD_COLUMNS, LeapfrogStep

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# every column of a finding but the run's names: a subset run's rows equal the full run's, vectors and marks included
FINDING_FIELDS = tuple(c for c in FINDING_COLUMNS if c not in ("store", "version"))
COUNTER_FIELDS = ("keys", "comparable_pairs", "skipped_pairs", "pending_keys")


def _rows(out) -> set[tuple]:
    tup = lambda v: tuple(v) if isinstance(v, list) else v  # noqa: E731
    return {
        tuple(tup(r[f]) for f in FINDING_FIELDS) for r in pq.read_table(out / "inconsistencies").to_pylist()
    }


def _counters(summary) -> dict:
    return {
        (e["partition"], e["region_a"], e["region_b"]): tuple(e[f] for f in COUNTER_FIELDS)
        for e in summary["by_pair"]
    }


def _run(spark, dirs, regions, out, state=None) -> tuple[int, dict]:
    code = run(
        LeapfrogOptions(
            store=STORE,
            version=1,
            out=str(out),
            state_dir=str(state) if state is not None else None,
            sources=[SourceSpec(x, dirs[x]) for x in regions],
        ),
        spark=spark,
    )
    return code, json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module", params=[3, 5])  # 4 lies between: the rule does not depend on the count
def store(request, spark, tmp_path_factory):
    n = request.param
    root = tmp_path_factory.mktemp(f"subsets{n}")
    histories = [h for h in generated(12, (3, 5)) if h.n_regions == n]  # every fault mix
    dirs = write_archives(histories, root / "archives")
    code, summary = _run(spark, dirs, range(n), root / "full")
    full = _rows(root / "full")
    assert len(full) > 5, "too few divergences for the comparison to mean anything"
    assert summary["store_regions"] == n and summary["totals"]["out_of_range"] > 0  # the noise's region n
    return n, histories, dirs, root, full, _counters(summary), summary


def _inside(rows, regions):
    return {r for r in rows if r[1] in regions and r[2] in regions}


def test_nightly_on_a_subset_reports_the_full_runs_findings_of_its_pairs(spark, store):
    n, _, dirs, root, full, counters, full_summary = store
    for i, s in enumerate(subsets(n, random.Random(n))):
        code, summary = _run(spark, dirs, s, root / f"nightly-{i}")
        assert _rows(root / f"nightly-{i}") == _inside(full, set(s)), s
        assert _counters(summary) == {k: v for k, v in counters.items() if set(k[1:]) <= set(s)}, s
        assert summary["store_regions"] == n and summary["store_regions_from"] == "heartbeats"
        # what is out of range is what the full run calls so (the noise's region n), nothing of the store's
        oor = {e["region"]: e["out_of_range"] for e in full_summary["by_region"]}
        assert {e["region"]: e["out_of_range"] for e in summary["by_region"]} == {x: oor[x] for x in s}


def test_incremental_runs_on_a_subset_report_the_full_runs_findings_of_its_pairs(spark, store, tmp_path):
    n, histories, _, _, full, _, _ = store
    rng = random.Random(f"incremental{n}")
    cut = {(p, x): rng.randint(0, 12) for p, h in enumerate(histories) for x in range(h.n_regions)}
    day1 = write_archives(histories, tmp_path / "day1", keep=lambda p, x, o: o <= cut[(p, x)])
    day2 = write_archives(histories, tmp_path / "day2", keep=lambda p, x, o: o > cut[(p, x)])
    (s,) = subsets(n, rng, count=1)
    _run(spark, day1, s, tmp_path / "out1", state=tmp_path / "state")
    code, summary = _run(spark, day2, s, tmp_path / "out2", state=tmp_path / "state")
    assert summary["store_regions"] == n
    # night 2 gives night 1's findings the status it finds for their keys now: the newest row of a finding counts
    status = FINDING_FIELDS.index("status")
    latest = {}
    for out in ("out1", "out2"):
        for r in _rows(tmp_path / out):
            latest[r[:status] + r[status + 1 : 8]] = r[:8]
    assert set(latest.values()) == {r[:8] for r in _inside(full, set(s))}, s


def test_the_watch_on_a_subset_names_the_full_runs_findings_of_its_pairs(store, tmp_path):
    n, histories, dirs, _, full, _, _ = store
    (s,) = subsets(n, random.Random(f"watch{n}"), count=1)
    opts = WatchOptions(
        STORE, 1, [SourceSpec(x, dirs[x]) for x in s], str(tmp_path / "cp"), str(tmp_path / "o")
    )
    assert store_regions_of(opts) == n
    assert json.loads((tmp_path / "cp" / "store-regions.json").read_text())["from"] == "heartbeats"
    step = LeapfrogStep(tuple((a, b) for a in s for b in s if a < b), n)
    found = set()
    for p in range(len(histories)):
        tables = {
            x: pa.Table.from_batches(list(archive.iter_partition(dirs[x], TOPIC, p, columns=RECORD_COLUMNS)))
            for x in s
        }
        state = None
        for half in (0, 1):  # two micro-batches a partition, the state carried between them
            batch = {
                x: t.slice(0, t.num_rows // 2) if half == 0 else t.slice(t.num_rows // 2)
                for x, t in tables.items()
            }
            result = step(p, batch, state)
            assert not result.failed
            found |= {
                (r["partition"], r["region_a"], r["region_b"], r["type"], r["key"])
                for r in result.findings.to_pylist()
            }
            state = result.state
    named = [FINDING_FIELDS.index(c) for c in ("partition", "region_a", "region_b", "type", "key")]
    assert found == {tuple(r[i] for i in named) for r in _inside(full, set(s))}, s


@pytest.mark.parametrize("store", [3], indirect=True)  # the rule does not depend on the count: one is enough
def test_a_probe_that_misses_the_heartbeats_costs_a_second_read_not_a_wrong_answer(
    spark, store, monkeypatch, caplog
):
    # the probe reads the sources' tails only; when they hold no heartbeat vector, the scan still meets one and
    # the nightly job reads again with the store's width
    from pipelines.leapfrog import regions

    n, _, dirs, root, full, _, _ = store
    monkeypatch.setattr(regions, "PROBE_PARTITIONS", 0)
    s = (0, 1)  # the sources alone would say 2 regions
    code, summary = _run(spark, dirs, s, root / "missed")
    assert _rows(root / "missed") == _inside(full, set(s))
    assert summary["store_regions"] == n and summary["store_regions_from"] == "heartbeats"
    assert f"give --regions {n} to spare the first read" in caplog.text
