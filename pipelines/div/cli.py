"""`tidegauge div validate` and `tidegauge div restore`: the command-line faces of the DIV jobs."""

from __future__ import annotations

import argparse
import textwrap

from div.validators import ValidatorSpecError
from pipelines.core import config as cfg
from pipelines.core.errors import UsageError, exit_codes
from pipelines.core.sources import SourceError, check_unique, parse_source

VALIDATE_HELP = textwrap.dedent("""\
    Validate whole topics with Venice's Data Integrity Validation (DIV): segments, sequence numbers and
    checksums of every producer, partition by partition.

    Findings: UNREGISTERED_PRODUCER, MISSING, CORRUPT, DUPLICATE, DATA_AFTER_SEGMENT_END (Venice's rules; fatal
    before End of Push, warnings after) and UNDECODABLE (a record that is not a Venice record). They are written
    one row per finding to OUT/errors/ (Parquet) with OUT/summary.json beside it.

    Exit codes: 0 no fatal finding, 1 fatal findings, 2 bad usage or unreadable source,
    3 some partitions could not be read (the others are written).""")

VALIDATE_EPILOG = textwrap.dedent("""\
    examples:
      tidegauge div validate --source 0=out/sim/archive/dc-0 --out out/div
      tidegauge div validate --source 1=kafka://broker:9092 --topic store_v1 --min-compaction-lag-ms 86400000 \\
          --now-ms 1700000000000 --out out/div-dc1
      tidegauge div validate --source 0=out/sim/archive/dc-0 --engine spark --master 'local[*]' --out out/div""")


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
      tidegauge div restore --source 0=out/sim/archive/dc-0 --store sim_store --version 1 --partition 0 \\
          --at-offset 1200 --out out/restore
      tidegauge div restore --source 1=kafka://broker-b:9092 --rt-source 0=s3://backups/archive/dc-0 \\
          --rt-source 1=kafka://broker-b:9092 --rt-source 2=s3://backups/archive/dc-2 --store s --version 3 \\
          --partition 5 --at-offset 88000 --out out/restore-p5""")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--conf",
        metavar="FILE",
        help="YAML configuration (sources, kafka client settings, spark); flags override it "
        "(default: conf/tidegauge.yaml when present)",
    )


def register(sub) -> None:
    div = sub.add_parser(
        "div",
        help="Data Integrity Validation: validate logs, restore DIV state",
        description="Data Integrity Validation (DIV) jobs: `validate` checks whole topics, "
        "`restore` rebuilds a replica's DIV state from heartbeats.",
    )
    div_sub = div.add_subparsers(dest="div_command", metavar="SUBCOMMAND")
    div.set_defaults(func=lambda a: (div.print_help(), 2)[1])

    v = div_sub.add_parser(
        "validate",
        help="validate topics with DIV (segments, sequences, checksums)",
        description=VALIDATE_HELP,
        epilog=VALIDATE_EPILOG,
    )
    v.add_argument(
        "--source",
        action="append",
        metavar="ID=URI",
        default=[],
        help="region id and where to read it: an archive directory (Parquet, Spark Kafka schema) or "
        "kafka://host:port[,host:port]. Repeatable, one per region.",
    )
    v.add_argument(
        "--topic",
        action="append",
        metavar="NAME",
        default=[],
        help="topic to validate (repeatable; default: every topic of every source)",
    )
    v.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output directory or URI (published whole): errors/ Parquet and summary.json",
    )
    v.add_argument(
        "--min-compaction-lag-ms",
        type=int,
        metavar="N",
        help="treat version topics as compacted with this min.compaction.lag.ms: a gap is tolerated "
        "for records at least N ms older than --now-ms (default: read from the topic's "
        "configuration on a live cluster; no tolerance for archives)",
    )
    v.add_argument(
        "--now-ms",
        type=int,
        metavar="T",
        help="the 'now' (epoch ms) compaction tolerance is measured against, so a batch run is "
        "repeatable (default: the time the job starts)",
    )
    v.add_argument(
        "--max-age-ms",
        type=int,
        default=-1,
        metavar="N",
        help="producer-state max age (Venice's div.producer.state.max.age.ms): forget producers whose "
        "last record is N ms older than the newest producer's. Default -1: never.",
    )
    v.add_argument(
        "--fail-fast",
        action="store_true",
        help="stop at the first fatal finding (exit 1) instead of validating everything",
    )
    v.add_argument(
        "--engine",
        choices=["local", "spark"],
        default="local",
        help="local: one process, partitions in turn (default); spark: partitions in parallel, same "
        "findings and summary (executors must be able to import tidegauge: install the wheel "
        "there or pass it with spark-submit --py-files; the Spark setting tidegauge.div.read = "
        "auto|shuffle|direct chooses how records reach them)",
    )
    v.add_argument("--master", metavar="URL", help="Spark master for --engine spark (default local[*])")
    v.add_argument(
        "--restore-at",
        type=int,
        metavar="O",
        help="start every partition at offset O with the DIV state restored from the last heartbeat "
        "at or before O (as a follower does after a restart), instead of from offset 0",
    )
    v.add_argument(
        "--validator",
        action="append",
        metavar="MODULE:CLASS",
        default=[],
        help="record validator to run after DIV, in order (repeatable). Built-ins: "
        "builtin:offsets_increasing, builtin:timestamp_drift, builtin:key_present, "
        "builtin:schema_ids. Parameters go in --conf under `validators:` "
        "(see docs/validators.md); rows are typed VALIDATOR:<name>",
    )
    _add_common(v)
    v.set_defaults(func=run_validate)

    _register_restore(div_sub)


@exit_codes(SourceError, ValidatorSpecError)
def run_validate(args: argparse.Namespace) -> int:
    from div.validators.registry import build_chain
    from pipelines.div.validate import ValidateOptions, run_local

    conf = cfg.load(args.conf)
    specs = cfg.sources(args.source, conf)
    if not specs:
        raise UsageError("no source given: use --source ID=URI (or `sources:` in --conf)")
    validators = list(conf.get("validators") or []) + [{"class": v} for v in args.validator]
    build_chain(validators)  # a bad validator entry is bad usage (exit 2), found before any partition is read
    opts = ValidateOptions(
        sources=specs,
        out=args.out,
        topics=args.topic,
        min_compaction_lag_ms=args.min_compaction_lag_ms,
        now_ms=args.now_ms,
        max_age_ms=args.max_age_ms,
        fail_fast=args.fail_fast,
        kafka_conf={s.region: cfg.kafka_conf(conf, s.region) for s in specs},
        record_validators=validators,
        restore_at=args.restore_at,
        engine=args.engine,
    )
    if args.engine == "spark":
        from pipelines.div.spark import run_spark

        master, spark_conf = cfg.spark_settings(conf, args.master)
        return run_spark(opts, master, spark_conf)
    return run_local(opts)


def _register_restore(div_sub) -> None:
    p = div_sub.add_parser(
        "restore",
        help="rebuild a replica's DIV state at a VT offset from heartbeats",
        description=RESTORE_HELP,
        epilog=RESTORE_EPILOG,
    )
    p.add_argument(
        "--source",
        required=True,
        metavar="ID=URI",
        help="the region whose VT replica is restored, and where to read it: an archive directory or "
        "kafka://host:port[,host:port]",
    )
    p.add_argument(
        "--rt-source",
        action="append",
        default=[],
        metavar="ID=URI",
        help="where region ID's RT is (repeatable, one per region): replays it from the heartbeat's "
        "watermark to the replica's resume offset. Without it a region's RT state is the "
        "heartbeat's, at its watermark (state.json says which offset it is at)",
    )
    p.add_argument("--store", metavar="S", help="store name (default: `store` in --conf)")
    p.add_argument(
        "--version",
        type=int,
        metavar="N",
        help="store version: the VT is S_vN (default: `version` in --conf)",
    )
    p.add_argument("--partition", type=int, required=True, metavar="P", help="partition to restore")
    p.add_argument(
        "--at-offset",
        type=int,
        required=True,
        metavar="O",
        help="the last VT offset the replica has processed: the state includes record O and a "
        "follower resumes at O + 1 (as a checkpoint's offset)",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output directory or URI (published whole): partition_state.bin, state.json, summary.json",
    )
    p.add_argument("--vt-topic", metavar="NAME", help="VT name when it is not S_vN")
    p.add_argument("--rt-topic", metavar="NAME", help="RT name when it is not S_rt (e.g. S_rt_v3)")
    _add_common(p)
    p.set_defaults(func=run_restore)


@exit_codes(SourceError)
def run_restore(args: argparse.Namespace) -> int:
    from pipelines.div.restore import RestoreOptions
    from pipelines.div.restore import run_restore as run_job

    conf = cfg.load(args.conf)
    source = parse_source(args.source)
    rt_sources = [parse_source(s) for s in args.rt_source]
    check_unique(rt_sources)
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
        source=source,
        store=store or "",
        version=int(version) if version is not None else -1,
        partition=args.partition,
        at=args.at_offset,
        out=args.out,
        rt_sources=rt_sources,
        vt_topic=args.vt_topic,
        rt_topic=args.rt_topic,
        kafka_conf={r: cfg.kafka_conf(conf, r) for r in regions},
    )
    return run_job(opts)
