"""`tidegauge repair plan`: for every key a `leapfrog` output found divergent, the write that makes every region
agree (docs/design.md, "Repair"; docs/outputs.md, `tidegauge repair plan --out DIR`).

The driver reads the leapfrog output (its summary must name the same store and version), then each region's
version topic once, partition by partition, keeping only the divergent keys' current records: each partition's
records go through `heartbeat.change_events.PartitionChanges` — the reading every change reader shares (key
without Venice's header, chunked values put back together, the logical timestamp DCR compares, the coordinate
from the leader footer) — and the last change of a divergent key is its current record there. (The duplicates
the reading drops are writes re-applied after a failover: a leader re-writes a write only when it still wins its
key, so the last delivered change is the record the region serves.) With `--rt`, the
RT write each coordinate names is read from that region's real-time topic (one range per partition). The rule
is `leapfrog.repair.plan_key`; this module only reads and writes. Local engine only: the reads are one pass over
each VT and the output is one row per divergent key.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from div import envelope as E
from div import keys
from div.records import Kind, iter_records
from heartbeat.change_events import PartitionChanges, logical_timestamp
from heartbeat.changes import ChangeState
from leapfrog.compare import OPEN
from leapfrog.repair import CAUSES, NONE, UNDECIDABLE, Record, Repair, plan_key
from leapfrog.results import divergent_keys
from pipelines.core.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_PARTIAL, UsageError
from pipelines.core.output import OutputDir, guard, read_output, write_parquet_file
from pipelines.core.progress import Progress
from pipelines.core.sources import Source, SourceError, SourceSpec, open_source

log = logging.getLogger("tidegauge.repair")

COMMAND = "repair plan"
PLAN_DIR = "plan"
MAX_LISTED = 100

PLAN_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("op", pa.string()),
        ("value", pa.binary()),
        ("logical_ts", pa.int64()),
        ("source_region", pa.int32()),
        ("source_offset", pa.int64()),
        ("regions_to_fix", pa.list_(pa.int32())),
        ("cause", pa.string()),
    ]
)
"""One row per divergent key: `tidegauge repair plan`'s Parquet contract (issue 31)."""

_LEAPFROG_COLUMNS = ["partition", "region_a", "region_b", "type", "key"]


@dataclass
class PlanOptions:
    store: str
    version: int
    sources: list[SourceSpec]
    leapfrog: str
    out: str
    rts: list[SourceSpec] = field(default_factory=list)
    tie_break: int | None = None
    kafka_conf: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def topic(self) -> str:
        return f"{self.store}_v{self.version}"

    @property
    def rt_topic(self) -> str:
        return f"{self.store}_rt"


@dataclass
class Divergent:
    """A divergent key: every (region_a, region_b, type) leapfrog reported for it."""

    partition: int
    key: bytes
    pairs: list[tuple[int, int, str]] = field(default_factory=list)


@dataclass
class Leapfrog:
    path: str
    summary: dict[str, Any]
    keys: dict[tuple[int, bytes], Divergent]


def load_leapfrog(path: str, opts: PlanOptions) -> Leapfrog:
    """The divergent keys of a `tidegauge leapfrog` output (its open findings), checked to be of the store version
    planned."""
    flag = f"--leapfrog {path}"
    where, summary = read_output(path, "--leapfrog", "leapfrog", (None, "leapfrog"))
    if summary.get("store") != opts.store or summary.get("version") != opts.version:
        raise UsageError(
            f"{flag}: compared store {summary.get('store')!r} version {summary.get('version')}, but this plan is for "
            f"store {opts.store!r} version {opts.version}: a plan must be made from a leapfrog run of the same "
            "store version"
        )
    keys: dict[tuple[int, bytes], Divergent] = {}
    d = where / "inconsistencies"
    try:
        files = d.files(".parquet") if d.is_dir() else None
        if files is None:
            raise UsageError(f"{flag}: has no inconsistencies/ directory (docs/outputs.md)")
        rows = []
        for f in files:
            columns = _LEAPFROG_COLUMNS + (
                ["status"] if "status" in pq.read_schema(f.path, filesystem=f.fs).names else []
            )
            rows += pq.read_table(f.path, filesystem=f.fs, columns=columns).to_pylist()
        # only the divergent keys (leapfrog.results.divergent_keys): a healed finding's regions agree again
        divergent = divergent_keys((r["partition"], r["key"], r.get("status")) for r in rows)
        for row in rows:
            k = (int(row["partition"]), bytes(row["key"]))
            if k in divergent and row.get("status") in (None, OPEN):
                keys.setdefault(k, Divergent(*k)).pairs.append(
                    (row["region_a"], row["region_b"], row["type"])
                )
    except (OSError, pa.ArrowException, KeyError) as exc:
        raise UsageError(f"{flag}: inconsistencies/ cannot be read: {exc}") from None
    return Leapfrog(path, summary, keys)


@dataclass
class RegionRead:
    region: int
    records: int = 0
    partitions: list[int] = field(default_factory=list)
    undecodable: int = 0
    problems: list[dict[str, Any]] = field(default_factory=list)


def _open(spec: SourceSpec, opts: PlanOptions, topic: str, flag: str) -> Source:
    source = open_source(spec, opts.kafka_conf.get(spec.region))
    if topic not in source.topics():
        _close(source)
        raise SourceError(f"{flag} {spec.region}={spec.uri}: no topic {topic!r}")
    return source


def _close(source: Source) -> None:
    close = getattr(source, "close", None)  # a Kafka source holds a client; an archive nothing
    if close is not None:
        close()


def read_current(
    spec: SourceSpec, opts: PlanOptions, wanted: dict[int, set[bytes]], n_regions: int, progress: Progress
) -> tuple[dict[tuple[int, bytes], Record | None], RegionRead]:
    """Each wanted key's current record in one region's VT (absent keys: None), reading only the partitions
    that hold wanted keys, each once from its first offset."""
    source = _open(spec, opts, opts.topic, "--source")
    got: dict[tuple[int, bytes], Record | None] = {(p, k): None for p, ks in wanted.items() for k in ks}
    info = RegionRead(spec.region)
    state = ChangeState(opts.store, opts.version, n_regions)
    try:
        _read_partitions(source, spec, opts, wanted, state, got, info, progress)
    finally:
        _close(source)
    return got, info


def _read_partitions(source, spec, opts, wanted, state, got, info, progress) -> None:
    partitions = set(source.partitions(opts.topic))
    for p in sorted(wanted):
        if p not in partitions:
            raise SourceError(f"--source {spec.region}={spec.uri}: {opts.topic} has no partition {p}")
        progress.stage(f"region {spec.region}: {opts.topic}[{p}]")
        first, end = source.bounds(opts.topic, p)
        changes = PartitionChanges(p, state.partition(p))
        mine = wanted[p]
        raw = pa.array([bytes([keys.HEADER_PUT_OR_DELETE]) + k for k in mine], pa.binary())
        for batch in progress.counted(source.iter_partition(opts.topic, p, start=first, end=end)):
            info.records += batch.num_rows
            parts = [batch]
            if not changes.push_started:
                # the StartOfPush, before any data record, says whether the version is chunked
                cut = pc.index(pc.equal(_header(batch), _DATA), True).as_py()
                parts = [batch] if cut < 0 else [batch.slice(0, cut), batch.slice(cut)]
            for part in parts:
                if changes.push_started and not changes.chunked:  # (a chunked version's keys carry suffixes)
                    part = wanted_rows(part, raw)
                for e in changes.feed(part):
                    if e.key in mine:
                        got[(p, e.key)] = Record(
                            e.op, e.value, e.logical_ts, e.upstream_region, e.upstream_offset
                        )
        info.partitions.append(p)
        info.undecodable += len(changes.problems)
        info.problems += [
            {"partition": q.partition, "offset": q.offset, "reason": q.reason} for q in changes.problems
        ][: MAX_LISTED - len(info.problems)]


def wanted_rows(batch: pa.RecordBatch, data_keys: pa.Array) -> pa.RecordBatch:
    """The rows of a version that is not chunked that can bear on the wanted keys' current records: their data
    records (Kafka key = the data header and the key) and every record that is not a data record (control
    messages: heartbeats, segments, the VersionSwap). The rest never becomes one of their events, and decoding
    it was nearly all of a plan's time (bench/bench_repair.py). The rule still sees every heartbeat; it sees
    fewer coordinates, so a redelivered record of a wanted key may pass as new: the same write, the same
    content, the same current record."""
    keep = pc.or_(pc.is_in(batch.column("key"), value_set=data_keys), pc.not_equal(_header(batch), _DATA))
    return batch.filter(keep)


_DATA = pa.scalar(bytes([keys.HEADER_PUT_OR_DELETE]), pa.binary())


def _header(batch: pa.RecordBatch) -> pa.Array:
    """Each record's key header byte (Venice's first key byte: data, control message, update)."""
    return pc.binary_slice(batch.column("key"), 0, 1)


def read_rt_writes(
    spec: SourceSpec, opts: PlanOptions, wanted: dict[int, dict[int, bytes]], progress: Progress
) -> tuple[dict[tuple[int, int, int], Record | None], dict[str, int]]:
    """The RT writes of one region at the wanted (partition → offset → key) positions: (partition, region,
    offset) → the write (op, value, logical timestamp), or None when it is not there, is not a plain Put or
    Delete (a chunked write), or is of another key (the RT of another store)."""
    source = _open(spec, opts, opts.rt_topic, "--rt")
    out: dict[tuple[int, int, int], Record | None] = {}
    counts = {"read": 0, "unreadable": 0}
    try:
        _read_rt(source, spec, opts, wanted, out, counts, progress)
    finally:
        _close(source)
    return out, counts


def _read_rt(source, spec, opts, wanted, out, counts, progress) -> None:
    codec = E.EnvelopeCodec()
    for p, offsets in sorted(wanted.items()):
        progress.stage(f"region {spec.region}: {opts.rt_topic}[{p}]")
        for o in offsets:
            out[(p, spec.region, o)] = None
        if p in source.partitions(opts.rt_topic):
            lo, hi = min(offsets), max(offsets) + 1
            named = pa.array(sorted(offsets), pa.int64())
            for batch in source.iter_partition(opts.rt_topic, p, start=lo, end=hi):
                batch = batch.filter(pc.is_in(batch.column("offset"), value_set=named))  # decode those only
                for rec in iter_records(batch, codec):
                    if rec.offset not in offsets or rec.env is None or rec.key is None:
                        continue
                    if rec.key[1:] != offsets[rec.offset]:
                        continue  # another key at that position: not the write the footer names
                    kind = rec.kind
                    body = rec.env["payloadUnion"][1]
                    if kind is Kind.PUT:
                        w = Record(
                            "PUT", body["putValue"], logical_timestamp(body, rec.env["producerMetadata"])
                        )
                    elif kind is Kind.DELETE:
                        w = Record("DELETE", None, logical_timestamp(body, rec.env["producerMetadata"]))
                    else:
                        continue
                    out[(p, spec.region, rec.offset)] = w
        found = sum(1 for o in offsets if out[(p, spec.region, o)] is not None)
        counts["read"] += found
        counts["unreadable"] += len(offsets) - found


def _value_text(r: Repair) -> str:
    if r.op == "DELETE":
        return "DELETE"
    v = r.value or b""
    head = v[:16].hex() + ("…" if len(v) > 16 else "")
    return f"PUT {len(v)} bytes {head}"


def _write_text(r: Repair) -> str:
    if not r.has_write:
        return "no write"
    src = "a bulk-load record" if r.source_region is None else f"RT write {r.source_region}@{r.source_offset}"
    stamp = f", above the winner's own {r.winner_ts}" if r.stamped_above_winner else ""
    return (
        f"{_value_text(r)} at logical_ts {r.logical_ts}{stamp} (re-emits {src}); regions to fix: "
        f"{', '.join(map(str, r.regions_to_fix))}"
    )


def plan_text(opts: PlanOptions, lf: Leapfrog, plans: dict[tuple[int, bytes], Repair], counts: dict) -> str:
    lines = [
        f"tidegauge repair plan: store {opts.store} version {opts.version}, from {lf.path}",
        f"{counts['divergent_keys']} divergent keys: {counts['writes']} writes "
        f"({counts['stamped_above_winner']} stamped above the winner's timestamp), "
        f"{counts['undecidable']} undecidable, {counts['converged']} already agreeing; RT writes {'read (--rt)' if opts.rts else 'not read (no --rt)'}"
        + (f"; --tie-break {opts.tie_break}" if opts.tie_break is not None else ""),
        "Each write is the winning record re-emitted with its own logical timestamp: a region that holds it or a "
        "newer write ignores it, a write made after the plan still wins. Where a region stores another record at "
        "that timestamp that Venice's tie-break keeps (a poisoned value with a higher hash), the write is stamped "
        "one above the highest timestamp any region holds, which every region takes (said per key).",
        "",
    ]
    by_pair: dict[tuple[int, int], list[tuple[int, bytes, str]]] = {}
    for (p, k), d in sorted(lf.keys.items()):
        for a, b, typ in d.pairs:
            by_pair.setdefault((a, b), []).append((p, k, typ))
    for (a, b), items in sorted(by_pair.items()):
        lines.append(f"pair {a}-{b}: {len(items)} keys")
        for p, k, typ in items:
            r = plans[(p, k)]
            lines.append(f"  partition {p} key {keys.shown(k)}  ({typ})  cause: {r.cause}")
            lines.append(f"    write: {_write_text(r)}")
            if r.detail:
                lines.append(f"    why: {r.detail}")
        lines.append("")
    return "\n".join(lines)


def run(opts: PlanOptions) -> int:
    """Read, plan, write. Returns the exit code: 0 every divergent key has a write (or agrees now), 1 some are
    undecidable, 3 some records could not be decoded (their keys may be planned on an older record)."""
    inputs = {"--leapfrog": opts.leapfrog}
    inputs |= {f"--source {s.region}": s.uri for s in opts.sources}
    inputs |= {f"--rt {s.region}": s.uri for s in opts.rts}
    guard(COMMAND, {"--out": opts.out}, inputs)
    regions = [s.region for s in opts.sources]
    if opts.tie_break is not None and opts.tie_break not in regions:
        raise UsageError(
            f"--tie-break {opts.tie_break}: not a region of --source ({', '.join(map(str, regions))})"
        )
    unknown_rt = [s.region for s in opts.rts if s.region not in regions]
    if unknown_rt:
        raise UsageError(f"--rt {unknown_rt[0]}: no --source of that region")
    lf = load_leapfrog(opts.leapfrog, opts)
    named = sorted({x for d in lf.keys.values() for a, b, _ in d.pairs for x in (a, b)})
    missing = [x for x in named if x not in regions]
    if missing:
        raise UsageError(
            f"--leapfrog {opts.leapfrog}: reports divergences of region {missing[0]}, which has no --source"
        )
    n_regions = int(lf.summary.get("store_regions") or max(regions) + 1)
    wanted: dict[int, set[bytes]] = {}
    for p, k in lf.keys:
        wanted.setdefault(p, set()).add(k)
    current: dict[int, dict[tuple[int, bytes], Record | None]] = {}
    reads: list[RegionRead] = []
    rt_counts = {"read": 0, "unreadable": 0}
    with Progress(COMMAND) as progress:
        for spec in opts.sources:
            current[spec.region], info = read_current(spec, opts, wanted, n_regions, progress)
            reads.append(info)
        rt: dict[tuple[int, int, int], Record | None] = {}
        for spec in opts.rts:
            need: dict[int, dict[int, bytes]] = {}
            for x in regions:
                for (p, k), rec in current[x].items():
                    if rec is not None and rec.region == spec.region and rec.offset is not None:
                        need.setdefault(p, {})[rec.offset] = k
            got, c = read_rt_writes(spec, opts, need, progress)
            rt |= got
            rt_counts = {n: rt_counts[n] + c[n] for n in c}
    given_rt = {s.region for s in opts.rts}
    plans: dict[tuple[int, bytes], Repair] = {}
    for p, k in sorted(lf.keys):
        per_region = {x: current[x][(p, k)] for x in regions}
        writes = None
        if given_rt:
            writes = {
                (rec.region, rec.offset): rt.get((p, rec.region, rec.offset))
                for rec in per_region.values()
                if rec is not None and rec.region in given_rt and rec.offset is not None
            }
        plans[(p, k)] = plan_key(per_region, writes, opts.tie_break)
    by_cause = {c: 0 for c in CAUSES}
    for r in plans.values():
        by_cause[r.cause] = by_cause.get(r.cause, 0) + 1
    undecidable = [(p, k, r) for (p, k), r in plans.items() if r.cause == UNDECIDABLE]
    undecodable = sum(i.undecodable for i in reads)
    code = EXIT_FINDINGS if undecidable else (EXIT_PARTIAL if undecodable else EXIT_CLEAN)
    counts = {
        "divergent_keys": len(plans),
        "writes": sum(1 for r in plans.values() if r.has_write),
        "undecidable": len(undecidable),
        "converged": by_cause.get("converged", 0),
        "stamped_above_winner": sum(1 for r in plans.values() if r.stamped_above_winner),
    }
    rows = [
        {
            "partition": p,
            "key": k,
            "op": r.op,
            "value": r.value if r.op == "PUT" else None,
            "logical_ts": r.logical_ts,
            "source_region": r.source_region,
            "source_offset": r.source_offset,
            "regions_to_fix": list(r.regions_to_fix),
            "cause": r.cause,
        }
        for (p, k), r in sorted(plans.items())
    ]
    with OutputDir(opts.out, COMMAND) as out:
        plan_dir = out.file(PLAN_DIR)
        plan_dir.makedirs()
        write_parquet_file(pa.Table.from_pylist(rows, schema=PLAN_SCHEMA), plan_dir / "part-00000.parquet")
        (out.file("plan.txt")).write_text(plan_text(opts, lf, plans, counts) + "\n")
        doc = {
            **out.common_fields(COMMAND, code, {s.region: s.uri for s in opts.sources}),
            "verdict": "findings" if undecidable else ("partial" if undecodable else "clean"),
            "store": opts.store,
            "version": opts.version,
            "leapfrog": lf.path,
            "rt_sources": {str(s.region): s.uri for s in opts.rts},
            "tie_break": opts.tie_break,
            **counts,
            "by_cause": by_cause,
            "by_op": {op: sum(1 for r in plans.values() if r.op == op) for op in ("PUT", "DELETE", NONE)},
            "regions_to_fix": {
                str(x): sum(1 for r in plans.values() if x in r.regions_to_fix) for x in regions
            },
            "undecidable_keys": [
                {"partition": p, "key": k.hex(), "regions": list(r.undecided), "why": r.detail}
                for p, k, r in undecidable[:MAX_LISTED]
            ],
            "writes_stamped_above_winner": [
                {
                    "partition": p,
                    "key": k.hex(),
                    "winner_ts": r.winner_ts,
                    "logical_ts": r.logical_ts,
                    "regions": list(r.ignored_by),
                }
                for (p, k), r in sorted(plans.items())
                if r.stamped_above_winner
            ][:MAX_LISTED],
            "rt_writes": rt_counts,
            "reads": [
                {
                    "region": i.region,
                    "topic": opts.topic,
                    "partitions": i.partitions,
                    "records": i.records,
                    "undecodable": i.undecodable,
                    "problems": i.problems,
                }
                for i in reads
            ],
        }
        out.write_json("summary.json", doc)
    _report(undecidable, counts)
    return code


def _report(undecidable: Iterable[tuple[int, bytes, Repair]], counts: dict[str, int]) -> None:
    undecidable = list(undecidable)
    log.info(
        "%d divergent keys: %d writes (%d stamped above the winner's timestamp), %d undecidable, %d already agreeing",
        counts["divergent_keys"],
        counts["writes"],
        counts["stamped_above_winner"],
        counts["undecidable"],
        counts["converged"],
    )
    for p, k, r in undecidable[:MAX_LISTED]:
        log.warning(
            "undecidable: partition %d key %s (regions %s): %s",
            p,
            k.hex(),
            ", ".join(map(str, r.undecided)),
            r.detail,
        )
