"""Version-topic records → the narrow rows Leap Frog needs, decoded in Arrow batches (inside `mapInArrow`).

Each VT record becomes one row: its `div.records.Kind` (as int8), its key content, a 64-bit hash of its value, the
footer's upstream region and RT offset, the heartbeat's `hbw` vector and the RMD checkpoint vector when present.
Values are never carried further than this stage (chunks excepted: their payloads are needed to hash chunked
values through their manifests).

The common records (nearly all) are read for the whole batch at once by `vector_decode`; the loop here reads the
rest and is the reference the vectorised path is tested against. Why this loop is not `div.records.iter_records`:
it builds its output columns in place, row by row, and it decodes only what Leap Frog reads (data and control
keys; UPDATE and Global-RT-DIV keys are left undecoded as OTHER). The classification (`div.records.kind`) and the
footer reading (`div.records.footer_source`) are the shared ones.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from div import envelope as E
from div import keys as K
from div.envelope_columns import Heads
from div.heartbeat_headers import header_value
from div.records import Kind, footer_source, manifest_chunk_keys
from div.records import kind as record_kind
from pipelines.leapfrog.vector_decode import VectorDecoder

# int8 codes of the kinds this module writes and its readers (scan, job) test, as plain ints for numpy and Spark
PUT, DELETE, CHUNK, MANIFEST = int(Kind.PUT), int(Kind.DELETE), int(Kind.CHUNK), int(Kind.MANIFEST)
HEARTBEAT, START_OF_PUSH, END_OF_PUSH = int(Kind.HEARTBEAT), int(Kind.START_OF_PUSH), int(Kind.END_OF_PUSH)
UNDECODABLE, OTHER = int(Kind.UNDECODABLE), int(Kind.OTHER)

DECODED_SCHEMA = pa.schema(
    [
        ("region", pa.int32()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("kind", pa.int8()),
        ("key", pa.binary()),
        ("value_hash", pa.int64()),
        ("deleted", pa.bool_()),
        ("src", pa.int32()),
        ("src_offset", pa.int64()),
        ("hbw", pa.list_(pa.int64())),
        ("rmd", pa.list_(pa.int64())),
        ("chunked", pa.bool_()),
        ("chunk_keys", pa.list_(pa.binary())),
        ("payload", pa.binary()),
    ]
)
DECODED_DDL = (
    "region int, partition int, offset long, kind byte, key binary, value_hash long, deleted boolean, "
    "src int, src_offset long, hbw array<long>, rmd array<long>, chunked boolean, "
    "chunk_keys array<binary>, payload binary"
)


def value_hash(value: bytes) -> int:
    """64-bit hash of value bytes (xxh3), as a signed long."""
    h = xxhash.xxh3_64_intdigest(value)
    return h - (1 << 64) if h >= 1 << 63 else h


def chunked_value_hash(payloads: list[bytes]) -> int:
    """The hash of a chunked value: xxh3 over its chunk payloads in manifest order (= the whole value's hash)."""
    h = xxhash.xxh3_64()
    for p in payloads:
        h.update(p)
    v = h.intdigest()
    return v - (1 << 64) if v >= 1 << 63 else v


def _rmd_vector(body: dict) -> list[int] | None:
    if body.get("replicationMetadataVersionId", -1) < 1:
        return None
    payload = body.get("replicationMetadataPayload") or b""
    if not payload:
        return None
    from div.rmd import RmdDecodeError, decode_rmd_vector

    try:
        vec = decode_rmd_vector(payload)
    except (RmdDecodeError, ValueError):
        return None
    return vec or None


class VtDecoder:
    """Turns archive-schema batches of one or more VT partitions into DECODED_SCHEMA batches.

    The common records are read by `vector_decode` for the whole batch at once; the rest go through this class's
    loop (`_decode_rows`), the reference both are tested against (`vectorised=False` uses it for every row).
    """

    def __init__(self, vectorised: bool = True, codec: E.EnvelopeCodec | None = None) -> None:
        """`codec`: one that goes on from what an earlier run learnt (`EnvelopeCodec.knowing`); a new one if None."""
        self.codec = codec if codec is not None else E.EnvelopeCodec()
        self.vector = VectorDecoder(self.codec) if vectorised else None
        self.loop_rows = 0  # rows the vectorised path left to the loop (profiles and tests read it)

    def decode(
        self, batch: pa.RecordBatch, region: int | None = None, envelopes: Heads | None = None
    ) -> pa.RecordBatch:
        """`envelopes`: what `div.envelope_columns` read of the batch's rows already (a reader before, over the same
        records in the same order, with a new codec); read here when None."""
        if self.vector is None or batch.num_rows == 0:
            return self._decode_rows(batch, region)
        names = batch.schema.names
        n = batch.num_rows
        if envelopes is not None:
            cols = self.vector.columns(envelopes)
        else:
            cols = self.vector.plan(
                batch.column(names.index("key")),
                batch.column(names.index("value")),
                batch.column(names.index("headers")) if "headers" in names else None,
            )
        fast = pa.RecordBatch.from_arrays(
            [
                pa.array(np.full(n, region, np.int32))
                if region is not None
                else batch.column(names.index("region")).cast(pa.int32()),
                batch.column(names.index("partition")).cast(pa.int32()),
                batch.column(names.index("offset")).cast(pa.int64()),
                pa.array(cols.kind),
                cols.key,
                pa.array(cols.value_hash, mask=~cols.has_hash),
                pa.array(cols.deleted == 1, mask=cols.deleted < 0),
                pa.array(cols.src.astype(np.int32), mask=~cols.has_src),
                pa.array(cols.src_offset, mask=~cols.has_src),
                pa.nulls(n, pa.list_(pa.int64())),
                pa.nulls(n, pa.list_(pa.int64())),
                pa.nulls(n, pa.bool_()),
                pa.nulls(n, pa.list_(pa.binary())),
                cols.chunk_payload,
            ],
            schema=DECODED_SCHEMA,
        )
        slow = np.flatnonzero(cols.slow)
        if len(slow) == 0:
            return fast
        self.loop_rows += len(slow)
        ref = self._decode_rows(batch.take(pa.array(slow)), region)
        where = np.full(n, -1, np.int64)
        where[slow] = np.arange(len(slow))
        spread = pa.array(where, mask=where < 0)
        is_slow = pa.array(cols.slow)
        return pa.RecordBatch.from_arrays(
            [pc.if_else(is_slow, r.take(spread), f) for r, f in zip(ref.columns, fast.columns, strict=True)],
            schema=DECODED_SCHEMA,
        )

    def _decode_rows(self, batch: pa.RecordBatch, region: int | None = None) -> pa.RecordBatch:
        names = batch.schema.names
        n = batch.num_rows
        keys_in = batch.column(names.index("key")).to_pylist()
        values = batch.column(names.index("value")).to_pylist()
        headers = batch.column(names.index("headers")).to_pylist() if "headers" in names else [None] * n
        if region is None:
            regions = batch.column(names.index("region")).to_pylist()
        else:
            regions = [region] * n
        kind = [OTHER] * n  # UPDATE and Global-RT-DIV keys stay OTHER: Leap Frog reads nothing of them
        key_out: list = [None] * n
        vhash: list = [None] * n
        deleted: list = [None] * n
        src: list = [None] * n
        src_off: list = [None] * n
        hbw: list = [None] * n
        rmd: list = [None] * n
        chunked: list = [None] * n
        chunk_keys: list = [None] * n
        payload: list = [None] * n
        decode = self.codec.decode
        # Kind members as locals, compared by identity: this loop is Leap Frog's hot path
        k_put, k_delete, k_manifest, k_chunk = Kind.PUT, Kind.DELETE, Kind.MANIFEST, Kind.CHUNK
        k_heartbeat, k_start_of_push = Kind.HEARTBEAT, Kind.START_OF_PUSH
        for i in range(n):
            key = keys_in[i]
            if not key:
                kind[i] = UNDECODABLE
                continue
            header = key[0]
            if header == K.HEADER_PUT_OR_DELETE:
                try:
                    env = decode(values[i], headers[i])
                except E.UndecodableError:
                    kind[i] = UNDECODABLE
                    key_out[i] = key[1:]  # the key is readable: it is unverified in this region from here
                    continue
                k = record_kind(key, env)
                body = env["payloadUnion"][1]
                key_out[i] = key[1:]
                if k is k_put:
                    kind[i] = PUT
                    vhash[i] = value_hash(body["putValue"])
                    deleted[i] = False
                elif k is k_delete:
                    kind[i] = DELETE
                    deleted[i] = True
                elif k is k_manifest:
                    named = manifest_chunk_keys(body["putValue"])
                    if named is None:
                        kind[i] = UNDECODABLE
                        continue
                    kind[i] = MANIFEST
                    chunk_keys[i] = named[0]
                    deleted[i] = False
                elif k is k_chunk:
                    kind[i] = CHUNK
                    payload[i] = body["putValue"]
                    continue
                else:
                    kind[i] = k  # a control or UPDATE payload under a data key: not a replicated value
                    continue
                up = footer_source(env)
                if up is None:
                    # Nothing places a value without a footer. A manifest without one is left as the Put it is,
                    # with no chunk keys: it counts as an unplaced data record, not as evidence of chunking.
                    if kind[i] == MANIFEST:
                        kind[i], chunk_keys[i] = PUT, None
                    continue
                src[i], src_off[i] = up
                rmd[i] = _rmd_vector(body)
            elif header == K.HEADER_CONTROL_MESSAGE:
                try:
                    env = decode(values[i], headers[i])
                except E.UndecodableError:
                    kind[i] = UNDECODABLE
                    continue
                k = record_kind(key, env)
                kind[i] = k
                if k is k_heartbeat:
                    up = footer_source(env)
                    if up is not None:
                        src[i], src_off[i] = up
                    raw = header_value(headers[i], "hbw")
                    if raw is not None:
                        hbw[i] = _decode_hbw(raw)
                elif k is k_start_of_push:
                    chunked[i] = bool(E.control_body(env).get("chunked"))
            elif header not in K.KNOWN_HEADERS:
                kind[i] = UNDECODABLE
        return pa.RecordBatch.from_arrays(
            [
                pa.array(regions, pa.int32()),
                batch.column(names.index("partition")).cast(pa.int32()),
                batch.column(names.index("offset")).cast(pa.int64()),
                pa.array(kind, pa.int8()),
                pa.array(key_out, pa.binary()),
                pa.array(vhash, pa.int64()),
                pa.array(deleted, pa.bool_()),
                pa.array(src, pa.int32()),
                pa.array(src_off, pa.int64()),
                pa.array(hbw, pa.list_(pa.int64())),
                pa.array(rmd, pa.list_(pa.int64())),
                pa.array(chunked, pa.bool_()),
                pa.array(chunk_keys, pa.list_(pa.binary())),
                pa.array(payload, pa.binary()),
            ],
            schema=DECODED_SCHEMA,
        )


def _decode_hbw(raw: bytes) -> list[int] | None:
    from div.heartbeat_headers import HeaderError, decode_hbw

    try:
        return list(decode_hbw(raw).high_watermarks)
    except HeaderError:
        return None
