"""Archive records with every awkward field (null keys and values, big and empty headers) and a reader of one
partition, shared by the tests of the archive format and of its Spark reader."""

from __future__ import annotations

import pyarrow as pa

from div import archive
from div.archive import KAFKA_ARROW_SCHEMA

BIG_HEADER = bytes(range(256)) * 70  # 17,920 bytes, every byte value


def make_records(topic: str, partition: int, offsets, ts0_ms: int = 1_700_000_000_000) -> list[tuple]:
    out = []
    for o in offsets:
        headers = None if o % 3 else [("hbw", BIG_HEADER if o % 2 == 0 else b"\x00\x01"), ("empty", None)]
        key = None if o % 11 == 5 else b"k%d" % o
        value = None if o % 13 == 7 else b"\xff\x00v%d" % o
        out.append((topic, partition, o, key, value, ts0_ms + o, 0, headers))
    return out


def read_all(directory, topic, partition, **kw) -> pa.Table:
    batches = list(archive.iter_partition(directory, topic, partition, **kw))
    schema = batches[0].schema if batches else KAFKA_ARROW_SCHEMA
    return pa.Table.from_batches(batches, schema=schema)
