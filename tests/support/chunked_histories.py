"""Generated Leap Frog histories written as a chunked version (venice-protocol-notes §1.7), as Venice would.

The same histories as `vt_fixtures.write_archives`, with the same values, in a chunked version: each region
partition opens with a StartOfPush saying `chunked = true`, every data key carries the `02 00` ChunkedKeySuffix,
some values (`chunked(v)`) are written as chunks (the default footer) followed by their manifest (the entry's
footer), and when a key's chunked value is replaced or deleted, DELETEs of its old chunk keys follow. A chunked
value's payloads concatenate to the value's bytes, so the findings are those of the unchunked archives: that is
the known truth. The inserted records move later offsets up; compaction's gaps stay gaps of the same size.
"""

from __future__ import annotations

from vt_builder import _MANIFEST, NON_CHUNK_SUFFIX, _avro, chunk_suffix
from vt_fixtures import _CODEC, TOPIC, _env, record_of, value_bytes

from div import envelope as E
from div import keys as K
from div.archive import ArchiveWriter
from leapfrog.reference import DataEntry

CHUNK_SIZE = 3  # value bytes per chunk: `value-N` makes three or more chunks


def chunked(v: int) -> bool:
    """Whether value `v` is stored chunked (two in three are)."""
    return v % 3 != 0


def _guid(region: int) -> bytes:
    return bytes([0x60 + region]) + bytes(range(1, 16))


def _put(value: bytes, schema_id: int, footer, seq: int, rmd: tuple = (b"", -1)) -> bytes:
    payload = (
        E.PUT,
        {
            "putValue": value,
            "schemaId": schema_id,
            "replicationMetadataVersionId": rmd[1],
            "replicationMetadataPayload": rmd[0],
        },
    )
    return _CODEC.encode(_env(payload, footer, seq))


def _delete(footer, seq: int) -> bytes:
    payload = (
        E.DELETE,
        {"schemaId": -1, "replicationMetadataVersionId": -1, "replicationMetadataPayload": b""},
    )
    return _CODEC.encode(_env(payload, footer, seq))


def region_records(h, x: int) -> tuple[list[tuple[int, bytes, bytes, list | None]], list[int]]:
    """Region `x`'s records of history `h` as a chunked version: [(offset, key, value, headers)], and the
    offsets of its manifests."""
    out: list[tuple[int, bytes, bytes, list | None]] = []
    manifests: list[int] = []
    live: dict[bytes, list[bytes]] = {}  # user key → the chunk keys of its current value
    start = h.start_heartbeat[x]
    shift = 0
    seq = 1_000_000  # producer sequence numbers of the inserted records (chunk ids are unique by it)
    sop = {"sorted": False, "chunked": True, "compressionStrategy": 0, "compressionDictionary": None}
    first = True
    for e in h.vt[x]:
        if start is not None and e.vt_offset < start.vt_offset:
            continue
        if first:  # the StartOfPush (the version is chunked), right before the first record in view
            env = _env(
                E.control_message(E.START_OF_PUSH, {**sop, "timestampPolicy": 0}), E.default_footer("l"), 0
            )
            out.append((e.vt_offset, K.control_key(_guid(x), 0, 0), _CODEC.encode(env), None))
            shift, first = 1, False
        if not isinstance(e, DataEntry):
            key, value, headers = record_of(e, h.n_regions, x)
            out.append((e.vt_offset + shift, key, value, headers))
            continue
        footer = E.leader_footer(f"leader-dc{x}", e.source_offset, e.source_region)
        key, whole, _ = record_of(e, h.n_regions, x)
        content = key[1:] + NON_CHUNK_SUFFIX
        if e.value_hash is not None and chunked(e.value_hash):
            data = value_bytes(e.value_hash)
            keys = []
            first_seq = seq
            for i in range(0, len(data), CHUNK_SIZE):
                ck = key[1:] + chunk_suffix(_guid(x), 0, first_seq, i // CHUNK_SIZE)
                out.append(
                    (
                        e.vt_offset + shift,
                        K.data_key(ck),
                        _put(data[i : i + CHUNK_SIZE], -10, E.default_footer("l"), seq),
                    )
                    + (None,)
                )
                keys.append(ck)
                shift += 1
                seq += 1
            manifest = _avro(_MANIFEST, {"keysWithChunkIdSuffix": keys, "schemaId": 1, "size": len(data)})
            manifests.append(e.vt_offset + shift)
            out.append(
                (e.vt_offset + shift, K.data_key(content), _put(manifest, -20, footer, e.vt_offset), None)
            )
            new_chunks = keys
        else:
            out.append((e.vt_offset + shift, K.data_key(content), whole, None))
            new_chunks = None
        for ck in live.pop(key, []):  # Venice cleans up the replaced value's chunks
            shift += 1
            seq += 1
            out.append((e.vt_offset + shift, K.data_key(ck), _delete(footer, seq), None))
        if new_chunks:
            live[key] = new_chunks
    return out, manifests


def write_chunked_archives(histories, root) -> tuple[dict[int, str], dict[tuple[int, int], list[int]]]:
    """One chunked archive per region, history i as partition i. Returns ({region: dir}, {(region, partition):
    manifest offsets})."""
    n = max(h.n_regions for h in histories)
    dirs = {x: str(root / f"dc-{x}") for x in range(n)}
    manifests: dict[tuple[int, int], list[int]] = {}
    writers = {x: ArchiveWriter(dirs[x]) for x in range(n)}
    for p, h in enumerate(histories):
        for x in range(h.n_regions):
            records, manifests[(x, p)] = region_records(h, x)
            for offset, key, value, headers in records:
                writers[x].append_record(TOPIC, p, offset, key, value, 1_700_000_000_000, 0, headers)
    for w in writers.values():
        w.close()
    return dirs, manifests
