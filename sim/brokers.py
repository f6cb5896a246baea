"""Apache Kafka brokers on loopback: real KRaft clusters for the tests, `simulate --brokers real` and the demo.

The librdkafka mock cluster (`sim.embedded_kafka`) is a test double; this module starts the real thing. One
`KafkaCluster` is one region's cluster: by default a single node that is both broker and controller, or
`brokers=3` nodes (each broker and controller, a quorum of three, so any one may be killed), or brokers beside one
dedicated controller (`dedicated_controller=True`). Each node is a JVM (`kafka.Kafka`) with its own directory,
ports chosen free on 127.0.0.1, a heap of at most 512 MiB and a small log-cleaner dedupe buffer, its storage
formatted first by `kafka.tools.StorageTool`. The cluster is ready when the AdminClient sees every broker.

The jars come from Maven Central, driven by `sim/jvm/kafka/pom.xml` (the Kafka version is its `kafka.version`),
copied once by `mvn dependency:copy-dependencies` into a cache outside the repository:
`~/.cache/tidegauge/jvm/kafka-<version>/lib/` (`$TIDEGAUGE_CACHE_DIR/jvm/...`, or `$XDG_CACHE_HOME/tidegauge/jvm/...`
when set). Several processes may ask at once: a file lock makes one of them resolve. `sim.maven` does that, for
these jars and for Spark's S3A connector alike.

Nothing outlives its owner: `close()` (or leaving the `with` block, exception or not) stops the nodes (SIGTERM,
then SIGKILL) and removes the cluster's directory; an interpreter that exits without closing closes them at exit
(atexit); one killed outright takes its brokers with it (Linux: each JVM gets SIGKILL when its parent dies), leaving
only its directory in the temporary directory. Brokers run in a session of their own, so a Ctrl-C meant for a live
simulation (which stops it cleanly) does not reach them.

    with KafkaCluster() as kafka:                       # ~10 s on 2 cores
        kafka.create_topics({"t": 8})                   # through the AdminClient: 8 partitions
        kafka.create_topics({"c": 1}, configs={"c": {"cleanup.policy": "compact"}})   # topic configs
        kafka.bootstrap_servers                         # "127.0.0.1:PORT" for any client
        kafka.kill_broker(1); kafka.restart_broker(1)   # SIGKILL, then the same node back on its ports

    with KafkaCluster(secured=True) as kafka:           # + SASL_SSL and mutual-TLS listeners, ACLs on
        kafka.add_scram_user("reader", password); kafka.allow("User:reader", ["t"])
        kafka.listener_servers("SASL_SSL"), kafka.certs.scram_conf("reader", password)
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from queue import Queue
from typing import IO, Any

from . import kafka_security, maven
from .maven import cache_dir  # noqa: F401 - where the jars are cached, as callers of this module knew it

JVM_DIR = Path(__file__).resolve().parent / "jvm" / "kafka"
KAFKA_POM = JVM_DIR / "pom.xml"
LOG4J2_CONFIG = JVM_DIR / "log4j2.properties"
MVN_TIMEOUT_S = 900.0  # a first resolution downloads ~45 MB of jars and Maven's plugins
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0  # SIGTERM (a controlled shutdown), then SIGKILL
HEAP = "512m"  # per node: -Xmx (the ceiling)
DEDUPE_BUFFER_BYTES = (
    16 << 20
)  # log.cleaner.dedupe.buffer.size (Kafka's default is 128 MiB): ~600k keys per pass
STARTED_LINE = "Kafka Server started"  # what kafka.server.KafkaRaftServer logs once a node serves


class BrokersError(RuntimeError):
    """Kafka brokers could not be had: no Java or Maven, jars that could not be resolved, a node that did not
    start or stop. The message says what to do."""


# -- the jars ----------------------------------------------------------------------------------------------
def kafka_version(pom: Path = KAFKA_POM) -> str:
    """The Kafka version the descriptor names (its `kafka.version` property)."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ET.parse(pom).getroot().find("m:properties/m:kafka.version", ns)
    if node is None or not (node.text or "").strip():
        raise BrokersError(f"{pom}: no <kafka.version> property")
    return node.text.strip()


def _jar_set() -> maven.JarSet:
    version = kafka_version()
    return maven.JarSet(
        name="kafka",
        version=version,
        pom=KAFKA_POM,
        label=f"Apache Kafka {version}",
        needs="real Kafka brokers need",
        marker=f"kafka_2.13-{version}.jar",
    )


def java_command() -> str:
    """The `java` to run brokers with, checked to be Java 17 or newer."""
    try:
        return maven.java_command("real Kafka brokers need")
    except maven.JarsError as exc:
        raise BrokersError(str(exc)) from None


def resolve_jars(timeout_s: float = MVN_TIMEOUT_S, progress: Callable[[str], None] | None = None) -> Path:
    """The directory holding the Kafka broker's jars, resolved from Maven Central on first use (then cached;
    re-resolved when the descriptor changes; `sim.maven` does it). Raises BrokersError naming what is missing or
    what Maven said."""
    try:
        return maven.resolve(_jar_set(), timeout_s, progress)
    except maven.JarsError as exc:
        raise BrokersError(str(exc)) from None


# -- processes that die with their owner -----------------------------------------------------------------
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class _Launcher:
    """Starts every JVM from one thread that lives as long as the interpreter: the kernel's parent-death signal
    follows the thread that forked, so a broker restarted from a short-lived thread (a timer) would otherwise die
    with that thread."""

    def __init__(self) -> None:
        self._queue: Queue = Queue()
        self._thread = threading.Thread(target=self._loop, name="kafka-launcher", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            fut, args, kwargs = self._queue.get()
            try:
                fut.set_result(subprocess.Popen(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

    def popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen:
        fut: Future = Future()
        self._queue.put((fut, args, kwargs))
        return fut.result()


_launcher: _Launcher | None = None
_launcher_lock = threading.Lock()


def _popen(cmd: list[str], log: IO[bytes], cwd: Path) -> subprocess.Popen:
    global _launcher
    with _launcher_lock:
        if _launcher is None:
            _launcher = _Launcher()
    return _launcher.popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        start_new_session=True,  # a terminal's Ctrl-C goes to the simulation, which stops the brokers itself
        preexec_fn=_die_with_parent,
    )


_live: weakref.WeakSet[KafkaCluster] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for cluster in list(_live):
        with contextlib.suppress(Exception):
            cluster.close()


# -- a cluster ---------------------------------------------------------------------------------------------
# Ports this process has handed out: clusters started together (`start_clusters`, one thread each) choose their
# ports at the same time, and a port one has chosen and closed, before its JVM binds it, may be the kernel's next
# answer to another.
_HANDED_OUT: set[int] = set()
_PORTS_LOCK = threading.Lock()


def _free_ports(n: int) -> list[int]:
    """n distinct ports free on 127.0.0.1 right now (held together while chosen, so never the same twice), none
    handed out before by this process."""
    socks = []
    ports: list[int] = []
    with _PORTS_LOCK:
        try:
            while len(ports) < n:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind(("127.0.0.1", 0))
                socks.append(s)
                if s.getsockname()[1] not in _HANDED_OUT:
                    ports.append(s.getsockname()[1])
            _HANDED_OUT.update(ports)
            return ports
        finally:
            for s in socks:
                s.close()


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, base64url without padding (what `kafka-storage random-uuid` prints),
    never starting with '-' (Kafka's Uuid.randomUuid draws again then too: the storage tool would take it for
    an option)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


@dataclass
class Node:
    """One JVM of a cluster: a broker, a controller or both; its ports stay the same across restarts."""

    node_id: int
    roles: tuple[str, ...]
    dir: Path
    broker_port: int | None = None
    controller_port: int | None = None
    secured_ports: dict[str, int] = field(default_factory=dict)  # listener name -> port (a secured cluster)
    proc: subprocess.Popen | None = None
    starts: int = 0
    log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def properties(self) -> Path:
        return self.dir / "server.properties"

    @property
    def server_log(self) -> Path:
        return self.dir / "logs" / "server.log"

    @property
    def stdout_log(self) -> Path:
        return self.dir / "logs" / "stdout.log"

    def started_count(self) -> int:
        """How many times this node's log says it finished starting (the log is appended to across restarts)."""
        try:
            return self.server_log.read_text(errors="replace").count(STARTED_LINE)
        except OSError:
            return 0

    def tail(self, lines: int = 15) -> str:
        """The last lines the node wrote (its log, else its console), to say why it did not start."""
        for path in (self.stdout_log, self.server_log):
            try:
                text = path.read_text(errors="replace").strip().splitlines()
            except OSError:
                continue
            errors = [ln for ln in text if " ERROR " in ln or "Exception" in ln or "Error:" in ln]
            pick = (errors or text)[-lines:]
            if pick:
                return "\n".join(pick)
        return "(it wrote nothing)"


class KafkaCluster:
    """One Apache Kafka cluster in KRaft mode on 127.0.0.1 (see the module's doc). `brokers` nodes, each broker
    and controller unless `dedicated_controller` (then one more node, the only controller). `config` adds or
    overrides broker settings (e.g. {"log.cleaner.backoff.ms": 500}); `root` is where its directory is made
    (default: the temporary directory). Starts at once unless `start=False` (then call `start()`). `secured`: the
    brokers also serve SASL_SSL (SCRAM-SHA-512) and mutual-TLS listeners under ACLs, with certificates made for
    the cluster (`certs`; `sim.kafka_security` says what), `listener_servers`, `add_scram_user` and `allow`."""

    def __init__(
        self,
        brokers: int = 1,
        *,
        dedicated_controller: bool = False,
        config: Mapping[str, Any] | None = None,
        root: str | os.PathLike | None = None,
        name: str = "kafka",
        heap: str = HEAP,
        auto_create_topics: bool = False,
        start: bool = True,
        start_timeout_s: float = START_TIMEOUT_S,
        progress: Callable[[str], None] | None = None,
        secured: bool = False,
    ) -> None:
        if brokers < 1:
            raise ValueError(f"brokers must be at least 1, got {brokers}")
        self.brokers = brokers
        self.dedicated_controller = dedicated_controller
        self.heap = heap
        self.start_timeout_s = start_timeout_s
        self.progress = progress
        self.version = kafka_version()
        self.cluster_id = _cluster_id()
        self.dir = Path(tempfile.mkdtemp(prefix=f"tidegauge-{name}-", dir=root))
        self._lock = threading.RLock()
        self._closed = False
        self.start_s: float | None = None  # seconds from format to ready, of the first start
        rf = min(3, brokers)
        self.config: dict[str, Any] = {
            "auto.create.topics.enable": str(auto_create_topics).lower(),
            "log.cleaner.dedupe.buffer.size": DEDUPE_BUFFER_BYTES,
            "log.cleaner.threads": 1,
            # the simulator stamps records with its own clock (years ago by default): nothing is deleted by age
            "log.retention.ms": -1,
            "log.retention.bytes": -1,
            "default.replication.factor": rf,
            "min.insync.replicas": 1 if rf == 1 else 2,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": 5,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": 1 if rf == 1 else 2,
            "transaction.state.log.num.partitions": 5,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": 1 if rf == 1 else 2,
            "group.initial.rebalance.delay.ms": 0,
            # a killed broker is fenced (its partitions' leadership moved, its restart accepted) after 3 s, not 9
            "broker.session.timeout.ms": 3000,
            "broker.heartbeat.interval.ms": 500,
            # 2 cores shared with everything else: fewer threads than Kafka's server-sized defaults
            "num.network.threads": 2,
            "num.io.threads": 2,
            "background.threads": 2,
            "num.recovery.threads.per.data.dir": 1,
            "num.replica.fetchers": 1,
        }
        self.certs: kafka_security.Certificates | None = None
        if secured:
            try:
                self.certs = kafka_security.make_certificates(self.dir / "tls")
            except kafka_security.CertificateError as exc:
                shutil.rmtree(self.dir, ignore_errors=True)
                raise BrokersError(str(exc)) from None
            self.config.update(kafka_security.broker_properties(self.certs))
        self.config.update(config or {})
        self.nodes: list[Node] = []
        first = 1
        if dedicated_controller:
            self.nodes.append(Node(0, ("controller",), self.dir / "node-0"))
        self.nodes += [
            Node(
                first + i,
                ("broker",) if dedicated_controller else ("broker", "controller"),
                self.dir / f"node-{first + i}",
            )
            for i in range(brokers)
        ]
        _live.add(self)
        if start:
            try:
                self.start()
            except BaseException:
                self.close()
                raise

    # -- lifecycle -----------------------------------------------------------------------------------------
    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KafkaCluster(kafka {self.version}, {self.brokers} broker(s), {'closed' if self._closed else self.bootstrap_servers})"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{n.broker_port}" for n in self.nodes if n.is_broker)

    @property
    def uri(self) -> str:
        """The cluster as a tidegauge source URI."""
        return "kafka://" + self.bootstrap_servers

    def listener_servers(self, listener: str) -> str:
        """bootstrap.servers of a secured cluster's `SASL_SSL` or `SSL` listener (`bootstrap_servers` is its
        PLAINTEXT one, the super user's)."""
        if self.certs is None:
            raise BrokersError(f"the cluster serves no {listener} listener: start it with secured=True")
        if listener not in kafka_security.SECURED_LISTENERS:
            raise ValueError(f"listener {listener!r} is not one of {kafka_security.SECURED_LISTENERS}")
        return ",".join(f"127.0.0.1:{n.secured_ports[listener]}" for n in self.nodes if n.is_broker)

    def add_scram_user(self, user: str, password: str) -> None:
        """A SCRAM-SHA-512 user of the SASL_SSL listener (a secured cluster)."""
        kafka_security.add_scram_user(self.admin(), user, password)

    def allow(
        self, principal: str, topics: Iterable[str], operations: tuple[str, ...] = ("READ", "DESCRIBE")
    ) -> None:
        """ACLs letting `principal` ("User:NAME": a SCRAM user, or a client certificate's CN) do `operations` on
        these topics, and nothing else it is not already allowed."""
        kafka_security.allow(self.admin(), principal, list(topics), operations)

    @property
    def broker_ids(self) -> list[int]:
        return [n.node_id for n in self.nodes if n.is_broker]

    def node(self, node_id: int) -> Node:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise ValueError(f"node {node_id} does not exist (nodes: {[n.node_id for n in self.nodes]})")

    def pids(self) -> dict[int, int]:
        """node id -> pid of its JVM, for the nodes running."""
        return {n.node_id: n.proc.pid for n in self.nodes if n.alive and n.proc is not None}

    def start(self) -> None:
        """Format every node's storage, start the nodes and wait until the AdminClient sees every broker. A port
        taken meanwhile by someone else (they are chosen free, then bound by the JVM) is retried on new ports."""
        t0 = time.monotonic()
        for attempt in range(3):
            self.prepare()
            self.format()
            self.launch()
            try:
                self.wait_ready()
                break
            except BrokersError as exc:
                if attempt == 2 or "Address already in use" not in str(exc):
                    raise
                self._stop_all(kill=True)
        self.start_s = time.monotonic() - t0

    def prepare(self) -> None:
        """Ports and server.properties of every node (new ports each time it is called)."""
        with self._lock:
            lib = resolve_jars(progress=self.progress)
            self._classpath = str(lib / "*")
            self._java = java_command()
            secured = kafka_security.SECURED_LISTENERS if self.certs is not None else ()
            ports = iter(
                _free_ports(
                    sum(
                        ("broker" in n.roles) * (1 + len(secured)) + ("controller" in n.roles)
                        for n in self.nodes
                    )
                )
            )
            for n in self.nodes:
                n.broker_port = next(ports) if n.is_broker else None
                n.secured_ports = {name: next(ports) for name in secured} if n.is_broker else {}
                n.controller_port = next(ports) if "controller" in n.roles else None
            voters = ",".join(
                f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes if n.controller_port
            )
            for n in self.nodes:
                if n.dir.exists():
                    shutil.rmtree(n.dir)
                (n.dir / "logs").mkdir(parents=True)
                listeners = []
                props: dict[str, Any] = {
                    "process.roles": ",".join(n.roles),
                    "node.id": n.node_id,
                    "controller.quorum.voters": voters,
                    "controller.listener.names": "CONTROLLER",
                    "listener.security.protocol.map": ",".join(
                        ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT", *(f"{s}:{s}" for s in secured)]
                    ),
                    "log.dirs": n.dir / "data",
                }
                if n.is_broker:
                    listeners.append(f"PLAINTEXT://127.0.0.1:{n.broker_port}")
                    listeners += [f"{name}://127.0.0.1:{port}" for name, port in n.secured_ports.items()]
                    props["advertised.listeners"] = ",".join(listeners)
                    props["inter.broker.listener.name"] = "PLAINTEXT"
                if n.controller_port:
                    listeners.append(f"CONTROLLER://127.0.0.1:{n.controller_port}")
                props["listeners"] = ",".join(listeners)
                props.update(self.config)
                n.properties.write_text("".join(f"{k}={_prop(v)}\n" for k, v in props.items()))

    def _jvm(self, node: Node, main: str, heap: str) -> list[str]:
        return [
            self._java,
            f"-Xmx{heap}",
            "-Xms64m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:ParallelGCThreads=1",
            "-XX:ConcGCThreads=1",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            "-Djava.net.preferIPv4Stack=true",
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
            f"-Dkafka.logs.dir={node.dir / 'logs'}",
            "-cp",
            self._classpath,
            main,
        ]

    def format(self) -> None:
        """`kafka.tools.StorageTool format` for every node, at once (each is a JVM start)."""
        procs = []
        for n in self.nodes:
            cmd = [
                *self._jvm(n, "kafka.tools.StorageTool", "256m"),
                "format",
                f"--cluster-id={self.cluster_id}",
                "--config",
                str(n.properties),
            ]
            log = open(n.dir / "logs" / "format.log", "wb")  # noqa: SIM115 - closed below
            procs.append((n, log, _popen(cmd, log, n.dir)))
        failed = []
        for n, log, proc in procs:
            try:
                code = proc.wait(timeout=self.start_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = "timeout"
            log.close()
            if code != 0:
                text = (n.dir / "logs" / "format.log").read_text(errors="replace").strip()
                failed.append(f"node {n.node_id} (exit {code}): {text[-800:]}")
        if failed:
            raise BrokersError("kafka.tools.StorageTool format failed: " + "; ".join(failed))

    def launch(self, nodes: Iterable[Node] | None = None) -> None:
        """Start the nodes' JVMs (every node by default); does not wait for them."""
        with self._lock:
            if self._closed:
                raise BrokersError("the cluster is closed")
            for n in self.nodes if nodes is None else nodes:
                if n.alive:
                    continue
                if n.log is not None:
                    n.log.close()
                n.log = open(n.stdout_log, "ab")  # noqa: SIM115 - closed when the node stops
                n.proc = _popen([*self._jvm(n, "kafka.Kafka", self.heap), str(n.properties)], n.log, n.dir)
                n.starts += 1

    def wait_ready(self, timeout_s: float | None = None, brokers: Iterable[int] | None = None) -> None:
        """Until every running node has said "Kafka Server started" once per launch (a restarted broker is
        unfenced again, not merely its old registration still alive) and the AdminClient sees `brokers` (default:
        every broker that runs) registered; raises BrokersError when a node exits or time runs out."""
        timeout_s = timeout_s or self.start_timeout_s
        deadline = time.monotonic() + timeout_s
        want = (
            set(brokers)
            if brokers is not None
            else {n.node_id for n in self.nodes if n.is_broker and n.alive}
        )
        seen: set[int] = set()
        waiting = [n for n in self.nodes if n.alive]
        last_error = ""
        while True:
            for n in self.nodes:
                if (
                    n.proc is not None
                    and n.proc.poll() is not None
                    and (n.node_id in want or not n.is_broker)
                ):
                    raise BrokersError(
                        f"Kafka node {n.node_id} ({'+'.join(n.roles)}) exited with {n.proc.returncode} while "
                        f"starting; its last lines ({n.dir / 'logs'}):\n{n.tail()}"
                    )
            waiting = [n for n in waiting if n.started_count() < n.starts]
            if not waiting:
                try:
                    seen = self.registered_brokers(timeout_s=5)
                    if want <= seen:
                        return
                except Exception as exc:  # noqa: BLE001 - not up yet: the next round says more
                    last_error = str(exc)
            if time.monotonic() > deadline:
                raise BrokersError(
                    f"Kafka {self.bootstrap_servers}: not ready after {timeout_s:.0f} s (nodes not started: "
                    f"{[n.node_id for n in waiting]}; brokers {sorted(want - seen)} not registered"
                    f"{'; ' + last_error if last_error else ''})"
                    + "".join(f"\nnode {n.node_id}: {n.tail(5)}" for n in self.nodes)
                )
            time.sleep(0.2)

    def _admin_conf(self, bootstrap: str | None = None) -> dict[str, Any]:
        # log_level 0: while brokers start or after one is killed, refused connections are expected
        return {
            "bootstrap.servers": bootstrap or self._running_bootstrap(),
            "log_level": 0,
            "socket.timeout.ms": 5000,
        }

    def _running_bootstrap(self) -> str:
        running = [f"127.0.0.1:{n.broker_port}" for n in self.nodes if n.is_broker and n.alive]
        return ",".join(running) or self.bootstrap_servers

    def admin(self):
        """An AdminClient of the cluster (through the brokers that run)."""
        from confluent_kafka.admin import AdminClient

        return AdminClient(self._admin_conf())

    def registered_brokers(self, timeout_s: float = 10) -> set[int]:
        """The broker ids the cluster's metadata holds (registered and unfenced), as the AdminClient sees them."""
        if not any(_port_open(n.broker_port) for n in self.nodes if n.is_broker and n.alive):
            raise BrokersError("no broker accepts connections yet")
        admin = self.admin()  # held until the answer is in: a client collected meanwhile cancels its requests
        desc = admin.describe_cluster(request_timeout=timeout_s).result(timeout=timeout_s + 5)
        return {node.id for node in desc.nodes}

    # -- topics ---------------------------------------------------------------------------------------------
    def create_topics(
        self,
        topics: Mapping[str, int],
        *,
        replication_factor: int = -1,
        config: Mapping[str, Any] | None = None,
        configs: Mapping[str, Mapping[str, Any]] | None = None,
        timeout_s: float = 60,
    ) -> None:
        """Create topics with exactly the given partition counts, through the AdminClient (CreateTopics); the
        replication factor defaults to the cluster's (min(3, brokers)). `config` is given to every topic (e.g.
        {"cleanup.policy": "compact"}), `configs[topic]` to that topic only, over `config` (one call can make a
        compacted version topic beside a plain copy). Raises if one exists."""
        from confluent_kafka.admin import NewTopic

        unknown = sorted(set(configs or {}) - set(topics))
        if unknown:
            raise ValueError(f"configs names topics not created here: {unknown}")

        def conf(topic: str) -> dict[str, str]:
            merged = {**(config or {}), **(configs or {}).get(topic, {})}
            return {k: _prop(v) for k, v in merged.items()}

        admin = self.admin()
        futures = admin.create_topics(
            [NewTopic(t, p, replication_factor, config=conf(t)) for t, p in topics.items()],
            request_timeout=timeout_s,
        )
        for name, fut in futures.items():
            try:
                fut.result(timeout=timeout_s + 5)
            except Exception as exc:  # noqa: BLE001 - named
                raise BrokersError(f"creating topic {name} on {self.bootstrap_servers}: {exc}") from None
        wait_for_leaders(admin, dict(topics), timeout_s)

    def partitions(self, topic: str, timeout_s: float = 10) -> dict[int, dict[str, Any]]:
        """partition -> {"leader": id, "replicas": [...], "isr": [...]} as the cluster's metadata says."""
        admin = self.admin()
        md = admin.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if md is None or md.error is not None:
            raise BrokersError(f"topic {topic}: {None if md is None else md.error}")
        return {
            p: {"leader": pm.leader, "replicas": list(pm.replicas), "isr": list(pm.isrs)}
            for p, pm in md.partitions.items()
        }

    # -- brokers going down and coming back -------------------------------------------------------------------
    def kill_broker(self, node_id: int) -> None:
        """SIGKILL the node's JVM (no controlled shutdown) and wait until it is gone."""
        n = self.node(node_id)
        with self._lock:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait(timeout=30)

    def stop_broker(self, node_id: int, timeout_s: float = 60) -> None:
        """SIGTERM the node (a controlled shutdown: its partitions' leadership moves first), SIGKILL after
        `timeout_s`."""
        n = self.node(node_id)
        with self._lock:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.terminate()
                try:
                    n.proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    n.proc.kill()
                    n.proc.wait(timeout=30)

    def restart_broker(self, node_id: int, wait: bool = True, timeout_s: float | None = None) -> None:
        """Start a stopped or killed node again, same ports and data (it recovers its log as after a crash);
        with `wait`, until it is registered again."""
        n = self.node(node_id)
        self.launch([n])
        if wait and n.is_broker:
            self.wait_ready(timeout_s, brokers=[node_id])

    # -- the end ------------------------------------------------------------------------------------------------
    def _signal_all(self, kill: bool) -> list[Node]:
        running = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        for n in running:
            with contextlib.suppress(ProcessLookupError):
                n.proc.kill() if kill else n.proc.terminate()
        return running

    def _reap(self, running: list[Node], deadline: float) -> None:
        for n in running:
            try:
                n.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait(timeout=30)
        for n in self.nodes:
            if n.log is not None:
                n.log.close()
                n.log = None

    def _stop_all(self, kill: bool = False, timeout_s: float = STOP_TIMEOUT_S) -> None:
        self._reap(self._signal_all(kill), time.monotonic() + timeout_s)

    def close(self, graceful: bool = True) -> None:
        """Stop every node (SIGTERM and up to 15 s, then SIGKILL; `graceful=False`: SIGKILL at once) and remove
        the cluster's directory. Idempotent."""
        close_clusters([self], graceful)


def close_clusters(clusters: Iterable[KafkaCluster], graceful: bool = True) -> None:
    """Close several clusters at once: every node is signalled first, then waited for (15 s, then SIGKILL), so
    shutting down N clusters costs about one's shutdown. Idempotent."""
    todo = []
    for c in clusters:
        c._lock.acquire()
        if c._closed:
            c._lock.release()
            continue
        c._closed = True
        todo.append(c)
    try:
        running = [(c, c._signal_all(kill=not graceful)) for c in todo]
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for c, nodes in running:
            c._reap(nodes, deadline)
    finally:
        for c in todo:
            shutil.rmtree(c.dir, ignore_errors=True)
            _live.discard(c)
            c._lock.release()


def wait_for_leaders(client: Any, topics: Mapping[str, int], timeout_s: float = 60) -> None:
    """Until the metadata `client` (an AdminClient or a Consumer) gets shows every topic with its partitions,
    each with a leader: CreateTopics answers once the controller has the topic, a moment before brokers serve it."""
    deadline = time.monotonic() + timeout_s
    while True:
        md = client.list_topics(timeout=10).topics
        short = {
            t: n
            for t, n in topics.items()
            if t not in md
            or md[t].error is not None
            or len(md[t].partitions) != n
            or any(p.leader < 0 for p in md[t].partitions.values())
        }
        if not short:
            return
        if time.monotonic() > deadline:
            raise BrokersError(
                f"topics {sorted(short)} have no leader for every partition after {timeout_s:.0f} s"
            )
        time.sleep(0.1)


def _prop(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _port_open(port: int | None) -> bool:
    if port is None:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_clusters(
    n: int, progress: Callable[[str], None] | None = None, **kwargs: Any
) -> list[KafkaCluster]:
    """n clusters (one per region) started side by side: every JVM launched first, then waited for, so the
    clusters cost about one cluster's start. `kwargs` go to every `KafkaCluster`. All or none: on a failure the
    ones started are closed."""
    resolve_jars(progress=progress)
    clusters: list[KafkaCluster] = []
    try:
        for _ in range(n):
            clusters.append(KafkaCluster(start=False, progress=progress, **kwargs))
        t0 = time.monotonic()
        for c in clusters:
            c.prepare()
        _format_all(clusters)
        for c in clusters:
            c.launch()
        for c in clusters:
            c.wait_ready()
        for c in clusters:
            c.start_s = time.monotonic() - t0
        return clusters
    except BaseException:
        for c in clusters:
            c.close(graceful=False)
        raise


def _format_all(clusters: list[KafkaCluster]) -> None:
    errors: list[BaseException] = []

    def run(c: KafkaCluster) -> None:
        try:
            c.format()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in clusters]  # each waits on its own JVMs
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@contextlib.contextmanager
def kafka_cluster(brokers: int = 1, **kwargs: Any) -> Iterator[KafkaCluster]:
    """`with kafka_cluster(3) as c:` — a started cluster, closed (and its directory removed) on the way out."""
    cluster = KafkaCluster(brokers, **kwargs)
    try:
        yield cluster
    finally:
        cluster.close()


__all__ = [
    "BrokersError",
    "KafkaCluster",
    "Node",
    "cache_dir",
    "close_clusters",
    "java_command",
    "kafka_cluster",
    "kafka_version",
    "resolve_jars",
    "start_clusters",
]
