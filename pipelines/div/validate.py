"""`tidegauge div validate`: DIV over whole topics, each partition independently.

The local engine runs partitions one after another in this process; the Spark engine (pipelines.div.spark) runs
them in parallel. Both feed each partition to `div.batch.PartitionRun`, so they share every rule.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from div.batch import PartitionRun, PartitionSummary, StopRun, is_realtime_topic, rows_to_table
from div.validator import ValidatorConfig
from pipelines.core.evidence import PartitionEvidence, describe_short, summary_fields, verdict
from pipelines.core.output import OutputDir, guard, source_inputs
from pipelines.core.progress import Progress
from pipelines.core.sources import Source, SourceError, SourceSpec, open_source

log = logging.getLogger("tidegauge.div")


@dataclass
class ValidateOptions:
    sources: list[SourceSpec]
    out: str
    topics: list[str] = field(default_factory=list)
    min_compaction_lag_ms: int | None = None
    now_ms: int | None = None
    max_age_ms: int = -1
    fail_fast: bool = False
    kafka_conf: dict[int, dict[str, Any]] = field(default_factory=dict)
    record_validators: list[dict[str, Any]] = field(default_factory=list)
    restore_at: int | None = None
    engine: str = "local"


@dataclass
class PartitionTask:
    """One (source, topic, partition) to validate, with the tolerances that apply to it. `end`: the end offset
    (exclusive) the driver planned, for a reader that is not the driver's opened source (a Spark task); None: the
    source's own planned bound."""

    region: int
    topic: str
    partition: int
    config: ValidatorConfig
    end: int | None = None


def plan(opts: ValidateOptions, opened: list[Source]) -> list[PartitionTask]:
    now_ms = opts.now_ms if opts.now_ms is not None else int(time.time() * 1000)
    tasks = []
    for src in opened:
        available = src.topics()
        if not available:
            what = (
                "no topic"
                if src.spec.is_kafka
                else "no record (no Parquet file in the archive schema holds one)"
            )
            raise SourceError(f"source {src.region}={src.uri}: holds {what}; nothing to validate")
        topics = opts.topics or available
        for topic in topics:
            if topic not in available:
                raise SourceError(
                    f"source {src.region}={src.uri}: no topic {topic!r} (it has: "
                    f"{', '.join(available) or 'no topics'})"
                )
            lag = opts.min_compaction_lag_ms
            if lag is None and not is_realtime_topic(topic):
                lag = src.min_compaction_lag_ms(topic)
            cfg = ValidatorConfig(min_compaction_lag_ms=lag, now_ms=now_ms, max_age_ms=opts.max_age_ms)
            for p in src.partitions(topic):
                tasks.append(PartitionTask(src.region, topic, p, cfg))
    return tasks


def start_run(
    task: PartitionTask, opts: ValidateOptions, source: Source | None = None
) -> tuple[PartitionRun, int | None]:
    """A fresh run for one task (record validators built, DIV state restored with --restore-at), and the offset
    to start from (None: the first record). Both engines start every partition here; `source` may be None on a
    Spark executor, which then opens its own when it needs one to restore from."""
    from div.validators.registry import build_chain

    run = PartitionRun(
        task.region,
        task.topic,
        task.partition,
        config=task.config,
        fail_fast=opts.fail_fast,
        record_validators=build_chain(opts.record_validators),
    )
    start = None
    if opts.restore_at is not None:
        from pipelines.div.restore import restore_validator

        if source is None:
            spec = next(s for s in opts.sources if s.region == task.region)
            source = open_source(spec, opts.kafka_conf.get(task.region))
        start = restore_validator(source, task.topic, task.partition, opts.restore_at, run)
    return run, start


def validate_partition(
    src: Source, task: PartitionTask, opts: ValidateOptions, progress: Progress | None = None
) -> PartitionRun:
    """Run DIV (and record validators) over one partition; returns the finished run.

    With --fail-fast the run stops at its first fatal finding; `run.stopped` then says where.
    """
    run, start = start_run(task, opts, src)
    try:
        batches = src.iter_partition(task.topic, task.partition, start=start)
        for batch in progress.counted(batches) if progress is not None else batches:
            run.feed(batch)
    except StopRun as stop:
        run.stopped = str(stop)
    run.finish()
    return run


def evidence_for(
    tasks: list[PartitionTask],
    summaries: list[PartitionSummary],
    failed: list[dict],
    sources: dict[int, Source],
) -> list[PartitionEvidence]:
    """What each planned partition promised (the source's bounds, fixed at planning) against what its run read
    and decoded — counted where it ran, on an executor for the Spark engine."""
    done = {(s.region, s.topic, s.partition): s for s in summaries}
    errors = {(f["region"], f["topic"], f["partition"]): f["error"] for f in failed}
    out = []
    for t in tasks:
        src = sources[t.region]
        first, end = src.bounds(t.topic, t.partition)
        s = done.get((t.region, t.topic, t.partition))
        start = s.start_offset if s is not None and s.start_offset is not None else first
        e = PartitionEvidence(
            t.region,
            t.topic,
            t.partition,
            start,
            end,
            planned_records=src.planned_records(t.topic, t.partition) if start == first else None,
            error=errors.get((t.region, t.topic, t.partition)),
        )
        if s is not None:
            e.read_records = s.records
            # a Kafka reader that stalls before the planned end raises (a failed partition); the end itself may
            # be compacted away, so only an archive's last planned offset must have been read
            e.reached_end = src.spec.is_kafka or (s.last_offset is not None and s.last_offset >= end - 1)
            e.undecodable = s.undecodable
            e.undecodable_offsets = list(s.undecodable_offsets)
        elif e.error is None:
            e.error = "not read (--fail-fast stopped the run before it)"
        out.append(e)
    return out


def summarize(
    out: OutputDir,
    summaries: list[PartitionSummary],
    failed: list[dict],
    exit_code: int,
    sources: dict[int, str],
    engine: str,
    evidence: list[PartitionEvidence],
) -> dict[str, Any]:
    by_type: Counter = Counter()
    for s in summaries:
        by_type.update(s.findings)
    fatal = sum(s.fatal_findings for s in summaries)
    return {
        **out.common_fields("div validate", exit_code, sources),
        **summary_fields(fatal, evidence, len(failed)),
        "engine": engine,
        "records_read": sum(s.records for s in summaries),
        "findings": sum(by_type.values()),
        "fatal_findings": fatal,
        "findings_by_type": dict(sorted(by_type.items())),
        "undecodable_records": sum(s.undecodable for s in summaries),
        "explained_by_undecodable": sum(s.explained for s in summaries),
        "producers_tracked": sum(s.producers_tracked for s in summaries),
        "partitions": [s.to_json() for s in summaries],
        "failed_partitions": failed,
    }


def exit_code_for(
    summaries: list[PartitionSummary], failed: list[dict], evidence: list[PartitionEvidence]
) -> int:
    """Fatal findings → 1; else anything planned not read or not decoded → 3; else 0 (pipelines.core.evidence)."""
    code = verdict(sum(s.fatal_findings for s in summaries), evidence, len(failed))[1]
    for line in describe_short(evidence):
        log.warning("%s", line)
    return code


def write_errors(out: OutputDir, table: pa.Table) -> None:
    out.write_table("errors", table)


def run_local(opts: ValidateOptions) -> int:
    """Validate every partition in this process. Returns the exit code; writes errors/ and summary.json."""
    guard("div validate", {"--out": opts.out}, source_inputs(opts.sources))
    opened = [open_source(s, opts.kafka_conf.get(s.region)) for s in opts.sources]
    by_region = {s.region: s for s in opened}
    tasks = plan(opts, opened)
    summaries: list[PartitionSummary] = []
    failed: list[dict] = []
    rows: list[tuple] = []
    t0 = time.time()
    with OutputDir(opts.out, "div validate") as out, Progress("div validate") as progress:
        for i, task in enumerate(tasks, 1):
            progress.stage(
                f"partition {i}/{len(tasks)} (region {task.region} {task.topic}[{task.partition}])"
            )
            try:
                run = validate_partition(by_region[task.region], task, opts, progress)
            except (SourceError, OSError) as exc:
                failed.append(
                    {
                        "region": task.region,
                        "topic": task.topic,
                        "partition": task.partition,
                        "error": str(exc),
                    }
                )
                log.error(
                    "region %d %s[%d] could not be validated: %s",
                    task.region,
                    task.topic,
                    task.partition,
                    exc,
                )
                continue
            summaries.append(run.summary)
            rows.extend(run.rows)
            rate = sum(s.records for s in summaries) / max(time.time() - t0, 1e-9)
            log.info(
                "[%d/%d] region %d %s[%d]: %d records, %d findings (%.0f records/s so far)",
                i,
                len(tasks),
                task.region,
                task.topic,
                task.partition,
                run.summary.records,
                sum(run.summary.findings.values()),
                rate,
            )
            if run.stopped:
                log.warning("--fail-fast: stopped at %s", run.stopped)
                break
        evidence = evidence_for(tasks, summaries, failed, by_region)
        code = exit_code_for(summaries, failed, evidence)
        write_errors(out, rows_to_table(rows))
        out.write_json(
            "summary.json",
            summarize(
                out, summaries, failed, code, {s.region: s.uri for s in opts.sources}, "local", evidence
            ),
        )
    return code
