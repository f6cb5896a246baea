"""`tidegauge watch`: its arguments, and the loop that runs the streaming query until it is stopped."""

from __future__ import annotations

import argparse
import logging
import signal
import textwrap
import threading
import time

from pipelines.core import config as cfg
from pipelines.core import spark_flags
from pipelines.core.errors import UsageError, exit_codes, spark_gone
from pipelines.core.sources import SourceError

log = logging.getLogger("tidegauge.watch")

HELP = textwrap.dedent("""\
    Watch an active/active store continuously: Leap Frog, with the nightly job's rules (each VT partition's
    state — marks, how the scan started, the records of keys still in play — lives in Spark's state store,
    RocksDB), and DIV, with `div validate`'s validator, in one Spark Structured Streaming query over every
    region's version topic that reads each record once for both; with --rt DIV reads every region's real-time
    topic as well, as `div validate` validates every topic a source holds, RTs included. A divergence is appended to
    OUT/leapfrog/ (one Parquet file per micro-batch, the columns of `leapfrog`'s inconsistencies plus
    finding_id and detected_at) as soon as heartbeats of both regions cover it; a DIV finding to OUT/div/ (the
    columns of `div validate`'s errors plus finding_id, whichever topic it is in).

    Runs until stopped: Ctrl-C or SIGTERM stops it after the current micro-batch. Started again with the same
    --checkpoint it goes on where it stopped: no finding lost, none repeated. The checkpoint of an older watch,
    which ran Leap Frog and DIV as two queries (leapfrog/ and div/ in it), is refused: give a new --checkpoint.

    Metrics for Prometheus on --metrics-port (docs/watch.md; alert rules in conf/alerts.yaml).

    Exit codes: 0 stopped cleanly, 2 bad usage or the query failed (the message says why).""")

EPILOG = textwrap.dedent("""\
    examples:
      tidegauge watch --store sim_store --version 1 --source 0=kafka://dc0:9092 --source 1=kafka://dc1:9092 \\
          --checkpoint /var/lib/tidegauge/checkpoint --out /var/lib/tidegauge/watch --metrics-port 9464
      curl -s localhost:9464/metrics | grep tidegauge_divergences_total
      tidegauge watch --store sim_store --version 1 --rt --source 0=out/sim/archive/dc-0 \\
          --source 1=out/sim/archive/dc-1 --checkpoint out/watch-checkpoint --out out/watch""")


def register(sub) -> None:
    p = sub.add_parser(
        "watch",
        help="continuous Leap Frog on Spark Structured Streaming, with Prometheus metrics",
        description=HELP,
        epilog=EPILOG,
    )
    p.add_argument(
        "--source",
        action="append",
        metavar="ID=URI",
        default=[],
        help="where a region's version topic (and its RT with --rt) is: kafka://host:port[,...] or an archive "
        "directory that grows; one per region, two or more",
    )
    p.add_argument("--store", metavar="S", help="store name (reads topic <S>_v<N>)")
    p.add_argument("--version", type=int, metavar="N", help="store version")
    p.add_argument(
        "--rt",
        action="store_true",
        default=None,
        help="DIV also validates each region's real-time topic <S>_rt, read from the same --source, as "
        "`div validate` does when a source holds it: by RT rules (an RT is after End of Push, so its findings "
        "are warnings, never fatal), its rows appended to OUT/div/ beside the VT's. Leap Frog reads only the "
        "VTs. Every source that answers must hold the RT, else exit 2 (`rt: true` in --conf)",
    )
    p.add_argument(
        "--rt-topic",
        metavar="NAME",
        help="the RT's name when it is not <S>_rt (e.g. <S>_rt_v3), as in `div restore`; implies --rt "
        "(`rt_topic:` in --conf)",
    )
    p.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="Spark's checkpoint (offsets and state, the last 10 micro-batches' of them): a local path, file://, "
        "hdfs:// or s3a:// URI (required). For s3a:// Hadoop's S3 connector goes on Spark's class path, "
        "resolved by mvn from Maven Central the first time (~690 MB, cached in ~/.cache/tidegauge/jvm), and "
        "the store is the AWS environment's (AWS_ENDPOINT_URL, AWS_REGION, credentials); under spark-submit "
        "give it --packages org.apache.hadoop:hadoop-aws:<Spark's Hadoop version> (docs/spark.md)",
    )
    p.add_argument("--out", metavar="DIR", help="where findings are appended (required)")
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="P",
        help="serve Prometheus metrics on port P of --metrics-address (0: a free port)",
    )
    p.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address the metrics are served on (default 127.0.0.1, loopback only; 0.0.0.0 for a Prometheus "
        "on another host)",
    )
    p.add_argument(
        "--trigger-interval",
        default="10 seconds",
        metavar="T",
        help="how often a micro-batch starts: a number and a unit, as Spark reads intervals: '10 seconds' "
        "(default), '1 minute', '500 milliseconds'",
    )
    p.add_argument(
        "--max-records-per-trigger",
        type=int,
        metavar="N",
        help="cap on the records one micro-batch reads (default: all that are there)",
    )
    p.add_argument(
        "--regions",
        type=cfg.region_count,
        metavar="N",
        help="how many regions the store has (ids 0..N-1), when the sources are some of them; default: learned "
        "from the heartbeats' vectors on the first start, else the highest --source id + 1 (kept in the "
        "checkpoint)",
    )
    p.add_argument(
        "--starting",
        choices=["earliest", "latest"],
        default="earliest",
        help="where a new checkpoint starts reading (default earliest; a restart always goes on from the checkpoint)",
    )
    p.add_argument(
        "--heartbeat-interval-ms",
        type=int,
        metavar="MS",
        help="the leaders' heartbeat interval, exported as tidegauge_heartbeat_interval_seconds so the alert rules "
        "(conf/alerts.yaml) count in intervals (default 60000, Venice's; or `heartbeat_interval_ms:` in --conf)",
    )
    p.add_argument(
        "--changes",
        type=int,
        metavar="R",
        help="also write region R's change stream: every change of its version topic exactly once, the bulk "
        "load first as the snapshot, appended to OUT/changes/ (one Parquet file per micro-batch, the columns of "
        "`tidegauge changes`; records that cannot be delivered to OUT/changes_problems/), exactly once across "
        "restarts (`changes: R` in --conf)",
    )
    p.add_argument("--master", metavar="URL", help="Spark master (default local[*])")
    p.add_argument(
        "--conf",
        metavar="FILE",
        help="YAML configuration (sources, store, version, rt, rt_topic, kafka settings, spark)",
    )
    p.set_defaults(func=run)


def rt_topic_of(args: argparse.Namespace, conf: dict, store: str) -> str | None:
    """The RT DIV validates beside the VT (--rt-topic, else <store>_rt with --rt; flags over `rt_topic:` and
    `rt:` in --conf), or None. The validator tells RT rules from the topic's name, as in `div validate`, so a
    name that is not an RT's is refused rather than judged by VT rules."""
    from div.batch import is_realtime_topic

    name = args.rt_topic or conf.get("rt_topic")
    wanted = args.rt if args.rt is not None else bool(conf.get("rt"))
    if not name and not wanted:
        return None
    name = name or f"{store}_rt"
    if not is_realtime_topic(name):
        raise UsageError(
            f"--rt-topic {name}: not a real-time topic name (<store>_rt, <store>_rt_v<N>, or either with _sep): "
            "DIV applies RT rules by the name, as `div validate` does"
        )
    return name


def _jvm_going(exc: BaseException) -> bool:
    """An error from Spark's side while a stop signal is being handled: the same signal reached the JVM (a
    terminal's Ctrl-C, or `timeout`, signal the whole process group), which is shutting down or gone."""
    return spark_gone(exc) or type(exc).__module__.split(".")[0] in ("py4j", "pyspark")


def _batch_id(query) -> int:
    """The id of the query's last finished micro-batch (-1 before the first)."""
    progress = query.lastProgress
    return int(progress.get("batchId", -1)) if progress else -1


class _Restarts:
    """A failed query is started again from its checkpoint (its unfinished micro-batch runs again, so nothing is
    lost or repeated): what fails a query is the machine or a source — a Python worker that could not start in
    Spark's 10 s on an overloaded host, a range that could not be read — never a record. After MAX_FAILURES
    failures in a row without a committed micro-batch between them, the watch gives up (exit 2)."""

    MAX_FAILURES = 5

    def __init__(self, base_delay_s: float = 5.0) -> None:
        self.base_delay_s = base_delay_s
        self.failures: dict[str, int] = {}
        self.batch_at_failure: dict[str, int | None] = {}

    def progressed(self, name: str, batch_id: int | None) -> None:
        if batch_id is not None and batch_id != self.batch_at_failure.get(name, batch_id):
            self.failures[name] = 0

    def restart(self, name: str, query, stop: threading.Event, again):
        error = query.exception()
        if error is None:
            raise UsageError(f"the streaming query {query.name} stopped by itself")
        from pipelines.core.stream_source import RecordsLostError

        if RecordsLostError.MARKER in str(error):  # re-running cannot bring deleted records back
            lost = str(error)[str(error).index(RecordsLostError.MARKER) :].splitlines()[0]
            raise UsageError(f"the streaming query {query.name} stopped: {lost}")
        n = self.failures.get(name, 0) + 1
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if n > self.MAX_FAILURES:
            raise UsageError(
                f"the streaming query {query.name} failed {n - 1} times in a row without committing a micro-batch; "
                f"last error: {error}"
            )
        self.failures[name] = n
        progress = query.lastProgress
        self.batch_at_failure[name] = progress.get("batchId") if progress else None
        delay = min(60.0, self.base_delay_s * 2 ** (n - 1))
        log.warning(
            "tidegauge watch: the %s query failed (%s); starting it again from its checkpoint in %g s "
            "(failure %d of %d in a row)",
            name,
            first,
            delay,
            n,
            self.MAX_FAILURES,
        )
        stop.wait(delay)
        return query if stop.is_set() else again()


@exit_codes(SourceError)
def run(args: argparse.Namespace) -> int:
    from pipelines.core.spark_session import get_session
    from pipelines.core.stream_source import read_status
    from pipelines.watch import checkpoint
    from pipelines.watch.job import (
        WatchOptions,
        observe_sources,
        prepare,
        query_names,
        start,
        start_query,
        status_file,
    )
    from pipelines.watch.metrics import WatchMetrics

    conf = cfg.load(args.conf)
    store, version, specs = cfg.store_version_regions(args, conf, "watch")
    if not args.checkpoint or not args.out:
        raise UsageError("--checkpoint and --out are required")
    # what Spark (and the stream source) would refuse only once the query starts, refused before anything is made
    spark_flags.trigger_interval(args.trigger_interval)
    if args.max_records_per_trigger is not None and args.max_records_per_trigger < 1:
        raise UsageError(f"--max-records-per-trigger {args.max_records_per_trigger}: must be 1 or more")
    master, spark_conf = cfg.spark_settings(conf, args.master)
    rt_topic = rt_topic_of(args, conf, store)
    opts = WatchOptions(
        store=store,
        version=int(version),
        sources=specs,
        checkpoint=args.checkpoint,
        out=args.out,
        kafka_conf={s.region: cfg.kafka_conf(conf, s.region) for s in specs},
        trigger_interval=args.trigger_interval,
        max_records_per_trigger=args.max_records_per_trigger,
        starting=args.starting,
        rt_topic=rt_topic,
        regions=args.regions if args.regions is not None else conf.get("regions"),
        changes_region=args.changes if args.changes is not None else conf.get("changes"),
    )
    interval = args.heartbeat_interval_ms
    if interval is None:
        interval = conf.get("heartbeat_interval_ms", 60_000)
    if not isinstance(interval, int) or interval <= 0:
        raise UsageError(f"--heartbeat-interval-ms must be positive, got {interval}")
    # an s3a:// checkpoint: the connector's jars (resolved once per machine) and the store's settings
    spark_conf = checkpoint.session_conf(opts.checkpoint, spark_conf, master, checkpoint.progress_line)
    prepare(opts)  # a bad --out or --checkpoint is said before Spark starts
    spark = get_session(master, app_name="tidegauge watch", conf=spark_conf)
    metrics = WatchMetrics(heartbeat_interval_ms=int(interval))
    server = metrics.serve(args.metrics_port, args.metrics_address) if args.metrics_port is not None else None
    if server is not None:
        print(f"tidegauge watch: metrics on {server.url}", flush=True)
    stop = threading.Event()

    def on_signal(signum, _frame):
        log.info(
            "tidegauge watch: %s received, stopping after the current micro-batch",
            signal.Signals(signum).name,
        )
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    queries = start(spark, opts, metrics)
    names = query_names(opts)
    print(
        f"tidegauge watch: watching {opts.topic} in {len(specs)} regions"
        + (f" (DIV also {opts.rt_topic})" if opts.rt_topic else "")
        + (
            f"; region {opts.changes_region}'s changes in {opts.out}/changes"
            if opts.changes_region is not None
            else ""
        )
        + f"; findings in {opts.out}",
        flush=True,
    )
    restarts = _Restarts()
    try:
        while not stop.is_set():
            stop.wait(1.0)
            for i, q in enumerate(queries):
                if q.lastProgress is not None:
                    metrics.observe_progress(
                        q.lastProgress, query=names[i], heartbeats_read=names[i] == "watch"
                    )
                    restarts.progressed(names[i], q.lastProgress.get("batchId"))
                if not q.isActive and not stop.is_set():
                    queries[i] = restarts.restart(
                        names[i], q, stop, lambda n=names[i]: start_query(spark, opts, n, metrics)
                    )
            status = status_file(opts)
            try:
                sources = read_status(status)
            except (OSError, ValueError):
                sources = None  # not written yet (the first planning), or being replaced
            # each query reads with offsets of its own, so each has its own lag (the status file is the watch
            # query's)
            for i, q in enumerate(queries):
                main = names[i] == "watch"
                observe_sources(
                    metrics,
                    q.lastProgress,
                    sources if main else None,
                    opts if main else None,
                    query=names[i],
                )
        # let the running micro-batch finish (stopping inside one would only make the restart redo it), but not
        # the ones after it: with a backlog they run back to back
        for q in queries:
            last = _batch_id(q)
            while q.isActive and q.status.get("isTriggerActive") and _batch_id(q) <= last:
                time.sleep(0.2)
            q.stop()
    except Exception as exc:
        if not (stop.is_set() and _jvm_going(exc)):
            raise
        # Ctrl-C in a terminal reaches Spark's JVM too, which stops at once: the micro-batch it was running
        # is not committed, and the next start from the checkpoint runs it again
        print(
            "tidegauge watch: stopped (Spark stopped with it; an unfinished micro-batch runs again on restart)"
        )
    finally:
        if server is not None:
            server.close()
    return 0
