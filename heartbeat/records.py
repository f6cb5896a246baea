"""Heartbeat records as Venice writes them (VeniceWriter.sendHeartbeat, the leader's VT propagation), plus our
`hbw`/`hbd` headers on VT heartbeats.

Venice identifies heartbeats by their fixed key (`div.keys.HEARTBEAT_KEY`: header 2, the heartbeat GUID,
segment 0, sequence 0) and gives them a StartOfSegment payload that DIV skips. We build them byte for byte the
same (tests/heartbeat/test_heartbeat_codecs.py checks Venice's bytes), so Venice servers and consumers treat ours
as their own:

* RT heartbeat — written by a leader to its local RT every interval: messageTimestamp = send (origin) time,
  logicalTimestamp −1, default footer (writer id, −1 / EARLIEST sentinels), header `vtp` only.
* VT heartbeat — written by a leader to its local VT when it consumes an RT heartbeat of any region:
  messageTimestamp = max(broker time, producer time) of that RT heartbeat, footer = this leader's host, the RT
  heartbeat's offset and position, upstreamKafkaClusterId = origin region; headers `vtp`, `lcs` (1 byte) and
  ours, `hbw` and `hbd`.

`parse_vt_heartbeat` reads any VT heartbeat, ours or a plain Venice one (then `watermarks`/`div_state` are None).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from div import checksum as cks
from div import envelope as E
from div import keys
from div.heartbeat_headers import (
    HBD_HEADER,
    HBW_HEADER,
    DivState,
    Watermarks,
    decode_hbd,
    decode_hbw,
    encode_hbd,
    encode_hbw,
    header_value,
)
from div.records import footer_source
from div.writer import OutRecord, vtp_header_value

LCS_HEADER = "lcs"
LEADER_NOT_COMPLETED = b"\x00"
LEADER_COMPLETED = b"\x01"

_CODEC: E.EnvelopeCodec | None = None


def _codec(codec: E.EnvelopeCodec | None) -> E.EnvelopeCodec:
    global _CODEC
    if codec is not None:
        return codec
    if _CODEC is None:
        _CODEC = E.EnvelopeCodec()
    return _CODEC


def _heartbeat_envelope(timestamp_ms: int, checksum_type: int, footer: tuple) -> dict:
    return {
        "messageType": E.MESSAGE_TYPE["CONTROL"],
        "producerMetadata": E.producer_metadata(keys.HEARTBEAT_GUID, 0, 0, timestamp_ms, -1),
        "payloadUnion": E.control_message(
            E.START_OF_SEGMENT, {"checksumType": checksum_type, "upcomingAggregates": []}
        ),
        "leaderMetadataFooter": footer,
    }


def rt_heartbeat(
    host: str,
    timestamp_ms: int,
    *,
    partition: int = 0,
    checksum_type: int = cks.ADHASH,
    codec: E.EnvelopeCodec | None = None,
) -> OutRecord:
    """The heartbeat a leader writes to its local RT partition (origin time `timestamp_ms`)."""
    env = _heartbeat_envelope(timestamp_ms, checksum_type, E.default_footer(host))
    return OutRecord(partition, keys.HEARTBEAT_KEY, _codec(codec).encode(env), (("vtp", vtp_header_value()),))


def vt_heartbeat_timestamp(rt_env: dict, broker_ts_ms: int | None) -> int:
    """Venice's clock-skew guard: the VT heartbeat carries max(broker time, producer time) of the RT one."""
    producer_ts = rt_env["producerMetadata"]["messageTimestamp"]
    return max(producer_ts, broker_ts_ms if broker_ts_ms is not None else -1)


def vt_heartbeat(
    host: str,
    *,
    origin_region: int,
    origin_rt_offset: int,
    timestamp_ms: int,
    partition: int = 0,
    leader_completed: bool = False,
    hbw: Watermarks | bytes | None = None,
    hbd: DivState | bytes | None = None,
    checksum_type: int = cks.ADHASH,
    codec: E.EnvelopeCodec | None = None,
) -> OutRecord:
    """The heartbeat a leader writes to its local VT after consuming the RT heartbeat at `origin_rt_offset` of
    `origin_region`. `timestamp_ms` = `vt_heartbeat_timestamp(...)` of that RT heartbeat. Without `hbw`/`hbd`
    the record is exactly Venice's."""
    footer = E.leader_footer(host, origin_rt_offset, origin_region)
    env = _heartbeat_envelope(timestamp_ms, checksum_type, footer)
    headers: list[tuple[str, bytes]] = [
        ("vtp", vtp_header_value()),
        (LCS_HEADER, LEADER_COMPLETED if leader_completed else LEADER_NOT_COMPLETED),
    ]
    if hbw is not None:
        headers.append((HBW_HEADER, hbw if isinstance(hbw, bytes) else encode_hbw(hbw)))
    if hbd is not None:
        headers.append((HBD_HEADER, hbd if isinstance(hbd, bytes) else encode_hbd(hbd)))
    return OutRecord(partition, keys.HEARTBEAT_KEY, _codec(codec).encode(env), tuple(headers))


@dataclass
class VtHeartbeat:
    """What a reader learns from one VT heartbeat.

    `origin_region`/`origin_rt_offset`: the RT heartbeat it was re-emitted from (footer cluster id and
    position); `origin_ms`: its messageTimestamp. `watermarks`/`div_state` are None on plain Venice heartbeats
    (and `div_state` also when the caller skipped decoding it; `hbd_size` then still says whether one was
    there). `lcs` is None when the header is absent.
    """

    origin_region: int
    origin_rt_offset: int
    origin_ms: int
    leader_host: str
    watermarks: Watermarks | None
    div_state: DivState | None
    lcs: bool | None
    hbd_size: int = 0


def parse_vt_heartbeat(
    key: bytes | None, env: dict, headers: Iterable | None, *, decode_div_state: bool = True
) -> VtHeartbeat | None:
    """Read a VT heartbeat (None when `key` is not the heartbeat key). Raises `codecs.HeaderError` when an
    `hbw`/`hbd` header is present but malformed: a reader must not mistake a broken claim for no claim."""
    if key is None or not keys.is_heartbeat_key(bytes(key)):
        return None
    footer = E.footer(env) or {}
    offset = (footer_source(env) or (-1, -1))[1]
    hbw = header_value(headers, HBW_HEADER)
    hbd = header_value(headers, HBD_HEADER)
    lcs = header_value(headers, LCS_HEADER)
    return VtHeartbeat(
        origin_region=footer.get("upstreamKafkaClusterId", -1),
        origin_rt_offset=offset,
        origin_ms=env["producerMetadata"]["messageTimestamp"],
        leader_host=footer.get("hostName", ""),
        watermarks=decode_hbw(hbw) if hbw is not None else None,
        div_state=decode_hbd(hbd) if hbd is not None and decode_div_state else None,
        lcs=None if lcs is None else lcs == LEADER_COMPLETED,
        hbd_size=0 if hbd is None else len(hbd),
    )
