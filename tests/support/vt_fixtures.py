"""Write generated Leap Frog histories as real VT archives, so the Spark job can be checked against the reference.

Each history becomes one partition of a `<store>_v1` topic in every region's archive: offset 0 is End of Push,
data entries are PUT/DELETE records with leader footers (and RMD vectors when the entry has one), heartbeat
entries are VT heartbeats with an `hbw` header, other entries are control messages; offsets compaction removed
are simply absent. A mid-stream scan's archive starts at its start heartbeat.
"""

from __future__ import annotations

from div import envelope as E
from div import keys as K
from div.archive import ArchiveWriter
from div.heartbeat_headers import Watermarks, encode_hbw
from div.rmd import encode_value_level_rmd
from leapfrog.reference import DataEntry, HeartbeatEntry, OtherEntry
from pipelines.leapfrog.decode import value_hash

STORE = "lf"
TOPIC = f"{STORE}_v1"
_CODEC = E.EnvelopeCodec("fastavro")
_GUID = bytes(range(16))


def value_bytes(v: int) -> bytes:
    return f"value-{v}".encode()


def spark_value_hash(v: int | None) -> int | None:
    """The value hash the job computes for a generated value."""
    return None if v is None else value_hash(value_bytes(v))


def _env(payload, footer, seq: int, ts: int = 1_700_000_000_000) -> dict:
    return {
        "messageType": {"PUT": 0, "DELETE": 1, "CONTROL": 2}[E.PAYLOAD_KIND[payload[0]]],
        "producerMetadata": E.producer_metadata(_GUID, 0, seq, ts, -2),
        "payloadUnion": payload,
        "leaderMetadataFooter": footer,
    }


def put_envelope(footer, value: bytes = b"v", schema_id: int = 1) -> dict:
    """A leader's v14 Put envelope without RMD, as plain tests need one."""
    payload = (
        E.PUT,
        {
            "putValue": value,
            "schemaId": schema_id,
            "replicationMetadataVersionId": -1,
            "replicationMetadataPayload": b"",
        },
    )
    return _env(payload, footer, 1, 5)


def record_of(entry, n_regions: int, region: int = 0) -> tuple[bytes, bytes, list | None]:
    """(key, value, headers) of one generated VT entry of `region`'s VT (whose leader names itself in footers
    and heartbeats, as a real one does: no two regions' VTs are byte-identical)."""
    off = entry.vt_offset
    host = f"leader-dc{region}"
    if isinstance(entry, DataEntry):
        footer = E.leader_footer(host, entry.source_offset, entry.source_region)
        rmd = encode_value_level_rmd(0, list(entry.rmd_vector)) if entry.rmd_vector is not None else b""
        rmd_v = 1 if entry.rmd_vector is not None else -1
        if entry.value_hash is None:
            payload = (
                E.DELETE,
                {"schemaId": -1, "replicationMetadataVersionId": rmd_v, "replicationMetadataPayload": rmd},
            )
        else:
            payload = (
                E.PUT,
                {
                    "putValue": value_bytes(entry.value_hash),
                    "schemaId": 1,
                    "replicationMetadataVersionId": rmd_v,
                    "replicationMetadataPayload": rmd,
                },
            )
        return K.data_key(entry.key), _CODEC.encode(_env(payload, footer, off)), None
    if isinstance(entry, HeartbeatEntry):
        env = {
            "messageType": 2,
            "producerMetadata": E.producer_metadata(K.HEARTBEAT_GUID, 0, 0, 1, -1),
            "payloadUnion": E.control_message(
                E.START_OF_SEGMENT, {"checksumType": 4, "upcomingAggregates": []}
            ),
            "leaderMetadataFooter": E.leader_footer(host, entry.origin_offset, entry.origin_region),
        }
        hbw = encode_hbw(Watermarks(entry.origin_region, entry.origin_offset, list(entry.watermarks), host))
        return K.HEARTBEAT_KEY, _CODEC.encode(env), [("hbw", hbw)]
    assert isinstance(entry, OtherEntry)
    ctype = E.END_OF_PUSH if off == 0 else E.START_OF_INCREMENTAL_PUSH
    body = {} if ctype == E.END_OF_PUSH else {"version": "noise"}
    env = _env(E.control_message(ctype, body), E.default_footer(host), off)
    return K.control_key(_GUID, 0, off), _CODEC.encode(env), None


def write_archives(histories, root, keep=None) -> dict[int, str]:
    """One archive per region; history i is partition i. Returns {region: archive dir}.

    `keep(partition, region, offset)`, when given, selects the records written (e.g. one day of a split)."""
    n = max(h.n_regions for h in histories)
    dirs = {x: str(root / f"dc-{x}") for x in range(n)}
    writers = {x: ArchiveWriter(dirs[x]) for x in range(n)}
    for p, h in enumerate(histories):
        for x in range(h.n_regions):
            start = h.start_heartbeat[x]
            for e in h.vt[x]:
                if start is not None and e.vt_offset < start.vt_offset:
                    continue
                if keep is not None and not keep(p, x, e.vt_offset):
                    continue
                key, value, headers = record_of(e, h.n_regions, x)
                writers[x].append_record(TOPIC, p, e.vt_offset, key, value, 1_700_000_000_000, 0, headers)
    for w in writers.values():
        w.close()
    return dirs
