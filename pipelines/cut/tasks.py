"""`tidegauge cut`'s tasks: each reads one partition range and answers, the same step on both engines.

A task is plain data (`Task`, JSON for a Spark task) and `run_task` its one step: "heartbeats" reads a VT
partition's heartbeats only (key, offset and headers; the values too for a heartbeat-aligned cut, which needs each
RT heartbeat's time from the envelope); "rt" finds C in an RT partition from its record timestamps
(`heartbeat.cuts.exact_cut`, fed batch by batch); "snapshot" reads region X's VT from its first offset up to ceil
through the change rule every reader uses (`heartbeat.change_events.PartitionChanges`: bulk load, chunked values,
duplicates), writes the partition's snapshot file (`pipelines.cut.snapshot`), and with `--rt` decodes only the RT
writes of the keys the VT leaves undecided. A task whose source fails answers its error; the run goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from div import envelope as E
from div import keys as K
from div.heartbeat_headers import HBW_HEADER, decode_hbw, header_value
from div.records import Kind, iter_records
from heartbeat.change_events import PartitionChanges, events_table, logical_timestamp
from heartbeat.changes import PartitionState
from heartbeat.cuts import exact_cut
from heartbeat.records import parse_vt_heartbeat
from leapfrog.repair import Record
from pipelines.core.output import ParquetFileWriter
from pipelines.core.sources import read_range
from pipelines.core.storage import Location, locate
from pipelines.cut.snapshot import SNAPSHOT_SCHEMA, snapshot_table, undecided_keys

_HEARTBEAT_KEY = pa.scalar(K.HEARTBEAT_KEY, pa.binary())


@dataclass
class Task:
    """One read: `kind` "heartbeats" (a VT partition's heartbeats), "rt" (an RT partition's C from its
    timestamps) or "snapshot" (X's VT up to ceil, and with `rts` the RT writes of the undecided keys)."""

    kind: str
    region: int
    uri: str
    topic: str
    partition: int
    start: int
    end: int
    with_origin: bool = False  # heartbeats: decode the envelopes for the RT heartbeats' times
    at_ms: int = 0
    cut: list[int] = field(default_factory=list)  # snapshot: C by region
    n_regions: int = 0
    # snapshot with --rt: per region, (uri, topic, start, end) of its RT partition up to the cut
    rts: dict[int, tuple[str, str, int, int]] = field(default_factory=dict)
    out: str = ""  # snapshot: the directory its part file goes into

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Task:
        d = json.loads(text)
        d["rts"] = {int(r): tuple(v) for r, v in d["rts"].items()}
        return cls(**d)


Reader = Callable[..., Iterator[pa.RecordBatch]]


def run_task(task: Task, kafka_conf: dict[int, dict[str, Any]], read: Reader = read_range) -> dict[str, Any]:
    """Run one task; its answer as a JSON-able dict (`records` read, `undecodable` offsets, `error` when the
    source failed: the partition then answers nothing)."""
    try:
        if task.kind == "heartbeats":
            return _heartbeats(
                task, read(task.uri, kafka_conf.get(task.region), *_range(task), columns=_hb_cols(task))
            )
        if task.kind == "rt":
            return _rt_cut(
                task,
                read(task.uri, kafka_conf.get(task.region), *_range(task), columns=["offset", "timestamp"]),
            )
        return _snapshot(task, kafka_conf, read)
    except (
        Exception
    ) as exc:  # a source failing mid-way (or a bug): this partition answers nothing, the run goes on
        return {"records": 0, "undecodable": [], "error": f"{type(exc).__name__}: {exc}"}


def _range(task: Task) -> tuple[str, int, int, int]:
    return task.topic, task.partition, task.start, task.end


def _hb_cols(task: Task) -> list[str]:
    return ["key", "offset", "headers", "value"] if task.with_origin else ["key", "offset", "headers"]


def _heartbeats(task: Task, batches: Iterable[pa.RecordBatch]) -> dict[str, Any]:
    """The VT heartbeats' offsets and hbw vectors, and (with_origin) what each says of its RT heartbeat."""
    codec = E.EnvelopeCodec()
    offsets: list[int] = []
    vectors: list[list[int]] = []
    marks: list[list[int]] = []
    bad: list[int] = []
    records = 0
    for batch in batches:
        records += batch.num_rows
        hb = batch.filter(pc.equal(batch.column("key"), _HEARTBEAT_KEY))
        if not hb.num_rows:
            continue
        if task.with_origin:
            for rec in iter_records(hb, codec):
                try:
                    if rec.env is None:
                        raise ValueError("undecodable")
                    h = parse_vt_heartbeat(rec.key, rec.env, rec.headers, decode_div_state=False)
                except Exception:  # a damaged heartbeat: counted with its offset, claims nothing
                    bad.append(rec.offset)
                    continue
                if h is None:
                    continue
                # a plain Venice heartbeat still says which RT heartbeat it reflects (the aligned cut), but claims
                # no vector (no floor or ceil)
                marks.append([rec.offset, h.origin_region, h.origin_rt_offset, h.origin_ms])
                if h.watermarks is not None:
                    offsets.append(rec.offset)
                    vectors.append(list(h.watermarks.high_watermarks))
        else:
            for off, headers in zip(
                hb.column("offset").to_pylist(), hb.column("headers").to_pylist(), strict=True
            ):
                raw = header_value(headers, HBW_HEADER)
                if raw is None:
                    continue
                try:
                    vectors.append(list(decode_hbw(raw).high_watermarks))
                except Exception:
                    bad.append(off)
                    continue
                offsets.append(off)
    return {"records": records, "undecodable": bad, "offsets": offsets, "vectors": vectors, "marks": marks}


def _rt_cut(task: Task, batches: Iterable[pa.RecordBatch]) -> dict[str, Any]:
    """C of one RT partition from its records' timestamps (`heartbeat.cuts.exact_cut`, fed batch by batch)."""
    c, records = -1, 0
    for batch in batches:
        records += batch.num_rows
        ts = batch.column("timestamp").cast(pa.int64())
        ms = np.asarray(pc.fill_null(ts, np.iinfo(np.int64).max).to_numpy(zero_copy_only=False)) // 1000
        c = exact_cut(batch.column("offset").to_numpy(zero_copy_only=False), ms, task.at_ms, c)
    return {"records": records, "undecodable": [], "c": c}


def part_file(directory: Location, partition: int) -> Location:
    return directory / f"part-{partition:05d}.parquet"


def _snapshot(task: Task, kafka_conf: dict[int, dict[str, Any]], read: Reader) -> dict[str, Any]:
    """X's change events up to ceil, the snapshot rows, and (with RT sources) the undecided keys resolved."""
    changes = PartitionChanges(task.partition, PartitionState.fresh(task.n_regions))
    parts: list[pa.Table] = []
    records = 0
    topic, _, start, end = _range(task)
    gaps = GapTracker(start)
    for batch in read(task.uri, kafka_conf.get(task.region), *_range(task)):
        records += batch.num_rows
        gaps.feed(batch.column("offset"))
        events = changes.feed(batch)
        if events:
            parts.append(events_table(events))
    events = pa.concat_tables(parts) if parts else events_table([])
    rt: dict[bytes, list[Record]] | None = None
    rt_records = 0
    wanted: list[bytes] = []
    rt_bad: list[list[int]] = []
    if task.rts:
        wanted = undecided_keys(events, task.cut, gaps.last_gap(end))
        rt, rt_records, rt_bad = _rt_writes(task, wanted, kafka_conf, read)
    table = snapshot_table(task.partition, events, task.cut, rt, gaps.last_gap(end))
    writer = ParquetFileWriter(part_file(locate(task.out), task.partition), SNAPSHOT_SCHEMA)
    try:
        writer.write(table)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    ops = table.column("op").to_pylist()
    return {
        "records": records,
        "rt_records": rt_records,
        "resolved": len(wanted),
        "rt_undecodable": rt_bad,
        "undecodable": [p.offset for p in changes.problems],
        "rows": table.num_rows,
        "exact": int(pc.sum(table.column("exact")).as_py() or 0),
        "none": ops.count("NONE"),
        "bulk_load": sum(1 for e in events.column("upstream_region").is_null().to_pylist() if e),
    }


class GapTracker:
    """The highest offset after which a VT range misses offsets (a log cleaner's work), fed the range's offset
    column batch by batch: records missing there may have been a key's newer state (`leapfrog.snapshot`)."""

    def __init__(self, start: int) -> None:
        self.previous = start - 1  # a range that starts later than planned lost nothing a key's state needs
        self.gap = -1

    def feed(self, offsets: pa.Array | pa.ChunkedArray) -> None:
        off = np.asarray(offsets.to_numpy(zero_copy_only=False) if len(offsets) else [], dtype=np.int64)
        if not len(off):
            return
        if off[0] > self.previous + 1 and self.previous >= 0:
            self.gap = max(self.gap, int(self.previous))
        steps = np.flatnonzero(off[1:] > off[:-1] + 1)
        if len(steps):
            self.gap = max(self.gap, int(off[steps[-1]]))
        self.previous = int(off[-1])

    def last_gap(self, end: int) -> int:
        """`gap`, or the last offset read when the range ends before `end` (records missing up to it)."""
        return max(self.gap, self.previous) if 0 <= self.previous < end - 1 else self.gap


def _rt_writes(
    task: Task, wanted: list[bytes], kafka_conf: dict[int, dict[str, Any]], read: Reader
) -> tuple[dict[bytes, list[Record]], int, list[list[int]]]:
    """Every region's RT writes at or below the cut of the wanted keys (only those are decoded), the records read,
    and [region, offset] of each of the wanted keys' RT records that could not be decoded (the key's resolution
    may then be wrong: the run is partial)."""
    out: dict[bytes, list[Record]] = {k: [] for k in wanted}
    bad: list[list[int]] = []
    if not wanted:
        return out, 0, bad
    raw = pa.array([bytes([K.HEADER_PUT_OR_DELETE]) + k for k in wanted], pa.binary())
    codec = E.EnvelopeCodec()
    records = 0
    for region, (uri, topic, start, end) in sorted(task.rts.items()):
        if end <= start:
            continue
        for batch in read(uri, kafka_conf.get(region), topic, task.partition, start, end):
            records += batch.num_rows
            for rec in iter_records(batch.filter(pc.is_in(batch.column("key"), value_set=raw)), codec):
                if rec.env is None:
                    bad.append([region, rec.offset])
                    continue
                if rec.kind not in (Kind.PUT, Kind.DELETE):
                    continue
                body = rec.env["payloadUnion"][1]
                ts = logical_timestamp(body, rec.env["producerMetadata"])
                value = body["putValue"] if rec.kind is Kind.PUT else None
                op = "PUT" if rec.kind is Kind.PUT else "DELETE"
                out[rec.key[1:]].append(Record(op, value, ts, region, rec.offset))
    return out, records, bad
