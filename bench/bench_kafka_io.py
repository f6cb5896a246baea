"""Throughput of the Kafka and archive plumbing every job stands on; prints one JSON object.

Measures records/s for: building Arrow batches and writing the archive, reading it back in offset order,
consuming the embedded mock cluster into Arrow batches, the Archiver tailing a producer, and the Spark data
source reading the mock cluster. Run: `python bench/bench_kafka_io.py [--records N] [--no-spark]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

import pyarrow as pa


def _records(n: int, partitions: int, value_size: int) -> list[pa.RecordBatch]:
    from div.archive import records_to_batch

    value = bytes(value_size)
    out = []
    step = 50_000
    for lo in range(0, n, step):
        recs = [
            (
                "bench",
                i % partitions,
                i // partitions,
                b"key-%d" % i,
                value,
                1_700_000_000_000 + i,
                0,
                [("hbw", b"x" * 32)] if i % 1000 == 0 else None,
            )
            for i in range(lo, min(n, lo + step))
        ]
        out.append(records_to_batch(recs))
    return out


def bench_archive(n: int, partitions: int, value_size: int) -> dict:
    from div import archive

    batches = _records(n, partitions, value_size)
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        with archive.ArchiveWriter(d) as w:
            for b in batches:
                w.append(b)
        write_s = time.perf_counter() - t
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        t = time.perf_counter()
        read = 0
        for p in range(partitions):
            for b in archive.iter_partition(d, "bench", p):
                read += b.num_rows
        read_s = time.perf_counter() - t
    assert read == n
    return {
        "archive_write_records_per_s": round(n / write_s),
        "archive_read_records_per_s": round(n / read_s),
        "archive_bytes_per_record": round(size / n, 1),
    }


def _fill(k, topic: str, n: int, partitions: int, value_size: int) -> float:
    from confluent_kafka import Producer

    k.create_topic(topic, partitions)
    p = Producer({"bootstrap.servers": k.bootstrap_servers, "linger.ms": 20, "batch.num.messages": 10000})
    value = bytes(value_size)
    t = time.perf_counter()
    for i in range(n):
        p.produce(topic, key=b"key-%d" % i, value=value, partition=i % partitions)
        if i % 20000 == 0:
            p.poll(0)
    p.flush(60)
    return time.perf_counter() - t


def bench_kafka(n: int, partitions: int, value_size: int, spark: bool) -> dict:
    from div import kafka_log
    from sim.archiver import Archiver
    from sim.embedded_kafka import EmbeddedKafka

    out: dict = {}
    # Records per partition must stay under the mock's ~5 MiB retention for the consume benchmark.
    with EmbeddedKafka(brokers=1) as k:
        produce_s = _fill(k, "bench", n, partitions, value_size)
        out["mock_produce_records_per_s"] = round(n / produce_s)
        with kafka_log.KafkaLog(k.bootstrap_servers) as kl:
            ends = {p: kl.watermarks("bench", p) for p in range(partitions)}
        assert all(low == 0 for low, _ in ends.values()), (
            "retention dropped records: use fewer or smaller ones"
        )
        t = time.perf_counter()
        got = 0
        for p, (low, high) in ends.items():
            for b in kafka_log.iter_partition(k.bootstrap_servers, None, "bench", p, low, high):
                got += b.num_rows
        consume_s = time.perf_counter() - t
        assert got == n
        out["kafka_consume_to_arrow_records_per_s"] = round(n / consume_s)

        with tempfile.TemporaryDirectory() as d:
            arc = Archiver(k.bootstrap_servers, None, d, topics=["tailed"])
            t = time.perf_counter()
            _fill(k, "tailed", n, partitions, value_size)
            archived = arc.stop()
            tail_s = time.perf_counter() - t
            assert archived == n
        out["archiver_produce_and_archive_records_per_s"] = round(n / tail_s)

        if spark:
            from pipelines.core.kafka_source import read_kafka
            from pipelines.core.spark_session import get_session

            session = get_session("local[2]", app_name="bench-kafka-io")
            read_kafka(session, k.bootstrap_servers, "bench", ending={"bench": {"0": 10}}).count()  # warm-up
            df = read_kafka(session, k.bootstrap_servers, "bench")
            t = time.perf_counter()
            count = df.count()
            spark_s = time.perf_counter() - t
            assert count == n
            out["spark_source_records_per_s"] = round(n / spark_s)
            session.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--value-size", type=int, default=60)
    ap.add_argument("--no-spark", action="store_true")
    args = ap.parse_args()
    result = {
        "records": args.records,
        "partitions": args.partitions,
        "value_size": args.value_size,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
    }
    result.update(bench_archive(args.records, args.partitions, args.value_size))
    result.update(bench_kafka(args.records, args.partitions, args.value_size, spark=not args.no_spark))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
