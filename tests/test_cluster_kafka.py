"""On a real Spark standalone cluster, live Kafka sources are read by the executors, each task its own planned range.

A master and two workers (each with its own working directory; the test run's cluster, conftest.spark_cluster,
shared with tests/test_cluster.py) run `leapfrog` and `div validate --engine spark`
as separate driver processes against `kafka://` sources: one embedded mock Kafka cluster per region (a set per
command), living in this test process and holding a small simulation's archives offset for offset. Their findings
and exit codes must equal local mode's over the archives.

That the records were read by the executors, each task its own offset range, is shown twice:

- summary.json's coverage: every (region, topic, partition) planned from offset 0 to the archive's end, and read
  exactly that many records;
- the executors' own record (`executor_reads`, their PySpark daemon): every Kafka read ran in an executor process
  (its working directory lies in a worker's), on both workers, and each stage that read the sources read exactly
  the planned ranges, each once, whole. Leap Frog reads in one pass per partition: a Spark task reads its VT
  partition (or a group of small ones) in every region; `div validate` spreads its partitions over 4 Spark tasks
  per core, so a Spark task may read several ranges, one after another.

The daemon also appends records to every partition before each of its Python workers serves a task (a producer
that keeps writing once the driver has planned): a task that fixed its own end offset instead of the plan's would
read them, and the counts and findings above would differ from the archives'.

The two driver processes run at once, and the local runs meanwhile (a job on this cluster costs ~1 minute, mostly
waiting for JVMs and Python workers to start): each worker has a core for each application, so each application
gets one single-core executor on each worker (`cores.max` 2, spread out), and waits until both have registered.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from small_sim import small_sim
from standalone_cluster import Cluster

from div import archive, kafka_log
from sim.embedded_kafka import EmbeddedKafka

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.kafka]

SUPPORT = Path(__file__).resolve().parent / "support"
APPENDED = 3  # records each executor's Python worker appends to every partition before its first task
NOW_MS = "1800000000000"


@dataclass
class Live:
    """Each region's archive in an embedded Kafka cluster of its own; `held[(region, topic, partition)]` is the
    number of records loaded (offsets 0..n-1, as in the archive)."""

    clusters: dict[int, EmbeddedKafka]
    held: dict[tuple[int, str, int], int]

    def sources(self) -> list[str]:
        return [a for r, c in sorted(self.clusters.items()) for a in ("--source", f"{r}={c.uri}")]

    def region_of(self, bootstrap: str) -> int:
        return next(r for r, c in self.clusters.items() if c.bootstrap_servers == bootstrap)

    def ends_now(self) -> dict[tuple[int, str, int], int]:
        out = {}
        for r, c in self.clusters.items():
            with kafka_log.KafkaLog(c.bootstrap_servers) as kl:
                out.update({(r, t, p): kl.watermarks(t, p)[1] for r_, t, p in self.held if r_ == r})
        return out


@dataclass
class Run:
    """One command on the cluster and the same command in local mode over the archives."""

    live: Live
    code: int
    stderr: str
    out: Path
    reads: Path  # where the executors recorded their reads
    local_code: int
    local_out: Path


def _load(archive_dir: str, cluster: EmbeddedKafka) -> dict[tuple[str, int], int]:
    """Every record of the archive produced into `cluster`, partition by partition in offset order, so that each
    lands at its archive offset (the archive's offsets run from 0 without holes: checked)."""
    from confluent_kafka import Producer

    infos = archive.describe(archive_dir)
    for topic in sorted({i.topic for i in infos}):
        cluster.create_topic(topic, max(i.partition for i in infos if i.topic == topic) + 1)
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "enable.idempotence": True, "linger.ms": 5}
    )
    held = {}
    for i in infos:
        assert (i.first_offset, i.last_offset + 1) == (0, i.records), f"{archive_dir} {i}: offsets with holes"
        for batch in archive.iter_partition(archive_dir, i.topic, i.partition, None, None):
            rows = batch.to_pydict()
            for key, value, ts, headers in zip(
                rows["key"], rows["value"], archive.timestamps_ms(batch), rows["headers"], strict=True
            ):
                producer.produce(
                    i.topic,
                    key=key,
                    value=value,
                    partition=i.partition,
                    timestamp=ts,
                    headers=[(h["key"], h["value"]) for h in headers or []],
                )
        held[(i.topic, i.partition)] = i.records
    assert producer.flush(30) == 0
    with kafka_log.KafkaLog(cluster.bootstrap_servers) as kl:
        for (topic, p), n in held.items():
            assert kl.watermarks(topic, p) == (0, n)
    return held


def _live(archives: dict[int, str]) -> Live:
    clusters = {r: EmbeddedKafka(brokers=1) for r in archives}
    held = {}
    for r, c in clusters.items():
        held.update({(r, t, p): n for (t, p), n in _load(archives[r], c).items()})
    return Live(clusters, held)


def _conf(root: Path, live: Live, name: str) -> tuple[Path, Path]:
    """(the --conf file of a cluster run, the directory its executors record their reads in)."""
    reads = root / f"{name}-reads"
    reads.mkdir()
    topics: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r, t, p in sorted(live.held):
        topics[live.clusters[r].bootstrap_servers][t].append(p)
    spark_conf = {
        "spark.python.daemon.module": "executor_reads",
        "spark.executorEnv.PYTHONPATH": str(SUPPORT),
        "spark.executorEnv.EXECUTOR_READS_LOG": str(reads),
        "spark.executorEnv.EXECUTOR_READS_TOPICS": json.dumps(topics),
        "spark.executorEnv.EXECUTOR_READS_APPEND": str(APPENDED),
        # one single-core executor on each worker, both registered before the first job, and no task waiting for
        # a preferred executor
        "spark.cores.max": "2",
        "spark.executor.cores": "1",
        "spark.executor.memory": "1g",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "300s",
        "spark.locality.wait": "0s",
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"spark": {"conf": spark_conf}}))
    return path, reads


def _start(cluster: Cluster, root: Path, argv: list[str], stderr: Path) -> subprocess.Popen:
    """A tidegauge driver process on the cluster (its stderr to a file: nobody reads a pipe until it ends)."""
    with open(stderr, "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", *argv, "--master", cluster.master_url],
            cwd=root,
            env=cluster.env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _local(argv: list[str]) -> int:
    """The same command in this process, in local mode (the test run's SparkSession), over the archives."""
    from pipelines.cli import main

    return main(argv)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, spark, spark_cluster) -> dict:
    """Both commands on the cluster over live sources (at once) and locally over the archives (meanwhile)."""
    cluster, _ = spark_cluster  # the test run's (conftest): two workers of two cores, room for both commands
    root = tmp_path_factory.mktemp("cluster-kafka")
    sim = small_sim(root / "sim", seed=5, records=1200, keys=250, faults={"dropped": 1, "poisoned": 1})
    archives = [a for r, p in sorted(sim.archives.items()) for a in ("--source", f"{r}={p}")]
    commands = {  # (the command, what it takes on the cluster only)
        "leapfrog": (["leapfrog", "--store", sim.store, "--version", str(sim.version)], []),
        "div": (["div", "validate", "--now-ms", NOW_MS], ["--engine", "spark"]),
    }
    lives: dict[str, Live] = {}
    try:
        for name in commands:  # a set per command: the executors of a run append to theirs
            lives[name] = _live(sim.archives)
        drivers, reads = {}, {}
        for name, (argv, extra) in commands.items():
            conf, reads[name] = _conf(root, lives[name], name)
            out = ["--conf", str(conf), "--out", str(root / f"{name}-cluster")]
            drivers[name] = _start(
                cluster, root, [*argv, *lives[name].sources(), *extra, *out], root / f"{name}.stderr"
            )
        try:
            local = {
                n: _local([*a, *archives, "--out", str(root / f"{n}-local")])
                for n, (a, _) in commands.items()
            }
            for d in drivers.values():
                d.wait(timeout=600)
        finally:
            for d in drivers.values():
                if d.poll() is None:
                    d.kill()
                    d.wait()
        yield {"spark_root": cluster.root} | {
            n: Run(
                lives[n],
                drivers[n].returncode,
                (root / f"{n}.stderr").read_text(errors="replace"),
                root / f"{n}-cluster",
                reads[n],
                local[n],
                root / f"{n}-local",
            )
            for n in commands
        }
    finally:
        for live in lives.values():
            for c in live.clusters.values():
                c.close()


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _coverage(summary: dict) -> dict[tuple[int, str, int], tuple[list[int], int]]:
    return {
        (e["region"], e["topic"], e["partition"]): (e["planned_offsets"], e["read_records"])
        for e in summary["evidence"]["by_partition"]
    }


def _executor_record(directory: Path) -> tuple[list[dict], list[dict]]:
    """(every Kafka read the executors made, every append) as the executors recorded them."""
    reads, appends = [], []
    for f in sorted(directory.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            entry = json.loads(line)
            (appends if "appended" in entry else reads).append(entry)
    return reads, appends


def _check_executor_reads(spark_root: Path, run: Run, planned: set[tuple[int, str, int]]) -> dict:
    """Every planned partition was read in executor processes, on both workers; every stage that read read each
    planned range [0, n) exactly once, whole, and nothing else; the partitions had grown past their planned ends
    by then. Returns the ranges each Spark task read, by (stage, task partition, attempt)."""
    live = run.live
    reads, appends = _executor_record(run.reads)
    assert reads and appends, "the executors recorded nothing"
    worker_of = {}
    for e in reads + appends:
        where = Path(e["cwd"]).resolve()
        assert where.is_relative_to(spark_root.resolve()), f"not in an executor: {e}"
        worker_of[e["pid"]] = where.relative_to(spark_root.resolve()).parts[0]
    assert {worker_of[e["pid"]] for e in reads} == {"worker-0", "worker-1"}, reads
    expected = sorted((r, t, p, 0, live.held[(r, t, p)]) for r, t, p in planned)
    by_stage, by_task = defaultdict(list), defaultdict(list)
    for e in reads:
        assert e["complete"] and e["records"] == e["end"] - e["start"], e
        assert (e["first_offset"], e["last_offset"]) == (e["start"], e["end"] - 1), e
        rng = (live.region_of(e["bootstrap"]), e["topic"], e["partition"], e["start"], e["end"])
        by_stage[e["stage"]].append(rng)
        by_task[(e["stage"], e["task_partition"], e["attempt"])].append(rng)
    for stage, ranges in by_stage.items():
        assert sorted(ranges) == expected, f"stage {stage} read other ranges than the planned ones"
    ends = live.ends_now()
    assert all(ends[k] > live.held[k] for k in planned), ends  # there was more to read than planned
    return by_task


def test_leapfrog_reads_live_kafka_on_the_executors_like_the_archives(runs):
    run: Run = runs["leapfrog"]
    assert run.code == run.local_code == 1, run.stderr  # the simulation's dropped and poisoned writes
    assert _findings(run.out / "inconsistencies") == _findings(run.local_out / "inconsistencies")
    got, want = _summary(run.out), _summary(run.local_out)
    assert got["verdict"] == want["verdict"] == "findings"
    assert got["sources"] == {str(r): c.uri for r, c in run.live.clusters.items()}
    assert got["evidence"]["partitions_read_short"] == 0
    planned = {k for k in run.live.held if k[1].endswith(f"_v{got['version']}")}
    assert _coverage(got) == {k: ([0, run.live.held[k]], run.live.held[k]) for k in planned}
    assert got["evidence"]["read_records"] == want["evidence"]["read_records"]
    by_task = _check_executor_reads(runs["spark_root"], run, planned)
    # one pass per partition: a task reads the partitions it was given (one, or a group of small ones) in every
    # region, and no other task reads them
    regions = set(run.live.clusters)
    partitions_of = defaultdict(set)
    for task, ranges in by_task.items():
        for p in {p for _, _, p, _, _ in ranges}:
            assert {r for r, _, q, _, _ in ranges if q == p} == regions, (task, ranges)
            partitions_of[p].add(task)
    assert all(len(tasks) == 1 for tasks in partitions_of.values()), partitions_of


def test_div_validate_reads_live_kafka_on_the_executors_like_the_archives(runs):
    run: Run = runs["div"]
    assert run.code == run.local_code, run.stderr
    got, want = _summary(run.out), _summary(run.local_out)
    assert got["verdict"] == want["verdict"] and got["findings_by_type"] == want["findings_by_type"]
    assert got["records_read"] == want["records_read"] == sum(run.live.held.values())
    assert got["evidence"]["partitions_read_short"] == 0 and not got["failed_partitions"]
    assert _coverage(got) == {k: ([0, n], n) for k, n in run.live.held.items()}
    assert _errors(run.out) == _errors(run.local_out)
    _check_executor_reads(runs["spark_root"], run, set(run.live.held))  # a Spark task may read several


def _findings(path: Path) -> list[tuple]:
    return sorted(
        (r["type"], r["region_a"], r["region_b"], r["partition"], r["key"])
        for r in pq.read_table(path).to_pylist()
    )


def _errors(out: Path) -> list[str]:
    return sorted(
        json.dumps(r, sort_keys=True, default=repr) for r in pq.read_table(out / "errors").to_pylist()
    )
