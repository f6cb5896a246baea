"""Chunked values as Leap Frog reads them (venice-protocol-notes §1.7): the one statement of the rules.

In a chunked version every data key ends with an Avro `ChunkedKeySuffix`: `02 00` for whole values and manifests,
another suffix for chunk keys (the chunks themselves, and the DELETEs Venice writes to clean up a replaced value's
chunks). A manifest names its chunk keys in order; its value is the concatenation of their payloads, so its value
hash is the hash of the payloads in manifest order (`decode.chunked_value_hash`). What Leap Frog compares, per key:

- a manifest becomes a Put whose value hash is its chunks' (`manifest_hash`); a manifest whose chunks are not all
  there (or that names none) is left out, as an undecodable record would be;
- a Put or Delete whose key does not end with `02 00` is a chunk key: not a value, left out;
- every other Put or Delete is a value of the key without its suffix;
- chunks themselves are never values.

Both the batch job (`pipelines.leapfrog.job`, whose Spark join finds each manifest's chunk rows across a run) and
the watch (`pipelines.watch.leapfrog_step`, which keeps chunks in its state until their manifest arrives) call
`manifest_hash` and `resolve`; only how each finds a manifest's chunk rows differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.leapfrog import decode as V

VALUE_SUFFIX = bytes(
    [2, 0]
)  # ChunkedKeySuffix of a value or a manifest: union branch 1 (null chunkId), false
DATA_KINDS = (V.PUT, V.DELETE)  # the records Leap Frog compares (a resolved manifest becomes a Put)


def chunked_version(facts: Iterable) -> bool:
    """Whether the records in view show a chunked version: a chunked StartOfPush, or chunks or manifests.
    Chunking is a property of the whole version: then every data key of every region carries a suffix."""
    return any(rp.chunked or rp.chunk_rows for rp in facts)


def manifest_hash(parts: Iterable[tuple[int, bytes | None]]) -> int | None:
    """A manifest's value hash from its chunk rows: `parts` holds, for each chunk key it names (its index in the
    manifest), one entry per chunk row found under that key — or one `(index, None)` when there is none. None
    (the manifest is left out) when a chunk is missing or the manifest names none."""
    ordered = sorted(parts, key=lambda p: (p[0], p[1] is not None, p[1] or b""))  # Spark's sort_array order
    payloads = [p for _, p in ordered]
    if not payloads or any(p is None for p in payloads):
        return None
    return V.chunked_value_hash(payloads)


def manifest_parts(
    chunk_keys: list[bytes], rows_of: Mapping[bytes, list[bytes | None]]
) -> list[tuple[int, bytes | None]]:
    """`manifest_hash`'s parts when the chunk rows are at hand: chunk key → the payloads of its rows (what the
    batch job's left join of a manifest's keys with the chunk rows gives)."""
    return [(i, p) for i, k in enumerate(chunk_keys) for p in (rows_of.get(k) or [None])]


def resolve(rows: pa.Table | pa.RecordBatch) -> pa.Table:
    """The values among a chunked version's scan rows (`scan.SCAN_SCHEMA` columns `kind`, `key`, `value_hash`,
    with `manifest_hash`: a manifest's `manifest_hash`, else null): manifests with a hash become Puts with it,
    keys lose their `02 00`, chunk keys and everything that is not a value are left out. The other columns pass
    unchanged; `manifest_hash` is dropped."""
    t = pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows
    kind = t.column("kind").to_numpy(zero_copy_only=False)
    manifest = kind == V.MANIFEST
    hashed = manifest & t.column("manifest_hash").is_valid().to_numpy(zero_copy_only=False)
    key = t.column("key")
    # a null key is no chunk key (it has no suffix to judge): kept, as the batch job's column rule keeps it
    value_key = pc.fill_null(pc.equal(pc.binary_slice(key, -2), VALUE_SUFFIX), True)
    keep = (np.isin(kind, DATA_KINDS) | hashed) & value_key.to_numpy(zero_copy_only=False)
    value_hash = pc.if_else(pa.array(manifest), t.column("manifest_hash"), t.column("value_hash"))
    kind_type = t.schema.field("kind").type
    out = t.set_column(
        t.schema.get_field_index("value_hash"), t.schema.field("value_hash"), value_hash.cast(pa.int64())
    )
    out = out.set_column(
        out.schema.get_field_index("kind"),
        out.schema.field("kind"),
        pa.array(np.where(manifest, V.PUT, kind), kind_type),
    )
    out = out.set_column(
        out.schema.get_field_index("key"), out.schema.field("key"), pc.binary_slice(key, 0, -2)
    )
    return out.filter(pa.array(keep)).drop_columns(["manifest_hash"])


def resolve_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`resolve` for `mapInArrow`."""
    for b in batches:
        yield from resolve(b).to_batches()
