"""Reading a live Kafka cluster as Arrow batches in the archive schema.

Jobs read either an archive or a cluster and must give the same answer for the same records, so this module
returns exactly what `div.archive` stores: raw key/value bytes, headers, offsets, and timestamps converted
from Kafka's milliseconds to the archive's microseconds. Reads are bounded by an end offset the caller fixes
up front (a nightly job must not chase a growing topic), use assign + seek (no consumer-group membership, no
commits), and tolerate offsets missing from compacted topics.

Client settings the caller passes (security.protocol, sasl.*, ssl.*, ...) go to librdkafka untouched and are
never logged or put into error messages: they may hold credentials.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from div.archive import KAFKA_ARROW_SCHEMA, bounded_batches, empty_batch

log = logging.getLogger(__name__)

_HEADERS_TYPE = KAFKA_ARROW_SCHEMA.field("headers").type
_TS_TYPE = KAFKA_ARROW_SCHEMA.field("timestamp").type
# Message.timestamp() types are librdkafka's (0 none, 1 CreateTime, 2 LogAppendTime); Spark's Kafka source
# uses Kafka's own ids (-1 none, 0 CreateTime, 1 LogAppendTime): subtract one.
_TS_TYPE_SHIFT = 1


class KafkaLogError(Exception):
    """A Kafka source could not be parsed, reached or read."""


class RangeTrimmedError(KafkaLogError):
    """A range read with `from_start=True` no longer starts where it was planned: retention (or DeleteRecords)
    removed its first offsets between planning and reading, so what was read would silently be short."""


def parse_kafka_uri(uri: str) -> str:
    """`kafka://host:port[,host:port...]` -> the bootstrap.servers string `host:port,...`."""
    if not isinstance(uri, str) or not uri.startswith("kafka://"):
        raise KafkaLogError(f"not a Kafka source URI (expected kafka://host:port[,host:port...]): {uri!r}")
    rest = uri[len("kafka://") :].rstrip("/")
    servers = [s.strip() for s in rest.split(",")]
    if not rest or any(not s for s in servers):
        raise KafkaLogError(f"Kafka source URI names no broker: {uri!r}")
    for s in servers:
        parsed = urlsplit("//" + s)
        try:
            port = parsed.port
        except ValueError:
            port = None
        if not parsed.hostname or port is None or parsed.path or parsed.query or "@" in s:
            raise KafkaLogError(f"Kafka source URI {uri!r}: {s!r} is not host:port")
    return ",".join(servers)


def bootstrap_of(source: str) -> str:
    """Accept either a kafka:// URI or a bare bootstrap.servers string."""
    return parse_kafka_uri(source) if source.startswith("kafka://") else source


class _OncePerKind(logging.Filter):
    """Pass a librdkafka log line only the first time its kind is seen in `every_s` seconds.

    An unreachable broker makes librdkafka log the same refusal every few milliseconds (about 190 lines before a
    job gives up); one line per distinct error says as much. Kinds ignore numbers (times, counters, ports of the
    same broker are kept by the text around them)."""

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        import re
        import time

        # "(after 0ms in state CONNECT, 1 identical error(s) suppressed)": librdkafka's own tally, not a new kind
        kind = re.sub(r"\d+(ms)?\b", "#", re.sub(r"\s*\(after [^)]*\)?[^(]*$", "", record.getMessage()))
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.every_s:
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[kind] = now
        return True


class _RetriedFailures(logging.Filter):
    """librdkafka's FAIL lines (a connection or a request that failed, which it retries by itself) as DEBUG: a job
    that gives up says so in its own error line, with librdkafka's reason (`ClientErrors`), so they are for
    --verbose. They reach Python only when a client is polled, as a metadata wait does to serve the error callback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and record.getMessage().startswith("FAIL "):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def client_logger() -> logging.Logger:
    """The logger librdkafka's own lines go to (through Python logging, rate-limited), instead of stderr."""
    logger = logging.getLogger("tidegauge.kafka.client")
    if not any(isinstance(f, _RetriedFailures) for f in logger.filters):
        logger.addFilter(_RetriedFailures())
    if not any(isinstance(f, _OncePerKind) for f in logger.filters):
        logger.addFilter(_OncePerKind())
    return logger


def consumer_config(bootstrap: str, conf: Mapping[str, object] | None = None) -> dict[str, object]:
    """Settings for a reading consumer: the caller's `conf` wins over our defaults, except bootstrap.servers."""
    base: dict[str, object] = {
        # Required by librdkafka even without group membership; we never subscribe nor commit.
        "group.id": "tidegauge-reader",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 10,
        "queued.min.messages": 200000,
        "logger": client_logger(),
    }
    base.update(dict(conf or {}))
    base["bootstrap.servers"] = bootstrap_of(bootstrap)
    return base


# -- why a cluster cannot be read ---------------------------------------------------------------------------
# librdkafka reports a refused login or TLS handshake only through its error callback; the call that then times
# out says "Broker transport failure", and a user would look for a network fault. `ClientErrors` keeps what the
# callback said, so the message can say what happened and which settings to check.

# Settings whose values may hold a credential: never shown, only whether they are set.
SECRET_WORDS = ("password", "secret", "token", "key", "oauthbearer.config", "jaas")
# Settings a user checks when a cluster cannot be reached, shown with their values (file paths, names).
_SHOWN_SETTINGS = (
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.keystore.location",
    "ssl.endpoint.identification.algorithm",
)
_AUTH_CODES = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}


def is_secret(name: str) -> bool:
    """Whether a librdkafka setting's value may hold a credential (its name says password, key, token, ...)."""
    lowered = str(name).lower()
    return lowered not in _SHOWN_SETTINGS and any(w in lowered for w in SECRET_WORDS)


def scrub(text: str, conf: Mapping[str, object] | None) -> str:
    """`text` without the value of any setting of `conf` that may hold a credential."""
    for name, value in (conf or {}).items():
        if is_secret(name) and value is not None and str(value):
            text = text.replace(str(value), "***")
    return text


def settings_to_check(conf: Mapping[str, object] | None) -> str:
    """The client settings that decide whether a cluster can be reached, as `name=value` (secrets as `set`)."""
    conf = {str(k).lower(): v for k, v in (conf or {}).items()}
    shown = [f"security.protocol={conf.get('security.protocol', 'plaintext (not set)')}"]
    shown += [f"{k}={conf[k]}" for k in _SHOWN_SETTINGS[1:] if k in conf]
    shown += [f"{k} set" for k in sorted(conf) if is_secret(k) and conf[k] not in (None, "")]
    return ", ".join(shown)


class ClientErrors:
    """librdkafka's `error_cb`: keeps the errors a client reported (each also logged, rate-limited, as librdkafka
    logs them without a callback), so a failure can name its cause. `conf` is what the client was given: its
    secret values are scrubbed from what is kept."""

    def __init__(self, conf: Mapping[str, object] | None = None) -> None:
        self._conf = dict(conf or {})
        self.errors: list[tuple[int, str]] = []

    def __call__(self, err: KafkaError) -> None:
        text = scrub(err.str(), self._conf)
        if len(self.errors) < 100:
            self.errors.append((err.code(), text))
        # librdkafka logs the failure itself (its FAIL line, through `client_logger`): kept for debugging only
        client_logger().debug("%s", text)

    def refused(self) -> str | None:
        """The cluster's refusal, when there was one: a failed login or TLS handshake (it will not heal by
        waiting), as one phrase; None otherwise."""
        for code, text in reversed(self.errors):
            if code in _AUTH_CODES:
                return f"authentication failed ({text})"
        for code, text in reversed(self.errors):
            if code == KafkaError._SSL or "SSL handshake" in text or "certificate verify failed" in text:
                return f"the TLS handshake failed: the client refused the broker's certificate ({text})"
            if "SSL routines" in text and "alert" in text:
                # the broker's TLS alert: it refused this client's certificate (expired, unknown CA, none sent)
                return f"the TLS handshake failed: the broker refused the client's certificate ({text})"
        return None

    def cause(self) -> str | None:
        """What librdkafka reported last (the refusal first), or None when it said nothing."""
        refused = self.refused()
        if refused:
            return refused
        # "1/1 brokers are down" follows the error that says why
        said = [text for code, text in self.errors if code != KafkaError._ALL_BROKERS_DOWN]
        if said:
            return said[-1]
        return self.errors[-1][1] if self.errors else None


def unreachable(
    what: str,
    bootstrap: str,
    conf: Mapping[str, object] | None,
    waited_s: float,
    errors: ClientErrors,
    e=None,
) -> KafkaLogError:
    """The error of a cluster that could not be read: what was asked, the cause librdkafka reported (the refused
    login or handshake rather than the transport failure it ends in), the time waited and what to check."""
    cause = errors.cause() or (scrub(str(e), conf) if e is not None else "no answer")
    refused = errors.refused() is not None
    hint = (
        "check the credentials and certificates these settings name"
        if refused
        else "check that a broker listens at that address and that these settings match its listener"
    )
    return KafkaLogError(
        f"{what}: {cause}; waited {waited_s:.1f} s for {bootstrap}. {hint[0].upper()}{hint[1:]}: "
        f"{settings_to_check(conf)}"
    )


class KafkaLog:
    """Metadata of one cluster: topics, partitions, watermarks. Holds one consumer; close() it (or use `with`)."""

    def __init__(
        self, bootstrap: str, conf: Mapping[str, object] | None = None, timeout_s: float = 10.0
    ) -> None:
        self.bootstrap = bootstrap_of(bootstrap)
        self.timeout_s = timeout_s
        self._conf = dict(conf or {})
        self.errors = ClientErrors(self._conf)
        try:
            self._consumer = Consumer({**consumer_config(self.bootstrap, conf), "error_cb": self.errors})
        except (KafkaException, ValueError) as e:
            raise KafkaLogError(
                f"cannot create a Kafka client for {self.bootstrap}: {scrub(str(e), self._conf)}"
            ) from e

    def __enter__(self) -> KafkaLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _metadata(self, topic: str | None = None):
        """The cluster's metadata, asked in short rounds: between them the error callback is served, so a refused
        login or TLS handshake ends the wait at once instead of after `timeout_s`."""
        t0 = time.monotonic()
        while True:
            left = self.timeout_s - (time.monotonic() - t0)
            try:
                return self._consumer.list_topics(topic, timeout=max(0.05, min(1.0, left)))
            except KafkaException as e:
                self._consumer.poll(0)  # serves the error callback
                if left <= 1.0 or self.errors.refused() is not None:
                    raise self._unreachable(f"cannot read metadata from {self.bootstrap}", t0, e) from None

    def _unreachable(self, what: str, t0: float, e: BaseException | None = None) -> KafkaLogError:
        return unreachable(what, self.bootstrap, self._conf, time.monotonic() - t0, self.errors, e)

    def topics(self, include_internal: bool = False) -> list[str]:
        """Topic names, sorted; Kafka's internal `__*` topics only if asked."""
        names = self._metadata().topics.keys()
        return sorted(n for n in names if include_internal or not n.startswith("__"))

    def partitions(self, topic: str) -> list[int]:
        md = self._metadata(topic).topics.get(topic)
        if md is None or md.error is not None and md.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise KafkaLogError(f"topic {topic!r} does not exist on {self.bootstrap}")
        if md.error is not None and md.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise KafkaLogError(
                f"topic {topic!r} on {self.bootstrap}: not authorized ({md.error.str()}): the principal these "
                f"settings name needs Describe and Read ACLs on it: {settings_to_check(self._conf)}"
            )
        if md.error is not None:
            raise KafkaLogError(f"topic {topic!r} on {self.bootstrap}: {md.error}")
        self._check_readable(topic)
        return sorted(md.partitions)

    def _check_readable(self, topic: str) -> None:
        """Raise when the cluster says the principal may not Read `topic`. A principal with Describe but no Read
        sees the topic, its partitions and offsets; only the fetch would fail, on an executor, partition by
        partition, where it would read as a partial run instead of a setting to fix. Asked only of a client that
        authenticates (security.protocol other than plaintext: ACLs name principals); silent when the cluster
        cannot say (no authorizer, an older broker)."""
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import AclOperation

        protocol = str(
            {str(k).lower(): v for k, v in self._conf.items()}.get("security.protocol", "plaintext")
        )
        if protocol.lower() == "plaintext":
            return
        try:
            admin = AdminClient(
                {"logger": client_logger(), **self._conf, "bootstrap.servers": self.bootstrap}
            )
            fut = admin.describe_topics(
                TopicCollection([topic]), request_timeout=self.timeout_s, include_authorized_operations=True
            )[topic]
            ops = fut.result(timeout=self.timeout_s + 1.0).authorized_operations
        except Exception as e:  # noqa: BLE001 - the cluster cannot say: the read will
            log.debug("cannot describe topic %s on %s: %s", topic, self.bootstrap, type(e).__name__)
            return
        if ops and AclOperation.READ not in ops and AclOperation.ALL not in ops:
            raise KafkaLogError(
                f"topic {topic!r} on {self.bootstrap}: not authorized to read it (the cluster allows this "
                f"principal only {', '.join(sorted(op.name for op in ops))}): the principal these settings name "
                f"needs a Read ACL on it: {settings_to_check(self._conf)}"
            )

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """(low, high): the first offset still stored and the offset the next record will get."""
        t0 = time.monotonic()
        try:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, int(partition)), timeout=self.timeout_s, cached=False
            )
        except KafkaException as e:
            self._consumer.poll(0)  # serves the error callback
            raise self._unreachable(f"cannot read watermarks of {topic}[{partition}]", t0, e) from None
        return int(low), int(high)

    def offset_for_time(self, topic: str, partition: int, ms: int) -> int:
        """The first offset whose timestamp is >= `ms` (the broker's time index: exact where the topic's
        timestamps are LogAppendTime), or the end offset when no record is that late."""
        t0 = time.monotonic()
        try:
            (tp,) = self._consumer.offsets_for_times(
                [TopicPartition(topic, int(partition), int(ms))], timeout=self.timeout_s
            )
        except KafkaException as e:
            self._consumer.poll(0)  # serves the error callback
            raise self._unreachable(f"cannot look up times in {topic}[{partition}]", t0, e) from None
        if tp.error is not None:
            raise KafkaLogError(
                f"cannot look up times in {topic}[{partition}] on {self.bootstrap}: {tp.error}"
            )
        return int(tp.offset) if tp.offset >= 0 else self.watermarks(topic, partition)[1]


def list_topics(
    bootstrap: str, conf: Mapping[str, object] | None = None, include_internal: bool = False
) -> list[str]:
    with KafkaLog(bootstrap, conf) as kl:
        return kl.topics(include_internal=include_internal)


def messages_to_batch(msgs: list[Message]) -> pa.RecordBatch:
    """Data messages (no error events) -> one RecordBatch in the archive schema, built column by column."""
    if not msgs:
        return empty_batch()
    ts = np.array([m.timestamp() for m in msgs], dtype=np.int64).reshape(len(msgs), 2)
    arrays = [
        pa.array([m.key() for m in msgs], pa.binary()),
        pa.array([m.value() for m in msgs], pa.binary()),
        pa.array([m.topic() for m in msgs], pa.string()),
        pa.array([m.partition() for m in msgs], pa.int32()),
        pa.array([m.offset() for m in msgs], pa.int64()),
        pa.array(ts[:, 1] * 1000, _TS_TYPE),
        pa.array(ts[:, 0] - _TS_TYPE_SHIFT, pa.int32()),
        pa.array([m.headers() for m in msgs], _HEADERS_TYPE),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=KAFKA_ARROW_SCHEMA)


def split_messages(msgs: list[Message]) -> tuple[list[Message], list[Message]]:
    """(data messages, error/event messages) from one consume() call."""
    errors = [m.error() for m in msgs]
    if not any(errors):
        return msgs, []
    data = [m for m, e in zip(msgs, errors, strict=True) if e is None]
    events = [m for m, e in zip(msgs, errors, strict=True) if e is not None]
    return data, events


def raise_on_fatal(events: list[Message], where: str, conf: Mapping[str, object] | None = None) -> None:
    """Partition EOF and transient errors are expected; anything librdkafka marks fatal or non-retriable is not.
    A topic the principal may not read says which settings name the principal."""
    for m in events:
        err = m.error()
        if err.code() == KafkaError._PARTITION_EOF:
            continue
        if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            # librdkafka's consumer must have a group.id and looks for its coordinator even when, as here, it only
            # assigns and never commits; a principal allowed to read the topics and nothing else (no group ACL)
            # is refused that lookup, which costs the read nothing
            log.debug("%s: %s (no group is used: ignored)", where, err)
            continue
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise KafkaLogError(
                f"{where}: not authorized to read the topic ({err.str()}): the principal these settings name "
                f"needs Read and Describe ACLs on it: {settings_to_check(conf)}"
            )
        if err.fatal() or (not err.retriable() and err.code() not in _TRANSIENT):
            raise KafkaLogError(f"{where}: {scrub(str(err), conf)}")
        log.warning("%s: %s (retrying)", where, err)


_TRANSIENT = {
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError._MSG_TIMED_OUT,
    KafkaError._RESOLVE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.REQUEST_TIMED_OUT,
}


def iter_partition(
    bootstrap: str,
    conf: Mapping[str, object] | None,
    topic: str,
    partition: int,
    start: int,
    end: int,
    batch_size: int = 65536,
    stall_timeout_s: float = 60.0,
    from_start: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Yield records of `topic[partition]` with offsets in [start, end) as archive-schema batches (at most
    `batch_size` records and `archive.MAX_BATCH_BYTES` bytes each).

    `end` is fixed by the caller (usually the high watermark when the job was planned): records appended later
    are not read. Offsets missing inside the range (compaction, transaction markers) are skipped; a `start`
    below the low watermark starts at the low watermark (auto.offset.reset=earliest), unless `from_start`:
    then RangeTrimmedError is raised, because a caller that planned the range from the watermarks must not take
    a range that retention cut after planning for a whole one. (Compaction never moves the low watermark, so a
    compacted head is still read.) If the log ends below `end` and nothing new arrives for `stall_timeout_s`,
    KafkaLogError is raised.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    start = max(int(start), 0) if start is not None and start >= 0 else None
    if start is not None and start >= end:
        return
    where = f"{topic}[{partition}] on {bootstrap_of(bootstrap)}"
    strict = from_start and start is not None
    errors = ClientErrors(conf)
    settings = {**consumer_config(bootstrap, conf), "error_cb": errors}
    if strict:  # librdkafka reports an out-of-range start as an error event instead of moving it
        settings["auto.offset.reset"] = "error"
    try:
        consumer = Consumer(settings)
    except (KafkaException, ValueError) as e:
        raise KafkaLogError(
            f"cannot create a Kafka client for {bootstrap_of(bootstrap)}: {scrub(str(e), conf)}"
        ) from e
    t0 = time.monotonic()
    try:
        consumer.assign([TopicPartition(topic, int(partition), OFFSET_BEGINNING if start is None else start)])
        next_offset = -1 if start is None else start
        last_progress = time.monotonic()
        while True:
            # Ask for no more than the range still holds: consume() waits until it has that many messages or
            # times out, so over-asking would stall on the last batch.
            want = batch_size if next_offset < 0 else max(1, min(batch_size, end - next_offset))
            msgs = consumer.consume(want, timeout=0.5)
            data, events = split_messages(msgs)
            if strict and any(m.error().code() == KafkaError._AUTO_OFFSET_RESET for m in events):
                raise _trimmed(consumer, topic, int(partition), start, end, where)
            raise_on_fatal(events, where, conf)
            if errors.refused() is not None:
                raise unreachable(
                    f"cannot read {where}", bootstrap_of(bootstrap), conf, time.monotonic() - t0, errors
                )
            done = False
            if data:
                last_progress = time.monotonic()
                offsets = [m.offset() for m in data]
                if offsets[-1] >= end:
                    cut = int(np.searchsorted(np.asarray(offsets), end))
                    data = data[:cut]
                    done = True
                if data:
                    next_offset = data[-1].offset() + 1
                    yield from bounded_batches(messages_to_batch(data), batch_size)
                if next_offset >= end:
                    done = True
            for m in events:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    if m.offset() >= end:
                        done = True
                    elif m.offset() > next_offset:
                        # Compacted away or never written: nothing to read up to the log end.
                        next_offset = m.offset()
            if done:
                return
            if time.monotonic() - last_progress > stall_timeout_s:
                said = errors.cause()
                raise KafkaLogError(
                    f"{where}: no records for {stall_timeout_s:.0f} s at offset {next_offset}, "
                    f"before the requested end offset {end}"
                    + (f" (librdkafka: {said}; settings: {settings_to_check(conf)})" if said else "")
                )
    finally:
        consumer.close()


def _trimmed(
    consumer: Consumer, topic: str, partition: int, start: int, end: int, where: str
) -> RangeTrimmedError:
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=5.0, cached=False
        )
        held = f"the partition now holds offsets {low} to {high - 1}"
    except KafkaException as e:
        held = f"the partition's watermarks cannot be read ({e})"
    return RangeTrimmedError(
        f"{where}: offsets {start} to {end - 1} were planned but offset {start} is no longer held "
        f"(retention or DeleteRecords removed it before it was read); {held}"
    )


def topic_config(
    bootstrap: str, conf: Mapping[str, object] | None, topic: str, name: str, timeout_s: float = 3.0
) -> str | None:
    """A topic's configuration value (e.g. `cleanup.policy`), or None when the cluster cannot tell us
    (librdkafka's mock cluster does not implement DescribeConfigs)."""
    admin_conf = {"logger": client_logger(), **dict(conf or {})}
    admin_conf["bootstrap.servers"] = bootstrap_of(bootstrap)
    try:
        admin = AdminClient(admin_conf)
        futures = admin.describe_configs(
            [ConfigResource(ConfigResource.Type.TOPIC, topic)], request_timeout=timeout_s
        )
        for fut in futures.values():
            entries = fut.result(timeout=timeout_s + 1.0)
            entry = entries.get(name)
            return None if entry is None else entry.value
    except Exception as e:  # noqa: BLE001 - any failure means "unknown", which callers must handle anyway
        log.info("cannot describe topic %s on %s: %s", topic, bootstrap_of(bootstrap), type(e).__name__)
    return None


def compaction(bootstrap: str, conf: Mapping[str, object] | None, topic: str) -> tuple[bool | None, int]:
    """(whether the topic is compacted, its min.compaction.lag.ms): (None, 0) when the cluster cannot say; the lag
    is Kafka's default 0 when a compacted topic does not set it."""
    policy = topic_config(bootstrap, conf, topic, "cleanup.policy")
    if policy is None or "compact" not in policy:
        return (None if policy is None else False), 0
    lag = topic_config(bootstrap, conf, topic, "min.compaction.lag.ms")
    return True, int(lag) if lag is not None else 0
