"""`tidegauge changes`: its arguments, and the options they make for `pipelines.changes.job.run_local` (or the
Spark engine, `pipelines.changes.spark.run_spark`)."""

from __future__ import annotations

import argparse
import re
import textwrap

from pipelines.core import config as cfg
from pipelines.core.errors import UsageError, exit_codes
from pipelines.core.sources import SourceError, SourceSpec
from pipelines.core.storage import absolute

HELP = textwrap.dedent("""\
    Change capture: every change in one region's version topic <S>_v<N>, each delivered exactly once, for a
    cache, a search index or an ETL that applies them. A VT holds duplicates (the broker redelivers, a new
    leader re-produces after a failover, a new version replays the real-time topics); tidegauge drops them
    with per-region watermarks kept from the records' leader footers and the heartbeats' hbw vectors
    (docs/design.md, "Change capture"), without per-record offset vectors. A run without earlier state
    delivers the version's bulk load first, as the initial snapshot.

    Writes OUT/changes/ (Parquet, one file per partition, one row per change in VT order: partition,
    vt_offset, key, op PUT|DELETE, value, logical_ts, upstream_region, upstream_offset) and OUT/summary.json
    (delivered, bulk_load, duplicates_dropped by cause, undecodable records with their offsets, what was read,
    the state used). docs/outputs.md has the contract.

    --state DIR makes runs incremental: a run reads on from the state the previous one left there and commits
    its own after its output is published; a run killed anywhere and run again delivers nothing twice and
    loses nothing (an output, once published, is delivered: read each one once). A state of version N-1 with
    --version N follows the store to its new version: the watermarks are kept, the new bulk load is skipped,
    and what the new version replays is dropped as the duplicate it is. A state belongs to one region's VT:
    it records the region (ID=LOC) and its VT's identity, and a source of another region is refused.

    --from-cut DIR/cut.json (written by `tidegauge cut`) starts at a consistent cut instead: exactly the changes
    above the cut, each once, no bulk load, the watermarks W = the cut's RT positions; what a cache restored from a
    snapshot at that time needs. With --state (a new directory) the state it writes resumes as usual.

    Runs never erase each other: an --out whose changes no consumer has marked read (--out/read.json naming the
    summary's `run`) is refused; give each run its own --out, or mark the output read before the next run.

    Exit codes: 0 every record read and delivered or dropped as a duplicate, 2 bad usage, an unreadable or
    empty source, a --state of another store, version or region's VT, a cut of another store or version, or an
    --out holding unread changes (nothing written), 3 some records could not be
    decoded or a partition could not be read (counted with their offsets, never delivered; the rest is
    written).""")

EPILOG = textwrap.dedent("""\
    examples:
      first run: the version's bulk load as the initial snapshot, then every change so far
        tidegauge changes --store sim_store --version 1 --source out/sim/archive/dc-0 --out out/changes
      every minute (cron, or a loop): each run reads on from --state and writes its own --out
        tidegauge changes --store s --version 3 --source kafka://broker:9092 --conf conf/tidegauge.yaml \\
            --state state/changes-s --out out/changes/run-$EPOCHSECONDS
      a cache restored from a snapshot at a cut: the changes after it, then on from --state as usual
        tidegauge changes --store s --version 3 --source 1=kafka://broker:9092 --conf conf/tidegauge.yaml \\
            --from-cut out/cut/cut.json --state state/cache-1 --out out/changes/run-$EPOCHSECONDS
      the store swapped to version 4 (the state is of version 3): the same --state, --version 4
        tidegauge changes --store s --version 4 --source kafka://broker:9092 --conf conf/tidegauge.yaml \\
            --state state/changes-s --out out/changes/run-$EPOCHSECONDS
      on Spark, one task per partition
        tidegauge changes --store s --version 3 --source s3://archive/dc-1 --engine spark --master yarn \\
            --state s3://state/changes-s --out s3://changes/s-v3-run-1""")


def register(sub) -> None:
    p = sub.add_parser(
        "changes",
        help="change capture: every change of a version topic, each once (resumable, version swaps)",
        description=HELP,
        epilog=EPILOG,
    )
    p.add_argument("--store", metavar="S", help="store name (default: `store` in --conf, else --from-cut's)")
    p.add_argument(
        "--version",
        type=int,
        metavar="N",
        help="store version: reads the VT S_vN (default: `version` in --conf, else --from-cut's). With a --state of version "
        "N-1, follows the store to version N",
    )
    p.add_argument(
        "--source",
        metavar="LOC",
        help="the region whose VT the client reads: its archive directory (Parquet, Spark Kafka schema) or "
        "kafka://host:port[,host:port]; ID=LOC names its region (the state records it and refuses another region's "
        "VT; without ID the source is no region's). Default: the only entry of `sources:` in --conf",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output directory or URI (published whole): changes/ Parquet and summary.json. An earlier run's "
        "output there is replaced only once read (DIR/read.json naming its summary's run), else refused",
    )
    p.add_argument(
        "--state",
        metavar="DIR",
        help="incremental runs: resume from the state in DIR (state.tgcc) when there is one, or follow it from "
        "version N-1; commit the new state there after the output is published",
    )
    p.add_argument(
        "--from-cut",
        metavar="FILE",
        help="start at a consistent cut (cut.json of `tidegauge cut`, same store and version): deliver exactly the "
        "changes above it, each once, no bulk load. With --state, the directory must hold no state yet",
    )
    p.add_argument(
        "--follow-unended",
        action="store_true",
        help="with a --state of version N-1: follow version N although that state has not read version N-1's "
        "VersionSwap message in every partition (refused by default: the new version's bulk load, which a follower "
        "skips, may then hold changes it never got). Only for stores whose versions end without one",
    )
    p.add_argument(
        "--regions",
        type=cfg.region_count,
        metavar="N",
        help="the store's region count, for a first run (default: the length of the heartbeats' hbw vectors "
        "in the topic; a --state knows it)",
    )
    p.add_argument(
        "--engine",
        choices=["local", "spark"],
        default="local",
        help="local: one process, partitions in turn (default); spark: one Spark task per partition, same "
        "output (executors must reach the source and the output, and import tidegauge)",
    )
    p.add_argument("--master", metavar="URL", help="Spark master for --engine spark (default local[*])")
    p.add_argument(
        "--conf",
        metavar="FILE",
        help="YAML configuration (store, version, sources, kafka client settings, spark); flags override it "
        "(default: conf/tidegauge.yaml when present)",
    )
    p.set_defaults(func=run_changes)


def parse_location(text: str) -> tuple[int | None, str]:
    """`LOC` or `ID=LOC` → (region id or None, LOC)."""
    text = (text or "").strip()
    m = re.fullmatch(r"(\d+)\s*=\s*(\S.*)", text)
    if m:
        return int(m.group(1)), m.group(2)
    if not text:
        raise SourceError("--source: empty; give an archive directory or kafka://host:port")
    return None, text


@exit_codes(SourceError)
def run_changes(args: argparse.Namespace) -> int:
    from pipelines.changes.job import ChangesOptions, run_local

    conf = cfg.load(args.conf)
    store = args.store or conf.get("store")
    version = args.version if args.version is not None else conf.get("version")
    if args.from_cut and (not store or version is None):
        from pipelines.changes.job import read_cut

        cut = read_cut(absolute(args.from_cut))  # the cut names its store version
        store, version = store or cut.store, version if version is not None else cut.version
    if not store or version is None:
        raise UsageError(
            "--store and --version are required (or `store:` and `version:` in --conf, or a --from-cut)"
        )
    if int(version) < 1:
        raise UsageError(f"--version {version}: store versions start at 1")
    if args.source is not None:
        region, loc = parse_location(args.source)
    else:
        configured = {int(r): u for r, u in (conf.get("sources") or {}).items()}
        region = conf.get("changes")  # the region whose changes `tidegauge watch --changes` writes
        if region is None and len(configured) == 1:
            (region,) = configured
        if region is None or region not in configured:
            raise UsageError(
                "--source LOC is required (or `sources:` in --conf with one entry, or with `changes: R` naming one)"
            )
        loc = configured[region]
    regions = args.regions if args.regions is not None else conf.get("regions")
    opts = ChangesOptions(
        store=str(store),
        version=int(version),
        source=SourceSpec(region if region is not None else -1, str(loc)),  # -1: no region said
        out=args.out,
        state_dir=absolute(args.state) if args.state else None,
        kafka_conf=cfg.kafka_conf(conf, region if region is not None else -1),
        regions=regions,
        engine=args.engine,
        region_given=region is not None,
        follow_unended=bool(args.follow_unended),
        from_cut=absolute(args.from_cut) if args.from_cut else None,
    )
    if args.engine == "spark":
        from pipelines.changes.spark import run_spark

        master, spark_conf = cfg.spark_settings(conf, args.master)
        return run_spark(opts, master, spark_conf)
    return run_local(opts)
