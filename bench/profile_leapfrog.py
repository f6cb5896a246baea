"""Profile of the nightly `leapfrog` job: where a record's time goes, from Spark's stage times and the Python workers'.

Builds (once, cached, as bench_leapfrog.py does) 2 regions × `--records` VT records, runs the job once to warm up,
then once more with Spark's UI on (loopback only) and, with `--python`, Spark's Python UDF profiler
(`spark.sql.pyspark.udf.profiler=perf`, cProfile inside the workers: it slows them, so the stage times of that run
are not the job's speed). Prints one JSON object:

- `stages`: each stage of the profiled run (its name as Spark gives it, tasks, wall time, the executors' run and
  CPU time, records in and out, shuffle bytes), from Spark's REST API;
- `python_top`: with `--python`, the Python functions taking the most time inside the workers (own time and
  cumulative time, calls), from the profiler's pstats;
- `per_record_us`: the executors' run time per VT record, per stage;
- `plan_nodes`: the time and size metrics of each node of the run's SQL plans (sort time, shuffle write time,
  fetch wait time, rows), from the same API.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))

from bench_leapfrog import job  # noqa: E402
from leapfrog_workload import LAYOUT, Workload, generate  # noqa: E402

from pipelines.core.spark_session import get_session  # noqa: E402

PLAN = "one-pass"  # --plan


def _job(spark, dirs: dict[int, str], out: str, store: str, state: str | None = None) -> float:
    return job(spark, dirs, out, store, state, plan=PLAN)[0]


def _rest(spark, path: str):
    base = spark.sparkContext.uiWebUrl
    app = spark.sparkContext.applicationId
    with urllib.request.urlopen(f"{base}/api/v1/applications/{app}/{path}", timeout=30) as r:  # noqa: S310
        return json.load(r)


def _stages(spark, after: int, records: int) -> list[dict]:
    out = []
    for s in sorted(_rest(spark, "stages?status=complete"), key=lambda s: s["stageId"]):
        if s["stageId"] <= after:
            continue
        run_ms = s.get("executorRunTime", 0)
        out.append(
            {
                "stage": s["stageId"],
                "name": s["name"][:80],
                "tasks": s["numTasks"],
                "executor_run_s": round(run_ms / 1000, 2),
                "executor_cpu_s": round(s.get("executorCpuTime", 0) / 1e9, 2),
                "input_records": s.get("inputRecords", 0),
                "shuffle_read_records": s.get("shuffleReadRecords", 0),
                "shuffle_write_records": s.get("shuffleWriteRecords", 0),
                "shuffle_write_bytes": s.get("shuffleWriteBytes", 0),
                "per_record_us": round(run_ms * 1000 / records, 3),
            }
        )
    return out


def _sql_metrics(spark, after_execution: int) -> list[dict]:
    """The timing and size metrics of every plan node (sort time, shuffle write and fetch wait time, rows) of the
    SQL executions after `after_execution`, as Spark's SQL tab shows them."""
    out = []
    for ex in _rest(spark, "sql?details=true&planDescription=false"):
        if ex["id"] <= after_execution:
            continue
        for node in ex.get("nodes", []):
            metrics = {
                m["name"]: m["value"]
                for m in node.get("metrics", [])
                if any(w in m["name"] for w in ("time", "rows", "size", "written", "spill"))
            }
            if metrics:
                out.append({"execution": ex["id"], "node": node["nodeName"], "metrics": metrics})
    return out


def _python_top(spark, limit: int, keep: str | None) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        d = keep or tmp
        os.makedirs(d, exist_ok=True)
        spark.profile.dump(id=None, path=d, type="perf")
        files = [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".pstats")]
        if not files:
            return []
        stats = pstats.Stats(*files)
    rows = []
    for (path, line, name), (_cc, calls, own, cum, _callers) in stats.stats.items():
        rows.append(
            {
                "function": f"{os.path.relpath(path) if path.startswith('/') else path}:{line}({name})",
                "own_s": round(own, 3),
                "cum_s": round(cum, 3),
                "calls": calls,
            }
        )
    return sorted(rows, key=lambda r: -r["own_s"])[:limit]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="VT records per region")
    ap.add_argument("--dir", default="/tmp/tidegauge-bench-leapfrog")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--python", action="store_true", help="also profile the Python workers (slows them)")
    ap.add_argument("--top", type=int, default=25, help="Python functions to list (default 25)")
    ap.add_argument(
        "--incremental",
        action="store_true",
        help="profile an incremental run over day 2 from day 1's state instead of the full job",
    )
    ap.add_argument("--pstats", help="keep the workers' pstats files in this directory (for pstats/snakeviz)")
    ap.add_argument(
        "--plan",
        choices=("one-pass", "shuffle"),
        default="one-pass",
        help="the job's plan (`tidegauge leapfrog --plan`; default one-pass, the job's default)",
    )
    args = ap.parse_args()
    global PLAN
    PLAN = args.plan
    w = Workload(vt_records=args.records)
    root = os.path.join(args.dir, f"w{args.records}-l{LAYOUT}")
    layout = "day1" if args.incremental else "full"
    if not os.path.isdir(os.path.join(root, layout)):
        generate(w, root, split=args.incremental)
    conf = {
        "spark.sql.shuffle.partitions": "8",
        "spark.driver.memory": "4g",
        "spark.ui.enabled": "true",
        "spark.ui.host": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
    }
    spark = get_session(args.master, conf=conf)
    dirs = {x: f"{root}/full/dc-{x}" for x in range(w.regions)}
    state = None
    if args.incremental:
        import shutil

        state = os.path.join(args.dir, "profile-state")
        shutil.rmtree(state, ignore_errors=True)
        _job(
            spark,
            {x: f"{root}/day1/dc-{x}" for x in range(w.regions)},
            os.path.join(args.dir, "p-d1"),
            w.store,
            state,
        )
        shutil.copytree(state, state + "-day1", dirs_exist_ok=True)
        dirs = {x: f"{root}/day2/dc-{x}" for x in range(w.regions)}
    _job(spark, dirs, os.path.join(args.dir, "profile-warmup"), w.store, state)
    if state is not None:  # the profiled run starts from day 1's state too
        shutil.rmtree(state)
        shutil.copytree(state + "-day1", state)
    done = [s["stageId"] for s in _rest(spark, "stages")]
    after = max(done) if done else -1
    executions = [e["id"] for e in _rest(spark, "sql")]
    after_execution = max(executions) if executions else -1
    if args.python:
        spark.conf.set("spark.sql.pyspark.udf.profiler", "perf")
    wall = _job(spark, dirs, os.path.join(args.dir, "profile-run"), w.store, state)
    records = w.regions * args.records // (2 if args.incremental else 1)
    result = {
        "benchmark": "profile_leapfrog",
        "vt_records": records,
        "python_profiler": args.python,
        "incremental": args.incremental,
        "plan": args.plan,
        "wall_s": round(wall, 2),
        "stages": _stages(spark, after, records),
        "plan_nodes": _sql_metrics(spark, after_execution),
    }
    if args.python:
        result["python_top"] = _python_top(spark, args.top, args.pstats)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
