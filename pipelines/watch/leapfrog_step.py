"""One micro-batch of continuous Leap Frog for one VT partition: the nightly incremental run, on what arrived.

Between two nights `leapfrog --state` keeps, per region partition, where each region's scan stands (offset
reached, final mark, how the scan started, the mark before its first gap) and the records of the keys still in
play (`pipelines.leapfrog.state`). A micro-batch of `tidegauge watch` is then a small incremental run over one
VT partition, with the same three rooms as the batch job and no rule of its own:

1. stage A (`pipelines.leapfrog.scan.SplitScan`) over each region's new records, in offset order;
2. the plan (`leapfrog.plan.plan_marks`) from their summaries and the facts carried from the last micro-batch;
3. the per-key stage (`pipelines.leapfrog.keys.ScanReduce`, heartbeat mode's `VectorKeyStage`) over the new rows
   merged with the carried records — the rows sorted as the fused job's shuffle sorts them.

What it returns is what the next micro-batch needs (`PartitionState`) and the findings. Findings are appended,
never retracted, so a (pair, key) is reported once: the first time a micro-batch finds it. A nightly run over the
same records reports one finding per (pair, key) too, the first in offset order; the two name the same keys.

Chunked values are not resolved here (their chunks are joined with their manifests across a whole run): a
partition whose records hold chunks is reported in `PartitionStep.chunked`, and its values are not compared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from div import archive
from leapfrog.plan import failed_reads, plan_marks
from pipelines.leapfrog import rows as R
from pipelines.leapfrog.carried import CARRIED_SCHEMA, sortkeys
from pipelines.leapfrog.keys import OUT_SCHEMA, MemorySink, ScanReduce
from pipelines.leapfrog.scan import SplitScan
from pipelines.leapfrog.state import region_rows

# the columns of a region's records a step reads: the archive's, as the streaming source gives them
RECORD_COLUMNS = ["offset", "key", "value", "headers"]
WAITING_SCHEMA = pa.schema(
    [
        ("region", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.field("element", archive.HEADER_TYPE))),
    ]
)
# A partition's first comparison waits until every region has sent records (or this many are held): a region
# left out of the first comparison would find, later, that the records it needed were not carried.
MAX_WAITING_RECORDS = 1_000_000
_VT_FIELDS = [
    ("split", pa.int32()),
    ("region", pa.int32()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("key", pa.binary()),
    ("value", pa.binary()),
]


@dataclass
class PartitionState:
    """What one VT partition carries from a micro-batch to the next."""

    facts: dict[tuple[int, int], dict] = field(default_factory=dict)  # (region, partition) → state.json row
    carried: pa.Table | None = None  # CARRIED_SCHEMA: records of keys still in play
    reported: set[tuple[int, int, bytes]] = field(default_factory=set)  # (region_a, region_b, key) found
    waiting: pa.Table | None = None  # WAITING_SCHEMA: records held until every region has sent some

    def to_bytes(self) -> bytes:
        """One self-contained value for a state store: JSON facts and findings, then the carried and the waiting
        records (Arrow IPC)."""
        head = json.dumps(
            {
                "facts": list(self.facts.values()),
                "reported": [[a, b, k.hex()] for a, b, k in sorted(self.reported)],
            }
        ).encode()
        parts = [head, _ipc(self.carried, CARRIED_SCHEMA), _ipc(self.waiting, WAITING_SCHEMA)]
        return b"".join(len(x).to_bytes(8, "little") + x for x in parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> PartitionState:
        parts, at = [], 0
        while at < len(data):
            n = int.from_bytes(data[at : at + 8], "little")
            parts.append(data[at + 8 : at + 8 + n])
            at += 8 + n
        head = json.loads(parts[0])
        carried, waiting = (pa.ipc.open_stream(pa.py_buffer(x)).read_all() for x in parts[1:3])
        return cls(
            facts={(f["region"], f["partition"]): f for f in head["facts"]},
            carried=carried if carried.num_rows else None,
            reported={(a, b, bytes.fromhex(k)) for a, b, k in head["reported"]},
            waiting=waiting if waiting.num_rows else None,
        )


def _ipc(table: pa.Table | None, schema: pa.Schema) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        w.write_table(table if table is not None else schema.empty_table())
    return sink.getvalue().to_pybytes()


@dataclass
class PartitionStep:
    """A micro-batch's result for one partition."""

    state: PartitionState
    findings: pa.Table  # OUT_SCHEMA "F" rows never reported before
    counters: pa.Table  # OUT_SCHEMA "C" rows of this micro-batch
    failed: dict[int, str]  # region → read error: that region's records were left out
    chunked: bool
    waiting: bool = False  # nothing compared yet: some region has sent no record


class LeapfrogStep:
    """Heartbeat-mode Leap Frog over one partition's micro-batches (the watch runs one per VT partition)."""

    def __init__(self, pairs: tuple[tuple[int, int], ...], n_regions: int) -> None:
        self.pairs, self.n = tuple(pairs), n_regions

    def __call__(
        self, partition: int, records: dict[int, pa.Table], state: PartitionState | None = None
    ) -> PartitionStep:
        """`records`: region → that region's new records of `partition` (RECORD_COLUMNS, any order; a region
        may be missing or empty)."""
        state = state or PartitionState()
        if not state.facts:
            records, held = _with_waiting(records, state.waiting)
            have = {x for x, t in records.items() if t is not None and t.num_rows}
            needed = {x for pair in self.pairs for x in pair}
            if not needed <= have and held < MAX_WAITING_RECORDS:
                return PartitionStep(
                    state=PartitionState(reported=state.reported, waiting=_waiting_table(records)),
                    findings=OUT_SCHEMA.empty_table(),
                    counters=OUT_SCHEMA.empty_table(),
                    failed={},
                    chunked=False,
                    waiting=True,
                )
        scan = SplitScan(self.n, "heartbeat", keep_chunks=False, buckets=1)
        parts: list[pa.RecordBatch] = []
        ends: dict[tuple[int, int], int] = {}
        for region, table in sorted(records.items()):
            if table is None or table.num_rows == 0:
                continue
            table = table.sort_by("offset")
            ends[(region, partition)] = int(table.column("offset")[-1].as_py()) + 1
            parts.extend(scan(iter(_vt_batches(table, region, partition))))
        summaries = [json.loads(t) for b in parts for t in _summary_texts(b)]
        rows = [b for b in parts if b.num_rows]
        carried_sortkeys = None
        if state.carried is not None and state.carried.num_rows:
            rows.extend(R.carried_batches(self.n)(iter(state.carried.to_batches())))
            carried_sortkeys = state.carried.column("sortkey")
        sorted_rows = _shuffle_order(rows, carried_sortkeys)
        sink = MemorySink()
        reduce = ScanReduce("heartbeat", self.pairs, self.n, ends, state.facts, sink=sink)
        out = pa.Table.from_batches(list(reduce(iter(sorted_rows.to_batches()))), OUT_SCHEMA)
        facts, _ = plan_marks(summaries, ends, self.n, state.facts)
        kind = out.column("row").to_numpy(zero_copy_only=False)
        findings = out.filter(pa.array(kind == "F"))
        fresh = []
        reported = set(state.reported)
        for a, b, key in zip(
            findings.column("region_a").to_pylist(),
            findings.column("region_b").to_pylist(),
            findings.column("key").to_pylist(),
            strict=True,
        ):
            fresh.append((a, b, key) not in reported)
            reported.add((a, b, key))
        return PartitionStep(
            state=PartitionState(
                facts={(f["region"], f["partition"]): f for f in region_rows(facts, ends, state.facts)},
                carried=sink.table() if sink.batches else None,
                reported=reported,
            ),
            findings=findings.filter(pa.array(fresh, pa.bool_())),
            counters=out.filter(pa.array(kind == "C")),
            failed={r: e for (r, _p), e in failed_reads(summaries).items()},
            chunked=any(rp.chunk_rows for rp in facts.values()),
        )


def _with_waiting(records: dict[int, pa.Table], waiting: pa.Table | None) -> tuple[dict[int, pa.Table], int]:
    """The records held from earlier micro-batches followed by the new ones, per region, and how many."""
    out = {x: t.select(RECORD_COLUMNS) for x, t in records.items() if t is not None and t.num_rows}
    if waiting is not None:
        region = waiting.column("region").to_numpy()
        for x in np.unique(region):
            held = waiting.filter(pa.array(region == x)).select(RECORD_COLUMNS)
            out[int(x)] = pa.concat_tables([held, out[int(x)]]) if int(x) in out else held
    return out, sum(t.num_rows for t in out.values())


def _waiting_table(records: dict[int, pa.Table]) -> pa.Table:
    parts = [
        pa.table(
            {"region": pa.array(np.full(t.num_rows, x, np.int32)), **{c: t.column(c) for c in RECORD_COLUMNS}}
        ).cast(WAITING_SCHEMA)
        for x, t in sorted(records.items())
    ]
    return pa.concat_tables(parts) if parts else WAITING_SCHEMA.empty_table()


def _vt_batches(table: pa.Table, region: int, partition: int):
    """A region's records as `tidegauge_vt` batches, one split (the stage keeps running marks per split)."""
    m = table.num_rows
    cols = [
        pa.array(np.full(m, region, np.int32)),  # split: one per region in a micro-batch
        pa.array(np.full(m, region, np.int32)),
        pa.array(np.full(m, partition, np.int32)),
        table.column("offset").cast(pa.int64()),
        table.column("key").cast(pa.binary()),
        table.column("value").cast(pa.binary()),
    ]
    fields = [pa.field(n, t) for n, t in _VT_FIELDS]
    if "headers" in table.column_names:
        cols.append(table.column("headers"))
        fields.append(pa.field("headers", table.schema.field("headers").type))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields)).to_batches()


def _is_summary(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    """A scan row is a split summary when it has a bucket (`pipelines.leapfrog.rows.summary_batch`)."""
    return table.column("bucket").is_valid().to_numpy(zero_copy_only=False)


def _summary_texts(batch: pa.RecordBatch) -> list[str]:
    is_summary = _is_summary(batch)
    return [batch.column("rec")[int(i)].as_py().decode() for i in np.flatnonzero(is_summary)]


def _shuffle_order(
    batches: list[pa.RecordBatch], carried_sortkeys: pa.ChunkedArray | None = None
) -> pa.Table:
    """The rows as the fused job's reduce task receives them: summaries first, then by (sortkey, key, region,
    offset) (`pipelines.leapfrog.rows.keyed`), in the shuffle's columns. `carried_sortkeys`: the sortkeys of the
    last rows, the carried records, as the state keeps them (computed when they were new rows); a crc32 per row
    in Python is computed only for the others (and for a carried record without one)."""
    table = pa.Table.from_batches(batches, R.SCAN_SCHEMA) if batches else R.SCAN_SCHEMA.empty_table()
    is_summary = _is_summary(table)
    kept = 0 if carried_sortkeys is None else len(carried_sortkeys)
    fresh = table.num_rows - kept
    keys = sortkeys(
        table.column("partition").slice(0, fresh), table.column("key").slice(0, fresh).fill_null(b"")
    )
    sortkey = keys.to_numpy()
    if kept:
        known = carried_sortkeys.combine_chunks()
        if known.null_count:
            missing = known.is_null().to_numpy(zero_copy_only=False)
            computed = sortkeys(
                table.column("partition").slice(fresh), table.column("key").slice(fresh)
            ).to_numpy()
            old = np.where(missing, computed, known.fill_null(0).to_numpy())
        else:
            old = known.to_numpy()
        sortkey = np.concatenate([sortkey, old.astype(np.int64)])
    sortkey = np.where(is_summary, -1, sortkey)
    bucket = np.full(table.num_rows, R.bucket_labels(1)[0], np.int32)
    shuffled = pa.table(
        {
            "bucket": bucket,
            "sortkey": sortkey,
            "key": table.column("key"),
            "region": table.column("region"),
            "offset": table.column("offset"),
            "rec": table.column("rec"),
        }
    )
    return shuffled.sort_by(
        [("sortkey", "ascending"), ("key", "ascending"), ("region", "ascending"), ("offset", "ascending")]
    )
