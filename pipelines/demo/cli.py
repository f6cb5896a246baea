"""`tidegauge demo`: the command-line face of `pipelines.demo.job` — the first thing a new user runs."""

from __future__ import annotations

import argparse
import textwrap

from pipelines.core import spark_flags
from pipelines.core.errors import UsageError, exit_codes
from pipelines.demo.job import DemoError

HELP = textwrap.dedent("""\
    Run the whole nightly job on embedded defaults: no cluster, no configuration.

    Starts one embedded Kafka cluster per region (librdkafka's mock cluster, on loopback), simulates an
    active/active store with three regions — a push job, online writes, leaders that resolve conflicts and write
    heartbeats, followers — and injects faults whose consequences are known: writes dropped or poisoned in one
    region, a gap, a corrupted value and a duplicate in a real-time topic, a leader failover and a compacted
    range. Then it runs `lag`, `leapfrog`, `div validate`, `div restore` and `report` on what was written,
    one line per step, and ends with the fault check: every injected fault found by the finding the
    simulation's truth.json names, and nothing else found.

    Writes OUT/sim/ (archives, truth.json), one directory per job (OUT/lag, OUT/leapfrog, OUT/div,
    OUT/restore, OUT/report), OUT/demo.json (steps, timings, the fault check) and OUT/demo.log (what the jobs
    logged). Open OUT/report/report.html in a browser. Running the demo again into the same OUT replaces it
    but keeps OUT/history, so the report shows what changed since the previous run (try another --seed).

    --kafka real runs the same on Apache Kafka instead of the mock: a broker per region (KRaft, one JVM of
    at most 512 MiB each) started on 127.0.0.1 and stopped at the end; the first time, Maven resolves its jars
    from Maven Central into ~/.cache/tidegauge/jvm (needs `mvn`). The mock proves the jobs; real brokers prove
    them against Kafka's own topic creation, fetches, log recovery and timestamps.

    Needs Java 17 (for Spark). Takes a few minutes on 2 cores.

    Exit codes: 0 every fault found and nothing else, 1 a mismatch (the ✗ lines say which), 2 bad usage
    (--out not empty, no Java), 3 a step failed (OUT/demo.log has the details).""")


def register(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="simulate three regions with faults on embedded Kafka, run every job, "
        "check the findings against the truth",
        description=HELP,
    )
    p.add_argument(
        "--out",
        default="tidegauge-demo",
        metavar="DIR",
        help="output directory: new, empty, or an earlier demo's (default ./tidegauge-demo)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=1,
        metavar="N",
        help="seed of the simulation: traffic, fault targets, GUIDs (default 1)",
    )
    p.add_argument(
        "--records",
        type=int,
        default=12_000,
        metavar="N",
        help="online writes, all regions together (default 12000; at least 3000 so that every "
        "fault can be placed)",
    )
    p.add_argument("--master", metavar="URL", help="Spark master (default local[*])")
    p.add_argument(
        "--kafka",
        choices=["mock", "real"],
        default="mock",
        help="the regions' clusters: mock (default: librdkafka's mock cluster, in process) or real (an Apache "
        "Kafka broker per region on 127.0.0.1; its jars are resolved once from Maven Central: needs mvn); "
        "with --watch too",
    )
    p.add_argument(
        "--brokers-per-region",
        type=int,
        default=1,
        metavar="N",
        help="with --kafka real: Apache Kafka nodes per region (default 1; 3 makes each region a quorum, so a "
        "broker fault kills a partition leader and another is elected while the run writes on)",
    )
    live = p.add_argument_group(
        "--watch: the continuous watch on a live simulation",
        "Runs `tidegauge simulate --live` and `tidegauge watch` on its clusters (each a process of its own), "
        "prints the curl command for the watch's metrics and each fault as it happens, each finding and "
        "heartbeat alert as the watch sees it, then checks: dropped/poisoned writes found <= 2 heartbeat "
        "intervals after heartbeats of both regions cover them, a silent leader's heartbeat age over the "
        "alert threshold <= 1.5 intervals after it, no false alert or finding, and the watch's findings equal "
        "leapfrog's and div validate's on the same records. A timing goal missed while the 1-minute load "
        "average was over 2 per core is reported as not judged, with the load, and does not fail the exit code; "
        "a missed or false finding always does. Default --out: ./tidegauge-demo-watch. "
        "A few minutes on 2 cores.",
    )
    live.add_argument("--watch", action="store_true", help="run the live demo of `tidegauge watch` instead")
    live.add_argument(
        "--duration", type=float, default=200.0, metavar="S", help="seconds of live traffic (default 200)"
    )
    live.add_argument(
        "--rate", type=float, default=100.0, metavar="R", help="writes per second per region (default 100)"
    )
    live.add_argument(
        "--heartbeat-ms",
        type=int,
        default=5_000,
        metavar="MS",
        help="the leaders' heartbeat interval; the measures count in it (default 5000)",
    )
    live.add_argument(
        "--faults",
        metavar="SPEC",
        help="faults at set times, as `simulate --faults` takes them (default: "
        "dropped@60,poisoned@75,gap@85,silent@90+45,corrupt@100,duplicate@110,isolated@145+20,failover@170,broker@180)",
    )
    live.add_argument(
        "--kill-watch-at",
        type=float,
        metavar="S",
        help="kill the watch with SIGKILL S seconds into the run and start it again from its checkpoint: "
        "checks that no finding is lost or written twice (a delay that spans its restart is not judged)",
    )
    live.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        metavar="P",
        help="the watch's metrics port (default: a free one)",
    )
    p.set_defaults(func=run)


@exit_codes(DemoError)
def run(args: argparse.Namespace) -> int:
    from pipelines.demo.job import DemoOptions, run_demo

    spark_flags.master(args.master)  # before the simulation, not when Spark starts minutes later
    if not 1 <= args.brokers_per_region <= 9:
        raise UsageError(f"--brokers-per-region {args.brokers_per_region}: give 1 to 9")
    if args.brokers_per_region > 1 and args.kafka != "real":
        raise UsageError(
            f"--brokers-per-region {args.brokers_per_region} needs --kafka real (the mock has one broker)"
        )
    if args.kill_watch_at is not None and not args.watch:
        raise UsageError("--kill-watch-at kills the live demo's watch: give --watch too")
    if args.watch:
        return _run_watch(args)
    if args.records < 3000:
        raise UsageError(
            f"--records {args.records}: the demo needs at least 3000 writes to place every fault"
        )
    opts = DemoOptions(
        out=args.out,
        seed=args.seed,
        records=args.records,
        verbose=bool(getattr(args, "verbose", False)),
        master=args.master,
        kafka=args.kafka,
        brokers_per_region=args.brokers_per_region,
    )
    return run_demo(opts).exit_code


def _run_watch(args: argparse.Namespace) -> int:
    from pipelines.demo.watch import DEFAULT_FAULTS, WatchDemoOptions, run_watch_demo

    if args.duration <= 0 or args.rate <= 0 or args.heartbeat_ms <= 0:
        raise UsageError("--duration, --rate and --heartbeat-ms must be positive")
    if args.kill_watch_at is not None and not 0 < args.kill_watch_at < args.duration:
        raise UsageError(
            f"--kill-watch-at {args.kill_watch_at:g}: give a time within the run's {args.duration:g} s"
        )
    opts = WatchDemoOptions(
        out=args.out if args.out != "tidegauge-demo" else WatchDemoOptions.out,
        seed=args.seed,
        duration_s=args.duration,
        rate=args.rate,
        heartbeat_ms=args.heartbeat_ms,
        faults=args.faults or DEFAULT_FAULTS,
        metrics_port=args.metrics_port,
        master=args.master,
        kafka=args.kafka,
        brokers_per_region=args.brokers_per_region,
        kill_watch_at=args.kill_watch_at,
    )
    return run_watch_demo(opts).exit_code
