"""`tidegauge repair`: its subcommands' arguments. `repair plan` makes the options for
`pipelines.repair.job.run`."""

from __future__ import annotations

import argparse
import textwrap

from pipelines.core import config as cfg
from pipelines.core.errors import UsageError, exit_codes
from pipelines.core.sources import SourceError, check_unique, parse_source

PLAN_HELP = textwrap.dedent("""\
    Plan the repair of what `tidegauge leapfrog` found: for every divergent key, the one write that makes every
    region agree. The write is the winning record re-emitted with its own logical timestamp, so that each region
    applies it through Venice's normal conflict resolution (DCR): a region that holds it, or a newer write,
    ignores it; a region that missed it takes it; a write made after the plan still wins.

    The winner: with --rt, the RT write a region's record names (its leader footer) is the truth, and a region
    whose value differs from it was poisoned. Otherwise the winner is what Venice's DCR picks among the regions'
    current records: the highest logical timestamp; on a tie a DELETE, else the higher Java hash of the value
    (Venice's AbstractMerge and MergeUtils; docs/design.md, "Repair"). Where DCR cannot decide — the same RT
    write held with different values and no --rt, or equal timestamps whose values' hashes tie — the key is
    undecidable: named, and left without a write unless --tie-break R takes region R's record.

    Reads the leapfrog output (it must be of the same store and version) and each region's version topic once
    (only the divergent keys are kept), and with --rt the RT writes the records name. Runs in this process
    (local engine): no Spark.

    Writes OUT/plan/ (Parquet, one row per divergent key: partition, key, op PUT|DELETE|NONE, value,
    logical_ts, source_region, source_offset, regions_to_fix, cause), OUT/plan.txt (per region pair: the keys
    in hex, the cause and the write) and OUT/summary.json (counts). docs/outputs.md has the contract. Nothing is
    written to any topic: applying a plan is a later command.

    Exit codes: 0 every divergent key has a write (or the regions agree now), 1 some keys are undecidable (named
    on stderr and in summary.json), 2 bad usage or an unreadable input (nothing written), 3 some records could
    not be decoded (the plan may rest on an older record of their keys).""")

PLAN_EPILOG = textwrap.dedent("""\
    examples:
      find the divergences, then plan their repair with the RTs as ground truth
        tidegauge leapfrog --store sim_store --version 1 --source 0=out/sim/archive/dc-0 \\
            --source 1=out/sim/archive/dc-1 --source 2=out/sim/archive/dc-2 --out out/leapfrog
        tidegauge repair plan --store sim_store --version 1 --source 0=out/sim/archive/dc-0 \\
            --source 1=out/sim/archive/dc-1 --source 2=out/sim/archive/dc-2 \\
            --rt 0=out/sim/archive/dc-0 --rt 1=out/sim/archive/dc-1 --rt 2=out/sim/archive/dc-2 \\
            --leapfrog out/leapfrog --out out/repair-plan
        less out/repair-plan/plan.txt
      without the RTs, trusting region 0 where conflict resolution cannot decide
        tidegauge repair plan --store s --version 3 --source 0=kafka://dc0:9092 --source 1=kafka://dc1:9092 \\
            --leapfrog out/leapfrog --out out/repair-plan --tie-break 0""")


def register(sub) -> None:
    repair = sub.add_parser(
        "repair",
        help="repair divergences: plan the write that makes every region agree",
        description="Repair what `tidegauge leapfrog` found. `plan` decides, for every divergent key, the write "
        "that makes every region agree.",
    )
    repair_sub = repair.add_subparsers(dest="repair_command", metavar="SUBCOMMAND")
    repair.set_defaults(func=lambda a: (repair.print_help(), 2)[1])
    p = repair_sub.add_parser(
        "plan",
        help="for every divergent key of a leapfrog output, the write that makes every region agree",
        description=PLAN_HELP,
        epilog=PLAN_EPILOG,
    )
    p.add_argument("--store", metavar="S", help="store name (default: `store` in --conf)")
    p.add_argument("--version", type=int, metavar="N", help="store version (default: `version` in --conf)")
    p.add_argument(
        "--source",
        action="append",
        metavar="ID=LOC",
        help="a region's version topic: region id and an archive directory (Parquet, Spark Kafka schema) or "
        "kafka://host:port[,...]; one per region, two or more (every region the leapfrog output names)",
    )
    p.add_argument(
        "--rt",
        action="append",
        default=[],
        metavar="ID=LOC",
        help="a region's real-time topic S_rt (archive or kafka://), to read the RT writes the records name: "
        "the ground truth that tells a poisoned region (repeatable; regions without one are judged by DCR)",
    )
    p.add_argument(
        "--leapfrog",
        required=True,
        metavar="DIR",
        help="the --out of a `tidegauge leapfrog` run of the same store version",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output directory or URI (published whole): plan/ Parquet, plan.txt and summary.json",
    )
    p.add_argument(
        "--tie-break",
        type=int,
        metavar="R",
        help="where conflict resolution cannot decide a key, take region R's record as the winner (default: "
        "such keys are undecidable and get no write)",
    )
    p.add_argument(
        "--conf",
        metavar="FILE",
        help="YAML configuration (store, version, sources, kafka client settings); flags override it",
    )
    p.set_defaults(func=run_plan)


@exit_codes(SourceError)
def run_plan(args: argparse.Namespace) -> int:
    from pipelines.repair.job import PlanOptions, run

    conf = cfg.load(args.conf)
    store, version, specs = cfg.store_version_regions(args, conf, "repair plan")
    if version < 1:
        raise UsageError(f"--version {version}: store versions start at 1")
    try:
        rts = [parse_source(s) for s in args.rt]
        check_unique(rts)
    except SourceError as exc:
        raise SourceError(str(exc).replace("--source", "--rt")) from None
    opts = PlanOptions(
        store=str(store),
        version=int(version),
        sources=specs,
        leapfrog=args.leapfrog,
        out=args.out,
        rts=rts,
        tie_break=args.tie_break,
        kafka_conf={s.region: cfg.kafka_conf(conf, s.region) for s in specs},
    )
    return run(opts)
