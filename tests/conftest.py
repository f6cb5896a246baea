"""Shared fixtures: one SparkSession per test run, the embedded Kafka cluster, real Apache Kafka clusters (one
broker, three brokers), one standalone Spark cluster (with an S3 server), and paths to reference data.

The tests mirror the source tree (tests/leapfrog/, tests/div/, tests/heartbeat/, tests/sim/,
tests/pipelines/<command>/); whole-product contracts sit here at the top and shared helpers in tests/support/.
"venice-protocol-notes §N" in a test cites ../shared/reference/venice-protocol-notes.md, the reference the tests
may read (the product never does).
"""

from __future__ import annotations

import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    """`../shared`: reference schemas and notes. Tests may read it; the product never does."""
    if not SHARED.exists():
        pytest.skip("../shared (reference schemas) is not present next to this checkout")
    return SHARED


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of this test run (a session costs ~7 s to start)."""
    from pipelines.core.spark_session import get_session

    session = get_session("local[2]", app_name="tidegauge-tests", conf={"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def demo_run(spark, tmp_path_factory):
    """One `tidegauge demo` (seed 1, its default size) for the test run: (DemoResult, the lines it printed). The
    demo's own test checks it; the documentation's tests run their pages' commands on its output. Nobody writes
    into it: a test that needs to, copies it."""
    from pipelines.demo.job import DemoOptions, run_demo

    lines: list[str] = []
    out = tmp_path_factory.mktemp("demo") / "tidegauge-demo"
    result = run_demo(DemoOptions(out=str(out), seed=1), emit=lines.append, spark=spark)
    return result, lines


@pytest.fixture(scope="session")
def embedded_kafka():
    """One librdkafka mock cluster (1 broker) for the test run; tests create their own uniquely named topics.

    Tests that take brokers down or inject errors must start their own `sim.embedded_kafka.EmbeddedKafka`.
    """
    from sim.embedded_kafka import EmbeddedKafka

    cluster = EmbeddedKafka(brokers=1)
    yield cluster
    cluster.close()


REAL_KAFKA_FIXTURES = {
    "kafka_jars",
    "real_kafka",
    "real_kafka_three",
    "real_kafka_three_session",
    "secured_kafka",
}


def pytest_collection_modifyitems(items):
    """A test that uses a real Kafka cluster is marked `kafka_real` whether or not it says so (-m 'not kafka_real'
    then leaves out every test that starts JVM brokers). A module that uses the standalone Spark cluster must be
    one of ONE_WORKER's."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if REAL_KAFKA_FIXTURES & names:
            item.add_marker(pytest.mark.kafka_real)
        module = item.nodeid.split("::", 1)[0]
        if "spark_cluster" in names and ONE_WORKER.get(module) != "spark-cluster":
            raise pytest.UsageError(f"{module} uses spark_cluster: add it to ONE_WORKER in tests/conftest.py")


# The suite runs on two pytest-xdist workers (the README's command: `pytest -n 2`), each given whole modules, so
# a module's own fixtures start once. Session servers start once a worker that uses them (one Kafka broker, the
# demo's run: seconds), except the standalone Spark cluster, too heavy to run twice at once: its modules share a
# worker.
ONE_WORKER = {"tests/test_cluster.py": "spark-cluster", "tests/test_cluster_kafka.py": "spark-cluster"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Whole modules (or ONE_WORKER's groups of them) to each worker, the largest first (pytest-xdist's loadscope,
    by module instead of by class)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return ONE_WORKER.get(module, module)

    return ByModule(config, log)


def _install_maven() -> None:
    """Debian's maven when `mvn` is missing and this runs as root with apt-get (as CI does): the suite installs
    what it needs, as the browser test installs Chromium. Elsewhere `resolve_jars` says what to install."""
    import os
    import shutil
    import subprocess

    from machine_lock import installs_lock

    if shutil.which("mvn") or os.name != "posix" or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with installs_lock():  # the other worker may be installing it (or something else) right now
        for cmd in (["apt-get", "install", "-y", "-qq", "maven"], ["apt-get", "update", "-qq"]) * 2:
            if shutil.which("mvn"):
                return
            try:
                subprocess.run(cmd, env=env, capture_output=True, timeout=900)
            except subprocess.TimeoutExpired:
                continue


@pytest.fixture(scope="session")
def kafka_jars() -> pathlib.Path:
    """The Apache Kafka broker's jars, resolved from Maven Central by mvn on the first run of the machine (~45 MB
    into ~/.cache/tidegauge/jvm, outside the checkout; sim/jvm/kafka/pom.xml says which), then reused. No test
    skips for want of them: without Maven or Maven Central the real-Kafka tests fail, saying why."""
    from sim.brokers import resolve_jars

    _install_maven()
    return resolve_jars()


@pytest.fixture(scope="session")
def s3a_jars() -> list[pathlib.Path]:
    """Spark's S3A connector (hadoop-aws at pyspark's Hadoop version and the AWS SDK bundle, ~690 MB), resolved by
    mvn from Maven Central on the first run of the machine into ~/.cache/tidegauge/jvm (pipelines/watch/jvm/s3a/
    pom.xml says which), then reused: what `tidegauge watch --checkpoint s3a://` puts on Spark's class path. As
    with `kafka_jars`, no test skips for want of them."""
    from pipelines.watch.checkpoint import s3a_jars

    _install_maven()
    return s3a_jars()


@pytest.fixture(scope="session")
def real_kafka(kafka_jars):
    """One Apache Kafka cluster (a single broker+controller node, KRaft, on loopback) for the test run; tests
    create their own uniquely named topics, through the AdminClient (`create_topics`). Started on first use
    (the first one resolves the broker's jars from Maven Central into ~/.cache/tidegauge/jvm, once), stopped and
    its directory removed at the end, whatever happened. Tests must not stop its broker: one that needs a broker
    killed or restarted uses `real_kafka_three` or a cluster of its own (`sim.brokers.KafkaCluster`). Its log
    cleaner looks for work every 0.5 s, not Kafka's 15 s, so a test of compaction waits for the cleaner about
    as long as the cleaning takes."""
    from sim.brokers import KafkaCluster

    with KafkaCluster(name="tests", config={"log.cleaner.backoff.ms": 500}) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def secured_kafka(kafka_jars):
    """One secured Apache Kafka node for the test run (`KafkaCluster(secured=True)`, see sim/kafka_security.py):
    PLAINTEXT for the super user (topics, ACLs, SCRAM users: `bootstrap_servers`, `admin()`), SASL_SSL with
    SCRAM-SHA-512 and mutual TLS (`listener_servers`), StandardAuthorizer on, certificates made by openssl for it
    (`certs`). One node with every listener costs one broker start for every security test."""
    from sim.brokers import KafkaCluster

    with KafkaCluster(name="tests-secured", secured=True) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def real_kafka_three_session(kafka_jars):
    """Three Apache Kafka nodes for the test run (see `real_kafka_three`)."""
    from sim.brokers import KafkaCluster

    with KafkaCluster(3, name="tests-three") as cluster:
        yield cluster


@pytest.fixture
def real_kafka_three(real_kafka_three_session):
    """Three Apache Kafka nodes, each broker and controller (a quorum of three), shared by the test run, for
    tests of broker deaths and leader elections; topics get three replicas and min.insync.replicas 2. A test may
    kill or stop any one node; whatever it left down is started again after it (pass or fail)."""
    cluster = real_kafka_three_session
    yield cluster
    down = [n.node_id for n in cluster.nodes if not n.alive]
    for node_id in down:
        cluster.restart_broker(node_id, wait=False)
    if down:
        cluster.wait_ready()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """One real Spark standalone cluster on loopback for the test run (tests/test_cluster*.py), started on first use
    and stopped at the end: a master and two workers of two cores each (room for two applications at once), each
    worker with its own working directory. An S3 server (moto, on loopback) is started first and its AWS
    variables given to the workers (so their executors) and to `Cluster.env()`'s drivers, the way users point a
    cluster at an endpoint; the test process's own environment is left alone (`s3_server.environ` for that).

    Yields (the `standalone_cluster.Cluster`, the `s3_server.S3Server`). Starting it costs ~20-40 s of JVMs."""
    from s3_server import s3_server
    from standalone_cluster import standalone_cluster

    root = tmp_path_factory.mktemp("spark-cluster")
    with (
        s3_server(point_environ=False) as s3,
        standalone_cluster(root, workers=2, cores=2, memory="2560m", env=s3.env) as cluster,
    ):
        yield cluster, s3


@pytest.fixture(scope="session")
def prometheus_binaries(request, tmp_path_factory):
    """Prometheus' `promtool` and `prometheus` server (`prometheus_server.Binaries`): each from PATH, else both taken
    from Debian's `prometheus` package into pytest's cache (`.pytest_cache/d/prometheus`; a temporary directory when
    the cache is off) on first use, as the browser test installs Chromium with apt. A test that needs one skips,
    saying why, when it could not be had (`Binaries.why_missing`)."""
    from machine_lock import installs_lock
    from prometheus_server import find_binaries

    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    where = (
        tmp_path_factory.mktemp("prometheus") if cache is None else pathlib.Path(cache.mkdir("prometheus"))
    )
    with installs_lock():  # both workers may want them: one unpacks, the other finds them there
        return find_binaries(where, where)
