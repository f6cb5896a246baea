"""`ChangeReader`: a client application's change capture from one region's version topic, each change once.

A cache, a search index or an ETL that follows a Venice store reads a region's VT and must apply every change
once, although the VT holds duplicates (broker redelivery, a new leader re-producing after a failover, a restart
from an older checkpoint, a new version replaying the real-time topics). `heartbeat.changes` is the rule that drops
them and `heartbeat.change_events` turns records into events; this module is the few lines of Kafka plumbing a
client would otherwise write around them, and gets wrong in one place that matters: the state it stores must cover
exactly the changes it has *applied*, not the records the consumer has fetched.

    from heartbeat import ChangeReader

    with ChangeReader("store", 3, {"bootstrap.servers": region_cluster}, state=stored, n_regions=3) as reader:
        while running:
            change = reader.poll(1.0)         # a ChangeEvent, or None when nothing came within the timeout
            if change is not None:
                apply(change)                 # key, op (PUT/DELETE), value, logical_ts, coordinate, VT position
                store(reader.state())         # bytes: covers exactly the changes poll returned

- The state is the client's: the reader reads `<store>_v<version>` with `assign` from each partition's stored
  position (a fresh reader from the start, its bulk load delivered as the initial snapshot) and never commits
  offsets to Kafka. Store `state()` together with what it covers (the same transaction, or the same file written
  atomically); a client restarted from any state it stored gets every later change once.
- A state of version N read with `version=N+1`, or `follow(N+1)` on a running reader, is a version swap: the marks
  are kept and the new version's bulk load and replayed changes already delivered are dropped. Follow a new version
  once the reader has caught up with the old one's end (its VersionSwap message): the new version's bulk load must
  hold nothing the reader has not delivered.
- `config` is the region cluster's confluent-kafka settings (bootstrap.servers and any security settings), passed to
  librdkafka untouched, never logged nor put in an error message.
- A record that cannot become an event (undecodable, no coordinate, an Update, a chunked value with chunks missing)
  is never delivered and never an exception: it is a `Problem` in `stats().problems`, logged once.
- **Resuming at a time** (`cut=`): a service whose store was restored from a snapshot at time T (or that lost
  everything after T) passes the cut of T (`heartbeat.cuts.Cut`, e.g. `Cut.from_json` of `tidegauge cut`'s
  cut.json) instead of a state, and gets exactly the changes above the cut, each once, no bulk load:

      cut = Cut.from_json(open("cut.json").read())
      with ChangeReader("store", 3, config, cut=cut, region=1) as reader:   # region 1's cluster
          for change in reader.events(to_end=True):
              apply_with_dcr(change)          # onto the snapshot: the higher logical_ts wins (docs/cut.md)
              store(reader.state())                                       # resumes as usual from here

  Onto a snapshot at the cut, a change is applied with Venice's conflict resolution (`leapfrog.repair.dcr_apply`),
  not by replacing the row: a write of the cut may follow a write above it in the VT (it beat it at the leader),
  and the stream rightly does not deliver it again. Each partition is read from the version's start and the records up to where the first change above the cut
  may lie are folded without delivering anything (`heartbeat.changes.from_cut`, the rule every reader shares);
  a state stored meanwhile resumes that fold. No Spark, no archive: only the region's cluster.
- **A state belongs to one region's VT.** It records the VT it was read from (per partition the first record after
  End of Push, `heartbeat.changes.LogId`) and, with `region=`, the region: resuming with another region's cluster
  (positions and W differ between regions) raises ChangeReaderError naming both before anything is delivered. A
  state written before format 2 has no identity: it resumes unchecked and records the log it resumes with.

Not thread-safe: one reader per thread. Internally it consumes in batches, feeds each partition's
`PartitionChanges`, and keeps with each buffered event the partition's state right after that event's record, so
`state()` never runs ahead of what `poll` returned.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from div import envelope as E
from div.kafka_log import (
    ClientErrors,
    KafkaLogError,
    bootstrap_of,
    consumer_config,
    is_secret,
    messages_to_batch,
    raise_on_fatal,
    scrub,
    split_messages,
    unreachable,
)

from .change_events import ChangeEvent, CutSeeker, PartitionChanges, Problem
from .changes import ChangeState, PartitionState, Verdict, cut_marks, cut_state, log_digest
from .cuts import Cut

log = logging.getLogger("tidegauge.heartbeat.changes")


class ChangeReaderError(KafkaLogError):
    """The version topic could not be found, reached or read; the message names the topic and the cluster."""


@dataclass(frozen=True)
class ChangeReaderStats:
    """What a reader did since it was made (versions it followed included).

    `delivered` counts the events `poll` returned (`bulk_load` of them from a version's bulk load, the initial
    snapshot). The rest counts records read from Kafka, whether or not their events have been returned yet:
    `duplicates_dropped` by cause (`below_record`: a change of its region at this RT position or later was read
    before; `below_heartbeat`: only a heartbeat's vector covered it), `bulk_skipped` (a followed version's bulk load),
    `reread` (records before a partition's position that Kafka gave again), `undecodable` (= len(problems)).
    `buffered`: events read but not returned yet (not in `state()`)."""

    delivered: int
    bulk_load: int
    duplicates_dropped: Mapping[str, int]
    bulk_skipped: int
    reread: int
    undecodable: int
    buffered: int
    problems: tuple[Problem, ...]

    def counts(self) -> dict[str, int]:
        """The numbers as one flat dict (`duplicates_dropped` is the total of its causes)."""
        return {
            "delivered": self.delivered,
            "bulk_load": self.bulk_load,
            "duplicates_dropped": sum(self.duplicates_dropped.values()),
            **{f"duplicates_{cause}": n for cause, n in self.duplicates_dropped.items()},
            "bulk_skipped": self.bulk_skipped,
            "reread": self.reread,
            "undecodable": self.undecodable,
            "buffered": self.buffered,
        }


def version_topic(store: str, version: int) -> str:
    """Venice's name of a store version's VT."""
    return f"{store}_v{version}"


class UnendedVersionError(ValueError):
    """A version swap asked of a state that has not read its version's end (the VersionSwap message) everywhere."""


def check_ended(state: ChangeState, version: int) -> None:
    """Refuse to follow `version` from `state` before the state has read its version's VersionSwap message in
    every partition it reads: until then the new version's bulk load, which a follower skips, may hold changes of
    the old version the reader has not been given (docs/design.md, "Change capture", the precondition)."""
    unended = state.unended()
    if unended:
        raise UnendedVersionError(
            f"version {state.version} of store {state.store!r} has not ended in partition(s) "
            f"{', '.join(map(str, unended))} of this state (their VersionSwap message is not read yet): following "
            f"version {version} now could lose changes of version {state.version}. Read version {state.version} on "
            "until its VersionSwap in every partition, then follow; a store whose versions end without a "
            "VersionSwap message can be followed anyway (`unended_ok=True`; `tidegauge changes --follow-unended`)"
        )


def initial_state(
    store: str,
    version: int,
    state: bytes | ChangeState | None,
    n_regions: int | None,
    unended_ok: bool = False,
    cut: Cut | None = None,
) -> ChangeState:
    """The state a reader of `store` version `version` starts from: fresh (needs `n_regions`), resumed (a state of
    `version`) or followed from the version before (a state of `version - 1`: a version swap, refused with
    UnendedVersionError unless the state has read that version's end, or `unended_ok`), or at a consistent cut
    (`cut`, of this store and version: every partition it names at `heartbeat.changes.cut_state`). Raises
    ValueError (StateError for damaged bytes) naming both sides of a mismatch."""
    if cut is not None:
        if state is not None:
            raise ValueError(
                "a reader starts from a state or from a cut, not both (a state resumes on its own)"
            )
        if (cut.store, cut.version) != (store, version):
            raise ValueError(
                f"the cut is of store {cut.store!r} version {cut.version}, not of store {store!r} version {version}"
            )
        n = int(n_regions) if n_regions is not None else cut.n_regions
        if n < 1:
            raise ValueError("the cut names no region: give n_regions")
        return ChangeState(
            store, version, n, {p: cut_state(cut_marks(cut.vector(p), n), n) for p in cut.partitions}
        )
    if state is None:
        if n_regions is None:
            raise ValueError(
                "a reader without a state needs n_regions (the store's region count: the width of its marks)"
            )
        return ChangeState(store, version, int(n_regions))
    if isinstance(state, (bytes, bytearray, memoryview)):
        state = ChangeState.from_bytes(bytes(state))
    elif not isinstance(state, ChangeState):
        raise TypeError(f"state must be bytes from state() or a ChangeState, not {type(state).__name__}")
    if n_regions is not None and int(n_regions) != state.n_regions:
        raise ValueError(f"n_regions {n_regions} differs from the state's {state.n_regions} regions")
    if state.store != store:
        raise ValueError(f"the state is of store {state.store!r}, not of store {store!r}")
    if state.version == version:
        return state
    if state.version == version - 1:
        if not unended_ok:
            check_ended(state, version)
        return state.follow(version)
    raise ValueError(
        f"the state is of version {state.version} of store {store!r}: a reader of version {version} takes a state "
        f"of version {version} (to resume) or {version - 1} (a version swap)"
    )


class ChangeReader:
    """Change events of store `store`, version `version`, from one region's cluster (`config`), each change once.

    `partitions`: the VT partitions to read (default: all of the topic's). `state`: bytes from `state()` (or a
    `ChangeState`) to resume from; of version `version - 1` it is a version swap. `n_regions`: the store's region
    count, needed without a state (with one it must agree). `batch_size`: records asked of Kafka at once.
    `timeout_s`: how long metadata requests may take. See the module docstring for the contract."""

    def __init__(
        self,
        store: str,
        version: int,
        config: Mapping[str, object],
        partitions: Iterable[int] | None = None,
        state: bytes | ChangeState | None = None,
        n_regions: int | None = None,
        *,
        batch_size: int = 1000,
        timeout_s: float = 10.0,
        unended_ok: bool = False,
        cut: Cut | None = None,
        region: int | None = None,
    ) -> None:
        if not store:
            raise ValueError("store must be a store name")
        if int(version) < 0:
            raise ValueError(f"version must not be negative, got {version}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        bootstrap = config.get("bootstrap.servers") if isinstance(config, Mapping) else None
        if not bootstrap:
            raise ValueError("config must hold the region cluster's bootstrap.servers")
        self.store = store
        self.version = int(version)
        self._base = initial_state(store, self.version, state, n_regions, unended_ok, cut)
        if region is not None:
            if self._base.region is not None and self._base.region != int(region):
                raise ValueError(
                    f"the state was written for region {self._base.region}'s version topic, not region {region}'s: "
                    "a state belongs to one region's VT"
                )
            self._base = self._base.with_region(int(region))
        self._cut = None if cut is None else {p: ps.marks for p, ps in self._base.partitions.items()}
        self._seekers: dict[int, CutSeeker] = {}
        self.n_regions = self._base.n_regions
        self.cluster = bootstrap_of(str(bootstrap))
        self._wanted = None if partitions is None else sorted({int(p) for p in partitions})
        if self._wanted is not None and any(p < 0 for p in self._wanted):
            raise ValueError(f"partitions must not be negative: {self._wanted}")
        self._batch_size = int(batch_size)
        self._timeout_s = float(timeout_s)
        self._codec = E.EnvelopeCodec()
        self._buffer: deque[tuple[ChangeEvent, PartitionState]] = deque()
        self._streams: dict[int, PartitionChanges] = {}
        self._committed: dict[int, PartitionState] = {}
        self._pending: dict[int, int] = {}
        self._at_end: dict[int, bool] = {}
        self._logged: dict[int, int] = {}  # problems already logged, per partition
        self._delivered = self._bulk_load = 0
        self._retired_counts: dict[Verdict, int] = {}
        self._retired_problems: list[Problem] = []
        self._retired_reread = 0
        self._consumer: Consumer | None = None
        try:
            settings = consumer_config(self.cluster, config)
            # the reader's own: it knows a partition's end from its EOF event, and the state is the caller's
            settings.update({"enable.partition.eof": True, "enable.auto.commit": False})
            # what librdkafka reports only through its error callback (a refused login or TLS handshake), for
            # the message of a cluster that cannot be read; a callback of the caller's own is kept
            self._errors = ClientErrors(config)
            settings.setdefault("error_cb", self._errors)
            self._consumer = Consumer(settings)
        except (KafkaException, ValueError, TypeError) as e:
            raise ChangeReaderError(
                f"cannot create a Kafka client for {self.cluster}: {scrub(str(e), config)}"
            ) from None
        self._scrub_config = {k: v for k, v in config.items() if is_secret(k)}
        self._config_shown = {k: v for k, v in config.items() if not callable(v)}
        try:
            self._assign(self._base)
        except BaseException:
            self.close()
            raise

    # -- reading ---------------------------------------------------------------------------------------------
    @property
    def topic(self) -> str:
        """The VT being read."""
        return version_topic(self.store, self.version)

    @property
    def partitions(self) -> list[int]:
        """The VT partitions being read."""
        return sorted(self._streams)

    def _where(self, topic: str | None = None) -> str:
        return f"version topic {topic or self.topic} on {self.cluster}"

    def _topic_partitions(self, topic: str) -> list[int]:
        t0 = time.monotonic()
        try:
            md = self._consumer.list_topics(topic, timeout=self._timeout_s)
        except KafkaException as e:
            if not self._streams:  # nothing assigned yet: serving the client's queue loses no record
                self._consumer.poll(0)
            raise ChangeReaderError(
                str(
                    unreachable(
                        f"cannot read the metadata of {self._where(topic)}",
                        self.cluster,
                        self._config_shown,
                        time.monotonic() - t0,
                        self._errors,
                        e,
                    )
                )
            ) from None
        tmd = md.topics.get(topic)
        if tmd is None or tmd.error is not None and tmd.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise ChangeReaderError(
                f"{self._where(topic)} does not exist (store {self.store!r}, version "
                f"{topic.rpartition('_v')[2]}): is the version pushed, and is this the region's cluster?"
            )
        if tmd.error is not None:
            raise ChangeReaderError(f"{self._where(topic)}: {tmd.error}")
        return sorted(tmd.partitions)

    def _assign(self, base: ChangeState) -> None:
        """Read `base`'s version from each partition's position. Checks everything before changing anything, so a
        failed `follow` leaves the reader on its version."""
        topic = version_topic(self.store, base.version)
        available = self._topic_partitions(topic)
        wanted = available if self._wanted is None else self._wanted
        missing = sorted(set(wanted) - set(available))
        if missing:
            raise ChangeReaderError(
                f"{self._where(topic)} has no partition {missing} (it has {len(available)} partitions)"
            )
        if self._cut is not None:
            uncut = sorted(set(wanted) - set(self._cut))
            if uncut:
                raise ChangeReaderError(
                    f"{self._where(topic)}: the cut has no partition {uncut} (it has {sorted(self._cut)})"
                )
        starts = {p: base.partition(p) for p in wanted}
        self._check_log(topic, starts)
        gaps: list[Problem] = []
        for p, ps in starts.items():
            try:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=self._timeout_s, cached=False
                )
            except KafkaException as e:
                raise ChangeReaderError(
                    f"cannot read the offsets of {self._where(topic)}, partition {p} (does the cluster answer? "
                    f"librdkafka says the partition is unknown when it does not): "
                    f"{scrub(str(e), self._scrub_config)}"
                ) from None
            if ps.position > high:
                raise ChangeReaderError(
                    f"{self._where(topic)}, partition {p} ends at offset {high}, before the state's position "
                    f"{ps.position}: the state is not of this topic (was the topic deleted and created again?)"
                )
            if ps.position < low:
                gaps.append(
                    Problem(
                        p,
                        ps.position,
                        f"offsets {ps.position}..{low - 1} are no longer in the topic (retention removed "
                        f"them before this reader read them): changes among them are lost to it",
                        topic,
                    )
                )
        self._consumer.assign([TopicPartition(topic, p, ps.position) for p, ps in starts.items()])
        self.version = base.version
        self._base = base
        self._streams = {p: PartitionChanges(p, ps, self._codec) for p, ps in starts.items()}
        self._seekers = (
            {}
            if self._cut is None
            else {p: CutSeeker(p, self._cut[p], self.n_regions, self._codec) for p in starts}
        )
        for g in gaps:
            self._streams[g.partition].problems.append(g)
        self._committed = dict(starts)
        self._pending = dict.fromkeys(starts, 0)
        self._at_end = dict.fromkeys(starts, False)
        self._logged = dict.fromkeys(starts, 0)
        self._buffer.clear()
        self._log_problems()

    def _check_log(self, topic: str, starts: Mapping[int, PartitionState]) -> None:
        """Refuse a state written for another VT: each partition's `LogId` record must be in this topic, unchanged
        (one record fetched per partition). A record no longer there (retention, compaction) cannot be checked:
        logged, and the reader goes on."""
        want = {p: ps.log_id for p, ps in starts.items() if ps.log_id is not None}
        if not want:
            return
        c = self._consumer
        c.assign([TopicPartition(topic, p, lid.offset) for p, lid in want.items()])
        found: dict[int, bytes | None] = {}
        deadline = time.monotonic() + self._timeout_s
        try:
            while len(found) < len(want) and time.monotonic() < deadline:
                for m in c.consume(len(want), 0.2):
                    p = m.partition()
                    if p not in want or p in found or m.topic() != topic:
                        continue
                    if m.error() is None:
                        found[p] = log_digest(m.key(), m.value()) if m.offset() == want[p].offset else None
                    elif m.error().code() == KafkaError._PARTITION_EOF:
                        found[p] = None
        finally:
            c.unassign()
        for p, lid in want.items():
            got = found.get(p)
            if got is None:
                log.warning(
                    "%s, partition %d: the state's log identity (the record at offset %d) cannot be checked: it is "
                    "not there (retention, compaction)",
                    self._where(topic),
                    p,
                    lid.offset,
                )
            elif got != lid.digest:
                said = f"region {self._base.region}'s" if self._base.region is not None else "another"
                raise ChangeReaderError(
                    f"{self._where(topic)}, partition {p}: the state was written for {said} version topic (its "
                    f"record at offset {lid.offset} was {lid.digest.hex()}, this topic holds {got.hex()} there): "
                    "a state belongs to one region's VT; give that region's cluster"
                )

    def _check_open(self) -> None:
        if self._consumer is None:
            raise RuntimeError("this ChangeReader is closed")

    def _consume(self, timeout: float) -> list[Message]:
        c = self._consumer
        msgs = c.consume(self._batch_size, 0)  # what is fetched already, without waiting
        if not msgs and timeout > 0:
            msgs = c.consume(1, timeout)  # wait for the first message only, then take what came with it
            if msgs and self._batch_size > 1:
                msgs.extend(c.consume(self._batch_size - 1, 0))
        return msgs

    def _fill(self, timeout: float) -> None:
        """Consume once (waiting up to `timeout` for a first message) and buffer the events it gives."""
        msgs = self._consume(timeout)
        if not msgs:
            return
        _, errors = split_messages(msgs)
        topic = self.topic
        by_partition: dict[int, list[Message]] = {}
        for m in msgs:  # in order: a partition is at its end when its EOF comes after its last data
            p = m.partition()
            if m.topic() != topic or p not in self._streams:
                continue  # fetched before an assignment changed
            if m.error() is None:
                by_partition.setdefault(p, []).append(m)
                self._at_end[p] = False
            elif m.error().code() == KafkaError._PARTITION_EOF:
                self._at_end[p] = True
        for p, part in by_partition.items():
            batches = [messages_to_batch(part)]
            seeker = self._seekers.get(p)
            if seeker is not None:  # from a cut: fold until the first change above it may come
                batches = seeker.feed(batches[0])
                if not seeker.found:
                    self._committed[p] = seeker.state()
                    continue
                del self._seekers[p]
                self._streams[p] = PartitionChanges(p, seeker.state(), self._codec)
            stream = self._streams[p]
            for batch in batches:
                for event in stream.iter_events(batch):
                    self._buffer.append((event, stream.state()))
                    self._pending[p] += 1
            if not self._pending[p]:
                self._committed[p] = stream.state()
        self._log_problems()
        if errors:  # after the data came with them is fed: the consumer has moved past it
            raise_on_fatal(errors, self._where())

    def _log_problems(self) -> None:
        for p, stream in self._streams.items():
            for pr in stream.problems[self._logged[p] :]:
                log.warning(
                    "%s, partition %d, offset %d: not delivered: %s", self._where(), p, pr.offset, pr.reason
                )
            self._logged[p] = len(stream.problems)

    def _poll(self, timeout: float, to_end: bool) -> ChangeEvent | None:
        self._check_open()
        if timeout < 0:
            raise ValueError(f"timeout must not be negative, got {timeout}")
        deadline = time.monotonic() + timeout
        while not self._buffer:
            if to_end and self.caught_up():
                return None
            left = deadline - time.monotonic()
            self._fill(max(0.0, min(left, 0.1) if to_end else left))
            if not self._buffer and time.monotonic() >= deadline:
                return None
        event, after = self._buffer.popleft()
        p = event.partition
        self._pending[p] -= 1
        # the state right after this event's record; once no event of p waits, after every record read of p
        self._committed[p] = after if self._pending[p] else self._streams[p].state()
        self._delivered += 1
        self._bulk_load += event.upstream_region is None
        return event

    def poll(self, timeout: float = 1.0) -> ChangeEvent | None:
        """The next change, or None when none came within `timeout` seconds."""
        return self._poll(float(timeout), False)

    def events(self, timeout: float = 1.0, *, to_end: bool = False) -> Iterator[ChangeEvent]:
        """The changes, until none comes within `timeout` seconds; with `to_end`, also stop as soon as every
        partition has been read to its end (`caught_up`)."""
        while True:
            event = self._poll(float(timeout), to_end)
            if event is None:
                return
            yield event

    def __iter__(self) -> Iterator[ChangeEvent]:
        """The changes, forever (waiting for more when there are none): `for change in reader: ...`."""
        while True:
            event = self._poll(1.0, False)
            if event is not None:
                yield event

    def caught_up(self) -> bool:
        """Every partition has been read to its end (as far as Kafka said last) and every event returned."""
        return not self._buffer and all(self._at_end.values())

    # -- state -----------------------------------------------------------------------------------------------
    def change_state(self) -> ChangeState:
        """The state covering exactly the events `poll` returned (as an object; `state()` gives its bytes)."""
        return self._base.replace(self._committed)

    def state(self) -> bytes:
        """The bytes to store: resuming from them (`ChangeReader(..., state=...)`) delivers every change after the
        last one `poll` returned, once. Events read from Kafka but not returned yet are not covered."""
        return self.change_state().to_bytes()

    def version_ended(self) -> bool:
        """Every partition read has reached its version's end (its VersionSwap message) and every event before it
        was returned: the moment to `follow` the next version."""
        return not self._buffer and bool(self._committed) and all(ps.ended for ps in self._committed.values())

    def follow(self, version: int, unended_ok: bool = False) -> None:
        """Swap to `version` (newer than the one read): read `<store>_v<version>` with the marks of `state()`, its
        bulk load skipped and the changes already delivered dropped. Events read but not returned yet are dropped:
        the reader is where a reader restarted from `state()` with `version` would be. Raises UnendedVersionError
        before `version_ended()` (unless `unended_ok`: a store whose versions end without a VersionSwap message),
        and ChangeReaderError when the new topic cannot be read; either way it stays on its version."""
        self._check_open()
        version = int(version)
        if version <= self.version:
            raise ValueError(
                f"cannot follow version {version} of store {self.store!r} from version {self.version}: "
                f"it is not newer"
            )
        current = self.change_state()
        if not unended_ok:
            check_ended(current, version)
        followed = current.follow(version)
        retiring = self._streams
        cut, self._cut = (
            self._cut,
            None,
        )  # a followed version is read from the state's marks, not from the cut
        try:
            self._assign(followed)  # raises before changing anything
        except BaseException:
            self._cut = cut
            raise
        for stream in retiring.values():
            for v, n in stream.counts.items():
                self._retired_counts[v] = self._retired_counts.get(v, 0) + n
            self._retired_problems.extend(stream.problems)
            self._retired_reread += stream.already_read

    # -- what happened ---------------------------------------------------------------------------------------
    def stats(self) -> ChangeReaderStats:
        verdicts = dict(self._retired_counts)
        problems = list(self._retired_problems)
        reread = self._retired_reread
        for stream in self._streams.values():
            for v, n in stream.counts.items():
                verdicts[v] = verdicts.get(v, 0) + n
            problems.extend(stream.problems)
            reread += stream.already_read
        return ChangeReaderStats(
            delivered=self._delivered,
            bulk_load=self._bulk_load,
            duplicates_dropped={
                "below_record": verdicts.get(Verdict.BELOW_RECORD, 0),
                "below_heartbeat": verdicts.get(Verdict.BELOW_HEARTBEAT, 0),
            },
            bulk_skipped=verdicts.get(Verdict.BULK_SKIPPED, 0),
            reread=reread,
            undecodable=len(problems),
            buffered=len(self._buffer),
            problems=tuple(problems),
        )

    def counts(self) -> dict[str, int]:
        """`stats()` as a flat dict of numbers: delivered, bulk_load, duplicates_dropped (and by cause:
        duplicates_below_record, duplicates_below_heartbeat), bulk_skipped, reread, undecodable, buffered."""
        return self.stats().counts()

    # -- resources -------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Leave Kafka (nothing is committed there: the state is the caller's). `state()` still answers."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def __enter__(self) -> ChangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ChangeReader", "ChangeReaderError", "ChangeReaderStats", "initial_state", "version_topic"]
