"""`tidegauge changes`: the change stream of one region's version topic, each change once (docs/design.md, "Change
capture"; docs/outputs.md, `tidegauge changes --out DIR`).

The driver settles and checks `--state` (`pipelines.changes.state`), opens the source, learns the store's region
count and plans one task per VT partition: read [the state's position, the end fixed now). Each task feeds its
records to `heartbeat.change_events.PartitionChanges` — the one rule every change reader drives — and writes the
partition's events, in VT order, to `changes/part-<partition>.parquet` (`run_partition`). The local engine runs
the tasks one after another here (`run_local`), the Spark engine one Spark task per partition
(`pipelines.changes.spark`); both finish here (`finish`): summary.json, then the state, committed after the output.

A partition that cannot be read (the source fails mid-way) delivers nothing this run and keeps its state: its file
is not written, the run is partial (exit 3), and the next run reads it again. A record that cannot become a change
(undecodable, no coordinate, a chunked value missing a chunk) is counted with its offset and never delivered; the
run is partial (exit 3) and the state moves past it, as a reader must (it cannot become readable later).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from div.heartbeat_headers import widest_hbw as hbw_width
from heartbeat.change_events import CHANGES_SCHEMA, CutSeeker, PartitionChanges, Problem, events_table
from heartbeat.change_reader import UnendedVersionError, initial_state
from heartbeat.changes import ChangeState, PartitionState, Verdict, cut_marks, cut_state, log_digest
from heartbeat.cuts import Cut, CutError, format_time
from pipelines.changes import state as states
from pipelines.core.errors import UsageError
from pipelines.core.evidence import (
    MAX_LISTED_OFFSETS,
    PartitionEvidence,
    describe_short,
    summary_fields,
    verdict,
)
from pipelines.core.output import OutputDir, ParquetFileWriter, guard
from pipelines.core.progress import Progress
from pipelines.core.publish import current
from pipelines.core.sources import Source, SourceError, SourceSpec, open_source
from pipelines.core.storage import Location, StorageError, locate

log = logging.getLogger("tidegauge.changes")

COMMAND = "changes"
CHANGES_DIR = "changes"
PROBE_RECORDS = 4096  # records read from the end of a partition to find a heartbeat vector (the region count)
PROBE_PARTITIONS = 4
FRESH, RESUME, SWAP, FROM_CUT = "fresh", "resume", "swap", "cut"
READ_MARK = (
    "read.json"  # what a consumer writes into --out once it has read a run's changes (docs/outputs.md)
)


@dataclass
class ChangesOptions:
    store: str
    version: int
    source: SourceSpec
    out: str
    state_dir: str | None = None
    kafka_conf: dict[str, Any] = field(default_factory=dict)
    regions: int | None = None  # the store's region count; None: the state's, else the heartbeats'
    engine: str = "local"
    region_given: bool = False  # the source was given as ID=URI (summary.json's `sources` names the id)
    follow_unended: bool = (
        False  # --follow-unended: swap although the state has not read the old version's end
    )
    from_cut: str | None = None  # --from-cut: a cut.json; the run delivers the changes above that cut

    @property
    def region(self) -> int | None:
        """The region whose VT is read, when the user said it (`ID=LOC`); never guessed."""
        return self.source.region if self.region_given else None

    @property
    def topic(self) -> str:
        return f"{self.store}_v{self.version}"


@dataclass
class PartitionTask:
    """One VT partition: read [start, end) (end fixed on the driver) from `state`. `first` is the partition's
    first offset in the source, `planned_records` what an archive promises for the range (None: unknown)."""

    partition: int
    start: int
    end: int
    first: int
    state: PartitionState
    planned_records: int | None = None
    cut: tuple[int, ...] | None = (
        None  # --from-cut: C of this partition; the task seeks its start from `start`
    )


@dataclass
class PartitionOutcome:
    """What one task did: records read, verdict counts, events delivered, problems (the first
    MAX_LISTED_OFFSETS listed, all counted), the state to keep; or why it failed (then nothing was delivered)."""

    partition: int
    records: int = 0
    last_offset: int | None = None
    already_read: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    delivered: int = 0
    bulk_load: int = 0
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0
    state: PartitionState | None = None
    error: str | None = None
    cut_start: int | None = None  # --from-cut: where the changes above the cut start (None: none yet)
    folded: int = 0  # --from-cut: records read before that start (none of them is above the cut)

    def count(self, v: Verdict) -> int:
        return self.counts.get(v.name, 0)

    def to_json(self) -> str:
        """For a Spark task's result row: the state through its own strict byte codec."""
        keys = ("partition", "records", "last_offset", "already_read", "counts", "cut_start", "folded")
        d = {k: getattr(self, k) for k in keys}
        d |= {"delivered": self.delivered, "bulk_load": self.bulk_load, "problem_count": self.problem_count}
        d["problems"] = [list(p) for p in self.problems]
        d["error"] = self.error
        if self.state is not None:
            n = len(self.state.marks)
            raw = ChangeState("-", 0, n, {self.partition: self.state}).to_bytes()
            d["state"] = base64.b64encode(raw).decode()
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> PartitionOutcome:
        d = json.loads(text)
        raw = d.pop("state", None)
        d["problems"] = [Problem(*p) for p in d["problems"]]
        out = cls(**d)
        if raw is not None:
            out.state = ChangeState.from_bytes(base64.b64decode(raw)).partitions[out.partition]
        return out


def partition_file(changes_dir: Location, partition: int) -> Location:
    return changes_dir / f"part-{partition:05d}.parquet"


def run_partition(
    task: PartitionTask, batches: Iterable[pa.RecordBatch], changes_dir: Location
) -> PartitionOutcome:
    """Feed one partition's records (in VT order, from the task's start) to the rule and write what it delivers to
    `changes_dir/part-<partition>.parquet` (appearing whole, with the schema even when empty). The one step both
    engines run. A read that fails leaves no file and keeps the task's state."""
    out = PartitionOutcome(task.partition)
    # from a cut: the records before the start (`heartbeat.changes.from_cut`) are folded, never delivered
    seeker = None if task.cut is None else CutSeeker(task.partition, task.cut, len(task.state.marks))
    changes = PartitionChanges(task.partition, task.state) if seeker is None else None
    writer = ParquetFileWriter(partition_file(changes_dir, task.partition), CHANGES_SCHEMA)
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            out.records += batch.num_rows
            out.last_offset = int(batch.column("offset")[-1].as_py())
            if changes is None:
                rest = seeker.feed(batch)
                if not seeker.found:
                    continue
                changes = PartitionChanges(task.partition, seeker.state())
            else:
                rest = (batch,)
            for b in rest:
                events = changes.feed(b)
                if events:
                    out.delivered += len(events)
                    out.bulk_load += sum(1 for e in events if e.upstream_region is None)
                    writer.write(events_table(events))
        if out.delivered == 0:
            writer.write(CHANGES_SCHEMA.empty_table())
        writer.close()
    except Exception as exc:  # the source failed mid-way (or a bug): this partition delivers nothing this run
        writer.abort()
        return PartitionOutcome(task.partition, error=_error_text(exc))
    if seeker is not None:
        out.folded = seeker.records
        out.cut_start = seeker.state().position if seeker.found else None
    if changes is None:  # from a cut, and nothing above it yet: the next run seeks on from here
        out.state = seeker.state()
        return out
    out.already_read = changes.already_read
    out.counts = {v.name: n for v, n in changes.counts.items()}
    out.problem_count = len(changes.problems)
    out.problems = list(changes.problems[:MAX_LISTED_OFFSETS])
    out.state = changes.state()
    return out


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, (SourceError, OSError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


# -- the driver ---------------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    """Everything a run knows before it reads a record."""

    loaded: states.Loaded
    source: Source
    base: ChangeState  # the state the tasks start from (after a version swap's follow)
    used: str  # FRESH, RESUME, SWAP or FROM_CUT
    regions_from: str  # where the region count came from: state, --regions, heartbeats
    tasks: list[PartitionTask]
    cut: Cut | None = None
    log_checked: list[int] = field(default_factory=list)  # partitions whose log identity matched
    log_unchecked: dict[int, str] = field(default_factory=dict)  # partition -> why it could not be checked


def widest_hbw(batches: Iterable[pa.RecordBatch]) -> int:
    """The length of the longest `hbw` vector among the batches' records (0: none)."""
    return max((hbw_width(b.column("headers").to_pylist()) for b in batches), default=0)


def probe_regions(source: Source, topic: str, partitions: list[int]) -> int:
    """The store's region count as the newest heartbeats say it (the length of their `hbw` vectors, which name
    every region of the store), from the tails of the first partitions; 0 when none has one."""
    for p in partitions[:PROBE_PARTITIONS]:
        first, end = source.bounds(topic, p)
        start = max(first, end - PROBE_RECORDS)
        if end > start:
            widest = widest_hbw(source.iter_partition(topic, p, start=start, end=end, columns=["headers"]))
            if widest:
                return widest
    return 0


def start_state(
    loaded: ChangeState | None, opts: ChangesOptions, state_file: str
) -> tuple[ChangeState | None, str]:
    """The state to read version N with, and how: FRESH (no state), RESUME (a state of N) or SWAP (of N-1:
    followed). The decision is the consumer API's (`heartbeat.change_reader.initial_state`), so every reader
    resumes and swaps alike; a state of another store or version is a usage error naming both, and so is a state
    of another region than `--source ID=LOC` names."""
    if loaded is None:
        return None, FRESH
    if opts.from_cut is not None:
        raise UsageError(
            f"--from-cut {opts.from_cut} and --state {opts.state_dir}: the state directory already holds a state "
            f"(of store {loaded.store!r} version {loaded.version}), and a run starts either from it or from the "
            "cut. Give a new --state directory to start at the cut (its state then resumes as usual), or leave "
            "out --from-cut to resume"
        )
    if opts.region is not None and loaded.region is not None and loaded.region != opts.region:
        raise UsageError(
            f"--state {state_file}: was written for region {loaded.region}'s version topic, and --source "
            f"{opts.region}={opts.source.uri} is region {opts.region}'s: a state belongs to one region's VT "
            "(positions and watermarks differ between regions); nothing was delivered"
        )
    try:
        state = initial_state(opts.store, opts.version, loaded, None, opts.follow_unended)
    except UnendedVersionError as exc:
        raise UsageError(f"--state {state_file}: {exc}") from None
    except ValueError as exc:
        raise UsageError(
            f"--state {state_file}: {exc}; this run reads store {opts.store!r} version {opts.version} (use another "
            "--state directory, or a new one to start afresh)"
        ) from None
    return state, RESUME if loaded.version == opts.version else SWAP


def check_unread(out: str) -> None:
    """Refuse an --out whose published output holds changes no consumer has marked read (`READ_MARK` naming its
    run): replacing it would erase them for good while the state moves on (docs/outputs.md)."""
    try:
        target = locate(out)
        if not target.is_dir():
            return
        published = current(target)
        doc = json.loads((published / "summary.json").read_bytes())
    except (OSError, ValueError, StorageError):
        return  # nothing published there (check_output judges the rest)
    if not isinstance(doc, dict) or doc.get("job") != COMMAND or not doc.get("delivered"):
        return
    run = doc.get("run")
    if run is not None and read_marked(target) == run:
        return
    run_text = f"run {run}, " if run else ""
    state = doc.get("state") or {}
    raise UsageError(
        f"--out {out}: holds the changes of an earlier run ({run_text}{doc['delivered']} changes, state "
        f"{state.get('from')} -> {state.get('to')}) that no consumer marked as read; a run never replaces changes "
        f'that may not have been read. Read them, then mark them read by writing {{"run": "{run}"}} to '
        f"{out}/{READ_MARK}; or give each run its own --out (docs/outputs.md)"
    )


def read_marked(target: Location) -> str | None:
    """The run a consumer marked read in `target/read.json` (`{"run": ...}`), or None."""
    try:
        doc = json.loads((target / READ_MARK).read_bytes())
    except (OSError, ValueError):
        return None
    return doc.get("run") if isinstance(doc, dict) and isinstance(doc.get("run"), str) else None


def read_cut(path: str) -> Cut:
    """The cut.json at `path` (a usage error naming it when it cannot be read or is not a cut)."""
    try:
        text = locate(path).read_bytes()
    except (OSError, StorageError) as exc:
        raise UsageError(f"--from-cut {path}: cannot be read ({exc})") from None
    try:
        return Cut.from_json(text, f"--from-cut {path}")
    except CutError as exc:
        raise UsageError(str(exc)) from None


def load_cut(opts: ChangesOptions) -> Cut:
    """--from-cut's cut.json, of this store and version (else a usage error naming both)."""
    cut = read_cut(opts.from_cut)
    if (cut.store, cut.version) != (opts.store, opts.version):
        raise UsageError(
            f"--from-cut {opts.from_cut}: is a cut of store {cut.store!r} version {cut.version}; this run reads "
            f"store {opts.store!r} version {opts.version} (a cut names positions of one version's topics only)"
        )
    return cut


def check_log(source: Source, opts: ChangesOptions, state: ChangeState, state_file: str) -> tuple[list, dict]:
    """Refuse (usage error, nothing delivered) a source whose VT is not the one the state was written for: each
    partition's `LogId` record must be there, unchanged. Returns the partitions checked and, for the others, why
    they could not be (no identity in a state written before format 2; the record gone: retention, compaction)."""
    checked, unchecked = [], {}
    for p, ps in state.partitions.items():
        if ps.log_id is None:
            unchecked[p] = (
                "the state holds no log identity (written by an earlier tidegauge, or before End of Push)"
            )
            continue
        off = ps.log_id.offset
        first, end = source.bounds(opts.topic, p)
        found = None
        if first <= off < end:
            for batch in source.iter_partition(
                opts.topic, p, start=off, end=off + 1, columns=["offset", "key", "value"]
            ):
                for o, k, v in zip(
                    *(batch.column(c).to_pylist() for c in ("offset", "key", "value")), strict=True
                ):
                    if o == off:
                        found = log_digest(k, v)
        if found is None:
            unchecked[p] = f"offset {off} is not in the source (it holds {first}..{end - 1})"
        elif found != ps.log_id.digest:
            said = f"region {state.region}'s" if state.region is not None else "another"
            raise UsageError(
                f"--state {state_file}: was written for {said} version topic: partition {p}'s record at offset "
                f"{off} was {ps.log_id.digest.hex()}, and --source {opts.source.uri} holds {found.hex()} there. A "
                "state belongs to one region's VT (positions and watermarks differ between regions); give that "
                "region's source, or a new --state directory; nothing was delivered"
            )
        else:
            checked.append(p)
    for p, why in unchecked.items():
        log.warning("%s[%d]: the state's log could not be checked: %s", opts.topic, p, why)
    return checked, unchecked


def prepare(opts: ChangesOptions) -> Prepared:
    """Checks, state, source and plan: everything before the first record is read. Raises a usage error (exit 2)
    for anything wrong, before anything is written (but settling a killed run's commit in --state)."""
    guard(
        COMMAND,
        {"--out": opts.out, "--state": opts.state_dir},
        {"--source": opts.source.uri, "--from-cut": opts.from_cut},
    )
    loaded = states.load(opts.state_dir) if opts.state_dir else states.Loaded(None, None)
    state_file = f"{opts.state_dir}/{states.STATE_FILE}" if opts.state_dir else ""
    state, used = start_state(loaded.state, opts, state_file)
    check_unread(opts.out)
    cut = load_cut(opts) if opts.from_cut is not None else None
    source = open_source(opts.source, opts.kafka_conf)
    topics = source.topics()
    where = f"--source {opts.source.uri}"
    if not topics:
        what = (
            "no topic"
            if source.spec.is_kafka
            else "no record (no Parquet file in the archive schema holds one)"
        )
        raise SourceError(f"{where}: holds {what}; there is no change to read")
    if opts.topic not in topics:
        vts = [t for t in topics if t.startswith(f"{opts.store}_v")]
        hint = f" (it has {', '.join(vts)})" if vts else f" (it has no version topic of store {opts.store!r})"
        raise SourceError(f"{where}: no topic {opts.topic!r}{hint}")
    partitions = source.partitions(opts.topic)
    if state is not None:
        n, regions_from = state.n_regions, "state"
        if opts.regions is not None and opts.regions != n:
            raise UsageError(
                f"--regions {opts.regions}: the state in --state {opts.state_dir} is of a store of {n} regions"
            )
    elif opts.regions is not None:
        n, regions_from = opts.regions, "--regions"
    else:
        n, regions_from = probe_regions(source, opts.topic, partitions), "heartbeats"
        if n == 0 and cut is not None and cut.n_regions:
            n, regions_from = cut.n_regions, "--from-cut"
        if n == 0:
            if all(source.bounds(opts.topic, p)[1] <= source.bounds(opts.topic, p)[0] for p in partitions):
                raise SourceError(
                    f"{where}: topic {opts.topic!r} holds no record yet; there is no change to read"
                )
            raise UsageError(
                f"cannot tell how many regions store {opts.store!r} has: no heartbeat with an hbw vector in the "
                f"last {PROBE_RECORDS} records of {opts.topic}'s first partitions; give --regions N"
            )
    checked, unchecked = check_log(source, opts, state, state_file) if used == RESUME else ([], {})
    base = state if state is not None else ChangeState(opts.store, opts.version, n)
    if opts.region is not None:
        base = base.with_region(opts.region)  # (a state of another region was refused above)
    marks: dict[int, tuple[int, ...]] = {}
    if cut is not None:
        used = FROM_CUT
        missing = sorted(set(partitions) - set(cut.partitions))
        if missing:
            raise UsageError(
                f"--from-cut {opts.from_cut}: has no partition {', '.join(map(str, missing))} of {opts.topic} "
                f"(it has {', '.join(map(str, cut.partitions)) or 'none'}): not a cut of this topic"
            )
        try:
            marks = {p: cut_marks(cut.vector(p), n) for p in partitions}
        except ValueError as exc:
            raise UsageError(f"--from-cut {opts.from_cut}: {exc}") from None
        base = base.replace({p: cut_state(m, n) for p, m in marks.items()})
    tasks = []
    for p in partitions:
        first, end = source.bounds(opts.topic, p)
        ps = base.partition(p)
        start = max(ps.position, first)
        if ps.position > end:
            log.warning(
                "%s[%d]: the state is at offset %d but the source ends at %d: nothing to read (is this the "
                "region the state was built on?)",
                opts.topic,
                p,
                ps.position,
                end,
            )
        elif ps.position < first and ps.position > 0:
            log.warning(
                "%s[%d]: offsets %d..%d are no longer in the source (retention): changes among them cannot be "
                "delivered",
                opts.topic,
                p,
                ps.position,
                first - 1,
            )
        if cut is not None and first > 0:
            log.warning(
                "%s[%d]: offsets 0..%d are no longer in the source (retention): the changes above the cut among "
                "them cannot be delivered",
                opts.topic,
                p,
                first - 1,
            )
        planned = source.planned_records(opts.topic, p) if start <= first else None
        tasks.append(PartitionTask(p, start, max(end, start), first, ps, planned, marks.get(p)))
    return Prepared(loaded, source, base, used, regions_from, tasks, cut, checked, unchecked)


def evidence_for(
    opts: ChangesOptions, prep: Prepared, outcomes: dict[int, PartitionOutcome]
) -> list[PartitionEvidence]:
    out = []
    region = opts.region
    for t in prep.tasks:
        o = outcomes.get(t.partition)
        e = PartitionEvidence(
            region, opts.topic, t.partition, t.start, t.end, planned_records=t.planned_records
        )
        if o is None or o.error is not None:
            e.error = o.error if o is not None else "no result"
        else:
            e.read_records = o.records
            # a Kafka range may end in compacted-away offsets; an archive's last planned offset must be read
            e.reached_end = opts.source.is_kafka or (o.last_offset is not None and o.last_offset >= t.end - 1)
            e.note_undecodable(p.offset for p in o.problems)
            e.undecodable = o.problem_count
        out.append(e)
    return out


def _duplicates(counts: dict[str, int]) -> dict[str, int]:
    below_record, below_heartbeat = counts.get("BELOW_RECORD", 0), counts.get("BELOW_HEARTBEAT", 0)
    return {
        "total": below_record + below_heartbeat,
        "below_record": below_record,
        "below_heartbeat": below_heartbeat,
    }


def _problem_json(p: Problem) -> dict[str, Any]:
    return {"topic": p.topic, "partition": p.partition, "offset": p.offset, "reason": p.reason}


def _partition_json(t: PartitionTask, o: PartitionOutcome | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "partition": t.partition,
        "read": {"from": t.start, "to": t.end, "state_position": t.state.position, "records": 0},
    }
    if o is None or o.error is not None:
        doc["error"] = o.error if o is not None else "no result"
        doc["state"] = _state_json(t.state)
        return doc
    doc["read"] |= {"records": o.records, "last_offset": o.last_offset, "already_read": o.already_read}
    if t.cut is not None:
        doc["cut"] = {"rt": list(t.cut), "start": o.cut_start, "records_before_start": o.folded}
    doc |= {
        "delivered": o.delivered,
        "bulk_load": o.bulk_load,
        "duplicates_dropped": _duplicates(o.counts),
        "bulk_skipped": o.count(Verdict.BULK_SKIPPED),
        "undecodable": o.problem_count,
        "problems": [_problem_json(p) for p in o.problems],
        "verdicts": dict(sorted(o.counts.items())),
        "state": _state_json(o.state),
        "error": None,
    }
    return doc


def _state_json(ps: PartitionState | None) -> dict[str, Any] | None:
    if ps is None:
        return None
    return {
        "position": ps.position,
        "phase": ps.phase.name.lower(),
        "marks": list(ps.marks),
        "ended": ps.ended,
    }


def finish(
    opts: ChangesOptions, prep: Prepared, out: OutputDir, outcomes: dict[int, PartitionOutcome], engine: str
) -> tuple[int, bytes]:
    """Everything after the tasks, for both engines, inside the output's `with`: the new state, summary.json, and
    (with --state) the pending commit, written last before the output is published. Returns the exit code and the
    new state's bytes, for `state.commit` once the output is published."""
    done = {p: o.state for p, o in outcomes.items() if o.error is None and o.state is not None}
    new_state = prep.base.replace(done)
    new = new_state.to_bytes()
    evidence = evidence_for(opts, prep, outcomes)
    failed = [
        t.partition for t in prep.tasks if outcomes.get(t.partition) is None or outcomes[t.partition].error
    ]
    code = verdict(0, evidence, len(failed))[1]
    for line in describe_short(evidence):
        log.warning("%s", line)
    ok = [o for o in outcomes.values() if o.error is None]
    counts: dict[str, int] = {}
    for o in ok:
        for k, n in o.counts.items():
            counts[k] = counts.get(k, 0) + n
    problems = [p for o in sorted(ok, key=lambda o: o.partition) for p in o.problems][:MAX_LISTED_OFFSETS]
    sources = {opts.source.region: opts.source.uri} if opts.region_given else {}
    cut = prep.cut
    doc = {
        **out.common_fields(COMMAND, code, sources),
        # the name a consumer writes into --out/read.json once it has read this run's changes
        "run": out.publication.run_id,
        "source": opts.source.uri,
        "region": opts.region,
        "engine": engine,
        "store": opts.store,
        "version": opts.version,
        "topic": opts.topic,
        "store_regions": {"count": prep.base.n_regions, "learned_from": prep.regions_from},
        "state": {
            "dir": opts.state_dir,
            "used": prep.used,
            "version": prep.loaded.state.version if prep.loaded.state is not None else None,
            "from": prep.loaded.id,
            "to": states.state_id(new),
            "recovered": prep.loaded.recovered,
            "region": new_state.region,
            "log_identity": {
                "checked": prep.log_checked,
                "unchecked": [{"partition": p, "why": w} for p, w in sorted(prep.log_unchecked.items())],
            },
        },
        "from_cut": None
        if cut is None
        else {"path": opts.from_cut, "at_ms": cut.at_ms, "at": format_time(cut.at_ms), "from": cut.source},
        **summary_fields(0, evidence, len(failed)),
        "records_read": sum(o.records for o in ok),
        "delivered": sum(o.delivered for o in ok),
        "bulk_load": sum(o.bulk_load for o in ok),
        "duplicates_dropped": _duplicates(counts),
        "bulk_skipped": counts.get("BULK_SKIPPED", 0),
        "undecodable": sum(o.problem_count for o in ok),
        "problems": [_problem_json(p) for p in problems],
        "partitions": [_partition_json(t, outcomes.get(t.partition)) for t in prep.tasks],
        # the version's VersionSwap read in every partition: the next run may follow version N+1
        "version_ended": bool(new_state.partitions) and not new_state.unended(),
        "failed_partitions": [
            {"partition": p, "error": outcomes[p].error if p in outcomes else "no result"} for p in failed
        ],
    }
    out.write_json("summary.json", doc)
    log.info(
        "%s: %d changes delivered (%d of the bulk load), %d duplicates dropped, %d records could not be "
        "delivered, from %d records of %d partitions (state: %s)",
        opts.topic,
        doc["delivered"],
        doc["bulk_load"],
        doc["duplicates_dropped"]["total"],
        doc["undecodable"],
        doc["records_read"],
        len(prep.tasks),
        prep.used,
    )
    if doc["version_ended"]:
        log.info(
            "%s has ended (its VersionSwap is read in every partition): follow the store with --version %d%s",
            opts.topic,
            opts.version + 1,
            " and the same --state" if opts.state_dir else "",
        )
    if opts.state_dir:
        states.prepare(opts.state_dir, out.target.uri, prep.loaded.id, new)
    return code, new


def _partition_batches(
    source: Source, topic: str, task: PartitionTask, progress: Progress
) -> Iterator[pa.RecordBatch]:
    if task.end > task.start:
        yield from progress.counted(
            source.iter_partition(topic, task.partition, start=task.start, end=task.end)
        )


def run_local(opts: ChangesOptions) -> int:
    """Every partition in this process, one after another. Returns the exit code."""
    prep = prepare(opts)
    with OutputDir(opts.out, COMMAND) as out, Progress(COMMAND) as progress:
        changes_dir = out.file(CHANGES_DIR)
        changes_dir.makedirs()
        outcomes: dict[int, PartitionOutcome] = {}
        for i, task in enumerate(prep.tasks, 1):
            progress.stage(f"partition {i}/{len(prep.tasks)} ({opts.topic}[{task.partition}])")
            outcome = run_partition(
                task, _partition_batches(prep.source, opts.topic, task, progress), changes_dir
            )
            if outcome.error is not None:
                log.error("%s[%d] could not be read: %s", opts.topic, task.partition, outcome.error)
            outcomes[task.partition] = outcome
        code, new = finish(opts, prep, out, outcomes, "local")
    if opts.state_dir:
        states.commit(opts.state_dir, new)
    return code
