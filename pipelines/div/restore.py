"""`tidegauge div restore` and `div validate --restore-at`: a replica's DIV state at any VT offset, from heartbeats.

Both are thin: the work is `div.restore` (find the last usable heartbeat at or before the offset by reading
backwards, load its `hbd`, replay the VT records after it; bring each region's RT state to the replica's resume
offset), fed through the sources every job reads (`pipelines.core.sources`: an archive or a live Kafka cluster).
`restore_validator` is the hook `div validate` calls per partition (in the local engine and on Spark executors
alike): it loads the state after offset O into the partition's validator and validation resumes at O + 1.
"""

from __future__ import annotations

import argparse
import logging
import textwrap
import time
from dataclasses import dataclass, field
from typing import Any

from div import partition_state as ps
from div.batch import MAX_LISTED
from div.restore import ReadRange, Restored, RtRegion, restore_rt, restore_vt
from pipelines.core import config as cfg
from pipelines.core.errors import UsageError
from pipelines.core.evidence import PartitionEvidence, describe_short, summary_fields
from pipelines.core.output import OutputDir, guard, source_inputs
from pipelines.core.progress import Progress
from pipelines.core.sources import Source, SourceError, SourceSpec, check_unique, open_source, parse_source

log = logging.getLogger("tidegauge.div")

RESTORE_HELP = textwrap.dedent("""\
    Rebuild the DIV state a replica of one VT partition holds after offset O (including record O), as a follower
    restarting there or a new leader taking over there would need it, without replaying the topic from offset 0:
    it finds the last heartbeat at or before O whose `hbd` header holds a complete DIV state, loads it, replays
    the VT records between that heartbeat and O and, with --rt-source, replays each region's RT from the
    heartbeat's watermark to the replica's resume offset (the last RT offset its VT reflects). Without a usable
    heartbeat it says so and replays the partition from its first offset.

    Writes OUT/partition_state.bin (Venice's PartitionState v24: the VT producer states and the offset),
    OUT/state.json (the same for people and tools, plus the RT states and resume offsets per region) and
    OUT/summary.json (with `verdict` and the `evidence` read). Exit codes: 0 restored from whole evidence, 2 bad
    usage or unreadable VT, 3 partial: an RT source could not be read, an RT ends before the offset the replica
    resumes at, or replayed records could not be decoded (everything is still written; summary.json and stderr
    say which).""")

RESTORE_EPILOG = textwrap.dedent("""\
    examples:
      tidegauge div restore --source 0=out/archive/dc-0 --store sim_store --version 1 --partition 0 \\
          --at-offset 1200 --out out/restore
      tidegauge div restore --source 1=kafka://broker-b:9092 --rt-source 0=out/archive/dc-0 \\
          --rt-source 1=kafka://broker-b:9092 --rt-source 2=out/archive/dc-2 --store s --version 3 \\
          --partition 5 --at-offset 88000 --out out/restore-p5""")


# ------------------------------------------------------------------------------- the hook of div validate


def source_reader(src: Source, topic: str, partition: int, progress: Progress | None = None) -> ReadRange:
    """`div.restore`'s record callback over one partition of a source (counting what it reads in `progress`)."""

    def read(start: int, end: int, columns=None):
        batches = src.iter_partition(topic, partition, start=start, end=end,
                                     columns=list(columns) if columns is not None else None)
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
    restored = restore_vt(source_reader(src, topic, partition), at, first_offset=first, validator=run.validator,
                          codec=run.codec)
    run.summary.start_offset = at + 1
    if restored.replay is not None and restored.replay.undecodable:
        # the state validation starts from was replayed over records it could not read: not whole evidence
        run.summary.undecodable += restored.replay.undecodable
        run.summary.undecodable_offsets[:] = restored.replay.undecodable_offsets[:MAX_LISTED]
    run.summary.restored_from_heartbeat = restored.heartbeat.offset if restored.heartbeat is not None else None
    if restored.heartbeat is None:
        log.warning("region %d %s[%d]: %s; replayed %d records from offset %d instead", src.region, topic,
                    partition, restored.fallback_reason, restored.vt_replayed, first)
    else:
        log.info("region %d %s[%d]: restored at offset %d from the heartbeat at %d (%d records replayed)",
                 src.region, topic, partition, at, restored.heartbeat.offset, restored.vt_replayed)
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


def _open_partition(spec: SourceSpec, conf: dict[str, Any] | None, topic: str, partition: int,
                    what: str) -> Source:
    src = open_source(spec, conf)
    if topic not in src.topics():
        raise SourceError(f"{what} {spec.region}={spec.uri}: no topic {topic!r} (it has: "
                          f"{', '.join(src.topics()) or 'no topics'})")
    if partition not in src.partitions(topic):
        raise SourceError(f"{what} {spec.region}={spec.uri}: topic {topic!r} has no partition {partition}")
    return src


def restore(opts: RestoreOptions, progress: Progress | None = None) -> tuple[Restored, dict[str, Any]]:
    """Restore the state; returns it and the run's facts for summary.json (timings, RT sources that failed).
    Raises UsageError for an unusable VT source or offset."""
    t0 = time.time()
    try:
        src = _open_partition(opts.source, opts.kafka_conf.get(opts.source.region), opts.vt, opts.partition,
                              "--source")
        first, end = src.bounds(opts.vt, opts.partition)
    except SourceError as exc:
        raise UsageError(str(exc)) from None
    if not first <= opts.at < end:
        raise UsageError(f"--at-offset {opts.at}: {opts.vt}[{opts.partition}] of source {opts.source.region} "
                         f"holds offsets {first}..{end - 1}")
    try:
        if progress is not None:
            progress.stage(f"restoring {opts.vt}[{opts.partition}] at {opts.at} (heartbeat search, VT replay)")
        restored = restore_vt(source_reader(src, opts.vt, opts.partition, progress), opts.at, first_offset=first)
    except SourceError as exc:
        raise UsageError(str(exc)) from None
    t_vt = time.time()
    if restored.heartbeat is None:
        log.warning("%s[%d] at %d: %s; replayed the partition from offset %d (%d records)", opts.vt,
                    opts.partition, opts.at, restored.fallback_reason, first, restored.vt_replayed)
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
            rt_src = _open_partition(spec, opts.kafka_conf.get(spec.region), opts.rt, opts.partition, "--rt-source")
            rt_first, _ = rt_src.bounds(opts.rt, opts.partition)
            if progress is not None:
                progress.stage(f"replaying the RT of region {spec.region}")
            entry = restore_rt(restored, spec.region, source_reader(rt_src, opts.rt, opts.partition, progress),
                               first_offset=rt_first)
        except (SourceError, OSError) as exc:
            failed.append({"region": spec.region, "uri": spec.uri, "error": str(exc)})
            evidence.append(PartitionEvidence(spec.region, opts.rt, opts.partition, 0, 0, error=str(exc)))
            log.error("RT of region %d could not be replayed: %s", spec.region, exc)
            continue
        evidence.append(_rt_evidence(opts, entry, rt_first))
        if entry.warning:
            log.warning("%s", entry.warning)
    facts = {
        "timings": {"vt_s": round(t_vt - t0, 4), "rt_s": round(time.time() - t_vt, 4),
                    "total_s": round(time.time() - t0, 4)},
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
    ev = PartitionEvidence(opts.source.region, opts.vt, opts.partition, start, opts.at + 1,
                           read_records=restored.vt_replayed, reached_end=True)
    if replay is not None:
        ev.note_undecodable(replay.undecodable_offsets)
        ev.undecodable = replay.undecodable
    return ev


def _rt_evidence(opts: RestoreOptions, entry: RtRegion, first: int) -> PartitionEvidence:
    """What one region's RT replay read: from the restore point's watermark to the replica's resume offset."""
    start = first if entry.watermark is None else entry.watermark + 1
    end = entry.resume_offset + 1
    reached = entry.state_offset is not None and entry.state_offset >= entry.resume_offset
    ev = PartitionEvidence(entry.region, opts.rt, opts.partition, start, max(start, end),
                           read_records=entry.replayed, reached_end=reached or end <= start)
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
        where = {"store": opts.store, "version": opts.version, "vt_topic": opts.vt, "rt_topic": opts.rt,
                 "region": opts.source.region, "partition": opts.partition}
        out.write_json("state.json", {**where, **restored.to_json()})
        common = out.common_fields("div restore", code, {opts.source.region: opts.source.uri})
        out.write_json("summary.json", {
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
        })
    return code


def register(div_sub, add_common) -> None:
    """Add `div restore` to the `div` subcommands (called by pipelines.div.cli)."""
    p = div_sub.add_parser("restore", help="rebuild a replica's DIV state at a VT offset from heartbeats",
                           description=RESTORE_HELP, epilog=RESTORE_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", required=True, metavar="ID=URI",
                   help="the region whose VT replica is restored, and where to read it: an archive directory or "
                        "kafka://host:port[,host:port]")
    p.add_argument("--rt-source", action="append", default=[], metavar="ID=URI",
                   help="where region ID's RT is (repeatable, one per region): replays it from the heartbeat's "
                        "watermark to the replica's resume offset. Without it a region's RT state is the "
                        "heartbeat's, at its watermark (state.json says which offset it is at)")
    p.add_argument("--store", metavar="S", help="store name (default: `store` in --conf)")
    p.add_argument("--version", type=int, metavar="N", help="store version: the VT is S_vN (default: `version` "
                                                             "in --conf)")
    p.add_argument("--partition", type=int, required=True, metavar="P", help="partition to restore")
    p.add_argument("--at-offset", type=int, required=True, metavar="O",
                   help="the last VT offset the replica has processed: the state includes record O and a "
                        "follower resumes at O + 1 (as a checkpoint's offset)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory (replaced atomically): partition_state.bin, state.json, summary.json")
    p.add_argument("--vt-topic", metavar="NAME", help="VT name when it is not S_vN")
    p.add_argument("--rt-topic", metavar="NAME", help="RT name when it is not S_rt (e.g. S_rt_v3)")
    add_common(p)
    p.set_defaults(func=run_restore_cmd)


def run_restore_cmd(args) -> int:
    conf = cfg.load(args.conf)
    try:
        source = parse_source(args.source)
        rt_sources = [parse_source(s) for s in args.rt_source]
        check_unique(rt_sources)
    except SourceError as exc:
        raise UsageError(str(exc)) from None
    store = args.store or conf.get("store")
    version = args.version if args.version is not None else conf.get("version")
    if not args.vt_topic and (not store or version is None):
        raise UsageError("--store and --version are needed to name the VT (or give --vt-topic)")
    if not args.rt_topic and rt_sources and not store:
        raise UsageError("--store is needed to name the RT (or give --rt-topic)")
    if args.partition < 0:
        raise UsageError(f"--partition {args.partition}: must not be negative")
    if args.at_offset < 0:
        raise UsageError(f"--at-offset {args.at_offset}: must not be negative")
    regions = {source.region} | {s.region for s in rt_sources}
    opts = RestoreOptions(
        source=source, store=store or "", version=int(version) if version is not None else -1,
        partition=args.partition, at=args.at_offset, out=args.out, rt_sources=rt_sources,
        vt_topic=args.vt_topic, rt_topic=args.rt_topic,
        kafka_conf={r: cfg.kafka_conf(conf, r) for r in regions},
    )
    return run_restore(opts)
