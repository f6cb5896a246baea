"""The two Kafka headers tidegauge adds to version-topic heartbeats: `hbw` (watermarks) and `hbd` (DIV state).

Venice's heartbeats carry one upstream coordinate each (the RT heartbeat they came from). Ours also carry the
leader's whole high-water-mark vector and the DIV state a follower needs to resume right after the heartbeat, so
that readers never need per-record offset vectors (docs/design.md, rules 2-4). Both live only in headers,
so an unmodified Venice consumer skips them.

The codec lives in `div` (not in `heartbeat`, which writes these headers) because DIV restore reads them and
`div` imports nothing of ours; the heartbeat library imports the codecs from here, so there is one codec.

Framing (normative, docs/design.md, rule 2):

* `hbw` = bytes `0x48 0x01` + Avro `HeartbeatWatermarks` v1;
* `hbd` = bytes `0x44 0x01` + Avro `HeartbeatDivState` v1, producer maps keyed by the 16 GUID bytes read as
  ISO-8859-1 text (Venice's PartitionState convention).

Decoders raise `HeaderError`, whose message names the header and the problem (magic, version, Avro, trailing
bytes), and never return a partial value.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass, field

import fastavro

from . import schemas

HBW_HEADER = "hbw"
HBD_HEADER = "hbd"
HBW_MAGIC = 0x48  # "H"
HBD_MAGIC = 0x44  # "D"
VERSION = 1


class HeaderError(ValueError):
    """An `hbw` or `hbd` header value that is not what this version of the protocol writes."""


@dataclass
class Watermarks:
    """Content of the `hbw` header.

    `high_watermarks[r]` is the highest RT offset of region r the leader had fully processed (every VT record
    derived from RT[r] at or below it precedes the heartbeat); -1 = nothing from r yet. `positions`, when not
    empty, gives the same as PubSub position blobs (for pub-sub systems without plain offsets).
    """

    origin_region: int
    origin_rt_offset: int
    high_watermarks: list[int]
    leader_host: str
    term_id: int = -1
    emit_ts_ms: int = -1
    positions: list[bytes] = field(default_factory=list)


@dataclass
class DivState:
    """Content of the `hbd` header: DIV producer states as Venice's ProducerPartitionState dicts.

    `vt_producers`: GUID → state, every VT producer as a follower holds it just before the heartbeat.
    `rt_producers`: region → (GUID → state), each region's RT producers after RT[r] up to and including the
    watermark of r. `truncated`: the leader left producers out to respect its size limit; treat as incomplete.
    """

    vt_producers: dict[bytes, dict] = field(default_factory=dict)
    rt_producers: dict[int, dict[bytes, dict]] = field(default_factory=dict)
    truncated: bool = False


_PARSED: dict[str, object] = {}


def _schema(name: str):
    parsed = _PARSED.get(name)
    if parsed is None:
        parsed = fastavro.parse_schema(schemas.load_json(name))
        _PARSED[name] = parsed
    return parsed


def _hbw_schema():
    return _schema("HeartbeatWatermarks.v1.avsc")


def _hbd_schema():
    return _schema("HeartbeatDivState.v1.avsc")


def producer_state_schema():
    """The parsed ProducerPartitionState record schema of `hbd` (for callers measuring one state's size)."""
    key = "ProducerPartitionState"
    parsed = _PARSED.get(key)
    if parsed is None:
        full = schemas.load_json("HeartbeatDivState.v1.avsc")
        record = full["fields"][0]["type"]["values"]
        parsed = fastavro.parse_schema(record)
        _PARSED[key] = parsed
    return parsed


def _write(magic: int, schema, datum: dict) -> bytes:
    buf = io.BytesIO()
    buf.write(bytes([magic, VERSION]))
    fastavro.schemaless_writer(buf, schema, datum)
    return buf.getvalue()


def _read(name: str, magic: int, schema, data: bytes | None) -> dict:
    if data is None or len(data) < 2:
        raise HeaderError(
            f"{name} header: {0 if data is None else len(data)} bytes is shorter than its 2-byte framing"
        )
    if data[0] != magic:
        raise HeaderError(f"{name} header: bad magic byte 0x{data[0]:02x} (expected 0x{magic:02x})")
    if data[1] != VERSION:
        raise HeaderError(
            f"{name} header: protocol version {data[1]} is not supported (this reader knows "
            f"version {VERSION})"
        )
    buf = io.BytesIO(bytes(data[2:]))
    try:
        datum = fastavro.schemaless_reader(buf, schema, None)
    except Exception as exc:  # fastavro raises EOFError, ValueError, UnicodeDecodeError, ... on bad bytes
        raise HeaderError(f"{name} header: Avro does not decode: {type(exc).__name__}: {exc}") from None
    extra = len(data) - 2 - buf.tell()
    if extra:
        raise HeaderError(f"{name} header: {extra} trailing bytes after the Avro record")
    return datum


# -- hbw -----------------------------------------------------------------------------------------------
def encode_hbw(w: Watermarks) -> bytes:
    return _write(
        HBW_MAGIC,
        _hbw_schema(),
        {
            "originRegionId": w.origin_region,
            "originRtOffset": w.origin_rt_offset,
            "upstreamHighWatermarks": [int(x) for x in w.high_watermarks],
            "upstreamHighWatermarkPositions": [bytes(p) for p in w.positions],
            "leaderHostName": w.leader_host,
            "termId": w.term_id,
            "emitTimestampMs": w.emit_ts_ms,
        },
    )


def decode_hbw(data: bytes | None) -> Watermarks:
    d = _read(HBW_HEADER, HBW_MAGIC, _hbw_schema(), data)
    return Watermarks(
        origin_region=d["originRegionId"],
        origin_rt_offset=d["originRtOffset"],
        high_watermarks=list(d["upstreamHighWatermarks"]),
        leader_host=d["leaderHostName"],
        term_id=d["termId"],
        emit_ts_ms=d["emitTimestampMs"],
        positions=[bytes(p) for p in d["upstreamHighWatermarkPositions"]],
    )


# -- hbd -----------------------------------------------------------------------------------------------
def guid_to_key(guid: bytes) -> str:
    if len(guid) != 16:
        raise HeaderError(f"hbd header: producer GUID must be 16 bytes, got {len(guid)}")
    return bytes(guid).decode("latin-1")


def _key_to_guid(key: str) -> bytes:
    try:
        guid = key.encode("latin-1")
    except UnicodeEncodeError:
        raise HeaderError(f"hbd header: producer key {key!r} is not ISO-8859-1 text of GUID bytes") from None
    if len(guid) != 16:
        raise HeaderError(f"hbd header: producer key is {len(guid)} bytes, a GUID is 16")
    return guid


def div_state_datum(s: DivState) -> dict:
    """The Avro datum of `hbd` (what encode_hbd writes after the framing)."""
    return {
        "vtProducerStates": {guid_to_key(g): st for g, st in s.vt_producers.items()},
        "rtProducerStates": [
            {"regionId": int(r), "producerStates": {guid_to_key(g): st for g, st in states.items()}}
            for r, states in sorted(s.rt_producers.items())
        ],
        "truncated": bool(s.truncated),
    }


def encode_hbd(s: DivState) -> bytes:
    try:
        return _write(HBD_MAGIC, _hbd_schema(), div_state_datum(s))
    except (ValueError, TypeError, KeyError) as exc:
        if isinstance(exc, HeaderError):
            raise
        raise HeaderError(
            f"hbd header: a producer state does not fit ProducerPartitionState: {exc}"
        ) from None


def decode_hbd(data: bytes | None) -> DivState:
    d = _read(HBD_HEADER, HBD_MAGIC, _hbd_schema(), data)
    rt: dict[int, dict[bytes, dict]] = {}
    for entry in d["rtProducerStates"]:
        region = entry["regionId"]
        if region in rt:
            raise HeaderError(f"hbd header: region {region} appears twice in rtProducerStates")
        rt[region] = {_key_to_guid(k): v for k, v in entry["producerStates"].items()}
    return DivState(
        vt_producers={_key_to_guid(k): v for k, v in d["vtProducerStates"].items()},
        rt_producers=rt,
        truncated=d["truncated"],
    )


def header_value(headers, name: str) -> bytes | None:
    """The value of header `name` in Kafka client form ([(key, value)]) or archive form ([{key, value}])."""
    if not headers:
        return None
    for item in headers:
        k, v = (item["key"], item["value"]) if isinstance(item, dict) else item
        if k == name:
            return v
    return None


def widest_hbw(headers: Iterable) -> int:
    """The length of the longest `hbw` vector among records' headers (each a record's header list or None; 0: no
    vector). A vector names every region of the store, so this is how a reader learns the store's region count
    from a topic's tail; a damaged header is skipped (the reading job counts its record)."""
    widest = 0
    for record_headers in headers:
        raw = header_value(record_headers, HBW_HEADER)
        if raw is None:
            continue
        try:
            widest = max(widest, len(decode_hbw(raw).high_watermarks))
        except (HeaderError, ValueError, EOFError, IndexError):
            continue
    return widest
