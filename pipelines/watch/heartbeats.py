"""The heartbeats a micro-batch brought, for the watch's heartbeat metrics (age since the last one, delay).

Proactive fault detection rests on one number per (region, VT partition, source region): how long ago the
newest heartbeat from the source region arrived in the region's VT. A leader that stops heartbeating, or a region
that stops replicating, shows as an age that keeps growing even when nobody writes. The records are read with the
`lag` job's own `LagMonitor`, so a VT heartbeat means the same thing to both.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from div import archive
from div.envelope import EnvelopeCodec
from div.keys import HEARTBEAT_KEY
from div.records import iter_records
from heartbeat.lag import LagMonitor


def newest_heartbeats(region: int, partition: int, records: pa.Table) -> list[dict]:
    """The newest VT heartbeat from each source region among one region partition's `records` (the archive's
    offset, key, value, headers and timestamp, the broker's time, which is when a heartbeat arrived: ≤ 0 or null
    and the origin time stands in, as in `lag`; any order). One row per source region: region, partition,
    source_region, origin_ms, arrival_ms. Heartbeats that cannot be decoded are left out (DIV reports them)."""
    is_hb = pc.fill_null(pc.equal(records.column("key"), pa.scalar(HEARTBEAT_KEY, pa.binary())), False)
    if not pc.any(is_hb).as_py():
        return []
    hb = records.filter(is_hb)
    times = archive.timestamps_ms(hb)  # of the heartbeats only: a Python list, not one per record
    monitor = LagMonitor(vt_region=region, partition=partition, keep_series=False)
    newest: dict[int, tuple[int, int]] = {}
    for rec, ms in zip(iter_records(hb, EnvelopeCodec()), times, strict=True):
        if rec.env is None:
            continue
        seen = monitor.feed(rec.key, rec.env, rec.headers, rec.offset, ms)
        if seen is None:
            continue
        at = (seen.vt_timestamp_ms, seen.origin_ms)
        if seen.origin_region not in newest or at > newest[seen.origin_region]:
            newest[seen.origin_region] = at
    return [
        {
            "region": region,
            "partition": partition,
            "source_region": source,
            "origin_ms": origin,
            "arrival_ms": arrival,
        }
        for source, (arrival, origin) in sorted(newest.items())
    ]
