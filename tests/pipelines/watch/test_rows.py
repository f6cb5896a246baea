"""The watch query's packed rows back as records, per (region, topic): what `WatchProcessor` hands Leap Frog (the
VT of every region) and DIV (each region's topics on their own)."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from pipelines.core.stream_source import pack
from pipelines.watch.rows import unpacked


def _blob(*offsets: int) -> bytes:
    return pack(pa.record_batch({"offset": pa.array(offsets, pa.int64())}))


def test_packed_rows_come_back_per_region_and_topic_in_the_order_given():
    frames = [
        pd.DataFrame(
            {
                "region": [1, 0, 1],
                "topic": ["s_v1", "s_rt", "s_v1"],
                "partition": [3, 3, 3],
                "records": [_blob(5, 6), _blob(9), _blob(7)],
            }
        ),
        pd.DataFrame({"region": [], "topic": [], "partition": [], "records": []}),  # an empty frame: nothing
        # pandas may hand a column of ints over as floats: the keys are ints all the same
        pd.DataFrame({"region": [0.0], "topic": ["s_rt"], "partition": [3], "records": [_blob(10)]}),
    ]
    got = unpacked(iter(frames), ("region", "topic"))
    assert list(got) == [(0, "s_rt"), (1, "s_v1")]
    assert all(type(region) is int for region, _ in got)
    assert got[(0, "s_rt")].column("offset").to_pylist() == [9, 10]
    assert got[(1, "s_v1")].column("offset").to_pylist() == [5, 6, 7]
    # without columns: every record of the group under 0
    assert unpacked(iter(frames[:1]))[0].column("offset").to_pylist() == [5, 6, 9, 7]
