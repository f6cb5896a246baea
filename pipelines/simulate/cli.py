"""`tidegauge simulate`: its arguments, and the `sim.config.SimConfig` they make for `pipelines.simulate.job.run`."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from pipelines.core import config as cfg_file
from pipelines.core.errors import UsageError, exit_codes
from sim.config import ConfigError

DEFAULT_CONF = Path("conf/simulate.yaml")

HELP = textwrap.dedent("""\
    Simulate an active/active store on Kafka and archive everything it writes.

    N regions (default 3), P partitions, one store version. A push job writes StartOfPush, batch data and
    EndOfPush to every region's version topic (VT); online producers write each region's real-time topic (RT)
    with DIV segments; in every region a leader per partition consumes all RTs, resolves conflicts (highest
    logical timestamp wins, then region id, then RT offset) and writes its VT with leader footers and
    heartbeats that carry high-water marks (hbw) and DIV state (hbd); followers replay each VT with DIV and
    checkpoints. Faults can be injected; each is listed with the findings it must cause in DIR/truth.json.

    Everything is driven by a simulated clock: the same --seed and settings give identical archives.

    Writes:
      DIR/archive/dc-<id>/    every topic of region <id> (Parquet, Spark's Kafka schema): input for
                              `tidegauge leapfrog`, `div validate`, `lag`
      DIR/truth.json          run parameters, per-region rates/quiet periods/lags, injected faults + expectations
      DIR/summary.json        records per topic, faults, leader and follower DIV findings, metadata bytes
      DIR/followers/dc-<id>/  follower checkpoints (Venice PartitionState, offset and DIV state together)

    Progress goes to stderr; the summary to stdout.
    Exit codes: 0 done, 2 bad usage, 3 the run failed (a cluster or worker failed; partial output is left).""")

EPILOG = textwrap.dedent("""\
    fault kinds for --faults (KIND=COUNT, comma-separated; a bare KIND means 1):
      dropped     a write applied in its origin region only        -> leapfrog MISSING_IN_x / VALUE_MISMATCH
      poisoned    a value changed by one region's leader          -> leapfrog VALUE_MISMATCH
      gap         a producer's record never reaches its RT        -> div MISSING (+ CORRUPT at its EndOfSegment)
      corrupt     a value changed after its checksum              -> div CORRUPT at the EndOfSegment
      duplicate   a producer's record delivered twice             -> div DUPLICATE (not fatal); leaders drop it
      failover    a leader stops; a successor resumes from the last VT heartbeat  -> nothing
      compaction  a VT range of one archive compacted as Kafka would -> nothing (DIV with compaction tolerance)
      broker      an embedded broker goes down for a moment        -> nothing

    examples:
      tidegauge simulate --out out/sim
      tidegauge simulate --out out/sim --records 200000 --partitions 8 --seed 7 \\
          --faults dropped=2,poisoned=1,failover=1,duplicate=1,gap=1,corrupt=1,compaction=1
      tidegauge simulate --out out/sim-legacy --legacy-rmd          # also write per-record offset vectors
      tidegauge simulate --out out/sim --kafka 0=kafka-a:9092 1=kafka-b:9092 2=kafka-c:9092 --conf my.yaml

    configuration: --conf FILE (default conf/simulate.yaml when present) holds a `simulate:` section (traffic:
    key count and skew, write rates, value sizes, quiet periods, lags, heartbeat cadence, ...; documented in
    conf/simulate.yaml) and `kafka:` / `kafka_by_region:` librdkafka settings passed through untouched.
    Flags override the file.""")


def register(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate an active/active store on Kafka; archive it; write the truth",
        description=HELP,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out", required=True, metavar="DIR", help="output directory (its archive/ must be empty)"
    )
    p.add_argument(
        "--conf", metavar="FILE", help="YAML configuration (default: conf/simulate.yaml when present)"
    )
    p.add_argument("--seed", type=int, metavar="N", help="seed of everything random (default 1)")
    p.add_argument("--regions", type=int, metavar="N", help="number of regions (default 3)")
    p.add_argument("--partitions", type=int, metavar="P", help="partitions of every RT and VT (default 4)")
    p.add_argument(
        "--records",
        type=int,
        metavar="N",
        help="online writes, all regions together; each VT receives about this many records minus "
        "conflict-resolution losers (default 20000)",
    )
    p.add_argument(
        "--faults",
        metavar="SPEC",
        help="faults to inject, e.g. dropped=2,poisoned=1,failover=1 (see below; default: none)",
    )
    p.add_argument(
        "--kafka",
        nargs="+",
        metavar="embedded|REGION=BOOTSTRAP",
        help="`embedded` (default: one librdkafka mock cluster per region) or one REGION=host:port "
        "per region for real clusters (topics <store>_rt and <store>_v<version> are created)",
    )
    p.add_argument(
        "--legacy-rmd",
        action="store_true",
        help="also write Venice's per-record replication_checkpoint_vector in every RMD payload, to "
        "compare its cost with heartbeats on the same traffic",
    )
    p.add_argument(
        "--workers",
        choices=["process", "inline"],
        help="process: each region's leaders and followers in a process of their own (default); "
        "inline: everything in this process",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run)


def build_config(args):
    """SimConfig from the conf file (if any) and the flags; raises UsageError naming the bad input."""
    from sim.config import ConfigError, SimConfig, from_mapping, parse_faults, parse_kafka

    path = args.conf
    if path is None and DEFAULT_CONF.exists():
        path = str(DEFAULT_CONF)
    data = cfg_file.load(path) if path is not None else {}
    section = data.get("simulate") or {}
    if not isinstance(section, dict):
        raise UsageError(f"--conf {path}: `simulate:` must be a mapping")
    try:
        cfg = from_mapping(section, SimConfig())
    except ConfigError as exc:
        raise UsageError(f"--conf {path}: {exc}") from None
    try:
        changes = {
            "out": args.out,
            "kafka_conf": {str(k): v for k, v in (data.get("kafka") or {}).items()},
            "kafka_conf_by_region": {
                int(r): dict(v or {}) for r, v in (data.get("kafka_by_region") or {}).items()
            },
        }
        for name in ("seed", "regions", "partitions", "records", "workers"):
            value = getattr(args, name)
            if value is not None:
                changes[name] = value
        if args.faults is not None:
            changes["faults"] = parse_faults(args.faults)
        if args.kafka is not None:
            changes["kafka"] = parse_kafka(args.kafka)
        if args.legacy_rmd:
            changes["legacy_rmd"] = True
        if args.no_progress:
            changes["progress"] = False
        return cfg.with_(**changes).validate()
    except ConfigError:
        raise  # names the flag itself (exit 2)
    except ValueError as exc:  # a region id in kafka_by_region that is not a number
        raise UsageError(f"--conf {path}: {exc}") from None


@exit_codes(ConfigError)
def run(args: argparse.Namespace) -> int:
    from pipelines.simulate.job import run as run_job

    return run_job(build_config(args))
