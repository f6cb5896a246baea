"""`tidegauge leapfrog`: the command-line face of the Leap Frog job (pipelines.leapfrog.job)."""

from __future__ import annotations

import argparse
import textwrap

from pipelines.core import config as cfg
from pipelines.core.errors import exit_codes
from pipelines.core.sources import SourceError

HELP = textwrap.dedent("""\
    Find divergences between the regions of an active/active store (Leap Frog), on Spark.

    For every key and every pair of regions, two records are compared only when each region's high-water mark,
    while its value stood, covers every write the other record depends on — so replication lag, conflicts that
    converge, duplicates and failovers never raise false alarms, and a real divergence (a write one region
    dropped, a value one region changed) is reported once both regions have heartbeats covering it.

    Modes: heartbeat (default) uses the leaders' heartbeat vectors (hbw headers) to raise every region's mark,
    so quiet regions do not block comparisons; footer uses record footers only (Venice's lily-pad rule); rmd
    uses Venice's legacy per-record vectors from the RMD payload when present.

    Output: OUT/inconsistencies/ (Parquet, one row per finding: VALUE_MISMATCH, MISSING_IN_A, MISSING_IN_B with
    key, offsets, vectors, marks and status) and OUT/summary.json (coverage per pair and partition, compacted
    ranges, undecodable records, timings); on stdout, a short summary per pair and type with the first keys.
    A finding is open while the two regions still differ (or cannot be compared yet), healed once a later
    comparable pair of the key's records agrees (a repair or a newer write converged them): healed findings
    stay in the output as history, and the exit code follows the open ones.

    Exit codes: 0 no open divergence, 1 open divergences found, 2 bad usage or unreadable source,
    3 some partitions could not be processed (the rest is written).""")

EPILOG = textwrap.dedent("""\
    examples:
      tidegauge leapfrog --source 0=out/sim/archive/dc-0 --source 1=out/sim/archive/dc-1 \\
          --source 2=out/sim/archive/dc-2 --out out/leapfrog     # the one store version the sources hold
      tidegauge leapfrog --store sim_store --version 1 --source 0=kafka://dc0:9092 --source 1=kafka://dc1:9092 \\
          --pairs 0-1 --mode footer --out out/lilypad
      tidegauge leapfrog --source 0=out/sim/archive/dc-0 --source 1=out/sim/archive/dc-1 \\
          --plan shuffle --out out/leapfrog     # the shuffle job instead of one pass per partition
      tidegauge leapfrog --store sim_store --version 1 --source 0=out/sim/archive/dc-0 \\
          --source 1=out/sim/archive/dc-1 --source 2=out/sim/archive/dc-2 --out out/leapfrog \\
          --state state/leapfrog     # nightly: each run reads only what came after the previous one

    on a cluster (see docs/spark.md):
      spark-submit --master yarn --py-files tidegauge.zip "$(python -m pipelines.submit --path)" leapfrog ...""")


def register(sub) -> None:
    p = sub.add_parser(
        "leapfrog",
        help="find divergences between regions (Leap Frog, on Spark)",
        description=HELP,
        epilog=EPILOG,
    )
    p.add_argument(
        "--store",
        metavar="S",
        help="store name: the VT is S_vN (default: `store` in --conf, else the one store whose *_vN topics the "
        "sources hold)",
    )
    p.add_argument(
        "--version",
        type=int,
        metavar="N",
        help="store version: the VT is S_vN (default: `version` in --conf, else the one version present; "
        "several: exit 2 naming them)",
    )
    p.add_argument(
        "--source",
        action="append",
        metavar="ID=URI",
        default=[],
        help="region id and its VT: an archive (a directory, or a URI such as s3://bucket/archive/dc-0) or "
        "kafka://host:port[,...]; one per region, two or more",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output directory or URI (published whole: renamed in, or a pointer on object stores)",
    )
    p.add_argument(
        "--pairs", default="all", metavar="all|A-B,...", help="region pairs to compare (default all)"
    )
    p.add_argument(
        "--regions",
        type=cfg.region_count,
        metavar="N",
        help="how many regions the store has (ids 0..N-1), when the sources are some of them; default: learned "
        "from the heartbeats' vectors, else the highest --source id + 1",
    )
    p.add_argument(
        "--mode", choices=["heartbeat", "footer", "rmd"], help="comparison mode (default heartbeat)"
    )
    p.add_argument(
        "--state",
        metavar="DIR",
        help="incremental runs: read the state the previous run left here (a directory or URI), process "
        "only newer records, publish the new state whole (findings equal a full rescan)",
    )
    p.add_argument(
        "--plan",
        choices=["shuffle", "one-pass"],
        help="how the records of a key meet: one-pass (default) reads each partition of every region in one "
        "task and compares there, without a shuffle; shuffle sends them to a task by key (the job before "
        "one-pass). Chunked values always take the shuffle. A one-pass task holds its rows within "
        "`leapfrog: task_memory_mb:` in --conf (default 256) and spills to local disk past it",
    )
    p.add_argument(
        "--master", metavar="URL", help="Spark master (default local[*], or what spark-submit set)"
    )
    p.add_argument(
        "--conf",
        metavar="FILE",
        help="YAML configuration (sources, store, version, kafka settings, spark); flags override it",
    )
    p.set_defaults(func=run)


@exit_codes(SourceError)
def run(args: argparse.Namespace) -> int:
    from pipelines.leapfrog.job import LeapfrogOptions, parse_pairs
    from pipelines.leapfrog.job import run as run_job

    conf = cfg.load(args.conf)
    store, version, specs = cfg.store_version_regions(args, conf, "leapfrog", infer=True)
    mode = args.mode or conf.get("mode") or "heartbeat"
    pairs = parse_pairs(args.pairs, [s.region for s in specs])
    master, spark_conf = cfg.spark_settings(conf, args.master)
    opts = LeapfrogOptions(
        store=store,
        version=int(version),
        sources=specs,
        out=args.out,
        pairs=pairs,
        mode=mode,
        state_dir=args.state,
        master=master,
        spark_conf=spark_conf,
        kafka_conf={s.region: cfg.kafka_conf(conf, s.region) for s in specs},
        regions=args.regions if args.regions is not None else conf.get("regions"),
        print_digest=True,
        plan=args.plan or (conf.get("leapfrog") or {}).get("plan") or LeapfrogOptions.plan,
        task_memory_mb=(conf.get("leapfrog") or {}).get("task_memory_mb"),
    )
    return run_job(opts)
