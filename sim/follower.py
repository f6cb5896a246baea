"""A follower replica of one region's VT partition: replays it with DIV and checkpoints offset and DIV state.

Followers see the VT exactly as consumers downstream of a leader would (records come from Kafka), validate it
with Venice's drainer procedure (`div.validator.PartitionValidator`), and save offset + DIV state together with
`div.checkpoint.CheckpointStore` every N records and at the end. They also keep what a promoted follower needs
at a leader failover — the last VT heartbeat it consumed and its current VT DIV state — and measure what the
VT spends on replication metadata: footer and RMD bytes per data record, and our heartbeat headers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from div import envelope as E
from div.checkpoint import CheckpointStore
from div.records import Kind, kind, message_type
from div.validator import Finding, PartitionValidator

from .cluster import SimClock

_FOOTER_NAME = E.LEADER_METADATA


def _long_size(n: int) -> int:
    """Bytes of a zig-zag varint (Avro int/long)."""
    z = n << 1 if n >= 0 else ~(n << 1)
    return (z.bit_length() + 6) // 7 or 1


_HOST_SIZE: dict[str, int] = {}


def footer_size(footer: dict) -> int:
    """Avro bytes of a leaderMetadataFooter (union branch + LeaderMetadata)."""
    host = footer["hostName"]
    hs = _HOST_SIZE.get(host)
    if hs is None:
        raw = host.encode()
        hs = _HOST_SIZE[host] = _long_size(len(raw)) + len(raw)
    pos = footer["upstreamPubSubPosition"]
    return (
        1
        + hs
        + _long_size(footer["upstreamOffset"])
        + _long_size(footer["upstreamKafkaClusterId"])
        + _long_size(len(pos))
        + len(pos)
        + _long_size(footer["termId"])
        + _long_size(footer["upstreamMessageTimestamp"])
    )


def rmd_size(body: dict) -> int:
    """Avro bytes of a Put/Delete's replicationMetadataVersionId and replicationMetadataPayload."""
    payload = body["replicationMetadataPayload"]
    return _long_size(body["replicationMetadataVersionId"]) + _long_size(len(payload)) + len(payload)


@dataclass
class MetadataBytes:
    """What one VT partition spends on replication metadata (summed)."""

    data_records: int = 0
    footer: int = 0
    rmd: int = 0
    heartbeats: int = 0
    heartbeat_headers: int = 0  # our hbw + hbd (names and values)
    vtp_headers: int = 0  # Venice's schema header on segment-0/sequence-0 messages (heartbeats, first SOS)

    def add(self, other: MetadataBytes) -> None:
        for f in ("data_records", "footer", "rmd", "heartbeats", "heartbeat_headers", "vtp_headers"):
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def as_dict(self) -> dict:
        n = max(1, self.data_records)
        return {
            "vt_data_records": self.data_records,
            "footer_bytes": self.footer,
            "rmd_bytes": self.rmd,
            "vt_heartbeats": self.heartbeats,
            "heartbeat_header_bytes": self.heartbeat_headers,
            "vtp_header_bytes": self.vtp_headers,
            "per_record": {
                "footer": round(self.footer / n, 3),
                "rmd": round(self.rmd / n, 3),
                "heartbeat_headers_amortised": round(self.heartbeat_headers / n, 3),
                "total": round((self.footer + self.rmd + self.heartbeat_headers) / n, 3),
            },
        }


@dataclass
class Follower:
    """Replays VT[region] partition `partition` with DIV; checkpoints into `store` every `every` records."""

    region: int
    partition: int
    topic: str
    store: CheckpointStore
    every: int
    clock: SimClock
    validator: PartitionValidator = field(default_factory=PartitionValidator)
    codec: E.EnvelopeCodec = field(default_factory=E.EnvelopeCodec)
    next_offset: int = 0
    findings: list[Finding] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    meta: MetadataBytes = field(default_factory=MetadataBytes)
    last_heartbeat: tuple[int, list] | None = None  # (VT offset, headers)
    last_heartbeat_ms: int = -1
    checkpoints: int = 0
    _since_checkpoint: int = 0

    def consume(self, msgs: list) -> None:
        """Validate VT records (one partition, offset order).

        The records are Kafka messages handed over by the simulation, not an Arrow batch, so this loop is not
        `div.records.iter_records`; it classifies them with `div.records` all the same. The simulation writes
        only Venice records: one that does not decode is a bug, and raises.
        """
        decode = self.codec.decode
        process = self.validator.process
        counts = self.counts
        meta = self.meta
        put, delete = Kind.PUT, Kind.DELETE
        for m in msgs:
            offset, key, value, headers = m.offset(), m.key(), m.value(), m.headers()
            ts = m.timestamp()[1]
            env = decode(value, headers)
            found = process(offset, key, env, ts, len(value))
            if found:
                self.findings.extend(found)
            mtype = message_type(env)
            if mtype is put or mtype is delete:
                f = env["leaderMetadataFooter"]
                if f is not None and f[1]["upstreamKafkaClusterId"] >= 0:  # leader-written (not push job)
                    meta.data_records += 1
                    meta.footer += footer_size(f[1])
                    meta.rmd += rmd_size(env["payloadUnion"][1])
                counts["put" if mtype is put else "delete"] += 1
            elif kind(key, env) is Kind.HEARTBEAT:
                counts["heartbeat"] += 1
                meta.heartbeats += 1
                for hk, hv in headers or ():
                    if hk in ("hbw", "hbd"):
                        meta.heartbeat_headers += len(hk) + len(hv or b"")
                    elif hk == "vtp":
                        meta.vtp_headers += len(hk) + len(hv or b"")
                self.last_heartbeat = (offset, headers)
                self.last_heartbeat_ms = env["producerMetadata"]["messageTimestamp"]
            else:
                counts["control"] += 1
                for hk, hv in headers or ():
                    if hk == "vtp":
                        meta.vtp_headers += len(hk) + len(hv or b"")
        n = len(msgs)
        self.next_offset = msgs[-1].offset() + 1 if n else self.next_offset
        counts["records"] += n
        self._since_checkpoint += n
        if self._since_checkpoint >= self.every:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Save the offset and DIV state together (atomically), stamped with simulated time."""
        if self.next_offset == 0:
            return
        self.store.save(
            self.topic,
            self.partition,
            self.next_offset - 1,
            self.validator.producer_states(),
            end_of_push=self.validator.end_of_push,
            last_update=self.clock.now,
            heartbeat_timestamp=self.last_heartbeat_ms,
        )
        self.checkpoints += 1
        self._since_checkpoint = 0
