"""Benchmark: `tidegauge repair plan` and `repair apply` (issue 31) on a simulation's own archives and cluster.

One simulation (`sim.run`, 2 regions, mock Kafka clusters) with about `--vt-records` VT records per region and
`--divergences` faults that make keys diverge (`dropped` and `poisoned`, half each; the fault placer may place
fewer: `faults_shortfall` says why, `divergent_keys` is what the plan really had). It holds a repair window
(`repair_window_s`, `on_repair_window`): every record archived, clusters up. In the window, in this process:

1. `leapfrog` on the archives (`pipelines.leapfrog.job.run`, local Spark session, `--master`);
2. `repair plan` (`pipelines.repair.job.run`) from that output, timed `--repeat` times without `--rt` and as
   many with `--rt` (the RT archives), alternating; the best of each side is reported;
3. a scan of the same VT archives that only reads their Arrow batches (`div.archive.iter_partition`, nothing
   decoded): the floor of the plan's read, to say where plan time goes;
4. `repair apply` (`pipelines.repair.apply.run`) of the real plan into region 0's RT (`kafka://` of the window's
   live.json); the simulation's leaders apply those writes after the window, as in the demo;
5. `repair apply` of a synthetic plan of `--apply-writes` PUTs (values of `--value-size` bytes; 1,000 writes are
   too few for a rate), written in the plan format (`pipelines.repair.job.PLAN_SCHEMA`, `write_parquet_file`, a
   summary.json by `OutputDir`), still in the window but into a fresh mock cluster of the simulation's kind
   (`sim.embedded_kafka.EmbeddedKafka`, one broker, in this process) holding the store's RT topic with the
   store's partition count. Not the simulation's own cluster: the mock cluster has no CreateTopics for a topic
   of a store of its own, and into the simulation's RT the leaders would replay 100k foreign writes after the
   window (and the mock cluster keeps only ~5 MiB per partition).

Prints one flat JSON object on stdout (progress on stderr):
    cpus, load_avg_start, load_avg_end          os.cpu_count(), os.getloadavg() before the simulation and at exit
    sim_records                                 the simulation's writes (SimConfig.records)
    vt_records_per_region                       min over regions of the VT records the plan read (every partition)
    vt_records_total                            both regions' VT records the plan read
    sim_s, leapfrog_s                           the simulation up to its window; the leapfrog job
    faults_requested, faults_shortfall          dropped+poisoned asked for; the placer's reasons for fewer (or {})
    divergent_keys, plan_writes, undecidable    the plan's summary without --rt (a poisoned key is undecidable)
    plan_rt_writes, plan_rt_undecidable         the same with --rt
    plan_s, plan_rt_s                           best `repair plan` wall seconds without / with --rt
    plan_s_per_1000_divergences                 plan_s * 1000 / divergent_keys
    plan_rt_s_per_1000_divergences              plan_rt_s * 1000 / divergent_keys
    plan_records_per_s, plan_rt_records_per_s   vt_records_total / plan_s (plan_rt_s)
    vt_scan_s, vt_scan_records_per_s            reading the VT archives' batches only, same partitions
    plan_over_scan                              plan_s / vt_scan_s
    rt_writes_read                              RT writes the --rt plan read (its summary's rt_writes.read)
    apply_writes, apply_acked, apply_s          the real plan: writes, acknowledged, wall seconds of apply.run
    apply_writes_per_s                          apply_acked / apply_s
    synthetic_apply_writes, synthetic_apply_acked, synthetic_apply_s, synthetic_apply_writes_per_s
                                                the same for the synthetic plan
    value_size                                  the synthetic plan's value bytes

Usage:
    python bench/bench_repair.py [--vt-records N] [--divergences D] [--apply-writes W] [--repeat R]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time

import pyarrow as pa

from div import archive
from pipelines.core.output import OutputDir, write_parquet_file
from pipelines.core.sources import SourceSpec
from pipelines.leapfrog.job import LeapfrogOptions
from pipelines.leapfrog.job import run as leapfrog_run
from pipelines.repair.apply import ApplyOptions
from pipelines.repair.apply import run as apply_run
from pipelines.repair.job import PLAN_DIR, PLAN_SCHEMA, PlanOptions
from pipelines.repair.job import run as plan_run
from sim import SimConfig, run
from sim.embedded_kafka import EmbeddedKafka

# Simulated writes (both regions together) per VT record of one region with 2 regions and keys = records / 5:
# 50,000 writes gave 43,313 VT records per region (2026-11-28).
RECORDS_PER_VT_RECORD = 1.155


def log(msg: str) -> None:
    print(f"[bench_repair] {msg}", file=sys.stderr, flush=True)


def _apply(name: str, what: str, plan: str, bootstrap: str, work: str, log) -> dict:
    """`repair apply` of `plan` into region 0's RT at `bootstrap`, timed: its `<name>_*` figures."""
    out = os.path.join(work, name.replace("_", "-"))
    s, code = _timed(apply_run, ApplyOptions(plan=plan, region=0, bootstrap=bootstrap, out=out))
    done = _summary(out)
    log(f"repair apply ({what}): {done['writes_acknowledged']} acknowledged in {s:.2f} s, exit {code}")
    return {
        f"{name}_writes": done["writes"],
        f"{name}_acked": done["writes_acknowledged"],
        f"{name}_s": round(s, 3),
        f"{name}_writes_per_s": round(done["writes_acknowledged"] / s),
    }


def _timed(fn, *a, **kw) -> tuple[float, object]:
    t = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # the jobs' own lines: stdout is this bench's JSON
        r = fn(*a, **kw)
    return time.perf_counter() - t, r


def _summary(path: str) -> dict:
    with open(os.path.join(path, "summary.json")) as f:
        return json.load(f)


def scan(dirs: dict[int, str], topic: str) -> tuple[float, int]:
    t = time.perf_counter()
    n = 0
    for d in dirs.values():
        for p in sorted(i.partition for i in archive.describe(d) if i.topic == topic):
            for batch in archive.iter_partition(d, topic, p):
                n += batch.num_rows
    return time.perf_counter() - t, n


def synthetic_plan(
    path: str, store: str, version: int, partitions: int, writes: int, value_size: int
) -> None:
    """A plan of `writes` PUTs of distinct keys in `repair plan`'s format (its schema and Parquet writer)."""
    rng = random.Random(31)
    value = rng.randbytes(value_size)
    rows = [
        {
            "partition": i % partitions,
            "key": b"bench-%09d" % i,
            "op": "PUT",
            "value": value[i % 7 :] + value[: i % 7],
            "logical_ts": 1_700_000_000_000 + i,
            "source_region": 1,
            "source_offset": i,
            "regions_to_fix": [0],
            "cause": "missed",
        }
        for i in range(writes)
    ]
    rows.sort(key=lambda r: (r["partition"], r["key"]))
    with OutputDir(path, "repair plan") as out:
        plan_dir = out.file(PLAN_DIR)
        plan_dir.makedirs()
        write_parquet_file(pa.Table.from_pylist(rows, schema=PLAN_SCHEMA), plan_dir / "part-00000.parquet")
        doc = {**out.common_fields("repair plan", 0, {}), "store": store, "version": version}
        doc |= {"divergent_keys": writes, "writes": writes, "synthetic": True}
        out.write_json("summary.json", doc)


def in_window(info: dict, args, work: str, res: dict) -> None:
    from pipelines.core.spark_session import get_session

    store, version = info["store"], int(info["version"])
    regions = info["regions"]
    sources = [SourceSpec(int(r["region"]), r["archive"]) for r in regions]
    dirs = {int(r["region"]): r["archive"] for r in regions}
    spark = get_session(args.master, conf={"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "4g"})
    lf = os.path.join(work, "leapfrog")
    log("leapfrog ...")
    res["leapfrog_s"], code = _timed(leapfrog_run, LeapfrogOptions(store, version, sources, lf), spark)
    res["leapfrog_s"] = round(res["leapfrog_s"], 1)
    log(f"leapfrog: {res['leapfrog_s']} s, exit {code}")

    plan_s: list[float] = []
    plan_rt_s: list[float] = []
    plans = {}
    for i in range(args.repeat):
        for rt in (False, True):
            out = os.path.join(work, f"plan-{'rt-' if rt else ''}{i}")
            opts = PlanOptions(store, version, sources, lf, out, rts=sources if rt else [])
            s, code = _timed(plan_run, opts)
            (plan_rt_s if rt else plan_s).append(s)
            plans[rt] = out
            log(f"repair plan{' --rt' if rt else ''}: {s:.1f} s, exit {code}")
    topic = f"{store}_v{version}"
    res["vt_scan_s"], scanned = scan(dirs, topic)
    log(f"VT scan: {res['vt_scan_s']:.1f} s, {scanned} records")

    plain, with_rt = _summary(plans[False]), _summary(plans[True])
    per_region = [r["records"] for r in plain["reads"]]
    total = sum(per_region)
    divergent = plain["divergent_keys"]
    res |= {
        "vt_records_per_region": min(per_region),
        "vt_records_total": total,
        "divergent_keys": divergent,
        "plan_writes": plain["writes"],
        "undecidable": plain["undecidable"],
        "plan_rt_writes": with_rt["writes"],
        "plan_rt_undecidable": with_rt["undecidable"],
        "plan_s": round(min(plan_s), 3),
        "plan_rt_s": round(min(plan_rt_s), 3),
        "plan_s_per_1000_divergences": round(min(plan_s) * 1000 / max(divergent, 1), 3),
        "plan_rt_s_per_1000_divergences": round(min(plan_rt_s) * 1000 / max(divergent, 1), 3),
        "plan_records_per_s": round(total / min(plan_s)),
        "plan_rt_records_per_s": round(total / min(plan_rt_s)),
        "vt_scan_records_per_s": round(scanned / res["vt_scan_s"]),
        "plan_over_scan": round(min(plan_s) / res["vt_scan_s"], 3),
        "rt_writes_read": with_rt["rt_writes"]["read"],
    }
    res["vt_scan_s"] = round(res["vt_scan_s"], 3)

    region0 = next(r for r in regions if int(r["region"]) == 0)
    res |= _apply("apply", "real plan", plans[True], region0["uri"].removeprefix("kafka://"), work, log)

    partitions = len({i.partition for i in archive.describe(dirs[0]) if i.topic == topic})
    synth = os.path.join(work, "synthetic-plan")
    synthetic_plan(synth, store, version, partitions, args.apply_writes, args.value_size)
    with EmbeddedKafka(
        brokers=1
    ) as kafka:  # the simulation's kind of cluster, started here: see the docstring
        kafka.create_topic(f"{store}_rt", partitions)
        res |= _apply("synthetic_apply", "synthetic plan", synth, kafka.bootstrap_servers, work, log)
    res["value_size"] = args.value_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vt-records", type=int, default=2_000_000, help="VT records per region (about)")
    ap.add_argument(
        "--records", type=int, default=None, help="the simulation's writes (default: from --vt-records)"
    )
    ap.add_argument("--divergences", type=int, default=1000, help="dropped + poisoned faults (default 1000)")
    ap.add_argument("--keys", type=int, default=None, help="keys (default: VT records / 5)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--apply-writes", type=int, default=100_000, help="writes of the synthetic plan")
    ap.add_argument("--value-size", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=1, help="repair plan runs per side (best reported)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed)")
    ap.add_argument("--quiet", action="store_true", help="no simulator progress lines")
    args = ap.parse_args()
    res: dict = {"cpus": os.cpu_count(), "load_avg_start": [round(x, 2) for x in os.getloadavg()]}
    work = args.dir or tempfile.mkdtemp(prefix="tidegauge-bench-repair-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    dropped = args.divergences // 2
    records = args.records or round(args.vt_records * RECORDS_PER_VT_RECORD)
    cfg = SimConfig(
        out=os.path.join(work, "sim"),
        seed=args.seed,
        regions=2,
        partitions=args.partitions,
        records=records,
        keys=args.keys or max(args.vt_records // 5, 1000),
        faults={"dropped": dropped, "poisoned": args.divergences - dropped},
        repair_window_s=3600.0,
        progress=not args.quiet,
    ).validate()
    t0 = time.perf_counter()

    def hook(info: dict) -> None:
        res["sim_s"] = round(time.perf_counter() - t0, 1)
        log(f"repair window open after {res['sim_s']} s")
        in_window(info, args, work, res)

    with contextlib.redirect_stdout(sys.stderr):
        result = run(cfg, on_repair_window=hook)
    res["sim_records"] = records
    res["faults_requested"] = args.divergences
    res["faults_shortfall"] = result.truth.get("faults_shortfall") or {}
    res["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.dir is None:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
