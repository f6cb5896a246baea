"""`tidegauge cut --engine spark`: the local engine's output, one Spark task per partition read.

The driver plans exactly as the local engine does (`job.run`: the same topics, bounds and tasks, the cut tied
together from the answers, the same outputs). Spark only distributes the task lists: first every VT partition's
heartbeats and every RT partition's timestamps, then the snapshot's partitions, each task running
`job.run_task` (the one step both engines run) with `pipelines.core.sources.read_range` and handing back its answer
as JSON; a snapshot task writes its part file into the output's staging directory itself. Every executor must
reach the sources and the output directory, and import tidegauge.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from pipelines.core.progress import Progress
from pipelines.cut.job import CutOptions, run
from pipelines.cut.tasks import Task, run_task

OUT_DDL = "tid int, answer string"
OUT_SCHEMA = pa.schema([("tid", pa.int32()), ("answer", pa.string())])


class CutTasks:
    """The `mapInArrow` function: task ids in, each task's answer out."""

    def __init__(self, tasks: list[Task], kafka_conf: dict[int, dict[str, Any]]) -> None:
        self.tasks = [t.to_json() for t in tasks]
        self.kafka_conf = kafka_conf

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for tid in batch.column("id").to_pylist():
                answer = run_task(Task.from_json(self.tasks[tid]), self.kafka_conf)
                yield pa.RecordBatch.from_pylist(
                    [{"tid": tid, "answer": json.dumps(answer)}], schema=OUT_SCHEMA
                )


def run_spark(opts: CutOptions, master: str | None = None, spark_conf: dict[str, str] | None = None) -> int:
    """Every partition read as one Spark task. Returns the exit code (the local engine's, for the same input)."""
    from pipelines.core.spark_session import get_session, warn_local_paths

    spark = get_session(master, conf=spark_conf)
    paths = {f"--source {s.region}": s.uri for s in opts.sources} | {
        f"--rt {s.region}": s.uri for s in opts.rts
    }
    warn_local_paths(spark, {**paths, "--out": opts.out})

    def run_tasks(tasks: list[Task], progress: Progress) -> list[dict[str, Any]]:
        if not tasks:
            return []
        progress.stage(f"reading {len(tasks)} partition(s)")
        fn = CutTasks(tasks, opts.kafka_conf)
        rows = spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(fn, OUT_DDL).collect()
        answers = {r["tid"]: json.loads(r["answer"]) for r in rows}
        return [answers[i] for i in range(len(tasks))]

    return run(opts, "spark", run_tasks, spark=spark)
