"""A PySpark daemon for a test cluster's executors: records every Kafka range their tasks read, and keeps producing.

Give it to a driver as `spark.python.daemon.module=executor_reads` (with this directory on the executors'
PYTHONPATH): each executor then starts its Python workers through it. Spark's daemon forks one process per worker;
in every forked worker (never in the daemon itself, which must fork without threads) this module

- first appends `EXECUTOR_READS_APPEND` undecodable records to every partition named in `EXECUTOR_READS_TOPICS`
  (JSON {bootstrap: {topic: [partitions]}}): a producer that keeps writing after the driver planned the job.
  A task that takes its end offset from the cluster instead of the plan reads them;
- then wraps `div.kafka_log.iter_partition`, through which every Kafka read of a job goes, and appends one JSON
  line per call to `EXECUTOR_READS_LOG/<pid>.jsonl`: where it ran (working directory: the executor's, inside
  its worker's work directory), the Spark task (stage, partition, attempt), the range asked for and the records
  yielded.

Test instrumentation only: nothing of the product imports it.
"""

from __future__ import annotations

import functools
import json
import os
import sys

APPENDED_KEY = b"executor_reads: appended after planning"
_installed = False


def _append(topics: dict[str, dict[str, list[int]]], n: int) -> list[dict]:
    from confluent_kafka import Producer

    done = []
    for bootstrap, parts in sorted(topics.items()):
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
        for topic, partitions in sorted(parts.items()):
            for p in partitions:
                for _ in range(n):
                    producer.produce(topic, key=APPENDED_KEY, value=b"\x00not a Venice envelope", partition=p)
                done.append({"bootstrap": bootstrap, "topic": topic, "partition": p, "records": n})
        if producer.flush(30) != 0:
            raise RuntimeError(f"executor_reads: could not append to {bootstrap}")
    return done


def _write(line: dict) -> None:
    path = os.path.join(os.environ["EXECUTOR_READS_LOG"], f"{os.getpid()}.jsonl")
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def _task() -> dict:
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        return {"stage": None, "task_partition": None, "attempt": None, "task_id": None}
    return {
        "stage": tc.stageId(),
        "task_partition": tc.partitionId(),
        "attempt": tc.attemptNumber(),
        "task_id": tc.taskAttemptId(),
    }


def install() -> None:
    """In a forked worker: append the records, then record every Kafka read of this process (once)."""
    global _installed
    if _installed:
        return
    _installed = True
    n = int(os.environ.get("EXECUTOR_READS_APPEND") or 0)
    topics = json.loads(os.environ.get("EXECUTOR_READS_TOPICS") or "{}")
    if n and topics:
        _write({"appended": _append(topics, n), "cwd": os.getcwd(), "pid": os.getpid()})

    from div import kafka_log

    original = kafka_log.iter_partition

    @functools.wraps(original)
    def iter_partition(bootstrap, conf, topic, partition, start, end, *args, **kwargs):
        line = {
            "cwd": os.getcwd(),
            "pid": os.getpid(),
            **_task(),
            "bootstrap": kafka_log.bootstrap_of(bootstrap),
            "topic": topic,
            "partition": int(partition),
            "start": None if start is None else int(start),
            "end": int(end),
            "records": 0,
            "first_offset": None,
            "last_offset": None,
            "complete": False,
        }
        try:
            for batch in original(bootstrap, conf, topic, partition, start, end, *args, **kwargs):
                if batch.num_rows:
                    offsets = batch.column("offset")
                    if line["first_offset"] is None:
                        line["first_offset"] = offsets[0].as_py()
                    line["last_offset"] = offsets[-1].as_py()
                    line["records"] += batch.num_rows
                yield batch
            line["complete"] = True
        finally:
            _write(line)

    kafka_log.iter_partition = iter_partition


def main() -> None:
    from pyspark import daemon

    forked_worker = daemon.worker

    def worker(sock, authenticated):
        install()
        return forked_worker(sock, authenticated)

    daemon.worker = worker  # manager() calls it by its module-level name in each forked process
    daemon.manager()


if __name__ == "__main__":
    sys.exit(main())
