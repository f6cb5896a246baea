"""`tidegauge div restore` and `div validate --restore-at`: a replica's DIV state at any VT offset, from heartbeats.

Both are thin: the work is `div.restore` (find the last usable heartbeat at or before the offset by reading
backwards, load its `hbd`, replay the VT records after it; bring each region's RT state to the replica's resume
offset), fed through the sources every job reads (`pipelines.core.sources`: an archive or a live Kafka cluster).
`restore_validator` is the hook `div validate` calls per partition (in the local engine and on Spark executors
alike): it loads the state after offset O into the partition's validator and validation resumes at O + 1.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from div import partition_state as ps
from div.batch import MAX_LISTED
from div.restore import ReadRange, Restored, RtRegion, restore_rt, restore_vt
from pipelines.core.errors import UsageError
from pipelines.core.evidence import PartitionEvidence, describe_short, summary_fields
from pipelines.core.output import OutputDir, guard, source_inputs
from pipelines.core.progress import Progress
from pipelines.core.sources import Source, SourceError, SourceSpec, open_source

log = logging.getLogger("tidegauge.div")

# ------------------------------------------------------------------------------- the hook of div validate


def source_reader(src: Source, topic: str, partition: int, progress: Progress | None = None) -> ReadRange:
    """`div.restore`'s record callback over one partition of a source (counting what it reads in `progress`)."""

    def read(start: int, end: int, columns=None):
        batches = src.iter_partition(
            topic, partition, start=start, end=end, columns=list(columns) if columns is not None else None
        )
        return progress.counted(batches) if progress is not None else batches

    return read


def restore_validator(src: Source, topic: str, partition: int, restore_at: int, run) -> int:
    """Load the DIV state after offset `restore_at` into `run.validator` (a fresh `div.batch.PartitionRun`) and
    return the offset validation resumes at (restore_at + 1). An offset past the partition's end restores at its
    last record; one before its first record leaves the state empty (nothing precedes it)."""
    first, end = src.bounds(topic, partition)
    at = min(restore_at, end - 1)
    if at < first:
        run.summary.start_offset = first
        return first
    restored = restore_vt(
        source_reader(src, topic, partition), at, first_offset=first, validator=run.validator, codec=run.codec
    )
    run.summary.start_offset = at + 1
    if restored.replay is not None and restored.replay.undecodable:
        # the state validation starts from was replayed over records it could not read: not whole evidence
        run.summary.undecodable += restored.replay.undecodable
        run.summary.undecodable_offsets[:] = restored.replay.undecodable_offsets[:MAX_LISTED]
    run.summary.restored_from_heartbeat = (
        restored.heartbeat.offset if restored.heartbeat is not None else None
    )
    if restored.heartbeat is None:
        log.warning(
            "region %d %s[%d]: %s; replayed %d records from offset %d instead",
            src.region,
            topic,
            partition,
            restored.fallback_reason,
            restored.vt_replayed,
            first,
        )
    else:
        log.info(
            "region %d %s[%d]: restored at offset %d from the heartbeat at %d (%d records replayed)",
            src.region,
            topic,
            partition,
            at,
            restored.heartbeat.offset,
            restored.vt_replayed,
        )
    return at + 1


# ------------------------------------------------------------------------------------------ div restore


@dataclass
class RestoreOptions:
    source: SourceSpec
    store: str
    version: int
    partition: int
    at: int
    out: str
    rt_sources: list[SourceSpec] = field(default_factory=list)
    vt_topic: str | None = None
    rt_topic: str | None = None
    kafka_conf: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def vt(self) -> str:
        return self.vt_topic or f"{self.store}_v{self.version}"

    @property
    def rt(self) -> str:
        return self.rt_topic or f"{self.store}_rt"


def _open_partition(
    spec: SourceSpec, conf: dict[str, Any] | None, topic: str, partition: int, what: str
) -> Source:
    src = open_source(spec, conf)
    if topic not in src.topics():
        raise SourceError(
            f"{what} {spec.region}={spec.uri}: no topic {topic!r} (it has: "
            f"{', '.join(src.topics()) or 'no topics'})"
        )
    if partition not in src.partitions(topic):
        raise SourceError(f"{what} {spec.region}={spec.uri}: topic {topic!r} has no partition {partition}")
    return src


def restore(opts: RestoreOptions, progress: Progress | None = None) -> tuple[Restored, dict[str, Any]]:
    """Restore the state; returns it and the run's facts for summary.json (timings, RT sources that failed).
    Raises SourceError for an unreadable VT source, UsageError for an offset outside it."""
    t0 = time.time()
    src = _open_partition(
        opts.source, opts.kafka_conf.get(opts.source.region), opts.vt, opts.partition, "--source"
    )
    first, end = src.bounds(opts.vt, opts.partition)
    if not first <= opts.at < end:
        raise UsageError(
            f"--at-offset {opts.at}: {opts.vt}[{opts.partition}] of source {opts.source.region} "
            f"holds offsets {first}..{end - 1}"
        )
    if progress is not None:
        progress.stage(f"restoring {opts.vt}[{opts.partition}] at {opts.at} (heartbeat search, VT replay)")
    restored = restore_vt(source_reader(src, opts.vt, opts.partition, progress), opts.at, first_offset=first)
    t_vt = time.time()
    if restored.heartbeat is None:
        log.warning(
            "%s[%d] at %d: %s; replayed the partition from offset %d (%d records)",
            opts.vt,
            opts.partition,
            opts.at,
            restored.fallback_reason,
            first,
            restored.vt_replayed,
        )
    regions = set(restored.upstream) | {s.region for s in opts.rt_sources}
    if restored.heartbeat is not None:
        regions |= set(restored.heartbeat.div_state.rt_producers)
        if restored.heartbeat.watermarks is not None:
            regions |= set(range(len(restored.heartbeat.watermarks.high_watermarks)))
    for r in sorted(regions):
        restored.rt_region(r)
    failed: list[dict[str, Any]] = []
    evidence = [_vt_evidence(opts, restored)]
    for spec in opts.rt_sources:
        try:
            rt_src = _open_partition(
                spec, opts.kafka_conf.get(spec.region), opts.rt, opts.partition, "--rt-source"
            )
            rt_first, _ = rt_src.bounds(opts.rt, opts.partition)
            if progress is not None:
                progress.stage(f"replaying the RT of region {spec.region}")
            entry = restore_rt(
                restored,
                spec.region,
                source_reader(rt_src, opts.rt, opts.partition, progress),
                first_offset=rt_first,
            )
        except (SourceError, OSError) as exc:
            failed.append({"region": spec.region, "uri": spec.uri, "error": str(exc)})
            evidence.append(PartitionEvidence(spec.region, opts.rt, opts.partition, 0, 0, error=str(exc)))
            log.error("RT of region %d could not be replayed: %s", spec.region, exc)
            continue
        evidence.append(_rt_evidence(opts, entry, rt_first))
        if entry.warning:
            log.warning("%s", entry.warning)
    facts = {
        "timings": {
            "vt_s": round(t_vt - t0, 4),
            "rt_s": round(time.time() - t_vt, 4),
            "total_s": round(time.time() - t0, 4),
        },
        "vt_first_offset": first,
        "vt_end_offset": end,
        "failed_rt_sources": failed,
        "evidence": evidence,
    }
    return restored, facts


def _vt_evidence(opts: RestoreOptions, restored: Restored) -> PartitionEvidence:
    """What the VT replay read: from the restore point to --at-offset (the search reads headers only)."""
    replay = restored.replay
    start = restored.replayed_from if restored.replayed_from is not None else opts.at + 1
    ev = PartitionEvidence(
        opts.source.region,
        opts.vt,
        opts.partition,
        start,
        opts.at + 1,
        read_records=restored.vt_replayed,
        reached_end=True,
    )
    if replay is not None:
        ev.note_undecodable(replay.undecodable_offsets)
        ev.undecodable = replay.undecodable
    return ev


def _rt_evidence(opts: RestoreOptions, entry: RtRegion, first: int) -> PartitionEvidence:
    """What one region's RT replay read: from the restore point's watermark to the replica's resume offset."""
    start = first if entry.watermark is None else entry.watermark + 1
    end = entry.resume_offset + 1
    reached = entry.state_offset is not None and entry.state_offset >= entry.resume_offset
    ev = PartitionEvidence(
        entry.region,
        opts.rt,
        opts.partition,
        start,
        max(start, end),
        read_records=entry.replayed,
        reached_end=reached or end <= start,
    )
    ev.note_undecodable(entry.undecodable_offsets)
    ev.undecodable = entry.undecodable
    return ev


def run_restore(opts: RestoreOptions) -> int:
    """`tidegauge div restore`: writes partition_state.bin, state.json and summary.json. Returns the exit code."""
    guard("div restore", {"--out": opts.out}, source_inputs([opts.source, *opts.rt_sources]))
    with OutputDir(opts.out, "div restore") as out, Progress("div restore") as progress:
        restored, facts = restore(opts, progress)
        evidence = facts.pop("evidence")
        verdict = summary_fields(0, evidence)
        code = verdict["exit_code"]
        for line in describe_short(evidence):
            log.warning("%s", line)
        out.file("partition_state.bin").write_bytes(ps.encode(restored.partition_state()))
        where = {
            "store": opts.store,
            "version": opts.version,
            "vt_topic": opts.vt,
            "rt_topic": opts.rt,
            "region": opts.source.region,
            "partition": opts.partition,
        }
        out.write_json("state.json", {**where, **restored.to_json()})
        common = out.common_fields("div restore", code, {opts.source.region: opts.source.uri})
        out.write_json(
            "summary.json",
            {
                **common,
                "rt_sources": {str(s.region): s.uri for s in opts.rt_sources},
                **where,
                "at_offset": opts.at,
                "restored_from": restored.source,
                "heartbeat_offset": restored.heartbeat.offset if restored.heartbeat is not None else None,
                "fallback_reason": restored.fallback_reason,
                "skipped_heartbeats": len(restored.skipped),
                "search": {"reads": restored.search_reads, "records_read": restored.search_records},
                "vt_records_replayed": restored.vt_replayed,
                "rt_records_replayed": {str(r): e.replayed for r, e in sorted(restored.rt.items())},
                "vt_producers": len(restored.vt.segments),
                "rt_producers": {str(r): len(e.validator.segments) for r, e in sorted(restored.rt.items())},
                "warnings": [e.warning for _, e in sorted(restored.rt.items()) if e.warning],
                **facts,
                **verdict,
            },
        )
    return code
