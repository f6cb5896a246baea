"""The Leap Frog job reads live Kafka clusters and gives exactly what it gives on archives of the same records.

Each region is an embedded mock cluster of its own holding `<store>_v1`; the records produced there are the
records of the archive, offset for offset. Two stores: generated histories with faults (the fused path) and a
chunked version (the two-phase path). Findings must be identical row for row, and summary.json identical except
where the run was (sources) and how long it took.

A partition whose planned end lies beyond its last record (the commit marker of a transaction takes the last
offset, which is what compaction at the end of a log looks like to a reader) must not stall the reader; the
offsets are reported as a compacted range and the findings are those of the archive.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from chunked_scenario import Store, scenario
from leapfrog_histories import generated
from leapfrog_run import run_leapfrog
from vt_builder import RegionVt, produce, write_archive
from vt_fixtures import record_of

from sim.embedded_kafka import EmbeddedKafka

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

REGIONS = (0, 1, 2)
HISTORIES = 40
RUN_FIELDS = {"sources", "timings", "started_at", "elapsed_s"}  # where and when, not what


@pytest.fixture(scope="module")
def clusters():
    cs = {x: EmbeddedKafka(brokers=1) for x in REGIONS}
    yield cs
    for c in cs.values():
        c.close()


def _histories():
    """Generated 3-region histories whose VT offsets run from 0 without holes (a producer into an empty
    partition can give exactly those offsets): no compaction, no mid-stream start."""
    out = []
    for h in generated(60):
        if h.n_regions != 3:
            continue
        if all(
            h.start_heartbeat[x] is None and [e.vt_offset for e in h.vt[x]] == list(range(len(h.vt[x])))
            for x in REGIONS
        ):
            out.append(h)
    return out[:HISTORIES]


def _history_logs(histories) -> dict[int, list[RegionVt]]:
    logs = {x: [] for x in REGIONS}
    for p, h in enumerate(histories):
        for x in REGIONS:
            vt = RegionVt(x, partition=p)
            for e in h.vt[x]:
                vt.raw(*record_of(e, h.n_regions, x))
            logs[x].append(vt)
    return logs


def _publish(clusters, logs: dict[int, list[RegionVt]], root, topic: str, transactional: bool = False):
    """The same records as archives and as topics; returns (archive sources, kafka sources)."""
    archives = {x: write_archive(vts, root / f"dc-{x}", topic) for x, vts in logs.items()}
    for x, vts in logs.items():
        clusters[x].create_topic(topic, len(vts))
        produce(
            vts,
            clusters[x].bootstrap_servers,
            topic,
            transactional_id=f"{topic}-{x}" if transactional else None,
        )
    return archives, {x: clusters[x].uri for x in logs}


def _run(spark, store: str, sources: dict[int, str], out, mode: str = "heartbeat"):
    code = run_leapfrog(spark, store, sources, out, mode=mode)
    summary = json.loads((out / "summary.json").read_text())
    return code, summary, pq.read_table(out / "inconsistencies")


def _what(summary: dict) -> dict:
    """What the two sources must agree on. `latest_records_kept` may not: the embedded cluster cannot say whether
    a topic is compacted (no DescribeConfigs), so a live read makes no promise (test_compaction_deadlines)."""
    out = {k: v for k, v in summary.items() if k not in RUN_FIELDS}
    out["by_region"] = [{k: v for k, v in r.items() if k != "latest_records_kept"} for r in out["by_region"]]
    return out


def test_generated_histories_on_kafka_equal_the_archives(spark, tmp_path, clusters):
    histories = _histories()
    assert len(histories) == HISTORIES and any(h.diverged[x] for h in histories for x in REGIONS)
    archives, kafka = _publish(clusters, _history_logs(histories), tmp_path, "gen_v1")
    code_a, sum_a, found_a = _run(spark, "gen", archives, tmp_path / "out-archive")
    code_k, sum_k, found_k = _run(spark, "gen", kafka, tmp_path / "out-kafka")
    assert found_a.num_rows > 0, "no finding: the comparison would prove little"
    assert found_k.to_pylist() == found_a.to_pylist()
    assert _what(sum_k) == _what(sum_a)
    assert code_k == code_a == 1
    assert sum_k["sources"] == {str(x): clusters[x].uri for x in REGIONS}
    assert {r["latest_records_kept"] for r in sum_a["by_region"]} == {True}
    assert {r["latest_records_kept"] for r in sum_k["by_region"]} == {False}


def test_chunked_version_on_kafka_equals_the_archives(spark, tmp_path, clusters):
    s = Store(chunked=True)
    scenario(s)
    s.heartbeats()
    logs = {x: [vt] for x, vt in s.vts.items()}
    archives, kafka = _publish(clusters, logs, tmp_path, "chunky_v1")
    code_a, sum_a, found_a = _run(spark, "chunky", archives, tmp_path / "out-archive")
    code_k, sum_k, found_k = _run(spark, "chunky", kafka, tmp_path / "out-kafka")
    assert found_a.num_rows == 6
    assert found_k.to_pylist() == found_a.to_pylist()
    assert _what(sum_k) == _what(sum_a)
    assert code_k == code_a == 1


def test_compacted_range_at_the_end_of_a_kafka_partition(spark, tmp_path, clusters):
    histories = _histories()[:12]
    logs = _history_logs(histories)
    archives, kafka = _publish(clusters, logs, tmp_path, "txn_v1", transactional=True)
    for mode in ("heartbeat", "footer"):
        code_a, sum_a, found_a = _run(spark, "txn", archives, tmp_path / f"out-archive-{mode}", mode)
        code_k, sum_k, found_k = _run(spark, "txn", kafka, tmp_path / f"out-kafka-{mode}", mode)
        ends = {(x, vt.partition): vt.next_offset for x, vts in logs.items() for vt in vts}
        for r in sum_k["by_region"]:
            end = ends[(r["region"], r["partition"])]
            assert r["last_offset"] == end - 1
            # the commit marker holds offset `end`: the planned end (end + 1) is one beyond the last record
            assert r["compacted_ranges"] == [[end, end]]
        assert all(r["compacted_ranges"] == [] for r in sum_a["by_region"])
        # safe: nothing the archive run does not report, and here nothing less either
        assert found_k.to_pylist() == found_a.to_pylist()
        assert code_k == code_a

        def strip(s):
            return [
                {k: v for k, v in r.items() if k not in ("compacted_ranges", "latest_records_kept")}
                for r in s["by_region"]
            ]

        assert strip(sum_k) == strip(sum_a)


@pytest.mark.parametrize(
    "policy, lag, deadline",
    [
        ("delete", None, None),  # never compacted: gaps are transaction markers, no record of a key is lost
        ("compact", "86400000", 1_000 + 86_400_000),
        ("compact,delete", None, 1_000),  # compacted, lag not given: Kafka's default 0
        (None, None, 1_000),  # the cluster would not say: no promise
    ],
)
def test_compaction_deadlines(monkeypatch, policy, lag, deadline):
    from div import kafka_log
    from leapfrog.plan import RegionPartition, mark_latest_kept
    from pipelines.leapfrog.source import compaction_deadlines

    def topic_config(uri, conf, topic, name, timeout_s=3.0):
        assert uri == "kafka://b:9092" and topic == "s_v1" and conf == {"security.protocol": "SSL"}
        return {"cleanup.policy": policy, "min.compaction.lag.ms": lag}[name] if policy is not None else None

    monkeypatch.setattr(kafka_log, "topic_config", topic_config)
    got = compaction_deadlines(
        {0: "/archives/dc-0", 1: "kafka://b:9092"},
        "s_v1",
        {1: {"security.protocol": "SSL"}},
        planned_ms=1_000,
    )
    assert got == ({} if deadline is None else {1: deadline})
    facts = {(x, 0): RegionPartition(x, 0) for x in (0, 1)}
    mark_latest_kept(facts, got, now_ms=1_000 + 3_600_000)  # read for an hour
    assert facts[(0, 0)].latest_kept  # an archive
    assert facts[(1, 0)].latest_kept == (deadline is None or deadline > 1_000 + 3_600_000)
