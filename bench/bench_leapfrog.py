"""Benchmark: the Leap Frog job vs a decode-only pass over the same archives, in the same Spark session.

Builds (once, cached) 2 regions × ~2M VT records, then runs `--repeat` rounds after `--warmup` untimed ones (the
first runs of a session pay for JIT compilation and worker start-up). A round times (a) reading the archives and
decoding every record (`pipelines.leapfrog.decode`, the minimum any job must do) and (b) the whole `leapfrog` job,
once for each of `--plans` (the shuffle job and the one-pass job, `pipelines.leapfrog.onepass`); with
`--incremental` also (c) an incremental run over day 2 from day 1's state (built once per plan, before the rounds,
and restored before each run). The job in (b) is the full rescan of both days that (c) is compared with.

Each side of each ratio gets one sample per round, so the best-of ratios compare minima over as many samples
(a minimum over more samples is lower: giving one side more rounds biases its ratio), spread alike over the
session (runs late in a session were seen to be faster than early ones, and one noisy sample off by 20 %).
A round also times two scans that read every byte of the same archives (the lengths of every key, value and
header value, summed in the JVM) and decode nothing: Spark's Parquet reader over the archive files (the floor) and
Leap Frog's own archive source. With `--loop`, a decode pass through the per-record reference loop as well.
Prints one JSON object; goals (issue 42): at least 400k VT records/s per core for the job, job / Parquet scan ≤ 4,
incremental / full ≤ 0.5 (on the best-of ratios; `*_neighbours` give the median of the ratios within each round
as well). The first plan's figures have the plain names, the others' the plan's name first (`one_pass_job_s`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from leapfrog_workload import LAYOUT, Workload, generate  # noqa: E402

from pipelines.core.sources import SourceSpec  # noqa: E402
from pipelines.core.spark_session import get_session  # noqa: E402
from pipelines.leapfrog.job import LeapfrogOptions, decode_only, run  # noqa: E402


def _opts(dirs: dict[int, str], store: str) -> LeapfrogOptions:
    return LeapfrogOptions(
        store=store, version=1, out="", sources=[SourceSpec(x, d) for x, d in dirs.items()]
    )


def decode_pass(spark, dirs: dict[int, str], store: str, vectorised: bool = True) -> float:
    t = time.perf_counter()
    decode_only(spark, _opts(dirs, store), vectorised=vectorised)
    return time.perf_counter() - t


def _byte_sum(df) -> int:
    """Every byte of every record's key, value and header values, summed in the JVM: a scan that reads it all and
    decodes nothing."""
    from pyspark.sql import functions as F

    headers = F.aggregate(
        F.col("headers"), F.lit(0).cast("long"), lambda acc, h: acc + F.length(h.getField("value"))
    )
    row = (
        F.coalesce(F.length("key"), F.lit(0))
        + F.coalesce(F.length("value"), F.lit(0))
        + F.coalesce(headers, F.lit(0))
    )
    return df.select(F.sum(row.cast("long")).alias("bytes")).first()["bytes"]


def parquet_scan(spark, dirs: dict[int, str]) -> tuple[float, int]:
    """Spark's own Parquet reader over the archive files, reading every byte (the floor of any scan here)."""
    t = time.perf_counter()
    n = _byte_sum(spark.read.parquet(*[os.path.join(d, "*.parquet") for d in dirs.values()]))
    return time.perf_counter() - t, n


def source_scan(spark, dirs: dict[int, str], store: str) -> tuple[float, int]:
    """Leap Frog's own archive source (`tidegauge_vt`), reading every byte, decoding nothing."""
    from pipelines.leapfrog.job import _sources
    from pipelines.leapfrog.source import plan, read_vt

    opts = _opts(dirs, store)
    t = time.perf_counter()
    n = _byte_sum(
        read_vt(spark, plan(_sources(opts), opts.topic, opts.kafka_conf), opts.topic, opts.kafka_conf)
    )
    return time.perf_counter() - t, n


def job(
    spark, dirs: dict[int, str], out: str, store: str, state: str | None = None, plan: str = "shuffle"
) -> tuple[float, int]:
    t = time.perf_counter()
    code = run(
        LeapfrogOptions(
            store=store,
            version=1,
            out=out,
            state_dir=state,
            sources=[SourceSpec(x, d) for x, d in dirs.items()],
            plan=plan,
        ),
        spark=spark,
    )
    return time.perf_counter() - t, code


def _median_ratio(a: list[float], b: list[float]) -> float:
    """Median of a[i] / b[i], each pair taken in the same round: a second view of the ratio, less swayed than
    best-of-each by one lucky sample on one side when the machine's speed drifts."""
    return round(statistics.median(x / y for x, y in zip(a, b, strict=True)), 3)


def _state_rows(state: str) -> int:
    import glob

    import pyarrow.parquet as pq

    return sum(
        pq.ParquetFile(f).metadata.num_rows for f in glob.glob(os.path.join(state, "carried", "*.parquet"))
    )


def _figures(jobs, incs, dec, pq_scans, src_scans, records: int, cores: int) -> dict:
    """One plan's figures: its job against the scans and the decode pass of the same rounds."""
    out = {
        "job_vt_records_per_s_per_core": round(records / min(jobs) / cores),
        "job_per_core_goal": ">= 400000",
        "job_over_scan": round(min(jobs) / min(pq_scans), 2),
        "job_over_scan_goal": "<= 4",
        "job_over_scan_neighbours": _median_ratio(jobs, pq_scans),
        "job_over_source_scan": round(min(jobs) / min(src_scans), 2),
        "job_s": round(min(jobs), 2),
        "ratio": round(min(jobs) / min(dec), 3),
        "ratio_neighbours": _median_ratio(jobs, dec),
        "job_runs_s": [round(x, 2) for x in jobs],
    }
    if incs:
        inc, full = min(incs), min(jobs)
        out.update(
            {
                "incremental_day2_s": round(inc, 2),
                "full_rescan_s": round(full, 2),
                "incremental_ratio": round(inc / full, 3),
                "incremental_goal": "<= 0.5",
                "incremental_runs_s": [round(x, 2) for x in incs],
                "incremental_ratio_neighbours": _median_ratio(incs, jobs),
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000, help="VT records per region")
    ap.add_argument("--dir", default="/tmp/tidegauge-bench-leapfrog")
    ap.add_argument("--repeat", type=int, default=4, help="timed rounds (default 4)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds of both passes first (default 1)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--incremental", action="store_true")
    ap.add_argument(
        "--loop",
        action="store_true",
        help="also time a decode pass through the per-record reference loop (VtDecoder(vectorised=False))",
    )
    ap.add_argument(
        "--keys",
        type=int,
        default=Workload.keys,
        help=f"distinct keys (default {Workload.keys}); with fewer keys a day touches every key "
        "and the state is small, with more most keys are written once and the state is large",
    )
    ap.add_argument(
        "--plans",
        default="shuffle,one-pass",
        help="the job's plans timed in each round (`tidegauge leapfrog --plan`); the first one's figures have "
        "the plain names (job_s, ...), every other one's the plan's name first (one_pass_job_s, ...)",
    )
    args = ap.parse_args()
    plans = args.plans.split(",")
    w = Workload(vt_records=args.records, keys=args.keys)
    root = os.path.join(
        args.dir, f"w{args.records}-l{LAYOUT}" + ("" if args.keys == Workload.keys else f"-k{args.keys}")
    )
    t = time.perf_counter()
    if not os.path.isdir(os.path.join(root, "full")):
        generate(w, root)
    build_s = time.perf_counter() - t
    spark = get_session(args.master, conf={"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "4g"})
    dirs = {x: f"{root}/full/dc-{x}" for x in range(w.regions)}
    for i in range(args.warmup):
        decode_pass(spark, dirs, w.store)
        for plan in plans:
            job(spark, dirs, os.path.join(args.dir, f"out-warmup-{i}"), w.store, plan=plan)
    if args.incremental:
        if not os.path.isdir(os.path.join(root, "day1")):
            generate(w, root, split=True)
        d1 = {x: f"{root}/day1/dc-{x}" for x in range(w.regions)}
        d2 = {x: f"{root}/day2/dc-{x}" for x in range(w.regions)}
        state, after_day1 = os.path.join(args.dir, "state"), {}
        for plan in plans:
            after_day1[plan] = os.path.join(args.dir, f"state-after-day1-{plan}")
            for d in (state, after_day1[plan]):
                shutil.rmtree(d, ignore_errors=True)
            job(spark, d1, os.path.join(args.dir, "inc-day1"), w.store, state, plan)
            shutil.copytree(state, after_day1[plan])
    dec, pq_scans, src_scans, loops = [], [], [], []
    jobs: dict[str, list[float]] = {plan: [] for plan in plans}
    incs: dict[str, list[float]] = {plan: [] for plan in plans}
    for i in range(args.repeat):
        pq_s, pq_bytes = parquet_scan(spark, dirs)
        src_s, src_bytes = source_scan(spark, dirs, w.store)
        assert pq_bytes == src_bytes, (pq_bytes, src_bytes)  # both read every byte
        pq_scans.append(pq_s)
        src_scans.append(src_s)
        if args.loop:
            loops.append(decode_pass(spark, dirs, w.store, vectorised=False))
        dec.append(decode_pass(spark, dirs, w.store))
        for plan in plans:
            s, code = job(spark, dirs, os.path.join(args.dir, f"out-{i}"), w.store, plan=plan)
            jobs[plan].append(s)
            if args.incremental:
                shutil.rmtree(state)
                shutil.copytree(after_day1[plan], state)  # day 2 always starts from day 1's state
                incs[plan].append(job(spark, d2, os.path.join(args.dir, "inc-day2"), w.store, state, plan)[0])
    result = {
        "benchmark": "leapfrog",
        "regions": w.regions,
        "vt_records_per_region": args.records,
        "keys": w.keys,
        "build_s": round(build_s, 1),
        "warmup_rounds": args.warmup,
        "rounds": args.repeat,
        "exit_code": code,
    }
    cores = spark.sparkContext.defaultParallelism
    records = w.regions * args.records
    if loops:
        result.update(
            {
                "loop_decode_only_s": round(min(loops), 2),
                "loop_decode_runs_s": [round(x, 2) for x in loops],
                "decode_speedup_over_loop": round(min(loops) / min(dec), 2),
            }
        )
    result.update(
        {
            "cores": cores,
            "plans": plans,
            "decode_vt_records_per_s_per_core": round(records / min(dec) / cores),
            "scan_bytes": pq_bytes,
            "parquet_scan_s": round(min(pq_scans), 2),
            "source_scan_s": round(min(src_scans), 2),
            "parquet_scan_runs_s": [round(x, 2) for x in pq_scans],
            "source_scan_runs_s": [round(x, 2) for x in src_scans],
            "decode_only_s": round(min(dec), 2),
            "decode_runs_s": [round(x, 2) for x in dec],
        }
    )
    for i, plan in enumerate(plans):
        prefix = "" if i == 0 else plan.replace("-", "_") + "_"
        if args.incremental:
            result[prefix + "state_rows_after_day1"] = _state_rows(after_day1[plan])
        result.update(
            {
                prefix + k: v
                for k, v in _figures(jobs[plan], incs[plan], dec, pq_scans, src_scans, records, cores).items()
            }
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
