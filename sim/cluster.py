"""One Kafka cluster per region: its topics, the producers that write it, and readers that capture it.

Determinism rests on two rules enforced here:

* every write to a topic partition goes through one producer instance (`RegionProducer`), idempotent so that
  retries keep order and never duplicate; offsets are therefore known in advance, and the producer predicts
  them (`next_offset`) so the simulator can name the offset of every record it writes. Its Kafka timestamps
  (CreateTime) come from the simulated clock, so archives match byte for byte across runs. (The coordinator
  owns each region's RT producer, the region's worker its VT producer.)
* a reader (`Reader`) consumes a set of partitions to offsets fixed by the caller, checks that no offset is
  missing (a gap means the cluster lost data, e.g. the embedded mock cluster's ~5 MiB-per-partition
  retention), optionally writes everything to an archive, and hands each partition's records to a handler.
  One consumption serves the archive, the leaders and the followers.

The embedded mock cluster (`sim.embedded_kafka`) is the default; Apache Kafka brokers started on loopback
(`sim.brokers`, `brokers: real`) or the caller's clusters are the real ones, reached with the caller's librdkafka
settings passed through untouched (never logged).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from div import archive
from div.kafka_log import consumer_config, messages_to_batch, raise_on_fatal, split_messages

from .embedded_kafka import EmbeddedKafka

if TYPE_CHECKING:
    from .brokers import KafkaCluster

log = logging.getLogger(__name__)


class ClusterError(RuntimeError):
    """A region's cluster could not be set up, lost records, or stalled."""


class SimClock:
    """The simulated clock: epoch milliseconds, moved by the simulator only."""

    __slots__ = ("now",)

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class RegionProducer:
    """A confluent-kafka producer that stamps records with simulated time and predicts their offsets.

    It has the produce/poll/flush surface `heartbeat.HeartbeatLeader` expects, so leaders write through it.
    """

    def __init__(
        self,
        bootstrap: str,
        conf: Mapping[str, Any],
        clock: SimClock,
        base_offsets: dict[tuple[str, int], int] | None = None,
    ) -> None:
        settings: dict[str, Any] = {
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_097_151,
            "message.timeout.ms": 300_000,
        }
        settings.update(conf)
        settings["bootstrap.servers"] = bootstrap
        self._producer = Producer(settings)
        self._clock = clock
        self._next: dict[tuple[str, int], int] = dict(base_offsets or {})
        self.records = 0
        self.last_offset = -1  # offset of the last record handed to produce()
        self.last_record: tuple | None = None  # (topic, value, key, partition, headers) of that record

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        headers: Any = None,
        on_delivery: Callable | None = None,
        **_: Any,
    ) -> None:
        if partition < 0:
            raise ClusterError(f"simulated writes name their partition (topic {topic})")
        self._producer.produce(
            topic,
            value=value,
            key=key,
            partition=partition,
            headers=headers,
            on_delivery=on_delivery,
            timestamp=self._clock.now,
        )
        tp = (topic, partition)
        off = self._next.get(tp, 0)
        self._next[tp] = off + 1
        self.last_offset = off
        self.last_record = (topic, value, key, partition, headers)
        self.records += 1

    def poll(self, timeout: float = 0) -> int:
        return self._producer.poll(timeout)

    def flush(self, timeout: float = 300.0) -> int:
        left = self._producer.flush(timeout)
        return left

    def next_offset(self, topic: str, partition: int) -> int:
        """The offset the next record written to `topic[partition]` will get."""
        return self._next.get((topic, partition), 0)

    def ends(self) -> dict[tuple[str, int], int]:
        return dict(self._next)

    def skip_to(self, topic: str, partition: int, offset: int) -> None:
        """Another producer wrote to `topic[partition]` (a repair): the next own record goes to `offset`."""
        if offset < self._next.get((topic, partition), 0):
            raise ClusterError(f"{topic}[{partition}]: end offset {offset} is below what this producer wrote")
        self._next[(topic, partition)] = offset

    def __len__(self) -> int:  # confluent's Producer reports its queue length; keep the same meaning
        return len(self._producer)


class Region:
    """A region's cluster: an embedded mock cluster started here, Apache Kafka brokers started here
    (`sim.brokers.KafkaCluster`, handed over: the region closes it), or a given one; creates the run's topics."""

    def __init__(
        self,
        region: int,
        bootstrap: str | None,
        conf: Mapping[str, Any],
        clock: SimClock,
        brokers: KafkaCluster | None = None,
    ) -> None:
        self.region = region
        self.conf = dict(conf)
        self.embedded: EmbeddedKafka | None = None
        self.brokers = brokers
        if brokers is not None:
            bootstrap = brokers.bootstrap_servers
        elif bootstrap is None:
            self.embedded = EmbeddedKafka(brokers=1)
            bootstrap = self.embedded.bootstrap_servers
        self.bootstrap = bootstrap
        self.clock = clock

    def create_topics(self, names: list[str], partitions: int) -> None:
        """Create fresh topics with `partitions` partitions (an existing topic is accepted only when empty):
        through the AdminClient (CreateTopics), except on the mock cluster, which has no CreateTopics (its own
        control API, through ctypes)."""
        if self.embedded is not None:
            for name in names:
                self.embedded.create_topic(name, partitions)
            return
        from confluent_kafka.admin import AdminClient, NewTopic

        existing = self._existing_topics()
        for name in [n for n in names if n in existing]:
            self._check_empty(name, partitions)  # created beforehand (e.g. by an operator): use it if empty
        missing = [n for n in names if n not in existing]
        if not missing:
            return
        admin = AdminClient({**self.conf, "bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(n, partitions) for n in missing], request_timeout=30)
        for name, fut in futures.items():
            try:
                fut.result(timeout=60)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    self._check_empty(name, partitions)
                    continue
                raise ClusterError(
                    f"region {self.region}: cannot create topic {name} on {self.bootstrap}: {exc}"
                ) from None
        from .brokers import BrokersError, wait_for_leaders

        try:
            wait_for_leaders(admin, dict.fromkeys(missing, partitions))
        except BrokersError as exc:
            raise ClusterError(f"region {self.region}: {self.bootstrap}: {exc}") from None

    def _existing_topics(self) -> set[str]:
        c = Consumer(consumer_config(self.bootstrap, self.conf))
        try:
            return set(c.list_topics(timeout=30).topics)  # all topics: asking for one could auto-create it
        except KafkaException as exc:
            raise ClusterError(
                f"region {self.region}: cannot read the topics of {self.bootstrap}: {exc}"
            ) from None
        finally:
            c.close()

    def _check_empty(self, topic: str, partitions: int) -> None:
        c = Consumer(consumer_config(self.bootstrap, self.conf))
        try:
            md = c.list_topics(timeout=10).topics.get(topic)
            if md is None or len(md.partitions) != partitions:
                raise ClusterError(
                    f"region {self.region}: topic {topic} exists on {self.bootstrap} with "
                    f"{0 if md is None else len(md.partitions)} partitions, not {partitions}"
                )
            for p in md.partitions:
                _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                if high:
                    raise ClusterError(
                        f"region {self.region}: topic {topic} on {self.bootstrap} is not empty; "
                        f"use another store name (simulate --conf with `store:`)"
                    )
        finally:
            c.close()

    def end_offsets(self, topic: str, partitions: int) -> dict[int, int]:
        """Each partition's high watermark as the cluster reports it (what any producer wrote there)."""
        c = Consumer(consumer_config(self.bootstrap, self.conf))
        try:
            return {
                q: c.get_watermark_offsets(TopicPartition(topic, q), timeout=30, cached=False)[1]
                for q in range(partitions)
            }
        except KafkaException as exc:
            raise ClusterError(
                f"region {self.region}: cannot read the end offsets of {topic}: {exc}"
            ) from None
        finally:
            c.close()

    def close(self) -> None:
        if self.embedded is not None:
            self.embedded.close()
            self.embedded = None
        if self.brokers is not None:
            self.brokers.close()
            self.brokers = None


class Reader:
    """Consumes a fixed set of partitions of one cluster, in offset order, without gaps.

    `drain(ends)` returns once every partition has been read up to `ends[(topic, partition)]` (exclusive);
    records beyond an end that arrive in the same fetch are handled too. `handler(topic, partition, messages)`
    receives each partition's records in offset order; with `archive_dir` everything is also archived.
    """

    def __init__(
        self,
        name: str,
        bootstrap: str,
        conf: Mapping[str, Any],
        partitions: list[tuple[str, int]],
        handler: Callable[[str, int, list], None],
        archive_dir: str | None = None,
        stall_timeout_s: float = 120.0,
    ) -> None:
        cfg = consumer_config(bootstrap, conf)
        cfg["enable.partition.eof"] = False
        # librdkafka prefetches in its own thread: what it has fetched is safe from the mock's retention.
        cfg.setdefault("queued.max.messages.kbytes", 262144)
        cfg.setdefault("fetch.max.bytes", 104857600)
        cfg.setdefault("max.partition.fetch.bytes", 8388608)
        self.name = name
        self.bootstrap = bootstrap
        self._consumer = Consumer(cfg)
        self._consumer.assign([TopicPartition(t, p, 0) for t, p in partitions])
        self._next: dict[tuple[str, int], int] = {tp: 0 for tp in partitions}
        self.writer = (
            None
            if archive_dir is None
            else archive.ArchiveWriter(archive_dir, file_rows=250_000, file_bytes=64 << 20)
        )
        self._handler = handler
        self.stall_timeout_s = stall_timeout_s
        self.records = 0
        self._closed = False

    def drain(self, ends: Mapping[tuple[str, int], int]) -> int:
        """Read until every partition reaches its end offset; returns the records read."""
        nxt = self._next
        missing = sum(max(0, e - nxt.get(tp, 0)) for tp, e in ends.items())
        read = 0
        last_progress = time.monotonic()
        while missing > 0:
            msgs = self._consumer.consume(min(missing, 50_000), timeout=0.5)
            data, events = split_messages(msgs)
            raise_on_fatal(events, f"reading {self.name} ({self.bootstrap})")
            if not data:
                if time.monotonic() - last_progress > self.stall_timeout_s:
                    behind = {
                        f"{t}[{p}]": (nxt.get((t, p), 0), e)
                        for (t, p), e in ends.items()
                        if nxt.get((t, p), 0) < e
                    }
                    raise ClusterError(
                        f"{self.name}: no records for {self.stall_timeout_s:.0f} s; (position, end) {behind}"
                    )
                continue
            last_progress = time.monotonic()
            self._dispatch(data)
            read += len(data)
            missing = sum(max(0, e - nxt.get(tp, 0)) for tp, e in ends.items())
        self.records += read
        return read

    def _dispatch(self, data: list) -> None:
        if self.writer is not None:
            self.writer.append(messages_to_batch(data))
        groups: dict[tuple[str, int], list] = {}
        for m in data:
            tp = (m.topic(), m.partition())
            g = groups.get(tp)
            if g is None:
                groups[tp] = g = []
            g.append(m)
        for tp, msgs in groups.items():
            expected = self._next.get(tp, 0)
            first, last = msgs[0].offset(), msgs[-1].offset()
            if first != expected or last - first + 1 != len(msgs):
                raise ClusterError(
                    f"{self.name}: {tp[0]}[{tp[1]}] offsets {first}..{last} ({len(msgs)} records) do not "
                    f"continue at {expected}: records were lost (the embedded cluster keeps ~5 MiB per "
                    f"partition; lower step_records) or duplicated"
                )
            self._next[tp] = last + 1
            self._handler(tp[0], tp[1], msgs)

    def add_partitions(self, partitions: list[tuple[str, int]]) -> None:
        """Read (and archive) these partitions too, from offset 0: a topic created while the run goes on (a live run's
        new version)."""
        new = [tp for tp in partitions if tp not in self._next]
        self._consumer.incremental_assign([TopicPartition(t, p, 0) for t, p in new])
        self._next.update(dict.fromkeys(new, 0))

    def positions(self) -> dict[tuple[str, int], int]:
        return dict(self._next)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.writer is not None:
                self.writer.close()
        finally:
            self._consumer.close()
