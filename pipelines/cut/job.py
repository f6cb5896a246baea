"""`tidegauge cut`: a consistent cut of a store version at one upstream time T, and a region's snapshot at it
(issue 40; docs/outputs.md, `tidegauge cut --out DIR`; the rules are `heartbeat.cuts` and `leapfrog.snapshot`).

The job reads as little as the answer needs. The cut needs only heartbeats and RT timestamps: each VT partition is
read for its heartbeats alone (key, offset and headers; the values too when the cut is heartbeat-aligned, for the
RT heartbeat's time), each RT partition (`--rt`) for its timestamps, or not at all where a Kafka topic's
timestamps are LogAppendTime and the broker's time index answers (`offsets_for_times`). `--snapshot X` then reads
X's VT up to ceil only, through the change rule every reader uses (`heartbeat.change_events.PartitionChanges`:
bulk load, chunked values, duplicates), and with `--rt` decodes only the RT writes of the keys the VT leaves
undecided.

The work is a list of tasks (`pipelines.cut.tasks`: read one partition range and answer), run one after another
here (`run_local`) or as Spark tasks (`pipelines.cut.spark`); the driver plans them, ties their answers together
(`tie`) and writes the outputs (`finish`), for both engines alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from div.batch import is_realtime_topic
from heartbeat.cuts import (
    FROM_HEARTBEATS,
    FROM_RT,
    Cut,
    CutPartition,
    HeartbeatMark,
    PositionFinder,
    Positions,
    aligned_cut,
    format_time,
)
from pipelines.core.errors import UsageError
from pipelines.core.evidence import PartitionEvidence, describe_short, summary_fields, verdict
from pipelines.core.output import OutputDir, guard, source_inputs
from pipelines.core.progress import Progress
from pipelines.core.sources import Source, SourceError, SourceSpec, open_source, read_range
from pipelines.core.topics import VT_TOPIC, select_version_topic, store_and_version
from pipelines.cut.tasks import Task, run_task

log = logging.getLogger("tidegauge.cut")

COMMAND = "cut"
SNAPSHOT_DIR = "snapshot"
READ, TIME_INDEX = "read", "offsets_for_times"


@dataclass
class CutOptions:
    """What `tidegauge cut` does (the CLI fills it from flags and --conf)."""

    sources: list[SourceSpec]  # each region's VT
    at_ms: int
    out: str
    rts: list[SourceSpec] = field(default_factory=list)  # each region's RT: the exact cut
    store: str | None = None  # None: the one store the sources hold
    version: int | None = None  # None: the one version present
    snapshot: int | None = None  # the region whose state at the cut is written
    kafka_conf: dict[int, dict[str, Any]] = field(default_factory=dict)


# -- planning -----------------------------------------------------------------------------------------------------


def select_topic(opened: list[Source], store: str | None, version: int | None) -> str:
    """The VT `<store>_v<version>` (completed from the sources when they hold one store version:
    `pipelines.core.topics`, the rule `lag` and `leapfrog` use), which every source must hold."""
    topic = select_version_topic(opened, store, version, "a cut is of one store version")
    for src in opened:
        if topic not in src.topics():
            vts = sorted(t for t in src.topics() if VT_TOPIC.match(t) and not is_realtime_topic(t))
            raise UsageError(
                f"--source {src.region}={src.uri} has no topic {topic!r} (it has {', '.join(vts) or 'none'}): "
                "a cut is of one store version, present in every source"
            )
    return topic


@dataclass
class Plan:
    """What the driver fixed before any read: the topics, each source's partitions and bounds."""

    topic: str
    rt_topic: str
    partitions: list[int]
    vt: dict[int, Source]
    rt: dict[int, Source]
    n_regions: int
    methods: dict[int, str] = field(default_factory=dict)  # RT region: how C was found

    def close(self) -> None:
        for src in [*self.vt.values(), *self.rt.values()]:
            close = getattr(src, "close", None)
            if close is not None:
                close()


def plan(opts: CutOptions) -> Plan:
    if not opts.sources:
        raise UsageError("no source given: use --source ID=LOC, one per region whose VT is read")
    if opts.snapshot is not None and opts.snapshot not in {s.region for s in opts.sources}:
        raise UsageError(f"--snapshot {opts.snapshot}: no --source of region {opts.snapshot}")
    vt: dict[int, Source] = {}
    rt: dict[int, Source] = {}
    try:
        for s in opts.sources:
            vt[s.region] = open_source(s, opts.kafka_conf.get(s.region, {}))
        topic = select_topic(list(vt.values()), opts.store, opts.version)
        rt_topic = f"{store_and_version(topic)[0]}_rt"
        for s in opts.rts:
            rt[s.region] = open_source(s, opts.kafka_conf.get(s.region, {}))
            if rt_topic not in rt[s.region].topics():
                raise UsageError(f"--rt {s.region}={s.uri} has no topic {rt_topic!r}")
    except BaseException:
        for src in [*vt.values(), *rt.values()]:
            getattr(src, "close", lambda: None)()
        raise
    partitions = sorted({p for src in vt.values() for p in src.partitions(topic)})
    n = max([s.region + 1 for s in opts.sources] + [s.region + 1 for s in opts.rts])
    return Plan(topic, rt_topic, partitions, vt, rt, n)


def check_rt_regions(opts: CutOptions, n_regions: int) -> None:
    """`--rt` is for every region of the store or for none: a cut from some RTs only is neither exact nor
    heartbeat-aligned."""
    if not opts.rts:
        return
    missing = sorted(set(range(n_regions)) - {s.region for s in opts.rts})
    if missing:
        raise UsageError(
            f"--rt is given for region(s) {', '.join(str(s.region) for s in sorted(opts.rts, key=lambda s: s.region))} "
            f"but not for region(s) {', '.join(map(str, missing))} of this {n_regions}-region store: give --rt for "
            "every region (an exact cut) or for none (a heartbeat-aligned cut)"
        )


def heartbeat_tasks(opts: CutOptions, p: Plan) -> list[Task]:
    return [
        Task("heartbeats", x, src.uri, p.topic, q, *src.bounds(p.topic, q), with_origin=not opts.rts)
        for x, src in sorted(p.vt.items())
        for q in p.partitions
        if q in src.partitions(p.topic)
    ]


def rt_tasks(opts: CutOptions, p: Plan, cuts: dict[tuple[int, int], int]) -> list[Task]:
    """RT partitions to read for their timestamps; where a Kafka topic's timestamps are the broker's
    (LogAppendTime) the time index answers at once, into `cuts`."""
    tasks = []
    for r, src in sorted(p.rt.items()):
        have = set(src.partitions(p.rt_topic))
        log_append = src.spec.is_kafka and src.timestamp_type(p.rt_topic) == "LogAppendTime"
        p.methods[r] = TIME_INDEX if log_append else READ
        for q in p.partitions:
            if q not in have:
                raise SourceError(f"--rt {r}={src.uri}: {p.rt_topic} has no partition {q}")
            if log_append:
                cuts[(r, q)] = src.offset_for_time(p.rt_topic, q, opts.at_ms + 1) - 1
            else:
                tasks.append(
                    Task("rt", r, src.uri, p.rt_topic, q, *src.bounds(p.rt_topic, q), at_ms=opts.at_ms)
                )
    return tasks


# -- the cut from the answers --------------------------------------------------------------------------------------


def tie(
    opts: CutOptions, p: Plan, hb: dict[tuple[int, int], dict], rt_cuts: dict[tuple[int, int], int]
) -> Cut:
    """The cut of every partition from the heartbeat and RT answers (a partition some answer failed for: left
    out)."""
    n = p.n_regions
    parts: dict[int, CutPartition] = {}
    for q in p.partitions:
        mine = {x: a for (x, pq), a in hb.items() if pq == q}
        if any(a.get("error") for a in mine.values()):
            continue
        if opts.rts:
            if any((r, q) not in rt_cuts for r in range(n)):
                continue
            c = tuple(rt_cuts[(r, q)] for r in range(n))
        else:
            marks = [HeartbeatMark(*m) for a in mine.values() for m in a["marks"]]
            c = aligned_cut(marks, opts.at_ms, n)
        regions: dict[int, Positions] = {}
        for x, a in sorted(mine.items()):
            finder = PositionFinder(c)
            if a["offsets"]:
                width = max(len(v) for v in a["vectors"])
                matrix = np.full((len(a["vectors"]), max(width, 1)), -1, dtype=np.int64)
                for i, v in enumerate(a["vectors"]):
                    matrix[i, : len(v)] = v
                finder.feed_batch(a["offsets"], matrix)
            regions[x] = finder.positions
        parts[q] = CutPartition(q, dict(enumerate(c)), regions)
    store, version = store_and_version(p.topic)
    return Cut(store, version, opts.at_ms, FROM_RT if opts.rts else FROM_HEARTBEATS, parts)


def snapshot_tasks(opts: CutOptions, p: Plan, cut: Cut, out_dir: str) -> tuple[list[Task], list[int]]:
    """X's snapshot task per partition where X reached the cut; the partitions where it is behind."""
    x = opts.snapshot
    src = p.vt[x]
    tasks, behind = [], []
    for q, cp in cut.partitions.items():
        pos = cp.regions.get(x)
        if pos is None or pos.behind:
            behind.append(q)
            continue
        first, _ = src.bounds(p.topic, q)
        vec = list(cp.vector(p.n_regions))
        rts = {
            r: (rsrc.uri, p.rt_topic, rsrc.bounds(p.rt_topic, q)[0], vec[r] + 1)
            for r, rsrc in sorted(p.rt.items())
        }
        tasks.append(
            Task(
                "snapshot",
                x,
                src.uri,
                p.topic,
                q,
                first,
                pos.ceil,
                cut=vec,
                n_regions=p.n_regions,
                rts=rts,
                out=out_dir,
            )
        )
    return tasks, behind


# -- outputs ------------------------------------------------------------------------------------------------------


def _evidence(tasks: list[Task], answers: list[dict], what: str) -> list[PartitionEvidence]:
    out = []
    for t, a in zip(tasks, answers, strict=True):
        e = PartitionEvidence(t.region, t.topic, t.partition, t.start, t.end)
        e.read_records = a.get("records", 0)
        e.reached_end = a.get("error") is None  # a read runs to its planned end or raises
        e.error = a.get("error")
        e.note_undecodable(a.get("undecodable", []))
        out.append(e)
        if e.error:
            log.error(
                "%s: region %d %s[%d] could not be read: %s", what, t.region, t.topic, t.partition, e.error
            )
    return out


def _rt_evidence(p: Plan, tasks: list[Task], answers: list[dict]) -> list[PartitionEvidence]:
    """The RT records of undecided keys that could not be decoded, as evidence of the RT partitions they are in
    (read for those keys only: no planned range)."""
    out = []
    for t, a in zip(tasks, answers, strict=True):
        by_region: dict[int, list[int]] = {}
        for region, offset in a.get("rt_undecodable", []):
            by_region.setdefault(region, []).append(offset)
        for region, offsets in sorted(by_region.items()):
            e = PartitionEvidence(region, p.rt_topic, t.partition, 0, 0)
            e.note_undecodable(offsets)
            out.append(e)
    return out


def human_summary(cut: Cut, p: Plan, snapshot: dict[str, Any] | None) -> str:
    """What stdout shows: per partition C, each region's floor and ceil, the regions behind."""
    kind = (
        "exact, from the RT timestamps"
        if cut.source == FROM_RT
        else "heartbeat-aligned, from the VT heartbeats"
    )
    lines = [f"cut of {p.topic} at {format_time(cut.at_ms)} (at_ms={cut.at_ms}; {kind})"]
    for q in p.partitions:
        cp = cut.partitions.get(q)
        if cp is None:
            lines.append(f"partition {q}: not cut (a source could not be read: see the log)")
            continue
        c = ", ".join(f"{r}:{o}" for r, o in sorted(cp.rt.items()))
        lines.append(f"partition {q}: C = {{{c}}}")
        behind = []
        for x, pos in sorted(cp.regions.items()):
            f = "-" if pos.floor is None else pos.floor
            ce = "-" if pos.ceil is None else pos.ceil
            state = "behind" if pos.behind else ("exact" if pos.exact else "")
            lines.append(f"  region {x}: floor {f}, ceil {ce}{'  ' + state if state else ''}")
            if pos.behind:
                behind.append(str(x))
        if behind:
            lines.append(f"  behind the cut: region {', '.join(behind)}")
    if snapshot is not None:
        left = snapshot["partitions_left_out"]
        lines.append(
            f"snapshot of region {snapshot['region']}: {snapshot['rows']} keys ({snapshot['exact']} exact, "
            f"{snapshot['rows'] - snapshot['exact']} not exact, {snapshot['none']} NONE"
            + (
                f"; {snapshot['resolved_from_rt']} resolved from the RT writes"
                if snapshot["resolved_from_rt"]
                else ""
            )
            + ")"
            + (
                f"; partitions left out (region {snapshot['region']} behind): {', '.join(map(str, left))}"
                if left
                else ""
            )
        )
    return "\n".join(lines)


def finish(
    opts: CutOptions,
    p: Plan,
    out: OutputDir,
    cut: Cut,
    evidence: list[PartitionEvidence],
    snap: tuple[list[Task], list[dict], list[int]] | None,
    engine: str,
) -> int:
    """cut.json, summary.json and the stdout summary, for both engines. Returns the exit code: 1 when the
    snapshot's region is behind the cut in some partition (left out), else 3 when something was not read or
    decoded, else 0."""
    failed = [q for q in p.partitions if q not in cut.partitions]
    snapshot_doc = None
    behind: list[int] = []
    if snap is not None:
        tasks, answers, behind = snap
        ok = [a for a in answers if a.get("error") is None]
        failed += [t.partition for t, a in zip(tasks, answers, strict=True) if a.get("error") is not None]
        snapshot_doc = {
            "region": opts.snapshot,
            "dir": SNAPSHOT_DIR,
            "rows": sum(a["rows"] for a in ok),
            "exact": sum(a["exact"] for a in ok),
            "none": sum(a["none"] for a in ok),
            "vt_records_read": sum(a["records"] for a in ok),
            "rt_records_read": sum(a["rt_records"] for a in ok),
            "resolved_from_rt": sum(a["resolved"] for a in ok),
            "partitions": sorted(
                t.partition for t, a in zip(tasks, answers, strict=True) if a.get("error") is None
            ),
            "partitions_left_out": behind,
        }
        for q in behind:
            log.warning(
                "region %d is behind the cut in %s[%d] (no heartbeat covers C yet): partition left out of the snapshot",
                opts.snapshot,
                p.topic,
                q,
            )
    code = verdict(len(behind), evidence, len(failed))[1]
    for line in describe_short(evidence):
        log.warning("%s", line)
    out.file("cut.json").write_text(cut.to_json())
    sources = {s.region: s.uri for s in opts.sources}
    doc = {
        **out.common_fields(COMMAND, code, sources),
        **summary_fields(len(behind), evidence, len(failed)),
        "engine": engine,
        "store": cut.store,
        "version": cut.version,
        "topic": p.topic,
        "at_ms": cut.at_ms,
        "at": format_time(cut.at_ms),
        "from": cut.source,
        "rt_sources": {str(s.region): s.uri for s in opts.rts},
        "rt_method": {str(r): m for r, m in sorted(p.methods.items())},
        "store_regions": p.n_regions,
        "behind": [
            {"partition": q, "region": x}
            for q, cp in cut.partitions.items()
            for x, pos in cp.regions.items()
            if pos.behind
        ],
        "snapshot": snapshot_doc,
        "failed_partitions": sorted(set(failed)),
    }
    out.write_json("summary.json", doc)
    print(human_summary(cut, p, snapshot_doc))
    return code


# -- the local engine ---------------------------------------------------------------------------------------------


def run_local(opts: CutOptions) -> int:
    """Every task in this process, one after another. Returns the exit code."""
    return run(opts, "local", lambda tasks, progress: [_local(t, opts, progress) for t in tasks])


def _local(task: Task, opts: CutOptions, progress: Progress) -> dict[str, Any]:
    progress.stage(f"{task.kind}: region {task.region} {task.topic}[{task.partition}]")

    def read(*args, **kw) -> Iterator[pa.RecordBatch]:
        return progress.counted(read_range(*args, **kw))

    return run_task(task, opts.kafka_conf, read)


Runner = Callable[[list[Task], Progress], list[dict[str, Any]]]


def run(opts: CutOptions, engine: str, run_tasks: Runner, spark: Any = None) -> int:
    """The job for either engine: `run_tasks` runs a list of tasks and returns their answers in order."""
    inputs = {**source_inputs(opts.sources), **{f"--rt {s.region}": s.uri for s in opts.rts}}
    guard(COMMAND, {"--out": opts.out}, inputs)
    check_rt_regions(opts, max(s.region + 1 for s in [*opts.sources, *opts.rts]))
    p = plan(opts)
    try:
        with Progress(COMMAND, spark=spark) as progress:
            hb_tasks = heartbeat_tasks(opts, p)
            rt_cuts: dict[tuple[int, int], int] = {}
            rtt = rt_tasks(opts, p, rt_cuts)
            answers = run_tasks(hb_tasks + rtt, progress)
            hb_answers, rt_answers = answers[: len(hb_tasks)], answers[len(hb_tasks) :]
            evidence = _evidence(hb_tasks, hb_answers, "heartbeats") + _evidence(rtt, rt_answers, "rt")
            for t, a in zip(rtt, rt_answers, strict=True):
                if a.get("error") is None:
                    rt_cuts[(t.region, t.partition)] = a["c"]
            width = max((len(v) for a in hb_answers for v in a.get("vectors", [])), default=0)
            p.n_regions = max(p.n_regions, width)
            check_rt_regions(opts, p.n_regions)
            cut = tie(
                opts,
                p,
                {(t.region, t.partition): a for t, a in zip(hb_tasks, hb_answers, strict=True)},
                rt_cuts,
            )
            with OutputDir(opts.out, COMMAND) as out:
                snap = None
                if opts.snapshot is not None:
                    directory = out.file(SNAPSHOT_DIR)
                    directory.makedirs()
                    tasks, behind = snapshot_tasks(opts, p, cut, directory.uri)
                    snap_answers = run_tasks(tasks, progress)
                    evidence += _evidence(tasks, snap_answers, "snapshot")
                    evidence += _rt_evidence(p, tasks, snap_answers)
                    snap = (tasks, snap_answers, behind)
                return finish(opts, p, out, cut, evidence, snap, engine)
    finally:
        p.close()
