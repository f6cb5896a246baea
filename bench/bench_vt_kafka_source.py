"""Benchmark: reading `kafka://` VT ranges with tidegauge's Python reader (`tidegauge_vt`) vs Spark's own Kafka
source (`spark-sql-kafka-0-10`), on real Apache Kafka brokers (KRaft, loopback, `sim.brokers`); prints one JSON object.

Builds `--regions` regions' VT archives (`leapfrog_workload`, ~`--records` per region, `--partitions` partitions),
starts one single-node cluster per region and produces each region's archive records (keys, values, headers, in
offset order, so offsets are the archive's) into the region's version topic. Then, in one Spark session (`--master`,
the Kafka source's jars on the driver's class path, resolved by bench/jvm/kafka/pom.xml), for the same
planned offset ranges (`pipelines.leapfrog.source.plan`: one split per region and partition), after `--warmup`
untimed rounds, `--repeat` rounds each time:

(a) `read_vt` (today's reader: confluent-kafka in the Python workers) written to the `noop` sink;
(b) `spark.read.format("kafka")` with `assign`, exact `startingOffsets`/`endingOffsets` per partition,
    `includeHeaders=true`, `failOnDataLoss=true`, the same columns (`bench/spark_kafka_source.read_kafka`),
    written to the `noop` sink.

and, unless `--no-tuned`, (c) as (b) with larger fetches (`TUNED`: the Java consumer's defaults fetch at most 1 MiB
per partition and return 500 records a poll; librdkafka prefetches up to 64 MiB in a thread of its own).

(a) and (b) go first in turn, round by round, (c) last. The `noop` sink makes (a) pay for its records' way from
Python into the JVM, which Leap Frog's job does not (it reads and decodes each split in the same Python worker,
`source.scan_splits`), and spares (b) their way into Python, which a job decoding in Python would pay. So each round
also times, unless `--no-to-python`, what the job would do before decoding: (a') `scan_splits` handing each split's
batches to a Python function that counts them, and (b') the Kafka source's rows through `mapInArrow` to the same
function, (b'') the same with `TUNED`. Before the rounds, each is read once more and reduced in the JVM to a
record count, a header count and the byte length of every key, value, header key and header value: both must give
the same numbers (asserted). Per-core rates use Spark's default parallelism.

Then the trimmed-range check: a topic of 1000 records whose records below offset 500 were deleted
(AdminClient.delete_records), read by both for [0, 1000) and [0, 400): what each returns (rows, first offset,
a read-error row) or raises, with `failOnDataLoss` false and true; and the same for a compacted topic whose log
cleaner left gaps inside the range (Venice's VTs are compacted).

Run: `python bench/bench_vt_kafka_source.py [--records 300000] [--regions 2] [--repeat 3]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the tests' copy of an archive into a topic (kafka_copy), as bench_scale.py uses their VT builder
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "support")
)

import spark_kafka_source as kafka_source  # noqa: E402
from leapfrog_workload import Workload, generate  # noqa: E402

from pipelines.core.spark_session import get_session  # noqa: E402
from pipelines.leapfrog.scan import READ_ERROR_OFFSET  # noqa: E402
from pipelines.leapfrog.source import VtSplit, _close, plan, read_vt  # noqa: E402


def _produce(bootstrap: str, directory: str, source_topic: str, topic: str, partitions: int) -> float:
    """Every archive record of the partitions, in order, into the empty `topic` (offsets come out the archive's),
    with larger producer batches than the tests use; the seconds it took."""
    from kafka_copy import produce_archive

    t = time.perf_counter()
    produce_archive(
        bootstrap,
        directory,
        source_topic,
        topic,
        range(partitions),
        conf={"linger.ms": 20, "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000},
        flush_timeout_s=120,
    )
    return time.perf_counter() - t


TUNED = {
    "kafka.max.partition.fetch.bytes": str(16 << 20),
    "kafka.fetch.max.bytes": str(64 << 20),
    "kafka.max.poll.records": "20000",
    "kafka.receive.buffer.bytes": str(4 << 20),
}


def _count_batches(batches):
    """What a decoder would be given, counted: one row per task."""
    import pyarrow as pa

    n = 0
    for b in batches:
        n += b.num_rows
    yield pa.RecordBatch.from_pydict({"n": [n]})


def _totals(df) -> dict:
    """Records, headers, and the byte length of every key, value, header key and header value, summed in the JVM."""
    from pyspark.sql import functions as F

    zero = F.lit(0).cast("long")
    hdr_bytes = F.aggregate(
        F.col("headers"),
        zero,
        lambda acc, h: (
            acc
            + F.coalesce(F.length(h.getField("key")), F.lit(0))
            + F.coalesce(F.length(h.getField("value")), F.lit(0))
        ),
    )
    hdr_count = F.aggregate(F.col("headers"), zero, lambda acc, h: acc + 1)
    row_bytes = (
        F.coalesce(F.length("key"), F.lit(0))
        + F.coalesce(F.length("value"), F.lit(0))
        + F.coalesce(hdr_bytes, zero)
    )
    r = df.select(
        F.count(F.lit(1)).alias("records"),
        F.sum(F.coalesce(hdr_count, zero)).alias("headers"),
        F.sum(row_bytes.cast("long")).alias("bytes"),
        F.sum(F.col("offset")).alias("offset_sum"),
    ).first()
    return {k: int(r[k] or 0) for k in ("records", "headers", "bytes", "offset_sum")}


def _noop(df) -> float:
    t = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t


def _trimmed(spark, cluster, topic: str) -> dict:
    """What each reader does with a range that starts below the partition's first offset held."""
    from confluent_kafka import Producer, TopicPartition

    from pipelines.core.sources import SourceSpec, open_source

    cluster.create_topics({topic: 1})
    p = Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5, "log_level": 0})
    for i in range(1000):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=0, headers=[("h", b"x")])
    assert p.flush(60) == 0
    admin = cluster.admin()
    for fut in admin.delete_records([TopicPartition(topic, 0, 500)], request_timeout=30).values():
        fut.result(timeout=35)
    uri = f"kafka://{cluster.bootstrap_servers}"
    src = open_source(SourceSpec(0, uri), None)
    try:
        bounds = list(src.bounds(topic, 0))
    finally:
        _close(src)
    out: dict = {"topic_bounds_after_delete": bounds, "deleted_below": 500}
    for start, end in ((0, 1000), (0, 400)):
        split = VtSplit(0, 0, uri, 0, start, end)
        case: dict = {}
        rows = read_vt(spark, [split], topic).select("offset", "value").collect()
        data = [r["offset"] for r in rows if r["offset"] != READ_ERROR_OFFSET]
        errors = [
            bytes(r["value"]).decode(errors="replace") for r in rows if r["offset"] == READ_ERROR_OFFSET
        ]
        case["read_vt"] = {
            "rows": len(data),
            "first_offset": min(data) if data else None,
            "read_error_rows": errors,
        }
        for fail in (False, True):
            name = f"kafka_source_failOnDataLoss_{str(fail).lower()}"
            try:
                offs = [
                    r["offset"]
                    for r in kafka_source.read_kafka(spark, [split], topic, fail_on_data_loss=fail)
                    .select("offset")
                    .collect()
                ]
                case[name] = {"rows": len(offs), "first_offset": min(offs) if offs else None}
            except Exception as exc:  # noqa: BLE001 - what it raises is the finding
                text = str(exc)
                line = next(
                    (ln for ln in text.splitlines() if "data loss" in ln.lower() or "lost" in ln.lower()), ""
                )
                case[name] = {"raised": type(exc).__name__, "message": (line or text.splitlines()[0])[:400]}
        out[f"range_{start}_{end}"] = case
    return out


def _compacted(spark, cluster, topic: str, timeout_s: float = 120.0) -> dict:
    """What each reader does with a range of a compacted topic whose cleaner left gaps (Venice's VTs are compacted:
    `source.compaction_deadlines`): 3000 records of 1 KiB over 20 keys, stamped ten days ago, in 1 MiB segments,
    then one record stamped now to roll the last old segment; read [0, end) once the cleaner has taken some."""
    from confluent_kafka import Producer

    from pipelines.core.sources import SourceSpec, open_source

    cluster.create_topics(
        {topic: 1},
        config={
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": 0.01,
            "segment.bytes": 1 << 20,
            "segment.ms": 60_000,
        },
    )
    old = int(time.time() * 1000) - 10 * 86_400_000
    p = Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5, "log_level": 0})
    for i in range(3000):
        p.produce(topic, key=b"k%d" % (i % 20), value=bytes(1024), partition=0, timestamp=old + i)
    p.produce(topic, key=b"last", value=b"x", partition=0)
    assert p.flush(60) == 0
    uri = f"kafka://{cluster.bootstrap_servers}"
    split = VtSplit(0, 0, uri, 0, 0, 3001)
    deadline = time.monotonic() + timeout_s
    while True:
        n = read_vt(spark, [split], topic).where(f"offset != {READ_ERROR_OFFSET}").count()
        if n < 3001 or time.monotonic() > deadline:
            break
        time.sleep(2)
    src = open_source(SourceSpec(0, uri), None)
    try:
        bounds = list(src.bounds(topic, 0))
    finally:
        _close(src)
    out: dict = {"topic_bounds": bounds, "range": [0, 3001], "compacted": n < 3001}
    rows = read_vt(spark, [split], topic).select("offset", "value").collect()
    data = [r["offset"] for r in rows if r["offset"] != READ_ERROR_OFFSET]
    errors = [bytes(r["value"]).decode(errors="replace") for r in rows if r["offset"] == READ_ERROR_OFFSET]
    out["read_vt"] = {"rows": len(data), "read_error_rows": errors}
    for fail in (False, True):
        name = f"kafka_source_failOnDataLoss_{str(fail).lower()}"
        try:
            k = kafka_source.read_kafka(spark, [split], topic, fail_on_data_loss=fail).count()
            out[name] = {"rows": k}
        except Exception as exc:  # noqa: BLE001 - what it raises is the finding
            text = str(exc)
            line = next(
                (ln for ln in text.splitlines() if "lost" in ln.lower() or "missing" in ln.lower()), ""
            )
            out[name] = {"raised": type(exc).__name__, "message": (line or text.splitlines()[0])[:400]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=300_000, help="VT records per region (approximately)")
    ap.add_argument("--regions", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds of both first (default 1)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--no-tuned", action="store_true", help="skip (c), the Kafka source with larger fetches")
    ap.add_argument(
        "--no-to-python", action="store_true", help="skip (a') (b') (b''): records handed to Python"
    )
    ap.add_argument(
        "--no-trimmed", action="store_true", help="skip the trimmed-range and compacted-gap checks"
    )
    args = ap.parse_args()

    from sim.brokers import close_clusters, start_clusters

    result: dict = {"python": platform.python_version(), "master": args.master}
    w = Workload(regions=args.regions, partitions=args.partitions, vt_records=args.records)
    topic = f"{w.store}_v1"
    root = tempfile.mkdtemp(prefix="tidegauge-bench-kafkasrc-")
    clusters = []
    try:
        t = time.perf_counter()
        dirs = generate(w, root)["full"]
        result["generate_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        # the log cleaner looks for work every 0.5 s (Kafka's default 15 s), for the compacted-gap check
        clusters = start_clusters(args.regions, name="bench-kafkasrc", config={"log.cleaner.backoff.ms": 500})
        result["brokers_start_s"] = round(time.perf_counter() - t, 1)
        result["kafka_version"] = clusters[0].version
        produce_s = 0.0
        for region, c in enumerate(clusters):
            c.create_topics({topic: args.partitions})
            produce_s += _produce(c.bootstrap_servers, dirs[region], topic, topic, args.partitions)
        result["produce_s"] = round(produce_s, 1)
        sources = {region: f"kafka://{c.bootstrap_servers}" for region, c in enumerate(clusters)}

        conf = kafka_source.session_conf({}, args.master)
        spark = get_session(master=args.master, app_name="bench-vt-kafka-source", conf=conf)
        assert kafka_source.available(spark), "Spark's Kafka source is not on the session's class path"
        cores = spark.sparkContext.defaultParallelism
        splits = plan(sources, topic)
        records = sum(s.end - s.start for s in splits)
        result.update({"records": records, "splits": len(splits), "cores": cores})

        def today():
            return read_vt(spark, splits, topic)

        def spark_source():
            return kafka_source.read_kafka(spark, splits, topic, fail_on_data_loss=True)

        def tuned():
            return kafka_source.read_kafka(spark, splits, topic, fail_on_data_loss=True, options=TUNED)

        from pipelines.leapfrog.source import scan_splits

        def today_py():
            return scan_splits(spark, splits, topic, None, _count_batches, "n long")

        def spark_py():
            return spark_source().mapInArrow(_count_batches, "n long")

        def tuned_py():
            return tuned().mapInArrow(_count_batches, "n long")

        a_tot, b_tot = _totals(today()), _totals(spark_source())
        if not args.no_tuned:
            c_tot = _totals(tuned())
            assert c_tot == b_tot, (c_tot, b_tot)
        a_tot["records_no_read_error"] = today().where(f"offset != {READ_ERROR_OFFSET}").count()
        assert a_tot["records_no_read_error"] == a_tot["records"], a_tot
        assert a_tot["records"] == records, (a_tot, records)
        for k in ("records", "headers", "bytes", "offset_sum"):
            assert a_tot[k] == b_tot[k], (k, a_tot, b_tot)
        result["totals_read_vt"] = a_tot
        result["totals_kafka_source"] = b_tot
        result["same_records_and_bytes"] = True

        if not args.no_to_python:
            counts = [sum(r["n"] for r in f().collect()) for f in (today_py, spark_py, tuned_py)]
            assert counts == [records] * 3, (counts, records)
        for _ in range(args.warmup):
            if not args.no_to_python:
                for f in (today_py, spark_py, tuned_py):
                    _noop(f())
            _noop(today())
            _noop(spark_source())
            if not args.no_tuned:
                _noop(tuned())
        result["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
        a_runs, b_runs, c_runs = [], [], []
        py_runs: dict[str, list[float]] = {}
        for i in range(args.repeat):
            if i % 2 == 0:
                a_runs.append(_noop(today()))
                b_runs.append(_noop(spark_source()))
            else:
                b_runs.append(_noop(spark_source()))
                a_runs.append(_noop(today()))
            if not args.no_tuned:
                c_runs.append(_noop(tuned()))
            if not args.no_to_python:
                for name, f in (
                    ("read_vt", today_py),
                    ("kafka_source", spark_py),
                    ("kafka_source_tuned", tuned_py),
                ):
                    py_runs.setdefault(name, []).append(_noop(f()))
        result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        a, b = min(a_runs), min(b_runs)
        result.update(
            {
                "read_vt_s": round(a, 3),
                "kafka_source_s": round(b, 3),
                "read_vt_records_per_s_per_core": round(records / a / cores),
                "kafka_source_records_per_s_per_core": round(records / b / cores),
                "kafka_source_speedup": round(a / b, 3),
                "speedup_neighbours": round(
                    statistics.median(x / y for x, y in zip(a_runs, b_runs, strict=True)), 3
                ),
                "read_vt_runs_s": [round(x, 3) for x in a_runs],
                "kafka_source_runs_s": [round(x, 3) for x in b_runs],
            }
        )
        if c_runs:
            c = min(c_runs)
            result.update(
                {
                    "kafka_source_tuned_options": TUNED,
                    "kafka_source_tuned_s": round(c, 3),
                    "kafka_source_tuned_records_per_s_per_core": round(records / c / cores),
                    "kafka_source_tuned_speedup": round(a / c, 3),
                    "kafka_source_tuned_runs_s": [round(x, 3) for x in c_runs],
                }
            )
        if py_runs:
            best = {k: min(v) for k, v in py_runs.items()}
            result["to_python"] = {
                **{f"{k}_records_per_s_per_core": round(records / t / cores) for k, t in best.items()},
                "kafka_source_speedup": round(best["read_vt"] / best["kafka_source"], 3),
                "kafka_source_tuned_speedup": round(best["read_vt"] / best["kafka_source_tuned"], 3),
                **{f"{k}_runs_s": [round(x, 3) for x in v] for k, v in py_runs.items()},
            }
        if not args.no_trimmed:
            result["trimmed"] = _trimmed(spark, clusters[0], "trimmed_v1")
            result["compacted"] = _compacted(spark, clusters[0], "compacted_v1")
    finally:
        close_clusters(clusters)
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
