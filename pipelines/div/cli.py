"""`tidegauge div validate` and `tidegauge div restore`: the command-line faces of the DIV jobs."""

from __future__ import annotations

import argparse
import textwrap

from pipelines.core import config as cfg
from pipelines.core.errors import UsageError
from pipelines.core.sources import SourceError

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
      tidegauge div validate --source 0=out/archive/dc-0 --out out/div
      tidegauge div validate --source 1=kafka://broker:9092 --topic store_v1 --min-compaction-lag-ms 86400000 \\
          --now-ms 1700000000000 --out out/div-dc1
      tidegauge div validate --source 0=out/archive/dc-0 --engine spark --master local[*] --out out/div""")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--conf", metavar="FILE",
                   help="YAML configuration (sources, kafka client settings, spark); flags override it "
                        "(default: conf/tidegauge.yaml when present)")


def register(sub) -> None:
    div = sub.add_parser("div", help="Data Integrity Validation: validate logs, restore DIV state",
                         description="Data Integrity Validation (DIV) jobs: `validate` checks whole topics, "
                                     "`restore` rebuilds a replica's DIV state from heartbeats.")
    div_sub = div.add_subparsers(dest="div_command", metavar="SUBCOMMAND")
    div.set_defaults(func=lambda a: (div.print_help(), 2)[1])

    v = div_sub.add_parser("validate", help="validate topics with DIV (segments, sequences, checksums)",
                           description=VALIDATE_HELP, epilog=VALIDATE_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("--source", action="append", metavar="ID=URI", default=[],
                   help="region id and where to read it: an archive directory (Parquet, Spark Kafka schema) or "
                        "kafka://host:port[,host:port]. Repeatable, one per region.")
    v.add_argument("--topic", action="append", metavar="NAME", default=[],
                   help="topic to validate (repeatable; default: every topic of every source)")
    v.add_argument("--out", required=True, metavar="DIR",
                   help="output directory (replaced atomically): errors/ Parquet and summary.json")
    v.add_argument("--min-compaction-lag-ms", type=int, metavar="N",
                   help="treat version topics as compacted with this min.compaction.lag.ms: a gap is tolerated "
                        "for records at least N ms older than --now-ms (default: read from the topic's "
                        "configuration on a live cluster; no tolerance for archives)")
    v.add_argument("--now-ms", type=int, metavar="T",
                   help="the 'now' (epoch ms) compaction tolerance is measured against, so a batch run is "
                        "repeatable (default: the time the job starts)")
    v.add_argument("--max-age-ms", type=int, default=-1, metavar="N",
                   help="producer-state max age (Venice's div.producer.state.max.age.ms): forget producers whose "
                        "last record is N ms older than the newest producer's. Default -1: never.")
    v.add_argument("--fail-fast", action="store_true",
                   help="stop at the first fatal finding (exit 1) instead of validating everything")
    v.add_argument("--engine", choices=["local", "spark"], default="local",
                   help="local: one process, partitions in turn (default); spark: partitions in parallel, same "
                        "findings and summary (executors must be able to import tidegauge: install the wheel "
                        "there or pass it with spark-submit --py-files; the Spark setting tidegauge.div.read = "
                        "auto|shuffle|direct chooses how records reach them)")
    v.add_argument("--master", metavar="URL", help="Spark master for --engine spark (default local[*])")
    v.add_argument("--restore-at", type=int, metavar="O",
                   help="start every partition at offset O with the DIV state restored from the last heartbeat "
                        "at or before O (as a follower does after a restart), instead of from offset 0")
    v.add_argument("--validator", action="append", metavar="MODULE:CLASS", default=[],
                   help="record validator to run after DIV, in order (repeatable). Built-ins: "
                        "builtin:offsets_increasing, builtin:timestamp_drift, builtin:key_present, "
                        "builtin:schema_ids. Parameters go in --conf under `validators:` "
                        "(see docs/validators.md); rows are typed VALIDATOR:<name>")
    _add_common(v)
    v.set_defaults(func=run_validate)

    from pipelines.div import restore as div_restore

    div_restore.register(div_sub, _add_common)


def run_validate(args) -> int:
    from div.validators.base import ValidatorSpecError
    from div.validators.registry import build_chain
    from pipelines.div.validate import ValidateOptions, run_local

    conf = cfg.load(args.conf)
    specs = cfg.sources(args.source, conf)
    if not specs:
        raise UsageError("no source given: use --source ID=URI (or `sources:` in --conf)")
    validators = list(conf.get("validators") or []) + [{"class": v} for v in args.validator]
    try:  # a bad validator entry is bad usage (exit 2), found before any partition is read
        build_chain(validators)
    except ValidatorSpecError as exc:
        raise UsageError(str(exc)) from None
    opts = ValidateOptions(
        sources=specs, out=args.out, topics=args.topic, min_compaction_lag_ms=args.min_compaction_lag_ms,
        now_ms=args.now_ms, max_age_ms=args.max_age_ms, fail_fast=args.fail_fast,
        kafka_conf={s.region: cfg.kafka_conf(conf, s.region) for s in specs},
        record_validators=validators, restore_at=args.restore_at, engine=args.engine,
    )
    try:
        if args.engine == "spark":
            from pipelines.div.spark import run_spark

            master, spark_conf = cfg.spark_settings(conf, args.master)
            return run_spark(opts, master, spark_conf)
        return run_local(opts)
    except SourceError as exc:
        raise UsageError(str(exc)) from None
