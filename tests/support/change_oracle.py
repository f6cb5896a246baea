"""What a change-capture reader must deliver from an archive: the one rule (`PartitionChanges`) in one pass over each
partition of a region's VT, from a fresh state. Readers that stop and resume, or read as a stream, must equal it."""

from __future__ import annotations

import pyarrow as pa

from div import archive
from heartbeat.change_events import CHANGES_SCHEMA, PartitionChanges, events_table
from heartbeat.changes import PartitionState


def one_pass(directory: str, topic: str, n_regions: int) -> pa.Table:
    """The region's changes (`CHANGES_SCHEMA`), sorted by partition and VT offset."""
    tables = [CHANGES_SCHEMA.empty_table()]
    for info in archive.describe(directory):
        if info.topic != topic:
            continue
        stream = PartitionChanges(info.partition, PartitionState.fresh(n_regions))
        for batch in archive.iter_partition(directory, topic, info.partition):
            tables.append(events_table(stream.feed(batch)))
    return pa.concat_tables(tables).sort_by([("partition", "ascending"), ("vt_offset", "ascending")])
