"""An in-process Kafka cluster for the simulator, the demo and the tests: librdkafka's mock cluster.

The mock cluster ships inside the confluent-kafka wheel (in its bundled librdkafka) and speaks the real Kafka
protocol over TCP on loopback, so producers and consumers use it exactly like a real cluster. Its control API
(`rdkafka_mock.h`) is not wrapped by confluent-kafka, so we call it through ctypes: create topics with any
partition count (AdminClient topic creation times out against it), take brokers down and up, and make
requests fail.

Limits of the mock, measured: it keeps about 5 MiB per partition and drops older messages (archive while
producing: `sim.archiver`), auto-created topics get 4 partitions, and consumers reading from offset 0 need
`auto.offset.reset=earliest`. Each EmbeddedKafka owns its own mock cluster, so several can run in one
process (the simulator runs one per region).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from collections.abc import Iterable

import confluent_kafka

# Kafka protocol request types (ApiKey) used with push_request_errors.
API_PRODUCE = 0
API_FETCH = 1
API_METADATA = 3

_RD_KAFKA_PRODUCER = 0
_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


class EmbeddedKafkaError(RuntimeError):
    """The mock cluster could not be created or refused a control request."""


def librdkafka_path() -> str:
    """Path of the librdkafka shared library bundled with confluent-kafka (falls back to a system one)."""
    pkg = os.path.dirname(confluent_kafka.__file__)
    patterns = [
        os.path.join(os.path.dirname(pkg), "confluent_kafka.libs", "librdkafka*.so*"),  # Linux wheels
        os.path.join(pkg, ".dylibs", "librdkafka*.dylib"),  # macOS wheels
        os.path.join(pkg, ".libs", "librdkafka*"),
    ]
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    system = ctypes.util.find_library("rdkafka")
    if system:
        return system
    raise EmbeddedKafkaError(f"no librdkafka found next to confluent_kafka ({pkg}) nor on the system")


def _load() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        lib = ctypes.CDLL(librdkafka_path())
        vp, cp, i32, i16, sz = (
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int32,
            ctypes.c_int16,
            ctypes.c_size_t,
        )
        signatures = {
            "rd_kafka_conf_new": ([], vp),
            "rd_kafka_conf_set": ([vp, cp, cp, cp, sz], ctypes.c_int),
            "rd_kafka_conf_destroy": ([vp], None),
            "rd_kafka_new": ([ctypes.c_int, vp, cp, sz], vp),
            "rd_kafka_destroy": ([vp], None),
            "rd_kafka_err2name": ([ctypes.c_int], cp),
            "rd_kafka_mock_cluster_new": ([vp, ctypes.c_int], vp),
            "rd_kafka_mock_cluster_destroy": ([vp], None),
            "rd_kafka_mock_cluster_bootstraps": ([vp], cp),
            "rd_kafka_mock_topic_create": ([vp, cp, ctypes.c_int, ctypes.c_int], ctypes.c_int),
            "rd_kafka_mock_broker_set_down": ([vp, i32], ctypes.c_int),
            "rd_kafka_mock_broker_set_up": ([vp, i32], ctypes.c_int),
            "rd_kafka_mock_broker_set_rtt": ([vp, i32, ctypes.c_int], ctypes.c_int),
            "rd_kafka_mock_push_request_errors_array": ([vp, i16, sz, ctypes.POINTER(ctypes.c_int)], None),
            "rd_kafka_mock_clear_request_errors": ([vp, i16], None),
            "rd_kafka_mock_partition_set_leader": ([vp, cp, i32, i32], ctypes.c_int),
        }
        for name, (argtypes, restype) in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = restype
        _lib = lib
        return lib


def error_name(code: int) -> str:
    name = _load().rd_kafka_err2name(int(code))
    return name.decode() if name else str(code)


class EmbeddedKafka:
    """A librdkafka mock cluster with `brokers` brokers (ids 1..brokers) listening on loopback.

    Use as a context manager or call close(). `bootstrap_servers` goes to any confluent-kafka client.
    """

    def __init__(self, brokers: int = 1) -> None:
        self._lock = threading.Lock()
        self._mcluster: int | None = None
        self._rk: int | None = None
        if brokers < 1:
            raise ValueError(f"brokers must be at least 1, got {brokers}")
        self._lib = _load()
        self.brokers = brokers
        errstr = ctypes.create_string_buffer(512)
        conf = self._lib.rd_kafka_conf_new()
        # The handle only hosts the mock cluster; keep its own client chatter out of the logs.
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, len(errstr))
        rk = self._lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not rk:
            self._lib.rd_kafka_conf_destroy(conf)
            raise EmbeddedKafkaError(f"rd_kafka_new failed: {errstr.value.decode(errors='replace')}")
        self._rk = rk
        mcluster = self._lib.rd_kafka_mock_cluster_new(rk, brokers)
        if not mcluster:
            self._lib.rd_kafka_destroy(rk)
            raise EmbeddedKafkaError(f"rd_kafka_mock_cluster_new({brokers}) failed")
        self._mcluster = mcluster
        self.bootstrap_servers: str = self._lib.rd_kafka_mock_cluster_bootstraps(mcluster).decode()

    def __enter__(self) -> EmbeddedKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.bootstrap_servers
        return f"EmbeddedKafka(brokers={self.brokers}, {state})"

    @property
    def closed(self) -> bool:
        return self._mcluster is None

    @property
    def uri(self) -> str:
        """The cluster as a tidegauge source URI."""
        return "kafka://" + self.bootstrap_servers

    def _handle(self) -> int:
        if self._mcluster is None:
            raise EmbeddedKafkaError("the embedded Kafka cluster is closed")
        return self._mcluster

    def _check(self, err: int, what: str) -> None:
        if err:
            raise EmbeddedKafkaError(f"{what}: {error_name(err)}")

    def _check_broker(self, broker_id: int) -> None:
        if broker_id != -1 and not 1 <= broker_id <= self.brokers:
            raise ValueError(
                f"broker id {broker_id} does not exist (ids are 1..{self.brokers}, or -1 for all)"
            )

    def create_topic(self, name: str, partitions: int, replication_factor: int = 1) -> None:
        """Create a topic with exactly `partitions` partitions (raises if it exists)."""
        if partitions < 1:
            raise ValueError(f"topic {name!r}: partitions must be at least 1, got {partitions}")
        if not 1 <= replication_factor <= self.brokers:
            raise ValueError(
                f"topic {name!r}: replication factor {replication_factor} needs that many brokers "
                f"(cluster has {self.brokers})"
            )
        with self._lock:
            err = self._lib.rd_kafka_mock_topic_create(
                self._handle(), name.encode(), partitions, replication_factor
            )
        self._check(err, f"creating topic {name!r} with {partitions} partitions")

    def broker_down(self, broker_id: int) -> None:
        """Disconnect the broker and refuse new connections (no leader change: its partitions stall)."""
        self._check_broker(broker_id)
        with self._lock:
            self._check(
                self._lib.rd_kafka_mock_broker_set_down(self._handle(), broker_id), f"broker {broker_id} down"
            )

    def broker_up(self, broker_id: int) -> None:
        self._check_broker(broker_id)
        with self._lock:
            self._check(
                self._lib.rd_kafka_mock_broker_set_up(self._handle(), broker_id), f"broker {broker_id} up"
            )

    def set_rtt(self, broker_id: int, rtt_ms: int) -> None:
        """Delay every response of the broker by `rtt_ms` (slow network)."""
        self._check_broker(broker_id)
        with self._lock:
            self._check(
                self._lib.rd_kafka_mock_broker_set_rtt(self._handle(), broker_id, rtt_ms),
                f"broker {broker_id} rtt",
            )

    def set_leader(self, topic: str, partition: int, broker_id: int) -> None:
        """Move a partition's leadership (a failover); -1 leaves the partition without a leader."""
        self._check_broker(broker_id)
        with self._lock:
            err = self._lib.rd_kafka_mock_partition_set_leader(
                self._handle(), topic.encode(), partition, broker_id
            )
        self._check(err, f"leader of {topic}[{partition}]")

    def push_request_errors(self, api_key: int, errors: Iterable[int]) -> None:
        """The next requests of type `api_key` fail with these error codes, one each, in order."""
        codes = [int(e) for e in errors]
        if not codes:
            return
        arr = (ctypes.c_int * len(codes))(*codes)
        with self._lock:
            self._lib.rd_kafka_mock_push_request_errors_array(self._handle(), api_key, len(codes), arr)

    def push_produce_errors(self, n: int, error_code: int) -> None:
        """The next `n` Produce requests fail with `error_code` (e.g. KafkaError.NOT_LEADER_FOR_PARTITION)."""
        if n < 0:
            raise ValueError(f"n must not be negative, got {n}")
        self.push_request_errors(API_PRODUCE, [error_code] * n)

    def clear_request_errors(self, api_key: int = API_PRODUCE) -> None:
        with self._lock:
            self._lib.rd_kafka_mock_clear_request_errors(self._handle(), api_key)

    def close(self) -> None:
        """Stop the brokers. Clients still connected see them as down."""
        with self._lock:
            if self._mcluster is None:
                return
            self._lib.rd_kafka_mock_cluster_destroy(self._mcluster)
            self._mcluster = None
            self._lib.rd_kafka_destroy(self._rk)
            self._rk = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing useful to do
            pass
