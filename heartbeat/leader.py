"""`HeartbeatLeader`: what a partition leader written in Python calls to write its VT and correct heartbeats.

A leader (one per region and partition) consumes RT partition p of every region, resolves conflicts, and writes
its local VT partition p. This class owns the parts that must be right for readers to trust heartbeats:

* the leader's VT producer DIV (a fresh GUID per term, Venice segments and checksums, leader footers pointing
  at the RT record each VT record came from);
* RT DIV of every region (a validator per region; findings are handed to the caller);
* acknowledgement tracking (`WatermarkTracker`): which RT offsets are fully reflected in the VT;
* RT heartbeats to the local RT every `interval_ms`, and a VT heartbeat for every RT heartbeat consumed, carrying
  `hbw` (the acknowledged watermark vector) and `hbd` (VT and RT DIV state).

The VT heartbeat rule (docs/design.md, rule 3): the VT heartbeat H for the RT heartbeat at offset o of region r is
produced only once every VT send caused by RT[r] records before o is acknowledged. H then carries the
tracker's watermarks at that moment (V[r] ≥ o), the VT DIV state of every VT producer as a follower holds it
just before H (this writer's segments when H is enqueued, plus the producers inherited at takeover), and each
region's RT DIV state at V[region]. Sends are acknowledged before H is produced, so they precede H in the VT;
sends of records beyond V are never claimed. Faults only delay heartbeats: a broker outage holds acks back,
and H waits. A send that fails for good breaks the leader (`LeaderBrokenError` from then on): it must not
claim anything past the failure, and must be restarted with a new term (term_id + 1, fresh GUID) from the last
VT heartbeat. A heartbeat that fails to send is only counted and logged (it claims nothing; the next one claims
at least as much), as are failed RT heartbeats (Venice only logs those too).

Records are Venice's byte for byte: data records carry termId -1 in their footer as Venice writes them; the
term lives in `hbw.termId` and in the fresh GUID of each term.

The Kafka producer should keep per-partition order across retries: when this class builds the producer from a
configuration dict it sets `enable.idempotence=true` (the caller's settings win).

`hbd` size policy: when the encoded `hbd` would exceed `hbd_max_bytes`, the producers whose last
messageTimestamp is oldest are left out first (VT and RT maps together) until it fits, and `truncated` is set;
a reader must then treat the state as incomplete. The whole heartbeat is about `hbd` + 17 KB (Venice's `vtp`
header) + the `hbw` vector: keep `hbd_max_bytes` below the topic's max.message.bytes minus that (the default,
900 000, fits Kafka's default 1 048 588).
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from div import checksum as cks
from div import envelope as E
from div import keys
from div.heartbeat_headers import DivState, Watermarks, encode_hbd, encode_hbw, producer_state_schema
from div.records import Kind, decode_record, message_type
from div.validator import (
    END_OF_FINAL_SEGMENT,
    END_OF_INTERMEDIATE_SEGMENT,
    IN_PROGRESS,
    UNDECODABLE,
    Finding,
    PartitionValidator,
    ValidatorConfig,
)
from div.writer import OutRecord, SegmentWriter, random_guid

from .records import rt_heartbeat, vt_heartbeat, vt_heartbeat_timestamp
from .watermarks import WatermarkTracker

log = logging.getLogger("tidegauge.heartbeat")

# RtRecord.kind is the name of a div.records.Kind (a string, as callers compare it with "PUT", "DELETE", ...)
DATA_KINDS = frozenset({Kind.PUT.name, Kind.DELETE.name, Kind.UPDATE.name})
DEFAULT_HBD_MAX_BYTES = 900_000


class LeaderBrokenError(RuntimeError):
    """A VT send failed for good: this leader may claim nothing more. Restart it with a new term."""


class LeaderUsageError(RuntimeError):
    """The calls came in an order the leader cannot honour (the message says which call was expected)."""


@dataclass(frozen=True, slots=True)
class RtRecord:
    """One consumed RT record as the leader saw it.

    `kind`, the name of a `div.records.Kind`: PUT, DELETE, UPDATE, CONTROL (a producer's SOS/EOS/...: nothing to
    write), HEARTBEAT (handled by the library: do nothing) or UNDECODABLE (not a Venice record: nothing to write).
    A record other than a heartbeat is named by its envelope's type (`div.records.message_type`): what the leader
    forwards is a Put, Delete or Update, chunked or not. `key` is the key content (without Venice's header byte);
    `env` the decoded envelope; `findings` the RT DIV findings of the record (Venice drops DUPLICATEs; after EOP
    the other kinds are warnings).
    """

    region: int
    offset: int
    kind: str
    key: bytes | None
    env: dict | None
    findings: list[Finding]
    broker_ts_ms: int | None
    error: str | None = None

    @property
    def is_heartbeat(self) -> bool:
        return self.kind == Kind.HEARTBEAT.name

    @property
    def is_data(self) -> bool:
        return self.kind in DATA_KINDS

    @property
    def is_duplicate(self) -> bool:
        return any(f.type == "DUPLICATE" for f in self.findings)


@dataclass
class LeaderStats:
    """What one leader did in its term, counted once: `heartbeat.metrics.LeaderMetrics` shows these same numbers
    to Prometheus.

    `rt_records`: RT records handed over (heartbeats included); `vt_sends`/`vt_acked`/`vt_failed`: VT records
    produced for them (control records of the writer's segments included) and their delivery reports;
    `vt_heartbeats*`/`rt_heartbeats*`: heartbeats produced, acknowledged and failed; `hbd_truncated`: VT
    heartbeats whose `hbd` was cut to fit. `watermark_advanced_ms[r]`: the leader's clock when region r's
    acknowledged watermark last moved, as `poll()`/`flush()` saw it (the term's start counts as a move).
    """

    rt_records: int = 0
    vt_sends: int = 0
    vt_acked: int = 0
    vt_failed: int = 0
    vt_heartbeats: int = 0
    vt_heartbeats_acked: int = 0
    vt_heartbeats_failed: int = 0
    rt_heartbeats: int = 0
    rt_heartbeats_acked: int = 0
    rt_heartbeats_failed: int = 0
    hbd_truncated: int = 0
    watermark_advanced_ms: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Current:
    region: int
    offset: int
    key: bytes
    env: dict | None
    broker_ts: int | None
    tokens: list


@dataclass(slots=True)
class _PendingHeartbeat:
    region: int
    rt_offset: int
    timestamp_ms: int


class HeartbeatLeader:
    """The leader of one VT partition: writes VT records and heartbeats that never over-claim.

    `producer_or_conf`: a confluent_kafka Producer (or anything with produce/poll/flush) connected to the local
    cluster, or a librdkafka configuration dict to build one from. `vt_topic`/`rt_topic`: the local VT and
    RT; `partition`: the partition led (same number in both). `region`: this leader's region id; `n_regions`:
    how many regions' RTs it consumes. `host`: writer id in footers (e.g. "host:port"). `term_id`: leadership
    term (written in `hbw`; give the last heartbeat's term + 1 on a restart). `interval_ms`: RT heartbeat
    period, emitted from `poll()` (≤ 0: only when `emit_rt_heartbeat()` is called). `clock`: epoch ms
    (injectable for simulations). `rt_validator_config`: tolerances of the RT validators.
    """

    def __init__(
        self,
        producer_or_conf: Any,
        *,
        vt_topic: str,
        rt_topic: str,
        partition: int,
        region: int,
        n_regions: int,
        host: str,
        term_id: int = -1,
        interval_ms: int = 60_000,
        hbd_max_bytes: int = DEFAULT_HBD_MAX_BYTES,
        clock: Callable[[], int] | None = None,
        checksum_type: int = cks.ADHASH,
        max_segment_age_ms: int = 300_000,
        rt_validator_config: ValidatorConfig | None = None,
        guid: bytes | None = None,
    ) -> None:
        if not 0 <= region < n_regions:
            raise ValueError(f"region {region} is not in 0..{n_regions - 1} (n_regions={n_regions})")
        if partition < 0:
            raise ValueError(f"partition must not be negative, got {partition}")
        if hbd_max_bytes < 64:
            raise ValueError(f"hbd_max_bytes={hbd_max_bytes} cannot hold even an empty DIV state")
        if isinstance(producer_or_conf, Mapping):
            from confluent_kafka import Producer

            # Idempotence keeps order across retries without duplicates; a heartbeat must fit in one message.
            conf = {
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.max.bytes": max(1_000_000, hbd_max_bytes + 100_000),
            }
            conf.update(producer_or_conf)
            self.producer = Producer(conf)
        else:
            self.producer = producer_or_conf
        self.vt_topic = vt_topic
        self.rt_topic = rt_topic
        self.partition = partition
        self.region = region
        self.n_regions = n_regions
        self.host = host
        self.term_id = term_id
        self.interval_ms = interval_ms
        self.hbd_max_bytes = hbd_max_bytes
        self.clock = clock or (lambda: int(time.time() * 1000))
        self.checksum_type = checksum_type
        self.leader_completed = False  # the `lcs` header: set once this leader reported completion
        self.codec = E.EnvelopeCodec()
        self._last_write_ts = -1
        self.writer = SegmentWriter(
            guid or random_guid(),
            checksum_type=checksum_type,
            max_segment_age_ms=max_segment_age_ms,
            host_name=host,
            clock=self._writer_clock,
            codec=self.codec,
        )
        self._validator_config = rt_validator_config
        self.stats = LeaderStats()
        self.tracker: WatermarkTracker | None = None
        self._rt_validators: list[PartitionValidator] = []
        self._inherited_vt: dict[bytes, dict] = {}
        self._current: _Current | None = None
        self._last_was_heartbeat = False
        self._pending_hbs: deque[_PendingHeartbeat] = deque()
        # the watermarks as poll() last saw them, for stats.watermark_advanced_ms
        self._seen_marks: list[int] = []
        self._tokens = itertools.count(1)
        self._last_rt_hb_ms: int | None = None
        self._segment_final = False
        self._broken_reason: str | None = None
        self._closed = False

    # -- identity --------------------------------------------------------------------------------------
    @property
    def guid(self) -> bytes:
        """This term's VT producer GUID."""
        return self.writer.guid

    @property
    def broken(self) -> bool:
        return self._broken_reason is not None

    @property
    def pending_heartbeats(self) -> int:
        """VT heartbeats waiting for acknowledgements before they may be written."""
        return len(self._pending_hbs)

    def watermarks(self) -> list[int]:
        """The acknowledged high-water-mark vector (what a heartbeat written now would claim)."""
        return self._tracker().watermarks()

    # -- takeover --------------------------------------------------------------------------------------
    def take_over(
        self,
        vt_producer_states: Mapping[bytes, dict] | None = None,
        rt_producer_states: Mapping[int, Mapping[bytes, dict]] | None = None,
        watermarks: Iterable[int] | None = None,
    ) -> None:
        """Start the term from restored state (call before the first RT record; without it: empty state).

        `watermarks[r]`: last RT offset of region r already reflected in the VT; the leader resumes RT[r] at
        `watermarks[r] + 1`. `rt_producer_states[r]`: RT[r] DIV state at that offset. `vt_producer_states`:
        DIV state of the VT producers as a follower holds it at the end of the VT when the term starts (the
        last heartbeat's `hbd.vtProducerStates` advanced over the VT records after it, e.g. `div restore`).
        A `VtHeartbeat` h gives: `take_over(vt, h.div_state.rt_producers, h.watermarks.high_watermarks)`.
        """
        self._check_open()
        if self.tracker is not None:
            raise LeaderUsageError(
                "take_over() must come before the first RT record or heartbeat of the term"
            )
        rt = {int(r): dict(s) for r, s in (rt_producer_states or {}).items()}
        bad = [r for r in rt if not 0 <= r < self.n_regions]
        if bad:
            raise ValueError(f"rt_producer_states names region(s) {bad} outside 0..{self.n_regions - 1}")
        self.tracker = WatermarkTracker(self.n_regions, watermarks, rt, self._validator_config)
        self._seen_marks = self.tracker.watermarks()
        now = self.clock()
        self.stats.watermark_advanced_ms = dict.fromkeys(range(self.n_regions), now)
        self._rt_validators = []
        for r in range(self.n_regions):
            v = PartitionValidator(is_realtime=True, config=self._validator_config)
            if rt.get(r):
                v.restore(rt[r])
            self._rt_validators.append(v)
        self._inherited_vt = {
            bytes(g): dict(s) for g, s in (vt_producer_states or {}).items() if bytes(g) != self.guid
        }

    def _tracker(self) -> WatermarkTracker:
        if self.tracker is None:
            self.take_over()
        assert self.tracker is not None
        return self.tracker

    # -- consuming RT ----------------------------------------------------------------------------------
    def on_rt_record(
        self,
        region: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable | None = None,
        broker_ts_ms: int | None = None,
    ) -> RtRecord:
        """Hand over RT record `offset` of `region` (in RT order per region). Heartbeats are handled here and
        need nothing more. For any other record write its VT records with `put()`/`delete()` (or none) and then
        call `done()`."""
        self._check_usable()
        tracker = self._tracker()
        if self._current is not None:
            cur = self._current
            raise LeaderUsageError(
                f"call done() for RT record {cur.offset} of region {cur.region} before "
                f"handing over the next one"
            )
        if not 0 <= region < self.n_regions:
            raise ValueError(f"region {region} is not in 0..{self.n_regions - 1}")
        if offset <= tracker.last_processed(region):
            raise LeaderUsageError(
                f"RT offset {offset} of region {region} was already processed (last "
                f"{tracker.last_processed(region)}): records are handed over once, in order"
            )
        self.stats.rt_records += 1
        key = bytes(key) if key is not None else b""
        if key == keys.HEARTBEAT_KEY:
            rec = self._on_rt_heartbeat(region, offset, key, value, headers, broker_ts_ms)
            if rec is not None:
                return rec
        self._last_was_heartbeat = False
        env, error = decode_record(self.codec, key, value, headers)
        if env is None:
            finding = Finding(offset, None, -1, -1, UNDECODABLE, False, error)
            self._current = _Current(region, offset, key, None, broker_ts_ms, [])
            return RtRecord(region, offset, Kind.UNDECODABLE.name, None, None, [finding], broker_ts_ms, error)
        findings = self._rt_validators[region].process(offset, key, env, broker_ts_ms, len(value or b""))
        self._current = _Current(region, offset, key, env, broker_ts_ms, [])
        return RtRecord(region, offset, message_type(env).name, key[1:], env, findings, broker_ts_ms)

    def _on_rt_heartbeat(self, region, offset, key, value, headers, broker_ts_ms) -> RtRecord | None:
        env, _ = decode_record(self.codec, key, value, headers)
        if env is None:
            return None  # not a heartbeat after all: the general path reports it as UNDECODABLE
        tracker = self._tracker()
        tracker.processed(region, offset, ())  # heartbeats are DIV-exempt: nothing to replay
        self._pending_hbs.append(_PendingHeartbeat(region, offset, vt_heartbeat_timestamp(env, broker_ts_ms)))
        self._last_was_heartbeat = True
        self._emit_ready_heartbeats()
        return RtRecord(region, offset, Kind.HEARTBEAT.name, None, env, [], broker_ts_ms)

    # -- writing the VT ------------------------------------------------------------------------------
    def put(
        self,
        key_content: bytes,
        value: bytes,
        schema_id: int = 1,
        *,
        rmd_version: int = -1,
        rmd_payload: bytes = b"",
        headers: Iterable[tuple[str, bytes]] | None = None,
    ) -> int:
        """Write a PUT to the VT for the current RT record (leader footer pointing at it). Returns how many
        Kafka records that took (a segment start or roll adds SOS/EOS)."""
        cur = self._require_current("put")
        recs = self.writer.put(
            self.partition,
            key_content,
            value,
            schema_id,
            rmd_version=rmd_version,
            rmd_payload=rmd_payload,
            footer=self._footer(cur),
        )
        return self._send(recs, cur, headers)

    def delete(
        self,
        key_content: bytes,
        schema_id: int = -1,
        *,
        rmd_version: int = -1,
        rmd_payload: bytes = b"",
        headers: Iterable[tuple[str, bytes]] | None = None,
    ) -> int:
        """Write a DELETE to the VT for the current RT record. Returns how many Kafka records that took."""
        cur = self._require_current("delete")
        recs = self.writer.delete(
            self.partition,
            key_content,
            schema_id,
            rmd_version=rmd_version,
            rmd_payload=rmd_payload,
            footer=self._footer(cur),
        )
        return self._send(recs, cur, headers)

    def done(self) -> None:
        """The current RT record is fully handled (its 0..n VT records are produced)."""
        self._check_usable()
        cur = self._current
        if cur is None:
            if self._last_was_heartbeat:
                return  # the library already finished the heartbeat
            raise LeaderUsageError("done() without a current RT record: call on_rt_record() first")
        self._current = None
        div_record = (cur.key, cur.env, cur.broker_ts) if cur.env is not None else None
        self._tracker().processed(cur.region, cur.offset, cur.tokens, div_record)

    def _footer(self, cur: _Current) -> tuple:
        upstream_ts = cur.broker_ts if cur.broker_ts is not None and cur.broker_ts > 0 else -1
        return E.leader_footer(self.host, cur.offset, cur.region, -1, upstream_ts)

    def _require_current(self, call: str) -> _Current:
        self._check_usable()
        if self._current is None:
            raise LeaderUsageError(f"{call}() needs a current RT record: call on_rt_record() first")
        return self._current

    def _send(self, recs: list[OutRecord], cur: _Current, headers) -> int:
        extra = list(headers) if headers else None
        last = len(recs) - 1
        for i, rec in enumerate(recs):
            token = next(self._tokens)
            cur.tokens.append(token)
            hdrs = list(rec.headers)
            if extra and i == last:
                hdrs.extend(extra)
            self._produce(self.vt_topic, rec, hdrs, functools.partial(self._on_data_delivery, token))
        self.stats.vt_sends += len(recs)
        if self.broken:  # a delivery report served while waiting for queue space
            raise self._broken_error()
        return len(recs)

    def _produce(self, topic: str, rec: OutRecord, headers: list, callback) -> None:
        while True:
            try:
                self.producer.produce(
                    topic,
                    value=rec.value,
                    key=rec.key,
                    partition=rec.partition,
                    headers=headers or None,
                    on_delivery=callback,
                )
                return
            except BufferError:  # the local queue is full: serve delivery reports to make room
                self.producer.poll(0.05)

    # -- delivery reports ------------------------------------------------------------------------------
    def _on_data_delivery(self, token: int, err, msg) -> None:
        tracker = self._tracker()
        if err is None:
            self.stats.vt_acked += 1
            tracker.acked(token)
            return
        self.stats.vt_failed += 1
        tracker.failed(token)
        if self._broken_reason is None:
            self._broken_reason = f"a VT send to {self.vt_topic}[{self.partition}] failed: {err}"
            log.error("leader %s of %s[%d] is broken: %s", self.host, self.vt_topic, self.partition, err)

    def _on_vt_heartbeat_delivery(self, err, msg) -> None:
        if err is None:
            self.stats.vt_heartbeats_acked += 1
        else:  # no data is lost: the next heartbeat claims at least as much
            self.stats.vt_heartbeats_failed += 1
            log.warning("VT heartbeat to %s[%d] failed: %s", self.vt_topic, self.partition, err)

    def _on_rt_heartbeat_delivery(self, err, msg) -> None:
        if err is None:
            self.stats.rt_heartbeats_acked += 1
        else:  # Venice only logs these too
            self.stats.rt_heartbeats_failed += 1
            log.warning("RT heartbeat to %s[%d] failed: %s", self.rt_topic, self.partition, err)

    # -- heartbeats ------------------------------------------------------------------------------------
    def poll(self, timeout: float = 0) -> int:
        """Serve delivery reports, write the VT heartbeats that became ready, and the RT heartbeat when
        `interval_ms` has passed. Call it often (every loop iteration). Returns the delivery reports served."""
        self._check_open()
        served = self.producer.poll(timeout)
        self._note_watermark_progress()  # what was acknowledged before a failure still counts
        self._check_usable()
        self._emit_ready_heartbeats()
        if self.interval_ms > 0:
            now = self.clock()
            if self._last_rt_hb_ms is None or now - self._last_rt_hb_ms >= self.interval_ms:
                self.emit_rt_heartbeat(now)
        return served or 0

    def emit_rt_heartbeat(self, timestamp_ms: int | None = None) -> int:
        """Write a heartbeat to the local RT partition now (origin time = `timestamp_ms` or the clock).
        Returns the origin time used."""
        self._check_usable()
        ts = self.clock() if timestamp_ms is None else int(timestamp_ms)
        rec = rt_heartbeat(
            self.host, ts, partition=self.partition, checksum_type=self.checksum_type, codec=self.codec
        )
        self._produce(self.rt_topic, rec, list(rec.headers), self._on_rt_heartbeat_delivery)
        self._last_rt_hb_ms = ts
        self.stats.rt_heartbeats += 1
        return ts

    def _emit_ready_heartbeats(self) -> None:
        if not self._pending_hbs or self.broken:
            return
        marks = self._tracker().watermarks()
        ready = [hb for hb in self._pending_hbs if marks[hb.region] >= hb.rt_offset]
        if not ready:
            return
        self._pending_hbs = deque(hb for hb in self._pending_hbs if marks[hb.region] < hb.rt_offset)
        hbd = self._encode_div_state()  # the same for every heartbeat of this batch: nothing is sent between
        for hb in ready:
            hbw = Watermarks(hb.region, hb.rt_offset, marks, self.host, self.term_id, self.clock())
            rec = vt_heartbeat(
                self.host,
                origin_region=hb.region,
                origin_rt_offset=hb.rt_offset,
                timestamp_ms=hb.timestamp_ms,
                partition=self.partition,
                leader_completed=self.leader_completed,
                hbw=encode_hbw(hbw),
                hbd=hbd,
                checksum_type=self.checksum_type,
                codec=self.codec,
            )
            self._produce(self.vt_topic, rec, list(rec.headers), self._on_vt_heartbeat_delivery)
            self.stats.vt_heartbeats += 1

    # -- DIV state for hbd -------------------------------------------------------------------------------
    def _writer_clock(self) -> int:
        # The writer stamps every record of one call with one clock reading; remembering the last reading
        # gives the messageTimestamp a follower's validator holds for this producer.
        t = self.clock()
        self._last_write_ts = t
        return t

    def vt_producer_states(self) -> dict[bytes, dict]:
        """VT DIV state a follower holds right after the last record this leader produced: the producers
        inherited at takeover plus this term's writer."""
        states = dict(self._inherited_vt)
        seg = self.writer.segment_state(self.partition)
        if seg is not None:
            if seg.ended:
                status = END_OF_FINAL_SEGMENT if self._segment_final else END_OF_INTERMEDIATE_SEGMENT
            else:
                status = IN_PROGRESS
            states[self.guid] = {
                "segmentNumber": seg.number,
                "segmentStatus": status,
                "isRegistered": True,
                "messageSequenceNumber": seg.next_sequence - 1,
                "messageTimestamp": self._last_write_ts,
                "checksumType": seg.checksum.type,
                "checksumState": seg.checksum.state(),
                "aggregates": {},
                "debugInfo": {},
            }
        return states

    def rt_producer_states(self) -> dict[int, dict[bytes, dict]]:
        """Per region, RT DIV state at the acknowledged watermark."""
        tracker = self._tracker()
        return {r: tracker.rt_producer_states(r) for r in range(self.n_regions)}

    def div_state(self) -> DivState:
        """The complete DIV state a heartbeat written now would carry (before any size limit)."""
        return DivState(self.vt_producer_states(), self.rt_producer_states(), False)

    def _encode_div_state(self) -> bytes:
        state = self.div_state()
        data = encode_hbd(state)
        if len(data) <= self.hbd_max_bytes:
            return data
        self.stats.hbd_truncated += 1
        data = fit_div_state(state, self.hbd_max_bytes)
        log.warning(
            "hbd of %s[%d] exceeds %d bytes: stalest producers left out (truncated=true)",
            self.vt_topic,
            self.partition,
            self.hbd_max_bytes,
        )
        return data

    # -- shutdown --------------------------------------------------------------------------------------
    def flush(self, timeout: float = 30.0) -> int:
        """Wait for outstanding sends, then write the VT heartbeats they made ready and wait for those.
        Returns the number of Kafka messages still not delivered (0 when everything is out)."""
        self._check_open()
        deadline = time.monotonic() + timeout
        left = self.producer.flush(timeout)
        if not self.broken:
            self._emit_ready_heartbeats()
        left = self.producer.flush(max(0.0, deadline - time.monotonic()))
        self._note_watermark_progress()
        return left

    def _note_watermark_progress(self) -> None:
        # When each mark last moved tells a stalled leader from a quiet one: every region's RT heartbeats move
        # its mark once an interval even when nobody writes. Checked here, once per loop iteration, rather than
        # on every acknowledgement (the hot path), at the cost of a loop iteration's resolution.
        tracker = self.tracker
        if tracker is None:
            return
        marks = tracker.watermarks()
        if marks == self._seen_marks:
            return
        now = self.clock()
        advanced = self.stats.watermark_advanced_ms
        for region, (mark, seen) in enumerate(zip(marks, self._seen_marks, strict=True)):
            if mark != seen:
                advanced[region] = now
        self._seen_marks = marks

    def close(self, timeout: float = 30.0, *, end_segment: bool = True) -> int:
        """Step down: end this term's segment (a final EndOfSegment, as Venice's graceful close) unless the
        leader is broken, and flush. Returns the messages still not delivered."""
        if self._closed:
            return 0
        if end_segment and not self.broken and self._current is None:
            recs = self.writer.end_segment(self.partition, final=True)
            for rec in recs:
                self._produce(self.vt_topic, rec, list(rec.headers), self._on_close_delivery)
            if recs:
                self._segment_final = True
        left = self.flush(timeout)
        self._closed = True
        return left

    def _on_close_delivery(self, err, msg) -> None:
        if err is not None:
            log.warning("final EndOfSegment to %s[%d] failed: %s", self.vt_topic, self.partition, err)

    # -- guards ----------------------------------------------------------------------------------------
    def _broken_error(self) -> LeaderBrokenError:
        return LeaderBrokenError(
            f"{self._broken_reason}; this leader may claim nothing past it: restart with a "
            f"new term (term_id {self.term_id + 1}) from the last VT heartbeat"
        )

    def _check_open(self) -> None:
        if self._closed:
            raise LeaderUsageError("this leader is closed")

    def _check_usable(self) -> None:
        self._check_open()
        if self._broken_reason is not None:
            raise self._broken_error()


def fit_div_state(state: DivState, max_bytes: int) -> bytes:
    """Encode `state` within `max_bytes`, leaving out the producers with the oldest messageTimestamp first
    (VT and RT maps together) and setting `truncated`. Every region keeps its (possibly empty) entry."""
    import io

    import fastavro

    schema = producer_state_schema()
    entries = []  # (messageTimestamp, size, map id, guid, state); map id None = VT, else region
    for source, states in [(None, state.vt_producers), *sorted(state.rt_producers.items())]:
        for guid, st in states.items():
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, schema, st)
            size = buf.tell() + len(bytes(guid).decode("latin-1").encode("utf-8")) + 3
            entries.append((st.get("messageTimestamp", -1), size, source, bytes(guid), st))
    entries.sort(key=lambda e: (-e[0], e[2] is not None, e[3]))
    empty = DivState({}, {r: {} for r in state.rt_producers}, True)
    # Each non-empty map adds a block count (≤ 5 bytes here) to the empty encoding.
    budget = max_bytes - len(encode_hbd(empty)) - 5 * (1 + len(state.rt_producers))
    kept: list = []
    used = 0
    for e in entries:
        if used + e[1] <= budget:
            kept.append(e)
            used += e[1]
    while True:
        out = DivState({}, {r: {} for r in state.rt_producers}, True)
        for _, _, source, guid, st in kept:
            (out.vt_producers if source is None else out.rt_producers[source])[guid] = st
        data = encode_hbd(out)
        if len(data) <= max_bytes or not kept:
            return data
        kept.pop()  # the size estimate was short: drop the stalest kept producer and retry


__all__ = [
    "HeartbeatLeader",
    "LeaderBrokenError",
    "LeaderStats",
    "LeaderUsageError",
    "RtRecord",
    "fit_div_state",
]
