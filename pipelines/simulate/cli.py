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
    with DIV segments; in every region a leader per partition consumes all RTs, resolves conflicts as Venice does
    (highest logical timestamp wins; on a tie a DELETE, then the higher Java hash of the value) and writes its VT with leader footers and
    heartbeats that carry high-water marks (hbw) and DIV state (hbd); followers replay each VT with DIV and
    checkpoints. Faults can be injected; each is listed with the findings it must cause in DIR/truth.json.

    Everything is driven by a simulated clock: the same --seed and settings give identical archives.

    --live runs the same simulation paced by the wall clock (simulated time = wall-clock time) with no planned
    end, for a continuous job such as `tidegauge watch` to attach to: producers, leaders and followers keep
    running at --rate writes/s per region until --duration S is over, or until SIGINT (Ctrl-C) or SIGTERM;
    then it stops cleanly: producers close their segments, leaders heartbeat a last time and step down, the
    archives are completed and the clusters shut down. As soon as the clusters are up it prints one line per
    region, `dc-<id> kafka://HOST:PORT <rt topic> <vt topic>`, and writes the same to DIR/live.json. Faults
    happen at known times (KIND@SECONDS) and each is added to DIR/truth.json as it happens, with the wall-clock
    time `at` (ms since the epoch; `end_at` too for faults that stop and resume).

    --repair-window S closes the loop of `tidegauge repair`: after the last write and the leaders' last
    heartbeats the run waits (live.json: state repair-window), leaders up and the archives complete so far, for
    `tidegauge repair apply` to write into a region's RT; it goes on once the file live.json names in
    repair_window_done exists (or after S seconds): every region's leaders apply those writes through their
    conflict resolution, heartbeat once more and step down. `tidegauge demo` runs this loop itself.

    Writes:
      DIR/archive/dc-<id>/    every topic of region <id> (Parquet, Spark's Kafka schema): input for
                              `tidegauge leapfrog`, `div validate`, `lag`
      DIR/truth.json          run parameters, per-region rates/quiet periods/lags, injected faults + expectations
      DIR/summary.json        records per topic, faults, leader and follower DIV findings, metadata bytes
      DIR/followers/dc-<id>/  follower checkpoints (Venice PartitionState, offset and DIV state together)
      DIR/live.json           (--live) each region's kafka:// URI and topics, state running/stopped

    Progress goes to stderr; the summary to stdout.
    Exit codes: 0 done (a live run stopped cleanly), 2 bad usage, 3 the run failed (a cluster or worker failed;
    partial output is left).""")

EPILOG = textwrap.dedent("""\
    fault kinds for --faults, comma-separated: KIND=COUNT places COUNT of them from the seed (a bare KIND means
    1); KIND@SECONDS puts one that many seconds after the first write (a write fault: on the first suitable
    write from then on), and KIND@SECONDS+SECONDS also says how long a stop/resume kind (*) lasts:
      dropped     a write applied in its origin region only        -> leapfrog MISSING_IN_x / VALUE_MISMATCH
      poisoned    a value changed by one region's leader          -> leapfrog VALUE_MISMATCH
      gap         a producer's record never reaches its RT        -> div MISSING (+ CORRUPT at its EndOfSegment)
      corrupt     a value changed after its checksum              -> div CORRUPT at the EndOfSegment
      duplicate   a producer's record delivered twice             -> div DUPLICATE (not fatal); leaders drop it
      failover*   a leader stops; a successor resumes from the last VT heartbeat  -> nothing
      compaction  a VT range of one archive compacted as Kafka would -> nothing (DIV with compaction tolerance)
      broker*     a region's broker goes down for a moment (mock) or is killed and restarted (real) -> nothing
      silent*     a leader stops heartbeating (its data still flows; outage_ms)  -> lag/heartbeat age only
      isolated*   a region stops replicating the others, then catches up (outage_ms) -> lag only
      redelivery  a leader writes a VT record twice (a retry after a lost ack) -> div DUPLICATE (not fatal)
      swap        a re-push of version+1 while writes go on: bulk load, End of Push, an RT replay from a
                  rewind point, then a VersionSwap ends version N (one per run; --live prints when End of
                  Push and the VersionSwap are written: read version N to its VersionSwap, then N+1) -> nothing
    truth.json `changes` says which changes a change-capture reader of each region's VTs must get.
    A live run without --duration takes timed faults only (and compaction=N, done to the archives at the end).

    examples:
      tidegauge simulate --out out/sim
      tidegauge simulate --out out/sim --records 200000 --partitions 8 --seed 7 \\
          --faults dropped=2,poisoned=1,failover=1,duplicate=1,gap=1,corrupt=1,compaction=1
      tidegauge simulate --out out/sim-legacy --legacy-rmd          # also write per-record offset vectors
      tidegauge simulate --out out/sim --kafka 0=kafka-a:9092 1=kafka-b:9092 2=kafka-c:9092 --conf my.yaml
      tidegauge simulate --out out/sim --brokers real       # an Apache Kafka broker per region, started here
      tidegauge simulate --live --out out/live --duration 600 --rate 200 --heartbeat-ms 2000 \\
          --faults failover@60,dropped@120,poisoned@150,silent@200+30,isolated@300+40,broker@400+5
      tidegauge simulate --live --out out/live --rate 50          # until Ctrl-C; prints the kafka:// URIs
      tidegauge simulate --live --out out/swap --brokers real --duration 180 --faults failover@40,swap@90
      tidegauge simulate --out out/sim --repair-window 600   # then, once live.json says repair-window:
          # leapfrog and repair plan on out/sim/archive/dc-<id>, repair apply into a region's kafka:// URI
          # (live.json's regions), then: touch out/sim/repair-window.done

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
        help="faults to inject, by count or at set times: e.g. dropped=2,poisoned=1,failover=1 or "
        "dropped@30,silent@60+20 (see below; default: none)",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="paced by the wall clock, no planned end: runs for --duration, or until SIGINT/SIGTERM, then "
        "stops cleanly; prints each region's kafka:// URI and topics and writes them to DIR/live.json",
    )
    p.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="with --live: seconds of traffic before a clean stop (default: until SIGINT/SIGTERM)",
    )
    p.add_argument(
        "--linger",
        type=float,
        metavar="S",
        help="with --live --duration: after the stop, keep the clusters serving S more seconds (or until "
        "SIGINT/SIGTERM), so a watch attached to them can read to the end (live.json says clusters_up)",
    )
    p.add_argument(
        "--repair-window",
        type=float,
        metavar="S",
        help="after the last write and the leaders' last heartbeats, hold the run open up to S seconds with "
        "leaders up (live.json: state repair-window; the archives hold the whole history by then): run "
        "`tidegauge leapfrog` and `tidegauge repair plan` on the archives, `tidegauge repair apply` into a "
        "region's RT (live.json has each region's kafka:// URI), then create the file live.json names in "
        "repair_window_done (or wait S s). Every region's leaders then apply what was written through their "
        "conflict resolution and heartbeat once more; truth.json's repair_window counts it",
    )
    p.add_argument(
        "--rate",
        type=float,
        metavar="R",
        help="writes per second per region (simulated seconds; wall-clock ones with --live) (default 1000)",
    )
    p.add_argument(
        "--heartbeat-ms",
        type=int,
        metavar="MS",
        help="every leader writes an RT heartbeat at least this often (default 5000)",
    )
    p.add_argument(
        "--kafka",
        nargs="+",
        metavar="embedded|REGION=BOOTSTRAP",
        help="`embedded` (default: one librdkafka mock cluster per region) or one REGION=host:port "
        "per region for real clusters (topics <store>_rt and <store>_v<version> are created)",
    )
    p.add_argument(
        "--brokers",
        choices=["mock", "real"],
        help="the clusters started for the regions when --kafka is not given: mock (default: librdkafka's mock "
        "cluster, in this process) or real (an Apache Kafka 4 broker per region on 127.0.0.1, its jars resolved "
        "once from Maven Central: needs mvn and Java 17; `brokers_per_region:` in --conf for more nodes)",
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
    from sim.config import ConfigError, SimConfig, from_mapping, parse_fault_spec, parse_kafka

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
        if args.live:
            if args.records is not None:
                raise ConfigError(
                    "--records: a live run writes at --rate until it stops; give --duration instead"
                )
            changes["live"] = True
        if args.duration is not None:
            if not args.live:
                raise ConfigError("--duration is for live runs: add --live (or give --records)")
            changes["duration_s"] = args.duration
        if args.linger is not None:
            if not args.live:
                raise ConfigError("--linger is for live runs: add --live")
            changes["linger_s"] = args.linger
        if args.repair_window is not None:
            if args.repair_window <= 0:
                raise ConfigError(f"--repair-window {args.repair_window:g}: give a number of seconds above 0")
            changes["repair_window_s"] = args.repair_window
        if args.rate is not None:
            changes["write_rate"] = [args.rate]
        if args.heartbeat_ms is not None:
            changes["heartbeat_every_ms"] = args.heartbeat_ms
        if args.faults is not None:
            changes["faults"], changes["fault_times"] = parse_fault_spec(args.faults)
        if args.kafka is not None:
            changes["kafka"] = parse_kafka(args.kafka)
        if args.brokers is not None:
            changes["brokers"] = args.brokers
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
