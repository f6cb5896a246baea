"""The three change readers deliver the same changes, and exactly the ones the simulation's truth names.

A simulation with VT redeliveries, a leader failover and a version swap while writes go on (3 regions, 2 partitions;
truth.json's `changes` says what each region's reader must get). For every region:

- `tidegauge changes` reads version 1 with `--state`, then version 2 with the same state (a swap): the coordinates
  it delivers are exactly `expected_changes` (each once; bulk load aside), and version 2's bulk load is skipped;
- the consumer API (`ChangeReader`) reads the same VTs from an Apache Kafka broker, version 1 to its end, then
  `follow(2)`: its events are the CLI's rows, column for column;
- the watch (`watch --changes R`, version 1: it follows no swap) appends the CLI's version-1 rows.

The rule has one home (heartbeat/changes.py, heartbeat/change_events.py); this test is what keeps its three callers
from drifting apart. The rule's own property test is tests/heartbeat/test_changes_properties.py.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from change_truth import expected_changes, swap_sim_config
from kafka_copy import produce_archive

from heartbeat import ChangeReader
from heartbeat.change_events import CHANGES_SCHEMA
from pipelines.cli import main
from pipelines.core.sources import SourceSpec
from pipelines.watch.changes import read_changes
from pipelines.watch.job import WatchOptions, start
from sim import run

pytestmark = [pytest.mark.slow]
ORDER = [("partition", "ascending"), ("vt_offset", "ascending")]


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    cfg = swap_sim_config(
        tmp_path_factory.mktemp("readers") / "sim", seed=11, records=3000, keys=300, lag_ms={}
    )
    result = run(cfg)
    kinds = Counter(f["kind"] for f in result.truth["faults"])
    assert kinds == {"redelivery": 2, "failover": 1, "swap": 1}, kinds
    return result


def _cli(sim, region: int, version: int, out, state) -> pa.Table:
    store = sim.truth["run"]["store"]
    code = main(
        ["changes", "--store", store, "--version", str(version), "--source", sim.archives[region]]
        + ["--out", str(out), "--state", str(state), "--regions", "3"]
    )
    assert code == 0
    return pq.read_table(out / "changes").cast(CHANGES_SCHEMA).sort_by(ORDER)


@pytest.fixture(scope="module")
def cli_rows(sim, tmp_path_factory) -> dict[int, dict[int, pa.Table]]:
    """region → version → the CLI's rows (version 2 read with version 1's state)."""
    out = {}
    for region in range(3):
        d = tmp_path_factory.mktemp(f"cli{region}")
        out[region] = {v: _cli(sim, region, v, d / f"v{v}", d / "state") for v in (1, 2)}
    return out


@pytest.mark.parametrize("region", [0, 1, 2])
def test_the_cli_delivers_exactly_the_truth_s_changes_across_the_swap(sim, cli_rows, region):
    rows = cli_rows[region]
    coords = [
        (r["partition"], r["upstream_region"], r["upstream_offset"])
        for v in (1, 2)
        for r in rows[v].select(["partition", "upstream_region", "upstream_offset"]).to_pylist()
        if r["upstream_region"] is not None
    ]
    expected = expected_changes(sim.truth, region)
    assert len(coords) == len(set(coords)), "a change delivered twice"
    assert set(coords) == expected
    assert rows[1].column("upstream_region").null_count > 0, "version 1's bulk load is the snapshot"
    assert rows[2].column("upstream_region").null_count == 0, "version 2's bulk load is not delivered again"


def _events_table(events) -> pa.Table:
    t = pa.Table.from_pylist([e._asdict() for e in events], schema=pa.schema(list(CHANGES_SCHEMA)))
    return t.sort_by(ORDER)


def test_the_consumer_api_on_kafka_delivers_the_cli_s_rows(sim, cli_rows, real_kafka):
    region = 1
    store = f"cr{uuid.uuid4().hex[:8]}"
    topics = {v: f"{store}_v{v}" for v in (1, 2)}
    real_kafka.create_topics({t: 2 for t in topics.values()})
    for v, t in topics.items():
        produce_archive(real_kafka.bootstrap_servers, sim.archives[region], f"sim_store_v{v}", t, range(2))
    conf = {"bootstrap.servers": real_kafka.bootstrap_servers, "log_level": 0}
    with ChangeReader(store, 1, conf, n_regions=3) as reader:
        v1 = list(reader.events(timeout=30, to_end=True))
        reader.follow(2)
        v2 = list(reader.events(timeout=30, to_end=True))
        stats = reader.stats()
    assert _events_table(v1).equals(cli_rows[region][1])
    assert _events_table(v2).equals(cli_rows[region][2])
    assert sum(stats.duplicates_dropped.values()) > 0


@pytest.mark.spark
def test_the_watch_appends_the_cli_s_version_1_rows(sim, cli_rows, spark, tmp_path):
    region = 2
    opts = WatchOptions(
        store=sim.truth["run"]["store"],
        version=1,
        sources=[SourceSpec(x, d) for x, d in sorted(sim.archives.items())],
        checkpoint=str(tmp_path / "ck"),
        out=str(tmp_path / "watch"),
        max_records_per_trigger=2000,
        changes_region=region,
        regions=3,
    )
    for q in start(spark, opts, available_now=True, queries=("changes",)):
        q.awaitTermination()
    assert read_changes(opts.out).sort_by(ORDER).equals(cli_rows[region][1])
