"""Make a range of an archived topic partition look compacted, as Kafka log compaction would leave it.

Kafka's cleaner keeps the latest record of each key and removes the older ones, so a compacted range has offset
gaps where superseded records were. We do the same to a chosen range of an archive after the run (the embedded
cluster does not compact): a record in [first, last] is removed when a record with the same Kafka key follows it
anywhere later in the partition. Control messages have unique keys and stay; heartbeats share one key, so only
the partition's last heartbeat would survive a full compaction — inside the range, all of them go.

The partition's files are replaced atomically file by file: new files are written under a hidden temporary
directory (readers skip names starting with '.'), then moved in, then the old files are removed.
"""

from __future__ import annotations

import os
import shutil
import uuid

import pyarrow as pa
import pyarrow.compute as pc

from div import archive


def compact_range(directory: str, topic: str, partition: int, first: int, last: int) -> list[int]:
    """Remove superseded records with offsets in [first, last] from one partition of an archive written by
    `div.archive.ArchiveWriter`. Returns the removed offsets (sorted)."""
    prefix = f"{topic}+{partition:05d}+"
    old_files = sorted(
        os.path.join(directory, n)
        for n in os.listdir(directory)
        if n.startswith(prefix) and n.endswith(".parquet")
    )
    if not old_files:
        raise archive.ArchiveError(f"{directory}: no files of {topic}[{partition}] to compact")
    table = pa.Table.from_batches(
        list(archive.iter_partition(directory, topic, partition)), schema=archive.KAFKA_ARROW_SCHEMA
    )
    offsets = table.column("offset").to_pylist()
    keys = table.column("key").to_pylist()
    latest: dict[bytes | None, int] = {}
    for off, key in zip(offsets, keys, strict=True):
        latest[key] = off
    removed = [
        off for off, key in zip(offsets, keys, strict=True) if first <= off <= last and latest[key] > off
    ]
    if not removed:
        return []
    keep = pc.invert(pc.is_in(table.column("offset"), value_set=pa.array(removed, pa.int64())))
    kept = table.filter(keep)
    tmp = os.path.join(directory, f".compact-{uuid.uuid4().hex[:8]}")
    try:
        with archive.ArchiveWriter(tmp) as w:
            w.append(kept)
        new_files = sorted(os.listdir(tmp))
        for name in new_files:
            target = os.path.join(directory, name)
            if os.path.exists(target):
                os.replace(os.path.join(tmp, name), target)
                old_files = [f for f in old_files if f != target]
            else:
                os.rename(os.path.join(tmp, name), target)
        for f in old_files:
            os.unlink(f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return removed
