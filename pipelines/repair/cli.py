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
        help="repair divergences: plan the write that makes every region agree, apply it, verify it",
        description="Repair what `tidegauge leapfrog` found. `plan` decides, for every divergent key, the write "
        "that makes every region agree; `apply` produces those writes into a region's real-time topic; `verify` "
        "checks, on a later leapfrog run, that the planned keys agree.",
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
    _register_apply(repair_sub)
    _register_verify(repair_sub)


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


APPLY_HELP = textwrap.dedent("""\
    Produce a repair plan's writes into region ID's real-time topic S_rt (S: the plan's store), the way a Venice
    online producer does: Put and Delete envelopes under a new producer GUID, in DIV segments (StartOfSegment,
    sequence numbers, checksum, a final EndOfSegment per partition), each carrying the plan's logical timestamp
    (producerMetadata.logicalTimestamp) into the plan's partition (a key's VT partition is its RT partition).
    Every region's leader then applies each write through its normal conflict resolution (DCR): a region that
    holds the write or a newer one ignores it, a region that missed it takes it.

    Idempotent: re-running a plan changes nothing the regions hold. Each write is the winner itself, with the
    plan's logical timestamp (the winner's own, or one above the highest any region held where a region's DCR
    would have kept another record at the winner's) and value: a region that already applied it meets an equal
    timestamp and an equal value, a tie Venice's DCR resolves to the stored record, and a region holding a newer
    write keeps it. The RT gains
    records (under a new GUID each run); the regions' data does not change.

    Rows with op NONE (undecidable, or already agreeing) are skipped and counted. A plan made before writes were
    stamped above the winner may warn that a region's DCR would keep its own value (writes_dcr_would_ignore: same
    timestamp, higher stored hash — a poisoned region, typically): those keys are written too and named on
    stderr, and the write alone will not fix that region: plan again.
    Values are not chunked, as Venice's online producers do not chunk into a real-time topic (a Venice leader
    does not put RT chunks back together): a key and value over VeniceWriter's 972,800-byte message limit
    refuse the whole plan before anything is written; repush the store to repair such a key. The plan holds no value schema id: PUTs carry --value-schema-id.

    --dry-run prints each write (key in hex) and contacts no cluster. --out DIR writes summary.json and writes/
    (Parquet: partition, key, op, logical_ts, rt_offset) for `repair verify --applied`.

    Exit codes: 0 every write acknowledged (or printed, with --dry-run), 2 bad usage, an unreadable plan, a
    cluster without the topic or its partitions, a value too large (nothing written), 3 some writes were not
    acknowledged (re-running the plan is safe).""")

APPLY_EPILOG = textwrap.dedent("""\
    examples:
      see what would be written, then write it into region 1's RT
        tidegauge repair apply --plan out/repair-plan --kafka 1=dc1:9092 --dry-run
        tidegauge repair apply --plan out/repair-plan --kafka 1=dc1:9092 --rate 500 --out out/repair-apply
      with the region's TLS/SASL client settings from a configuration file (kafka: / kafka_by_region:)
        tidegauge repair apply --plan out/repair-plan --kafka 1=dc1:9093 --conf conf/tidegauge.yaml""")


def _register_apply(repair_sub) -> None:
    p = repair_sub.add_parser(
        "apply",
        help="produce a repair plan's writes into a region's real-time topic, as a Venice producer does",
        description=APPLY_HELP,
        epilog=APPLY_EPILOG,
    )
    p.add_argument("--plan", required=True, metavar="DIR", help="the --out of a `tidegauge repair plan` run")
    p.add_argument(
        "--kafka",
        required=True,
        metavar="ID=BOOTSTRAP",
        help="the region whose real-time topic takes the writes, and its brokers (host:port[,...])",
    )
    p.add_argument("--dry-run", action="store_true", help="print the writes; produce nothing")
    p.add_argument("--rate", type=float, metavar="N", help="at most N writes per second (default: no limit)")
    p.add_argument(
        "--value-schema-id",
        type=int,
        default=1,
        metavar="N",
        help="the value schema id PUTs carry (default 1; the plan does not record the winner's)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="also write summary.json and writes/ (the RT offset of each write) there",
    )
    p.add_argument(
        "--conf",
        metavar="FILE",
        help="YAML configuration: the region's Kafka client settings (kafka:, kafka_by_region:), passed as they are",
    )
    p.set_defaults(func=run_apply)


@exit_codes()
def run_apply(args: argparse.Namespace) -> int:
    from pipelines.repair.apply import ApplyOptions, run

    conf = cfg.load(args.conf)
    region_text, sep, bootstrap = (args.kafka or "").partition("=")
    try:
        region = int(region_text)
    except ValueError:
        region = -1
    if not sep or region < 0 or not bootstrap.strip():
        raise UsageError(f"--kafka {args.kafka}: give ID=host:port[,...] (a region id and its brokers)")
    bootstrap = bootstrap.strip().removeprefix("kafka://")
    return run(
        ApplyOptions(
            plan=args.plan,
            region=region,
            bootstrap=bootstrap,
            dry_run=args.dry_run,
            rate=args.rate,
            kafka_conf=cfg.kafka_conf(conf, region),
            value_schema_id=args.value_schema_id,
            out=args.out,
        )
    )


VERIFY_HELP = textwrap.dedent("""\
    Check that a repair converged: read a repair plan and a `tidegauge leapfrog` output made after the plan was
    applied and had time to replicate, and report each planned key. Leap Frog lists every divergence it saw in
    the range it read, the ones the repair has since fixed too: give --source for every region and the regions'
    current records of the planned keys decide (read from each VT once, as `repair plan` reads them).

      converged        every region holds the same record now (--source), or leapfrog no longer finds it divergent
      pending          still divergent, and some region's final high-water mark for the region whose RT took the
                       write is below the write's RT offset: that region has not processed the repair yet (lag)
      ignored_by_dcr   still divergent though every mark covers the write, and the plan warned that a region's
                       DCR keeps its own value (same timestamp, higher hash): only a plan made before such
                       writes were stamped one above the winner carries that warning; plan again
      diverging_again  still divergent though every mark covers the write
      still_divergent  still divergent, without --applied: leapfrog's output has the regions' marks but not where
                       the repair write is in the RT, so pending cannot be told from diverging again
      no_write         a planned key without a write (op NONE: undecidable) still divergent

    Divergent keys outside the plan are counted (new divergences: plan them again). The leapfrog output must be
    of the plan's store and version; --applied, the --out of `repair apply`, of the same store. Prints a page;
    --out DIR also writes verify.txt (the page), keys/ (Parquet: partition, key, op, cause, status, regions,
    types) and summary.json.

    Exit codes: 0 every planned key converged, 1 some did not, 2 bad usage or an unreadable input (nothing
    written).""")

VERIFY_EPILOG = textwrap.dedent("""\
    examples:
      after `repair apply --out out/repair-apply` and replication, compare the regions again and verify
        tidegauge leapfrog --store s --version 3 --source 0=kafka://dc0:9092 --source 1=kafka://dc1:9092 \\
            --out out/leapfrog-after
        tidegauge repair verify --plan out/repair-plan --leapfrog out/leapfrog-after \\
            --applied out/repair-apply --source 0=kafka://dc0:9092 --source 1=kafka://dc1:9092 \\
            --out out/repair-verify""")


def _register_verify(repair_sub) -> None:
    p = repair_sub.add_parser(
        "verify",
        help="check on a later leapfrog run that every planned key converged",
        description=VERIFY_HELP,
        epilog=VERIFY_EPILOG,
    )
    p.add_argument("--plan", required=True, metavar="DIR", help="the --out of a `tidegauge repair plan` run")
    p.add_argument(
        "--leapfrog",
        required=True,
        metavar="DIR",
        help="the --out of a `tidegauge leapfrog` run made after the repair replicated",
    )
    p.add_argument(
        "--applied",
        metavar="DIR",
        help="the --out of the `tidegauge repair apply` run: where each write landed, to tell pending keys",
    )
    p.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="ID=LOC",
        help="region ID's VT after the repair (archive directory or kafka://bootstrap), once per region: the "
        "regions' current records of the planned keys then decide whether each converged",
    )
    p.add_argument("--conf", metavar="FILE", help="configuration file (Kafka client settings per region)")
    p.add_argument("--store", metavar="S", help="the plan's store, checked (the plan names it; optional)")
    p.add_argument("--version", type=int, metavar="N", help="the plan's version, checked (optional)")
    p.add_argument(
        "--out", metavar="DIR", help="also write verify.txt, keys/ (Parquet) and summary.json there"
    )
    p.set_defaults(func=run_verify)


@exit_codes(SourceError)
def run_verify(args: argparse.Namespace) -> int:
    from pipelines.repair.verify import VerifyOptions, run

    conf = cfg.load(args.conf)
    specs = [parse_source(s) for s in args.source]
    check_unique(specs)
    return run(
        VerifyOptions(
            plan=args.plan,
            leapfrog=args.leapfrog,
            applied=args.applied,
            out=args.out,
            sources=specs,
            kafka_conf={s.region: cfg.kafka_conf(conf, s.region) for s in specs},
            store=args.store,
            version=args.version,
        )
    )
