"""`tidegauge changes --engine spark`: the local engine's output, one Spark task per VT partition.

The driver plans exactly as the local engine does (`job.prepare`: the same state, region count and ranges, the
end offsets fixed on the driver). Spark only distributes the task list (`spark.range(n, numSlices=n)`: one task per
partition); each task reads its range with `pipelines.core.sources.read_range`, runs `job.run_partition` (the one
step both engines run, around `heartbeat.change_events.PartitionChanges`) and writes its partition's file into the
output's staging directory itself, then hands back one row: its outcome as JSON (counts, problems, the partition's
new state). The driver collects those rows and finishes with the local engine's `job.finish` (summary.json, the
pending commit), publishes, and commits the state.

Every executor must reach the source (a shared filesystem or an object store for archives, the brokers for Kafka)
and the output directory, and import tidegauge (install the wheel on the executors, or ship it with
`spark-submit --py-files`). A task that fails to read is reported as its partition's error (exit 3); the partition
keeps its state and delivers nothing this run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from pipelines.changes import state as states
from pipelines.changes.job import (
    CHANGES_DIR,
    COMMAND,
    ChangesOptions,
    PartitionOutcome,
    PartitionTask,
    finish,
    prepare,
    run_partition,
)
from pipelines.core.output import OutputDir
from pipelines.core.progress import Progress
from pipelines.core.sources import read_range
from pipelines.core.storage import locate

log = logging.getLogger("tidegauge.changes")

OUT_DDL = "tid int, outcome string"
OUT_SCHEMA = pa.schema([("tid", pa.int32()), ("outcome", pa.string())])


class ChangeTasks:
    """The `mapInArrow` function: task ids in; each task reads its partition, writes its file, yields its outcome."""

    def __init__(
        self,
        tasks: list[PartitionTask],
        uri: str,
        kafka_conf: dict[str, Any],
        topic: str,
        out: str,
        records=None,
    ) -> None:
        self.tasks, self.uri, self.kafka_conf, self.topic, self.out = tasks, uri, kafka_conf, topic, out
        self.records = records  # a Spark accumulator of the records read, for the driver's progress line

    def _batches(self, task: PartitionTask) -> Iterator[pa.RecordBatch]:
        if task.end <= task.start:
            return
        for batch in read_range(self.uri, self.kafka_conf, self.topic, task.partition, task.start, task.end):
            if self.records is not None:
                self.records.add(batch.num_rows)
            yield batch

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        changes_dir = locate(self.out)
        for batch in batches:
            for tid in batch.column("id").to_pylist():
                task = self.tasks[tid]
                outcome = run_partition(task, self._batches(task), changes_dir)
                yield pa.RecordBatch.from_pylist(
                    [{"tid": tid, "outcome": outcome.to_json()}], schema=OUT_SCHEMA
                )


def run_spark(
    opts: ChangesOptions, master: str | None = None, spark_conf: dict[str, str] | None = None
) -> int:
    """Every partition as one Spark task. Returns the exit code (the local engine's, for the same input)."""
    prep = prepare(opts)
    from pipelines.core.spark_session import get_session, warn_local_paths

    spark = get_session(master, conf=spark_conf)
    warn_local_paths(spark, {"--source": opts.source.uri, "--out": opts.out, "--state": opts.state_dir})
    tasks = prep.tasks
    with OutputDir(opts.out, COMMAND) as out, Progress(COMMAND, spark=spark) as progress:
        changes_dir = out.file(CHANGES_DIR)
        changes_dir.makedirs()
        outcomes: dict[int, PartitionOutcome] = {}
        if tasks:
            progress.stage(f"reading {len(tasks)} partition(s)")
            fn = ChangeTasks(
                tasks, opts.source.uri, opts.kafka_conf, opts.topic, changes_dir.uri, progress.accumulator()
            )
            rows = spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(fn, OUT_DDL).collect()
            for r in rows:
                o = PartitionOutcome.from_json(r["outcome"])
                outcomes[o.partition] = o
        for t in tasks:
            o = outcomes.get(t.partition)
            if o is not None and o.error is not None:
                log.error("%s[%d] could not be read: %s", opts.topic, t.partition, o.error)
        progress.stage("writing the results")
        code, new = finish(opts, prep, out, outcomes, "spark")
    if opts.state_dir:
        states.commit(opts.state_dir, new)
    return code
