"""Tails a Kafka cluster into an archive directory while producers are writing.

The embedded mock cluster keeps only about 5 MiB per partition, so a simulation that wants to keep everything
it produced must archive concurrently. The Archiver runs in a background thread: one consumer assigned (no
group, no commits) to every partition of every topic (or of the topics named), discovering new topics and
partitions periodically, writing through `div.archive.ArchiveWriter`. `stop()` drains each partition up to the
end offset it has at that moment, flushes and closes.

librdkafka prefetches into its own queue from a background thread, which is what lets the archiver stay ahead
of retention even when Python is busy; records are then converted in bulk (one Arrow column per consume call).
An archive directory that already holds records is resumed after its last offset per partition.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from div import archive
from div.kafka_log import consumer_config, messages_to_batch, raise_on_fatal, split_messages

log = logging.getLogger(__name__)


class ArchiverError(RuntimeError):
    """The archiver thread failed or could not drain in time."""


@dataclass(frozen=True)
class Gap:
    """Offsets [first, last] of a partition the archiver never saw: dropped by retention before it could read
    them, compacted away, or taken by transaction markers."""

    topic: str
    partition: int
    first: int
    last: int


class Archiver:
    """Archive every partition of a cluster (or of `topics`) into `out_dir` until stop()."""

    def __init__(
        self,
        bootstrap: str,
        conf: Mapping[str, object] | None,
        out_dir: str,
        topics: Iterable[str] | None = None,
        discover_interval_s: float = 1.0,
        flush_interval_s: float = 10.0,
        consume_batch: int = 20000,
        row_group_size: int = 65536,
        start: bool = True,
    ) -> None:
        self.bootstrap = bootstrap
        self.out_dir = out_dir
        self.topics = None if topics is None else sorted(set(topics))
        self.discover_interval_s = discover_interval_s
        self.flush_interval_s = flush_interval_s
        self.consume_batch = consume_batch
        cfg = consumer_config(bootstrap, conf)
        # Prefetch generously: what librdkafka has fetched is safe from the mock's retention.
        cfg.setdefault("queued.max.messages.kbytes", 262144)
        cfg.setdefault("fetch.max.bytes", 104857600)
        cfg.setdefault("max.partition.fetch.bytes", 8388608)
        self._conf = cfg
        self._resume = (
            {(p.topic, p.partition): p.last_offset + 1 for p in archive.describe(out_dir)}
            if _has_files(out_dir)
            else {}
        )
        self._writer = archive.ArchiveWriter(out_dir, row_group_size=row_group_size)
        self._lock = threading.Lock()
        self._next: dict[tuple[str, int], int] = {}  # next offset expected per assigned partition
        self._eof: dict[tuple[str, int], int] = {}
        self._gaps: list[Gap] = []
        self._records = 0
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._drain_timeout_s = 120.0
        self._thread = threading.Thread(target=self._run, name=f"archiver[{out_dir}]", daemon=True)
        self._started = False
        self._stopped = False
        if start:
            self.start()

    def start(self) -> Archiver:
        if not self._started:
            self._started = True
            self._thread.start()
        return self

    def __enter__(self) -> Archiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def records(self) -> int:
        """Records consumed and handed to the archive writer so far (all are written by stop())."""
        with self._lock:
            return self._records

    def positions(self) -> dict[tuple[str, int], int]:
        """Next offset the archiver will read, per (topic, partition) it follows."""
        with self._lock:
            return dict(self._next)

    def gaps(self) -> list[Gap]:
        with self._lock:
            return list(self._gaps)

    def stop(self, timeout_s: float = 120.0) -> int:
        """Archive every partition up to its current end offset, write all files, and return the record count.
        Raises ArchiverError if the thread failed (what it had consumed is still written)."""
        if self._stopped:
            return self.records
        self._stopped = True
        self._drain_timeout_s = timeout_s
        self._stop.set()
        if self._started:
            self._thread.join()
        else:
            self._writer.close()
        if self._error is not None:
            raise ArchiverError(
                f"archiving {self.bootstrap} into {self.out_dir} failed: {self._error}"
            ) from self._error
        return self.records

    # ------------------------------------------------------------------------------------ thread

    def _run(self) -> None:
        consumer = None
        try:
            consumer = Consumer(self._conf)
            self._loop(consumer)
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self._error = e
            log.error("archiver for %s failed: %s", self.out_dir, e)
        finally:
            try:
                self._writer.close()
            except BaseException as e:  # noqa: BLE001
                self._error = self._error or e
            if consumer is not None:
                consumer.close()

    def _loop(self, consumer: Consumer) -> None:
        last_discover = last_flush = 0.0
        targets: dict[tuple[str, int], int] | None = None
        deadline = 0.0
        while True:
            now = time.monotonic()
            if targets is None and self._stop.is_set():
                # Final discovery, then fix what "everything" means: the end offsets as of now.
                self._discover(consumer)
                targets = self._end_offsets(consumer)
                deadline = now + self._drain_timeout_s
            elif targets is None and now - last_discover >= self.discover_interval_s:
                self._discover(consumer)
                last_discover = now
            if targets is not None and self._drained(targets):
                return
            if targets is not None and now > deadline:
                missing = {
                    f"{t}[{p}]": (self._next.get((t, p)), end)
                    for (t, p), end in targets.items()
                    if not self._partition_done((t, p), end)
                }
                raise ArchiverError(
                    f"could not drain within {self._drain_timeout_s:.0f} s: (position, end) {missing}"
                )
            msgs = consumer.consume(self.consume_batch, timeout=0.1)
            if msgs:
                self._handle(msgs)
            if now - last_flush >= self.flush_interval_s:
                self._writer.flush()
                last_flush = now

    def _discover(self, consumer: Consumer) -> None:
        try:
            md = consumer.list_topics(timeout=5.0)
        except KafkaException as e:
            log.warning("archiver: cannot list topics of %s: %s", self.bootstrap, e)
            return
        new = []
        for name, tmd in md.topics.items():
            if self.topics is None:
                if name.startswith(("__", "_", ".")):
                    continue  # Kafka internals; '_'/'.' names cannot be archived (Spark hides such files)
            elif name not in self.topics:
                continue
            if tmd.error is not None:
                continue
            for p in tmd.partitions:
                tp = (name, p)
                if tp in self._next:
                    continue
                start = self._resume.get(tp)
                with self._lock:
                    self._next[tp] = start if start is not None else 0
                new.append(TopicPartition(name, p, OFFSET_BEGINNING if start is None else start))
        if new:
            consumer.incremental_assign(new)
            log.info("archiver: following %d new partitions", len(new))

    def _end_offsets(self, consumer: Consumer) -> dict[tuple[str, int], int]:
        ends = {}
        for tp in list(self._next):
            try:
                _, high = consumer.get_watermark_offsets(TopicPartition(*tp), timeout=10.0, cached=False)
            except KafkaException as e:
                raise ArchiverError(f"cannot read the end offset of {tp[0]}[{tp[1]}]: {e}") from e
            ends[tp] = high
        return ends

    def _partition_done(self, tp: tuple[str, int], end: int) -> bool:
        return self._next.get(tp, 0) >= end or self._eof.get(tp, -1) >= end

    def _drained(self, targets: dict[tuple[str, int], int]) -> bool:
        return all(self._partition_done(tp, end) for tp, end in targets.items())

    def _handle(self, msgs: list) -> None:
        data, events = split_messages(msgs)
        for m in events:
            if m.error().code() == KafkaError._PARTITION_EOF:
                self._eof[(m.topic(), m.partition())] = m.offset()
        raise_on_fatal(events, f"archiving {self.bootstrap}")
        if not data:
            return
        batch = messages_to_batch(data)
        gaps = []
        nexts = {}
        for tp, part in archive.split_by_partition(batch):
            offsets = part.column("offset").to_numpy()
            expected = self._next.get(tp, 0)
            if offsets[0] > expected:
                gaps.append(Gap(tp[0], tp[1], expected, int(offsets[0]) - 1))
            jumps = np.flatnonzero(np.diff(offsets) > 1)
            gaps.extend(Gap(tp[0], tp[1], int(offsets[j]) + 1, int(offsets[j + 1]) - 1) for j in jumps)
            nexts[tp] = int(offsets[-1]) + 1
            self._writer.append(part)
        with self._lock:
            self._records += len(data)
            self._next.update(nexts)
            self._gaps.extend(gaps)
        for g in gaps:
            log.warning(
                "archiver: offsets %d..%d of %s[%d] were not in the log when read",
                g.first,
                g.last,
                g.topic,
                g.partition,
            )


def _has_files(directory: str) -> bool:
    return os.path.isdir(directory) and any(not n.startswith((".", "_")) for n in os.listdir(directory))
