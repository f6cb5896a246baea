"""`div validate --restore-at` on both engines, and `div restore` on a live cluster: the same answers everywhere.

Inputs are the independent restore scenarios (tests/support/div_restore_fixtures.py): partitions restored from a
heartbeat, one without any heartbeat (full replay), one that ends before the restore offset; from archives and
from the embedded Kafka cluster. Each engine's output is compared field by field (apart from timings), and with
the full run's findings after the offset.
"""

from __future__ import annotations

import json
import os
import random

import div_restore_fixtures as F
import pyarrow.parquet as pq
import pytest
import venice_reference as V

from pipelines.cli import main as cli_main
from pipelines.core.sources import SourceSpec
from pipelines.div.spark import run_spark
from pipelines.div.validate import ValidateOptions, run_local

SCENARIOS = {  # (region, partition) -> build arguments
    (0, 0): dict(seed=1),
    (0, 1): dict(seed=2),
    (0, 2): dict(seed=4, hb_every=10_000),  # no heartbeat at all: restore replays from offset 0
    (0, 3): dict(seed=6, per_region=12, failovers=0),  # ends before the restore offsets below
    (1, 0): dict(seed=3),
}


@pytest.fixture(scope="module")
def restore_archives(tmp_path_factory):
    root = tmp_path_factory.mktemp("restore-spark")
    built = {}
    for (region, p), kw in SCENARIOS.items():
        scen = F.build(**kw)
        V.write_archive(str(root / f"dc-{region}"), F.VT, p, list(enumerate(scen.vt)))
        built[(region, p)] = scen
    assert len(built[(0, 3)].vt) < 150 and not built[(0, 2)].heartbeats
    return str(root / "dc-0"), str(root / "dc-1"), built


def _opts(sources, out, **kw) -> ValidateOptions:
    return ValidateOptions(sources=sources, out=str(out), **kw)


def _errors(out) -> list[dict]:
    rows = pq.read_table(os.path.join(out, "errors")).to_pylist()
    return sorted(
        rows, key=lambda r: (r["region"], r["topic"], r["partition"], r["offset"], r["type"], r["detail"])
    )


def _summary(out) -> dict:
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    for k in ("engine", "elapsed_s", "started_at"):
        s.pop(k)
    return s


@pytest.mark.spark
@pytest.mark.parametrize("read", ["shuffle", "direct"])
@pytest.mark.parametrize("at", [240, 420])
def test_engines_agree_with_restore_at(spark, restore_archives, tmp_path, read, at):
    a0, a1, built = restore_archives
    sources = [SourceSpec(0, a0), SourceSpec(1, a1)]
    full_out = tmp_path / "full"
    run_local(_opts(sources, full_out))
    local_out, spark_out = tmp_path / "local", tmp_path / "spark"
    code = run_local(_opts(sources, local_out, restore_at=at))
    assert run_spark(_opts(sources, spark_out, restore_at=at), read=read) == code
    assert _summary(spark_out) == _summary(local_out)
    assert _errors(spark_out) == _errors(local_out)
    # and both are the full run's findings after the offset
    assert _errors(local_out) == [e for e in _errors(full_out) if e["offset"] > at]
    starts = {(p["region"], p["partition"]): p["start"] for p in _summary(local_out)["partitions"]}
    for key, scen in built.items():
        last = len(scen.vt) - 1
        point = F.restore_point(scen, min(at, last))
        assert starts[key] == {"offset": min(at, last) + 1, "restored_from_heartbeat": point}, key
    assert starts[(0, 2)]["restored_from_heartbeat"] is None
    assert any(_errors(local_out))


@pytest.mark.spark
@pytest.mark.kafka
def test_engines_agree_with_restore_at_on_a_live_cluster(spark, embedded_kafka, restore_archives, tmp_path):
    from confluent_kafka import Producer

    _, _, built = restore_archives
    topic = f"restore-{random.Random().randrange(1 << 30):08x}"
    embedded_kafka.create_topic(topic, 4)
    producer = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers, "linger.ms": 5})
    for p in range(4):
        for rec in built[(0, p)].vt:
            producer.produce(
                topic, key=rec.key, value=rec.value, partition=p, headers=rec.headers, timestamp=rec.ts
            )
    assert producer.flush(30) == 0
    sources = [SourceSpec(0, embedded_kafka.uri)]
    local_out, spark_out = tmp_path / "local", tmp_path / "spark"
    code = run_local(_opts(sources, local_out, topics=[topic], restore_at=300))
    assert run_spark(_opts(sources, spark_out, topics=[topic], restore_at=300)) == code
    assert _summary(spark_out) == _summary(local_out)
    errors = _errors(local_out)
    assert _errors(spark_out) == errors
    # the same findings as from the archive
    archive_out = tmp_path / "archive"
    run_local(_opts([SourceSpec(0, restore_archives[0])], archive_out, restore_at=300))
    strip = [{k: v for k, v in e.items() if k != "topic"} for e in errors]
    assert strip == [{k: v for k, v in e.items() if k != "topic"} for e in _errors(archive_out)]
    assert strip


@pytest.mark.kafka
def test_div_restore_reads_a_live_cluster_like_the_archive(embedded_kafka, restore_archives, tmp_path):
    """Backward search by seeking on Kafka: the same state.json as from the archive of the same records."""
    from confluent_kafka import Producer

    a0, _, built = restore_archives
    scen = built[(0, 1)]
    store = f"rk{random.Random().randrange(1 << 30):08x}"
    embedded_kafka.create_topic(f"{store}_v1", 1)
    producer = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers, "linger.ms": 5})
    for rec in scen.vt:
        producer.produce(
            f"{store}_v1", key=rec.key, value=rec.value, partition=0, headers=rec.headers, timestamp=rec.ts
        )
    assert producer.flush(30) == 0
    at = scen.failover_offsets[-1] + 4
    outs = {}
    for name, uri, vt in (("kafka", embedded_kafka.uri, f"{store}_v1"), ("archive", a0, F.VT)):
        out = tmp_path / name
        assert (
            cli_main(
                [
                    "div",
                    "restore",
                    "--source",
                    f"0={uri}",
                    "--vt-topic",
                    vt,
                    "--partition",
                    "1" if name == "archive" else "0",
                    "--at-offset",
                    str(at),
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        outs[name] = json.loads((out / "state.json").read_text())
        for k in ("vt_topic", "partition"):
            outs[name].pop(k)
    assert outs["kafka"] == outs["archive"]
    assert outs["kafka"]["heartbeat_offset"] == F.restore_point(scen, at)
