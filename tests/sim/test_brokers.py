"""Real Apache Kafka brokers on loopback (`sim.brokers`), what the real-Kafka tests, `simulate --brokers real` and
`demo --kafka real` stand on (issue 29).

- the jars: resolved by Maven from the descriptor kept in the repository into a cache outside it, once; without
  Maven or Java, or when Maven fails or hangs, an error that says what to do;
- a broker as configured: at most 512 MiB of heap, a small log-cleaner dedupe buffer, no topic created by asking
  for it, its own session (a Ctrl-C for the simulation does not reach it), logs in a file;
- topics through the AdminClient with exactly their partition counts (the simulator's path on real clusters);
- three nodes: the partition leader killed, another elected, writes acknowledged meanwhile, the node back in the
  ISR, nothing lost or duplicated;
- nothing outlives its owner: an interpreter that dies on an exception closes its clusters (atexit), one killed
  with SIGKILL takes its brokers with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from sim import brokers
from sim.brokers import KAFKA_POM, BrokersError, kafka_version, resolve_jars
from sim.cluster import ClusterError, Region, SimClock

REPO = Path(__file__).resolve().parents[2]


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


# -- the jars ------------------------------------------------------------------------------------------------
def test_the_jars_are_resolved_into_a_cache_outside_the_repository_once(kafka_jars, monkeypatch):
    version = kafka_version()
    assert version.split(".")[0] == "4"
    lib = kafka_jars
    assert not lib.resolve().is_relative_to(REPO.resolve())
    assert lib.parent.name == f"kafka-{version}" and lib.parent.parent == brokers.cache_dir()
    names = {p.name for p in lib.glob("*.jar")}
    assert f"kafka_2.13-{version}.jar" in names  # kafka.Kafka and kafka.tools.StorageTool
    assert {n.rsplit("-", 1)[0] for n in names} >= {"log4j-core", "log4j-slf4j-impl", "slf4j-api"}
    stamp = json.loads((lib.parent / "resolved.json").read_text())
    assert stamp["pom_sha256"] == hashlib.sha256(KAFKA_POM.read_bytes()).hexdigest()
    assert sorted(stamp["jars"]) == sorted(names)
    # cached: no Maven needed any more
    monkeypatch.setattr(brokers.shutil, "which", lambda name, *a, **k: None)
    assert resolve_jars() == lib


def _empty_cache(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIDEGAUGE_CACHE_DIR", str(tmp_path / "cache"))


def test_without_maven_or_java_the_error_says_what_to_install(monkeypatch, tmp_path):
    _empty_cache(monkeypatch, tmp_path)
    real_which = brokers.shutil.which
    monkeypatch.setattr(
        brokers.shutil, "which", lambda name, *a, **k: None if name == "mvn" else real_which(name, *a, **k)
    )
    with pytest.raises(BrokersError, match=r"no 'mvn' is on PATH.*apt-get install -y maven"):
        resolve_jars()
    monkeypatch.setattr(brokers.shutil, "which", lambda name, *a, **k: None)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(BrokersError, match=r"Java 17 or newer.*apt-get install -y openjdk-17-jre-headless"):
        brokers.java_command()
    assert not (tmp_path / "cache" / "jvm" / f"kafka-{kafka_version()}").exists()


def _fake_mvn(tmp_path: Path, body: str, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text("#!/bin/sh\n" + body)
    mvn.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_a_failing_maven_is_quoted_and_a_hanging_one_stopped(monkeypatch, tmp_path):
    _empty_cache(monkeypatch, tmp_path)
    _fake_mvn(
        tmp_path,
        'echo "[INFO] resolving"\necho "[ERROR] Could not find artifact org.apache.kafka:kafka_2.13:jar:9.9"\n'
        'if [ "$TIDEGAUGE_TEST_HANG" = 1 ]; then exec sleep 60; fi\nexit 1\n',
        monkeypatch,
    )
    with pytest.raises(BrokersError, match=r"exit 1\): \[ERROR\] Could not find artifact.*mvn\.log"):
        resolve_jars()
    monkeypatch.setenv("TIDEGAUGE_TEST_HANG", "1")
    t0 = time.monotonic()
    with pytest.raises(BrokersError, match=r"did not resolve .* in 2 s \(is Maven Central reachable\?\)"):
        resolve_jars(timeout_s=2)
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "cache" / "jvm" / f"kafka-{kafka_version()}").exists()  # nothing half-made is used


def test_cluster_ids_are_kafka_uuids_that_never_look_like_an_option():
    ids = [brokers._cluster_id() for _ in range(5000)]  # one in 64 base64url strings starts with '-'
    assert all(len(i) == 22 and not i.startswith("-") for i in ids) and len(set(ids)) == len(ids)
    assert all(set(i) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") for i in ids)
    assert any("-" in i for i in ids)  # the alphabet is base64url's, '-' included elsewhere than first


# -- one broker ----------------------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    """The process runs (a zombie waiting for a parent that does not reap it counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_the_broker_runs_as_configured(real_kafka):
    node = real_kafka.nodes[0]
    pid = node.proc.pid
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"-Xmx512m" in argv and argv[argv.index(b"-cp") + 2] == b"kafka.Kafka"
    assert os.getsid(pid) == pid  # a session of its own: a terminal's Ctrl-C reaches the simulation, not it
    admin = real_kafka.admin()
    resource = ConfigResource(ResourceType.BROKER, str(node.node_id))
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert int(configs["log.cleaner.dedupe.buffer.size"].value) == 16 << 20  # Kafka's default: 128 MiB
    assert configs["auto.create.topics.enable"].value == "false"
    assert configs["log.retention.ms"].value == "-1"  # the simulator's records carry old timestamps
    assert configs["process.roles"].value == "broker,controller"
    log = node.server_log.read_text(errors="replace")
    assert brokers.STARTED_LINE in log and f"Kafka version: {real_kafka.version}" in log
    assert " INFO " not in node.stdout_log.read_text(errors="replace")  # the log goes to the file only
    assert real_kafka.start_s is not None and real_kafka.start_s < brokers.START_TIMEOUT_S


def test_topics_get_their_partition_counts_through_the_admin_client(real_kafka):
    rt, vt, other, missing = (_name(p) for p in ("rt", "vt", "other", "missing"))
    region = Region(
        0, real_kafka.bootstrap_servers, {}, SimClock(0)
    )  # the simulator's path on a real cluster
    region.create_topics([rt, vt], 5)
    real_kafka.create_topics({other: 11})
    assert {t: len(real_kafka.partitions(t)) for t in (rt, vt, other)} == {rt: 5, vt: 5, other: 11}
    assert {p["leader"] for p in real_kafka.partitions(vt).values()} == {1}
    # asking for a topic does not create it (as on a production cluster)
    c = Consumer({"bootstrap.servers": real_kafka.bootstrap_servers, "group.id": "t", "log_level": 0})
    try:
        md = c.list_topics(missing, timeout=10).topics[missing]
        assert md.error is not None and md.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    finally:
        c.close()
    assert missing not in real_kafka.admin().list_topics(timeout=10).topics
    # an existing topic is taken only when empty and of the same partition count
    region.create_topics([rt], 5)
    with pytest.raises(ClusterError, match="with 11 partitions, not 5"):
        region.create_topics([other], 5)
    p = Producer({"bootstrap.servers": real_kafka.bootstrap_servers})
    p.produce(vt, b"x", partition=3)
    assert p.flush(30) == 0
    with pytest.raises(ClusterError, match="is not empty"):
        region.create_topics([vt], 5)


def test_topics_get_their_own_configs_in_one_call(real_kafka):
    compacted, plain = _name("compacted"), _name("plain")
    real_kafka.create_topics(
        {compacted: 1, plain: 2},
        config={"segment.ms": 60_000},
        configs={compacted: {"cleanup.policy": "compact", "min.compaction.lag.ms": 3_600_000}},
    )
    admin = real_kafka.admin()
    got = {}
    for t in (compacted, plain):
        resource = ConfigResource(ResourceType.TOPIC, t)
        entries = admin.describe_configs([resource])[resource].result(timeout=30)
        got[t] = {k: entries[k].value for k in ("cleanup.policy", "min.compaction.lag.ms", "segment.ms")}
    assert got == {
        compacted: {"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000", "segment.ms": "60000"},
        plain: {"cleanup.policy": "delete", "min.compaction.lag.ms": "0", "segment.ms": "60000"},
    }
    with pytest.raises(ValueError, match="not created here"):
        real_kafka.create_topics({_name("x"): 1}, configs={"other": {"cleanup.policy": "compact"}})


# -- three nodes ---------------------------------------------------------------------------------------------
def _wait_for(what: str, check, timeout_s: float = 90):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except Exception:  # noqa: BLE001 - metadata of a cluster in the middle of an election
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _produce(bootstrap: str, topic: str, values: range) -> None:
    failed = []
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "log_level": 0,
        }
    )
    for i in values:
        p.produce(topic, str(i).encode(), partition=0, on_delivery=lambda err, _m: err and failed.append(err))
    assert p.flush(120) == 0 and not failed, failed


def test_a_killed_leader_is_replaced_and_comes_back_with_nothing_lost(real_kafka_three, capsys):
    kafka = real_kafka_three
    topic = _name("election")
    kafka.create_topics({topic: 1})
    before = kafka.partitions(topic)[0]
    assert sorted(before["replicas"]) == sorted(before["isr"]) == [1, 2, 3]
    _produce(kafka.bootstrap_servers, topic, range(500))
    leader = before["leader"]
    t0 = time.monotonic()
    kafka.kill_broker(leader)
    after = _wait_for(
        "a new leader", lambda: (p := kafka.partitions(topic)[0])["leader"] not in (leader, -1) and p
    )
    election_s = time.monotonic() - t0
    assert leader not in after["isr"] and not kafka.node(leader).alive
    _produce(kafka.bootstrap_servers, topic, range(500, 1000))  # acks=all with 2 of 3 in sync
    t1 = time.monotonic()
    kafka.restart_broker(leader)
    restart_s = time.monotonic() - t1
    _wait_for("the old leader back in sync", lambda: leader in kafka.partitions(topic)[0]["isr"])
    c = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": "t",
            "enable.partition.eof": True,
            "log_level": 0,
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    try:
        while True:
            m = c.poll(30)
            assert m is not None, f"nothing to read after {len(got)} records"
            if m.error() and m.error().code() == KafkaError._PARTITION_EOF:
                break
            assert m.error() is None, m.error()
            got.append(int(m.value()))
    finally:
        c.close()
    assert got == list(range(1000))
    with capsys.disabled():
        print(
            f"\n[three brokers] leader {leader} killed: new leader {after['leader']} after {election_s:.1f} s; "
            f"restarted and registered in {restart_s:.1f} s"
        )


# -- nothing outlives its owner ------------------------------------------------------------------------------
CHILD = """
import json, sys, time
from sim.brokers import KafkaCluster
c = KafkaCluster(root=sys.argv[1], name=sys.argv[2])
print(json.dumps({"pids": list(c.pids().values()), "dir": str(c.dir)}), flush=True)
if sys.argv[2] == "raises":
    raise RuntimeError("the test failed")
time.sleep(600)
"""


@pytest.mark.slow
def test_a_dying_owner_takes_its_brokers_with_it(kafka_jars, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    children = {
        how: subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path), how],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for how in ("raises", "killed")
    }
    try:
        started = {}
        for how, child in children.items():
            line = child.stdout.readline()
            assert line, f"{how}: {child.stderr.read()}"
            started[how] = json.loads(line)
            assert started[how]["pids"] and all(_alive(p) for p in started[how]["pids"])
        # an uncaught exception: the interpreter's exit closes the cluster (atexit)
        raises = children["raises"]
        assert raises.wait(120) == 1 and "the test failed" in raises.stderr.read()
        assert not any(_alive(p) for p in started["raises"]["pids"])
        assert not Path(started["raises"]["dir"]).exists()
        # SIGKILL: nothing of the owner runs any more, the kernel kills its brokers
        killed = children["killed"]
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        _wait_for(
            "the brokers of a killed owner to die",
            lambda: not any(map(_alive, started["killed"]["pids"])),
            30,
        )
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()
