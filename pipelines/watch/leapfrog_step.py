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
A finding has a status, open or healed (`leapfrog.compare.status_of`), as the nightly job's: every micro-batch that
compares a reported key again says its status now, and the step returns the reported findings whose status changed
(`PartitionStep.status_changes`: a repair healed them, or a newer write opened them again).

Chunked values are compared through their manifests, with the batch job's rules (`pipelines.leapfrog.chunks`): in
a chunked version (a chunked StartOfPush, or chunks and manifests, in the partition's records so far) each
manifest becomes a value whose hash is its chunks' payloads' in manifest order, keys lose their `02 00` suffix,
and chunk keys (chunks, and the DELETEs that clean them up) are not values. Chunks precede their manifest in a
VT, but a micro-batch may end between them: the chunks wait in `PartitionState.chunks` until the manifest that
names them comes, and leave it then, or when a DELETE cleans them up. Chunks before End of Push (the batch
push's, whose manifests name no upstream region and lie before the scan start, which the comparison leaves out)
are not held. A manifest whose chunks are not all there is left out, as the batch job leaves it out. The batch
job finds a manifest's chunks anywhere in its run; here they must come before it or in its micro-batch, as Venice
writes them. If the version shows itself chunked only after the partition's records were compared as an unchunked
version's (no chunked StartOfPush in view), `PartitionStep.chunked_late` says so: those comparisons used suffixed
keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from div import archive
from div.envelope import learned_versions
from div.envelope_columns import Heads, reads_as_new
from leapfrog.compare import HEALED, OPEN
from leapfrog.plan import failed_reads, plan_marks
from pipelines.leapfrog import chunks as C
from pipelines.leapfrog import decode as V
from pipelines.leapfrog import rows as R
from pipelines.leapfrog.carried import CARRIED_SCHEMA
from pipelines.leapfrog.keys import OUT_SCHEMA, MemorySink, ScanReduce
from pipelines.leapfrog.scan import SCAN_SCHEMA, SplitScan
from pipelines.leapfrog.state import region_rows
from pipelines.leapfrog.withhold import unverified_index, withhold

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
# a region's records as a step reads them; a micro-batch's frame whose records all lack headers comes from pandas
# with a null-typed column, which must not change the table's type
RECORD_SCHEMA = pa.schema([f for f in WAITING_SCHEMA if f.name != "region"])
# chunks waiting for the manifest that names them (chunks precede their manifest in a VT)
CHUNKS_SCHEMA = pa.schema(
    [("region", pa.int32()), ("offset", pa.int64()), ("key", pa.binary()), ("payload", pa.binary())]
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
    healed: set[tuple[int, int, bytes]] = field(default_factory=set)  # those of `reported` healed now
    waiting: pa.Table | None = None  # WAITING_SCHEMA: records held until every region has sent some
    chunked: bool = False  # the records in view showed a chunked version (`chunks.chunked_version`)
    chunks: pa.Table | None = None  # CHUNKS_SCHEMA: chunks whose manifest has not arrived yet
    # with the settled records kept apart (`pipelines.watch.settled`): the size of their base and log, and the
    # token of this update; None: `carried` holds the settled records too
    settled: dict | None = None

    def to_bytes(self) -> bytes:
        """One self-contained value for a state store: JSON facts and findings, then the carried, the waiting
        records and the chunks (Arrow IPC)."""
        head = json.dumps(
            {
                "facts": list(self.facts.values()),
                "reported": [[a, b, k.hex()] for a, b, k in sorted(self.reported)],
                "healed": [[a, b, k.hex()] for a, b, k in sorted(self.healed)],
                "chunked": self.chunked,
                **({"settled": self.settled} if self.settled is not None else {}),
            }
        ).encode()
        parts = [
            head,
            _ipc(self.carried, CARRIED_SCHEMA),
            _ipc(self.waiting, WAITING_SCHEMA),
            _ipc(self.chunks, CHUNKS_SCHEMA),
        ]
        return b"".join(len(x).to_bytes(8, "little") + x for x in parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> PartitionState:
        parts, at = [], 0
        while at < len(data):
            n = int.from_bytes(data[at : at + 8], "little")
            parts.append(data[at + 8 : at + 8 + n])
            at += 8 + n
        head = json.loads(parts[0])
        # (a state written before chunks were held has three parts)
        carried, waiting, *chunks = (pa.ipc.open_stream(pa.py_buffer(x)).read_all() for x in parts[1:4])
        return cls(
            facts={(f["region"], f["partition"]): f for f in head["facts"]},
            carried=carried if carried.num_rows else None,
            reported={(a, b, bytes.fromhex(k)) for a, b, k in head["reported"]},
            healed={(a, b, bytes.fromhex(k)) for a, b, k in head.get("healed", ())},
            waiting=waiting if waiting.num_rows else None,
            chunked=bool(head.get("chunked")),
            chunks=chunks[0] if chunks and chunks[0].num_rows else None,
            settled=head.get("settled"),
        )


# Every micro-batch rewrites each touched partition's whole state (tens of MB at 100k keys a partition): LZ4 makes
# that a third of the bytes to send to the state store, write and checkpoint, for a few ms a MB.
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


def _ipc(table: pa.Table | None, schema: pa.Schema) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=_IPC_OPTIONS) as w:
        w.write_table(table if table is not None else schema.empty_table())
    return sink.getvalue().to_pybytes()


@dataclass
class PartitionStep:
    """A micro-batch's result for one partition."""

    state: PartitionState
    findings: pa.Table  # OUT_SCHEMA "F" rows never reported before
    counters: pa.Table  # OUT_SCHEMA "C" rows of this micro-batch
    failed: dict[int, str]  # region → read error: that region's records were left out
    # the version showed itself chunked only after this partition's records had been compared as an unchunked
    # version's (no chunked StartOfPush in view before): those comparisons used suffixed keys, so findings may
    # differ from a nightly run's
    chunked_late: bool = False
    waiting: bool = False  # nothing compared yet: some region has sent no record
    # the longest heartbeat vector met: wider than the step's region count means the watch was started with too
    # few of the store's regions (before any heartbeat said how many): it must be restarted with --regions
    widest_hbw: int = 0
    # (region_a, region_b, key, status) of findings reported before whose status changed in this micro-batch
    status_changes: list[tuple[int, int, bytes, str]] = field(default_factory=list)


class LeapfrogStep:
    """Heartbeat-mode Leap Frog over one partition's micro-batches (the watch runs one per VT partition)."""

    def __init__(self, pairs: tuple[tuple[int, int], ...], n_regions: int) -> None:
        self.pairs, self.n = tuple(pairs), n_regions

    def __call__(
        self,
        partition: int,
        records: dict[int, pa.Table],
        state: PartitionState | None = None,
        envelopes: dict[int, Heads] | None = None,
        settled: Callable[[pa.Array], pa.Table] | None = None,
    ) -> PartitionStep:
        """`records`: region → that region's new records of `partition` (RECORD_COLUMNS, any order; a region
        may be missing or empty). `envelopes`: region → `div.envelope_columns.read_envelopes` of its records, when
        a reader before this step read them (the watch reads each record once for Leap Frog and DIV).

        `settled`: when the settled keys' records are kept apart from `state.carried` (`pipelines.watch.settled`),
        gives the carried records (CARRIED_SCHEMA) of the settled keys among the distinct keys it is given: the
        keys of this micro-batch's values. Only those take part in the comparison; the per-key stage would pass
        the others on unchanged (`keys.pass_untouched`), so the findings are the same."""
        state = state or PartitionState()
        envelopes = dict(envelopes or {})
        if not state.facts:
            if state.waiting is not None:
                # records held from earlier micro-batches go first: nobody read them this time
                for x in np.unique(state.waiting.column("region").to_numpy()):
                    envelopes.pop(int(x), None)
            records, held = _with_waiting(records, state.waiting)
            have = {x for x, t in records.items() if t is not None and t.num_rows}
            needed = {x for pair in self.pairs for x in pair}
            if not needed <= have and held < MAX_WAITING_RECORDS:
                return PartitionStep(
                    state=PartitionState(
                        reported=state.reported, healed=state.healed, waiting=_waiting_table(records)
                    ),
                    findings=OUT_SCHEMA.empty_table(),
                    counters=OUT_SCHEMA.empty_table(),
                    failed={},
                    waiting=True,
                )
        # the two-phase job's scan rows: chunks and manifests with their payloads and chunk keys; each region's
        # codec goes on from what the facts say it learnt from `vtp` headers in earlier micro-batches
        scan = SplitScan(self.n, "heartbeat", facts=state.facts)
        scanned: dict[int, pa.Table] = {}
        summaries: list[dict] = []
        ends: dict[tuple[int, int], int] = {}
        for region, table in sorted(records.items()):
            if table is None or table.num_rows == 0:
                continue
            order = archive.offset_order(table)
            if order is not None:
                table = table.take(order)
            ends[(region, partition)] = int(table.column("offset")[-1].as_py()) + 1
            batches = _vt_batches(table, region, partition)
            heads = None
            if region in envelopes and reads_as_new(learned_versions(scan.learned.get((region, partition)))):
                read, at = envelopes[region], 0
                if order is not None:
                    read = read.take(order)
                heads = []
                for b in batches:
                    heads.append(read.slice(at, at + b.num_rows))
                    at += b.num_rows
                heads = iter(heads)
            out = pa.Table.from_batches(list(scan(iter(batches), heads)), SCAN_SCHEMA)
            order = out.column("order").to_numpy()
            summaries.extend(
                json.loads(t) for t in out.filter(pa.array(order == 0)).column("summary").to_pylist()
            )
            scanned[region] = out.filter(pa.array(order == 1))
        facts, _ = plan_marks(summaries, ends, self.n, state.facts)
        chunked = state.chunked or C.chunked_version(facts.values())
        held = state.chunks
        if chunked:
            scanned, held = _values_of_chunked(scanned, state.chunks, facts, partition)
        else:
            scanned = {
                x: t.filter(pc.is_in(t.column("kind"), pa.array(C.DATA_KINDS, pa.int8())))
                for x, t in scanned.items()
            }
        rows = [R.summary_batch(sm, 1) for sm in summaries]
        rows.extend(_narrow(t, self.n, x, partition) for x, t in scanned.items() if t.num_rows)
        carried_sortkeys = None
        carried = state.carried
        if settled is not None:
            touched = [
                t.column("key").combine_chunks().cast(pa.binary()) for t in scanned.values() if t.num_rows
            ]
            found = settled(pc.unique(pa.concat_arrays(touched))) if touched else None
            if found is not None and found.num_rows:
                found = found.cast(CARRIED_SCHEMA)
                carried = (
                    found if carried is None else pa.concat_tables([carried.cast(CARRIED_SCHEMA), found])
                )
        if carried is not None and carried.num_rows:
            rows.extend(R.carried_batches(self.n)(iter(carried.to_batches())))
            carried_sortkeys = carried.column("sortkey")
        sorted_rows = R.reduce_order(rows, carried_sortkeys)
        sink = MemorySink()
        watched: dict[tuple[int, int, int], list[bytes]] = {}
        for a, b, key in state.reported:
            watched.setdefault((partition, a, b), []).append(key)
        reduce = ScanReduce(
            "heartbeat",
            self.pairs,
            self.n,
            ends,
            state.facts,
            sink=sink,
            watched={k: tuple(v) for k, v in watched.items()},
        )
        out = pa.Table.from_batches(list(reduce(iter(sorted_rows.to_batches()))), OUT_SCHEMA)
        kind = out.column("row").to_numpy(zero_copy_only=False)
        # as the nightly job does, a finding that rests on a record that could not be decoded is withheld, with
        # the unreadable records read so far: they include every one before the heartbeats that allowed the
        # comparison (the nightly job also withholds for those after them)
        findings = withhold(out.filter(pa.array(kind == "F")), *unverified_index(facts))
        fresh = []
        reported, healed = set(state.reported), set(state.healed)
        changes: list[tuple[int, int, bytes, str]] = []
        for a, b, key in zip(
            findings.column("region_a").to_pylist(),
            findings.column("region_b").to_pylist(),
            findings.column("key").to_pylist(),
            strict=True,
        ):
            fresh.append((a, b, key) not in reported)
        # every status this micro-batch found: its findings' and, for keys reported before that it found no
        # finding of, its "H" rows
        now = out.filter(pa.array((kind == "F") | (kind == "H")))
        withheld = _keys(out.filter(pa.array(kind == "F"))) - _keys(findings)
        for a, b, key, status in zip(
            *(now.column(c).to_pylist() for c in ("region_a", "region_b", "key", "status")), strict=True
        ):
            if (a, b, key) in withheld:  # it rests on an undecodable record: not reported, status unknown
                continue
            was = (a, b, key) in reported
            before = HEALED if (a, b, key) in healed else OPEN
            reported.add((a, b, key))
            (healed.add if status == HEALED else healed.discard)((a, b, key))
            if was and status != before:
                changes.append((a, b, key, status))
        return PartitionStep(
            state=PartitionState(
                facts={(f["region"], f["partition"]): f for f in region_rows(facts, ends, state.facts)},
                carried=sink.table() if sink.batches else None,
                reported=reported,
                healed=healed,
                chunked=chunked,
                chunks=held,
            ),
            findings=findings.filter(pa.array(fresh, pa.bool_())),
            status_changes=sorted(changes),
            counters=out.filter(pa.array(kind == "C")),
            failed={r: e for (r, _p), e in failed_reads(summaries).items()},
            chunked_late=chunked and not state.chunked and bool(state.facts),
            widest_hbw=max((sm.get("widest_hbw", 0) for sm in summaries), default=0),
        )


def _keys(findings: pa.Table) -> set[tuple[int, int, bytes]]:
    """(region_a, region_b, key) of finding rows."""
    return set(zip(*(findings.column(c).to_pylist() for c in ("region_a", "region_b", "key")), strict=True))


def _values_of_chunked(
    scanned: dict[int, pa.Table], held: pa.Table | None, facts: dict, partition: int
) -> tuple[dict[int, pa.Table], pa.Table | None]:
    """A chunked version's values (`chunks.resolve`) among each region's scan rows, each manifest hashed
    through its chunks — those held from earlier micro-batches and this one's —, and the chunks to hold for the
    next: not those a manifest used, nor those a DELETE cleaned up, nor those before End of Push when the
    region's scan starts there (only a manifest the comparison leaves out could name them)."""
    out: dict[int, pa.Table] = {}
    keep: list[pa.Table] = []
    held_region = held.column("region").to_numpy() if held is not None else np.zeros(0, np.int32)
    for region in sorted(set(scanned) | {int(x) for x in np.unique(held_region)}):
        t = scanned.get(region, SCAN_SCHEMA.empty_table())
        kind = t.column("kind").to_numpy()
        is_chunk = kind == V.CHUNK
        chunks = t.filter(pa.array(is_chunk)).select(["offset", "key", "payload"])
        if held is not None:
            mine = held.filter(pa.array(held_region == region)).select(["offset", "key", "payload"])
            chunks = pa.concat_tables([mine, chunks.cast(mine.schema)])
        rows_of: dict[bytes, list[tuple[int, bytes | None]]] = {}
        for o, k, p in zip(
            *(chunks.column(c).to_pylist() for c in ("offset", "key", "payload")), strict=True
        ):
            rows_of.setdefault(k, []).append((o, p))
        hashes: list[int | None] = [None] * t.num_rows
        used: set[bytes] = set()
        manifest = np.flatnonzero(kind == V.MANIFEST)
        if len(manifest):
            names = t.column("chunk_keys").take(pa.array(manifest)).to_pylist()
            for i, keys in zip(manifest.tolist(), names, strict=True):
                found = {k: [p for _, p in rows_of[k]] for k in keys if k in rows_of}
                hashes[i] = C.manifest_hash(C.manifest_parts(keys, found))
                if hashes[i] is not None:
                    used.update(keys)
        # a DELETE under a chunk key (Venice cleaning up a replaced value's chunks) ends the chunks before it
        cleaned: dict[bytes, int] = {}
        deletes = np.flatnonzero(kind == V.DELETE)
        for o, k in zip(
            t.column("offset").take(pa.array(deletes)).to_pylist(),
            t.column("key").take(pa.array(deletes)).to_pylist(),
            strict=True,
        ):
            if k is not None and k[-2:] != C.VALUE_SUFFIX:
                cleaned[k] = max(cleaned.get(k, -1), o)
        # chunks before End of Push, where this micro-batch starts the region's scan: the batch push's, named by
        # manifests before it (which the comparison leaves out); Venice's leaders write after End of Push. (A
        # resumed region's `start_after` is only where the last micro-batch stopped.)
        rp = facts.get((region, partition))
        start = rp.start_after if rp is not None and rp.start_kind == "end_of_push" else -1
        left = [
            (region, o, k, p)
            for k, rs in rows_of.items()
            if k not in used
            for o, p in rs
            if o > start and o > cleaned.get(k, -1)
        ]
        if left:
            keep.append(
                pa.Table.from_pylist(
                    [dict(zip(CHUNKS_SCHEMA.names, r, strict=True)) for r in left], CHUNKS_SCHEMA
                )
            )
        with_hash = t.append_column("manifest_hash", pa.array(hashes, pa.int64()))
        if region in scanned:
            out[region] = C.resolve(with_hash)
    return out, (pa.concat_tables(keep) if keep else None)


def _narrow(t: pa.Table, n: int, region: int, partition: int) -> pa.RecordBatch:
    """A region's value rows (`scan.SCAN_SCHEMA`) as the fused job's shuffle rows (`rows.data_batch`), which is
    what `SplitScan(..., buckets=...)` makes of the same rows."""
    t = t.combine_chunks()
    return R.data_batch(
        n,
        partition,
        region,
        region,  # split: one per region in a micro-batch (`_vt_batches`)
        t.column("seg").to_numpy(),
        t.column("key").chunk(0),
        t.column("offset").to_numpy(),
        t.column("value_hash").chunk(0),
        t.column("src").chunk(0),
        t.column("src_offset").chunk(0),
        R.unpack_marks(t.column("hw").chunk(0), n),
    )


def _with_waiting(records: dict[int, pa.Table], waiting: pa.Table | None) -> tuple[dict[int, pa.Table], int]:
    """The records held from earlier micro-batches followed by the new ones, per region, and how many."""
    out = {
        x: t.select(RECORD_COLUMNS).cast(RECORD_SCHEMA)
        for x, t in records.items()
        if t is not None and t.num_rows
    }
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
