"""`tidegauge cut`: its arguments, and the options they make for `pipelines.cut.job.run_local` (or the Spark
engine, `pipelines.cut.spark.run_spark`)."""

from __future__ import annotations

import argparse
import textwrap

from heartbeat.cuts import CutError, parse_time
from pipelines.core import config as cfg
from pipelines.core.errors import UsageError, exit_codes
from pipelines.core.sources import SourceError, SourceSpec, check_unique, parse_source

HELP = textwrap.dedent("""\
    A consistent cut of a store version at one upstream time T: where each region's version topic stood at T,
    which regions had not caught up, and (with --snapshot X) what region X held at T. A heartbeat ties a
    position in a VT to a position in every region's real-time topic (its hbw vector), so one time names a
    coherent position everywhere, in any region, per partition.

    C, the cut: per partition and region r, the highest offset of r's RT whose timestamp is <= T. With --rt for
    every region it is exact (read from the RT timestamps, or from the broker's time index where the topic's
    timestamps are LogAppendTime); without --rt it is heartbeat-aligned (the latest RT heartbeat at or before T
    that the VTs reflect), never beyond the exact one. In each region's VT: floor (the last heartbeat whose
    vector is <= C), ceil (the first whose vector is >= C: every record of the cut lies before it; none: the
    region is behind) and exact (a heartbeat's vector equals C). Reads only heartbeats and RT timestamps.

    --snapshot X writes X's state at the cut, per key: the bulk load, then the conflict-resolution winner among
    the writes at or below the cut, read from X's VT up to ceil. A key that a write above the cut touched before
    ceil is not exact from the VT alone; with --rt it is resolved from the RT writes with Venice's own DCR (the
    rule `repair plan` uses), so every key is exact.

    Writes OUT/cut.json (the cut: `tidegauge changes --from-cut OUT/cut.json` then replays exactly the changes
    after it, each once), OUT/snapshot/ (Parquet,
    one row per key: partition, key, op PUT|DELETE|NONE, value, logical_ts, upstream_region, upstream_offset,
    exact) and OUT/summary.json; prints a summary. docs/outputs.md has the contract.

    Exit codes: 0 the cut (and snapshot) written, 1 region X is behind the cut in some partition (those
    partitions are left out of the snapshot and named), 2 bad usage (a time without a zone, --rt for some
    regions only, a store version the sources do not hold) or an unreadable source (nothing written), 3 some
    records could not be read or decoded (counted with their offsets; the rest is written).""")

EPILOG = textwrap.dedent("""\
    examples:
      where was every region's VT at midnight UTC, and which had not caught up (heartbeat-aligned)
        tidegauge cut --source 0=out/sim/archive/dc-0 --source 1=out/sim/archive/dc-1 \\
            --at 2026-11-29T00:00:00Z --out out/cut
      what did region 1 hold at that time, exact for every key (the RTs read too)
        tidegauge cut --store sim_store --version 1 --source 0=kafka://dc0:9092 --source 1=kafka://dc1:9092 \\
            --rt 0=kafka://dc0:9092 --rt 1=kafka://dc1:9092 --at 2026-11-29T02:00+02:00 --snapshot 1 --out out/cut
      then resume a cache at that time: every change after the cut, each once (region 1's VT)
        tidegauge changes --source 1=kafka://dc1:9092 --from-cut out/cut/cut.json --state state/cache-1 \\
            --out out/changes-after-cut
      on Spark, one task per partition read
        tidegauge cut --source 0=s3://archive/dc-0 --source 1=s3://archive/dc-1 --at 1764374400000 \\
            --snapshot 0 --engine spark --master yarn --out s3://cuts/midnight""")


def register(sub) -> None:
    p = sub.add_parser(
        "cut",
        help="a consistent cut at one upstream time: each region's VT position, and a snapshot at it",
        description=HELP,
        epilog=EPILOG,
    )
    p.add_argument(
        "--source",
        action="append",
        metavar="ID=LOC",
        default=[],
        help="region ID's version topics: an archive directory (or any storage URI) or kafka://host:port[,...]. "
        "Repeatable, one per region whose VT is placed",
    )
    p.add_argument(
        "--rt",
        action="append",
        metavar="ID=LOC",
        default=[],
        help="region ID's real-time topic <S>_rt (archive or kafka://): the exact cut. Give it for every region "
        "of the store or for none",
    )
    p.add_argument(
        "--at",
        required=True,
        metavar="TIME",
        help="the time T: ISO 8601 with a zone (2026-11-29T00:00:00Z, 2026-11-29T02:00+02:00) or epoch "
        "milliseconds",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output directory or URI (published whole): cut.json, snapshot/ and summary.json",
    )
    p.add_argument(
        "--snapshot",
        type=int,
        metavar="ID",
        help="write region ID's state at the cut (it needs a --source); reads its VT up to ceil only",
    )
    p.add_argument(
        "--store",
        metavar="S",
        help="store name (default: `store` in --conf, else the one store in the sources)",
    )
    p.add_argument(
        "--version",
        type=int,
        metavar="N",
        help="store version: the VT S_vN (default: `version` in --conf, else the one version in the sources)",
    )
    p.add_argument(
        "--engine",
        choices=["local", "spark"],
        default="local",
        help="local: one process (default); spark: one Spark task per partition read, same output",
    )
    p.add_argument("--master", metavar="URL", help="Spark master for --engine spark (default local[*])")
    p.add_argument(
        "--conf",
        metavar="FILE",
        help="YAML configuration (store, version, sources, kafka client settings, spark); flags override it "
        "(default: conf/tidegauge.yaml when present)",
    )
    p.set_defaults(func=run_cut)


def _rts(texts: list[str]) -> list[SourceSpec]:
    try:
        given = [parse_source(t) for t in texts]
        check_unique(given)
    except SourceError as exc:
        raise UsageError(str(exc).replace("--source", "--rt")) from None
    return sorted(given, key=lambda s: s.region)


@exit_codes(SourceError, CutError)
def run_cut(args: argparse.Namespace) -> int:
    from pipelines.cut.job import CutOptions, run_local

    try:
        at_ms = parse_time(args.at)
    except CutError as exc:
        raise UsageError(f"--at {exc}") from None
    conf = cfg.load(args.conf)
    specs = cfg.sources(args.source, conf)
    rts = _rts(args.rt)
    version = args.version if args.version is not None else conf.get("version")
    if version is not None and int(version) < 1:
        raise UsageError(f"--version {version}: store versions start at 1")
    opts = CutOptions(
        sources=specs,
        at_ms=at_ms,
        out=args.out,
        rts=rts,
        store=args.store or conf.get("store"),
        version=None if version is None else int(version),
        snapshot=args.snapshot,
        kafka_conf={s.region: cfg.kafka_conf(conf, s.region) for s in [*specs, *rts]},
    )
    if args.engine == "spark":
        from pipelines.cut.spark import run_spark

        master, spark_conf = cfg.spark_settings(conf, args.master)
        return run_spark(opts, master, spark_conf)
    return run_local(opts)
