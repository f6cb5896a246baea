"""`tidegauge watch --changes R`: the change stream written as region R's VT grows equals what the one rule gives over
the whole VT in one pass (`PartitionChanges`), each change once — across micro-batches that cut a chunked value
from its manifest, and across restarts from the checkpoint (the kill -9 test in test_watch_job.py checks it too)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from change_oracle import one_pass
from chunked_histories import write_chunked_archives
from leapfrog_histories import Mix, generate
from small_sim import small_sim
from vt_fixtures import STORE, TOPIC

from div import archive
from pipelines.core.errors import UsageError
from pipelines.core.sources import SourceSpec
from pipelines.watch.changes import read_changes
from pipelines.watch.job import WatchOptions, start

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _copy(src: str, dst, topic: str, keep) -> None:
    with archive.ArchiveWriter(str(dst)) as w:
        for info in archive.describe(src):
            if info.topic != topic:
                continue
            for batch in archive.iter_partition(src, topic, info.partition):
                offsets = batch.column("offset").to_pylist()
                mask = pa.array([keep(info.partition, o) for o in offsets])
                if pa.compute.any(mask).as_py():
                    w.append(batch.filter(mask))


def _watch(spark, opts) -> None:
    for q in start(spark, opts, available_now=True, queries=("changes",)):
        q.awaitTermination()


def test_a_growing_vt_watched_in_small_micro_batches_gives_the_one_pass_changes(spark, tmp_path):
    sim = small_sim(tmp_path / "sim", faults={"failover": 1}, records=900, keys=200)
    region = next(iter(sorted(sim.archives)))
    full = sim.archives[region]
    expected = one_pass(full, sim.topic, 3)
    assert (
        expected.num_rows > 100 and expected.column("upstream_region").null_count > 0
    )  # snapshot and changes
    live = tmp_path / "live"
    cut = {p: o for p, o in ((0, 300), (1, 250))}
    _copy(full, live, sim.topic, lambda p, o: o <= cut[p])
    opts = WatchOptions(
        store=sim.store,
        version=sim.version,
        sources=[SourceSpec(x, str(live) if x == region else d) for x, d in sim.archives.items()],
        checkpoint=str(tmp_path / "ck"),
        out=str(tmp_path / "watch"),
        max_records_per_trigger=170,
        changes_region=region,
    )
    _watch(spark, opts)
    first = read_changes(opts.out).num_rows
    _copy(full, live, sim.topic, lambda p, o: o > cut[p])
    _watch(spark, opts)
    got = read_changes(opts.out).sort_by([("partition", "ascending"), ("vt_offset", "ascending")])
    assert 0 < first < got.num_rows
    assert got.equals(expected)
    _watch(spark, opts)  # nothing new: nothing appended
    assert read_changes(opts.out).num_rows == expected.num_rows


def test_chunked_values_cut_from_their_manifest_by_micro_batches_are_delivered_whole(spark, tmp_path):
    histories = [generate(s, Mix("clean")) for s in range(21, 27)]
    dirs, _ = write_chunked_archives(histories, tmp_path / "chunked")
    n = max(h.n_regions for h in histories)
    expected = one_pass(dirs[0], TOPIC, n)
    assert expected.num_rows > 20
    opts = WatchOptions(
        store=STORE,
        version=1,
        sources=[SourceSpec(x, d) for x, d in dirs.items()],
        checkpoint=str(tmp_path / "ck"),
        out=str(tmp_path / "watch"),
        max_records_per_trigger=7,  # chunk groups are 3+ records: many are cut
        changes_region=0,
        regions=n,
    )
    _watch(spark, opts)
    got = read_changes(opts.out).sort_by([("partition", "ascending"), ("vt_offset", "ascending")])
    assert got.equals(expected)
    assert not (tmp_path / "watch" / "changes_problems").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"changes_region": 5}, "--changes 5: no --source names region 5"),
        ({"changes_region": 0, "starting": "latest"}, "leave --starting at earliest"),
    ],
)
def test_changes_usage_errors(spark, tmp_path, change, message):
    histories = [generate(1, Mix("clean"))]
    dirs, _ = write_chunked_archives(histories, tmp_path / "a")
    opts = WatchOptions(
        store=STORE,
        version=1,
        sources=[SourceSpec(x, d) for x, d in dirs.items()],
        checkpoint=str(tmp_path / "ck"),
        out=str(tmp_path / "watch"),
        **change,
    )
    with pytest.raises(UsageError, match=message):
        start(spark, opts, available_now=True)
    assert not (tmp_path / "watch").exists()
