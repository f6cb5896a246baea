"""Benchmark: how the Leap Frog job scales — records, regions, a hot key, chunked values, memory, workers.

Sections (`--sections`, default all), each a key of the JSON object printed at the end:

- `records`: 2 regions at 0.5, 1, 2 and 4 M VT records per region (`--sizes`; keys = records × `--keys-ratio`,
  so every size has as many writes per key); job seconds per size, best of `--repeat` runs, the sizes taken in
  turn within each round. Goal: each doubling of the records at most 2.1× the time.
- `regions`: 2, 3 and 5 regions at equal VT records per region; job seconds and seconds per region pair.
- `hot_key`: one key of one partition holds 10 % of the writes; per-task durations of the reduce stage (the
  stage that reads the shuffle by key), read from the REST API of Spark's UI (enabled for this session). Two
  variants: 10 % of the online (RT) writes, and 10 % of each region's VT records (more RT writes: a hot key's
  remote writes mostly lose last-writer-wins, so 10 % of the RT gives about 5 % of a VT); the standard workload
  is the control. Goal: no reduce task above 2× the median task, in every run of either variant.
- `chunked`: values of 1–4 MiB written as Venice writes them (chunks of at most 950 KiB, Venice's default
  `max.size.for.user.payload.per.message.in.bytes`, then a manifest; a replaced value's chunks deleted), built
  with tests/support/vt_builder.py; job seconds and MiB of values per second.
- `memory`: peak memory of a job run in a fresh driver process (local mode: one JVM is driver and executor,
  `--driver-memory`) at two sizes (`--memory-sizes`): the JVM, and the Python processes the JVM starts
  (pyspark.daemon and the workers it forks), sampled from /proc every 0.2 s (VmHWM, the kernel's own peak, per
  process; the sum of VmRSS and of PSS over the Python workers alive at once), and Spark's own executor metrics
  (peak JVM heap). The same for chunked values at two partition sizes (`--memory-chunked-values`) and for the
  hot_key section's vt10 workload against its control (`--memory-hot-key`). Goal: flat, which this benchmark
  takes as a peak at the larger size at most 1.25× the peak at the smaller one (records and chunked values).
- `cluster`: the same job on a Spark standalone cluster on loopback (tests/support/standalone_cluster.py) with
  one worker and with two, one core each, run as driver processes (`python -m pipelines.cli leapfrog --master
  spark://...`); the two clusters run side by side and the runs alternate. The job's time is `timings.total_s`
  of its summary.json; Spark's event log gives the part spent in Spark jobs, /proc the CPU time of the
  executors (JVM and Python workers) and of the driver's children. Goal: speed-up (one worker / two workers, on
  the job's time) ≥ 1.7.

Workloads come from bench/leapfrog_workload.py (cached under `--work`, each with the time it took to build).
`--quick` runs tiny sizes (a smoke run; its figures mean nothing). Every goal appears under `goals` with the
figure, the limit and met / not met; `machine` holds the load average when the benchmark started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests" / "support"))

from leapfrog_workload import LAYOUT, Workload, generate  # noqa: E402

SECTIONS = ("records", "regions", "hot_key", "chunked", "memory", "cluster")
MIB = 1 << 20
VENICE_CHUNK = 950 * 1024  # VeniceWriter's default max.size.for.user.payload.per.message.in.bytes
SHUFFLE_PARTITIONS = "8"
DRIVER_MEMORY = "4g"
STORE_CHUNKED = "chunky"
MEMORY_FLAT = 1.25  # our reading of "flat": the peak at the larger size at most this many times the smaller's


# -- workloads -------------------------------------------------------------------------------------------------
def _label(n: int) -> str:
    """500000 -> 500k, 1000000 -> 1M (no dots: the benchmark table addresses figures by dotted paths)."""
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def workload(work: Path, w: Workload) -> tuple[dict[int, str], dict]:
    """The archives of `w` (built once, cached under `work`) and how long building them took."""
    name = f"w-r{w.regions}-n{w.vt_records}-k{w.keys}-l{LAYOUT}"
    if w.hot_partitions is not None:
        name += f"-hot{w.hot_keys}x{w.hot_share}p{w.hot_partitions}"
    root = work / name
    meta_file = root / "build.json"
    if not meta_file.exists():
        shutil.rmtree(root, ignore_errors=True)
        load = os.getloadavg()[0]
        t = time.perf_counter()
        generate(w, str(root))
        meta = {"build_s": round(time.perf_counter() - t, 1), "load_avg_before": round(load, 2)}
        meta_file.write_text(json.dumps(meta))
        meta["cached"] = False
    else:
        meta = {**json.loads(meta_file.read_text()), "cached": True}
    return {x: str(root / "full" / f"dc-{x}") for x in range(w.regions)}, meta


def chunked_workload(work: Path, values_per_partition: int, partitions: int = 2, seed: int = 7):
    """Two regions' VTs of a chunked version: `values_per_partition` keys per partition, each a value of 1–4 MiB
    from region 0's or region 1's RT, a tenth of them replaced later by another such value (Venice deletes the
    old chunks); both regions apply the same writes, then heartbeats cover them. Returns (dirs, facts)."""
    from vt_builder import TS, RegionVt

    from div.archive import ArchiveWriter

    root = work / f"chunked-v{values_per_partition}-p{partitions}-s{seed}"
    meta_file = root / "build.json"
    regions = (0, 1)
    dirs = {x: str(root / f"dc-{x}") for x in regions}
    if meta_file.exists():
        return dirs, {**json.loads(meta_file.read_text()), "cached": True}
    shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()[0]
    t = time.perf_counter()
    rng = random.Random(seed)
    plan = []  # per partition: (key, size, src, value seed)
    for _p in range(partitions):
        writes = [
            (b"big-%d" % i, rng.randint(MIB, 4 * MIB), rng.randrange(2), rng.getrandbits(32))
            for i in range(values_per_partition)
        ]
        writes += [
            (key, rng.randint(MIB, 4 * MIB), rng.randrange(2), rng.getrandbits(32))
            for key, *_ in writes[: max(1, values_per_partition // 10)]
        ]
        plan.append(writes)
    facts = {"values": 0, "value_bytes": 0, "records_per_region": 0}
    # small row groups: a row group of 1 MiB records is read (and held) whole
    writers = {x: ArchiveWriter(dirs[x], row_group_size=16, file_rows=256) for x in regions}
    for p, writes in enumerate(plan):
        for x in regions:
            vt = RegionVt(x, partition=p, chunked=True)
            vt.start_of_push()
            vt.end_of_push()
            rt = {r: -1 for r in regions}
            for key, size, src, vseed in writes:
                rt[src] += 1
                vt.put(key, random.Random(vseed).randbytes(size), src, rt[src], chunk_size=VENICE_CHUNK)
                if x == 0:
                    facts["values"] += 1
                    facts["value_bytes"] += size
            vector = [rt[r] + 1 for r in regions]
            for origin in regions:
                vt.heartbeat(origin, vector[origin], vector)
            for off, rec in enumerate(vt.records):
                writers[x].append_record(
                    f"{STORE_CHUNKED}_v1", p, off, rec.key, rec.value, TS, 0, rec.headers
                )
            if x == 0:
                facts["records_per_region"] += len(vt.records)
            del vt
        for wr in writers.values():
            wr.flush()
    for wr in writers.values():
        wr.close()
    facts.update(
        {
            "partitions": partitions,
            "build_s": round(time.perf_counter() - t, 1),
            "load_avg_before": round(load, 2),
            "archive_bytes_per_region": sum(f.stat().st_size for f in Path(dirs[0]).glob("*.parquet")),
        }
    )
    meta_file.write_text(json.dumps(facts))
    return dirs, {**facts, "cached": False}


# -- running the job in this process -----------------------------------------------------------------------------
def session(driver_memory: str = DRIVER_MEMORY):
    from pipelines.core.spark_session import get_session

    return get_session(
        "local[2]",
        conf={
            "spark.sql.shuffle.partitions": SHUFFLE_PARTITIONS,
            "spark.driver.memory": driver_memory,
            # the UI's REST API gives the reduce stage's task durations (hot_key) and the executor's peak heap
            "spark.ui.enabled": "true",
            "spark.executor.metrics.pollingInterval": "200ms",
        },
    )


def run_job(spark, dirs: dict[int, str], out: Path, store: str = "bench") -> dict:
    """One Leap Frog run through the job's public entry point: wall seconds, exit code, what summary.json says."""
    from pipelines.core.sources import SourceSpec
    from pipelines.leapfrog.job import LeapfrogOptions, run

    t = time.perf_counter()
    code = run(
        LeapfrogOptions(
            store=store, version=1, out=str(out), sources=[SourceSpec(x, d) for x, d in dirs.items()]
        ),
        spark=spark,
    )
    s = time.perf_counter() - t
    summary = json.loads((out / "summary.json").read_text())
    return {"s": s, "code": code, "summary": summary}


def _facts(summary: dict, regions: int) -> dict:
    t = summary["totals"]
    return {
        "vt_records_per_region": round(t["records"] / regions),
        "keys": t["keys"],
        "findings": sum(t["findings"].values()),
        "fused": summary["timings"].get("fused"),
    }


def _best(runs: list[dict]) -> float:
    return min(r["s"] for r in runs)


def records_section(spark, args, work: Path) -> dict:
    loads = {}
    dirs = {}
    for n in args.sizes:
        dirs[n], loads[_label(n)] = workload(work, Workload(vt_records=n, keys=_keys(args, n)))
    runs: dict[int, list[dict]] = {n: [] for n in args.sizes}
    for _ in range(args.warmup):
        run_job(spark, dirs[args.sizes[0]], work / "out" / "warmup")
    for _ in range(args.repeat):
        for n in args.sizes:
            runs[n].append(run_job(spark, dirs[n], work / "out" / f"records-{_label(n)}"))
    job_s = {_label(n): round(_best(runs[n]), 2) for n in args.sizes}
    facts = {_label(n): _facts(runs[n][-1]["summary"], 2) for n in args.sizes}
    ratio, record_ratio = {}, {}
    for a, b in zip(args.sizes, args.sizes[1:], strict=False):
        k = f"{_label(a)}-{_label(b)}"
        ratio[k] = round(job_s[_label(b)] / job_s[_label(a)], 3)
        record_ratio[k] = round(
            facts[_label(b)]["vt_records_per_region"] / facts[_label(a)]["vt_records_per_region"], 3
        )
    return {
        "regions": 2,
        "keys_ratio": args.keys_ratio,
        "job_s": job_s,
        "vt_records_per_region": {k: v["vt_records_per_region"] for k, v in facts.items()},
        "records_per_s": {k: round(2 * facts[k]["vt_records_per_region"] / job_s[k]) for k in job_s},
        "doubling_ratio": ratio,
        "record_ratio": record_ratio,
        "max_doubling_ratio": max(ratio.values()) if ratio else None,
        "runs_s": {_label(n): [round(r["s"], 2) for r in runs[n]] for n in args.sizes},
        "exit_codes": sorted({r["code"] for rs in runs.values() for r in rs}),
        "facts": facts,
        "workloads": loads,
    }


def _keys(args, records: int) -> int:
    return max(1000, int(records * args.keys_ratio))


def regions_section(spark, args, work: Path) -> dict:
    n = args.regions_records
    dirs, loads = {}, {}
    for r in args.regions:
        dirs[r], loads[str(r)] = workload(work, Workload(regions=r, vt_records=n, keys=_keys(args, n)))
    runs: dict[int, list[dict]] = {r: [] for r in args.regions}
    for _ in range(args.warmup):
        run_job(spark, dirs[args.regions[0]], work / "out" / "warmup")
    for _ in range(args.repeat):
        for r in args.regions:
            runs[r].append(run_job(spark, dirs[r], work / "out" / f"regions-{r}"))
    out = {"vt_records_per_region_planned": n, "by_regions": {}}
    for r in args.regions:
        best = _best(runs[r])
        pairs = r * (r - 1) // 2
        f = _facts(runs[r][-1]["summary"], r)
        out["by_regions"][str(r)] = {
            "pairs": pairs,
            "job_s": round(best, 2),
            "s_per_pair": round(best / pairs, 2),
            "vt_records_per_region": f["vt_records_per_region"],
            "records_per_s": round(r * f["vt_records_per_region"] / best),
            "runs_s": [round(x["s"], 2) for x in runs[r]],
            "exit_codes": sorted({x["code"] for x in runs[r]}),
        }
    out["workloads"] = loads
    return out


# -- the reduce stage's tasks, from Spark's REST API -------------------------------------------------------------
def _rest(spark, path: str):
    sc = spark.sparkContext
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/{path}"
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def _stage_ids(spark) -> set[tuple[int, int]]:
    return {(s["stageId"], s["attemptId"]) for s in _rest(spark, "stages")}


def reduce_tasks(spark, before: set[tuple[int, int]]) -> dict:
    """Tasks of the stage that read the most shuffle records among the stages run since `before`: the reduce
    side of the job's shuffle by key (per-key comparison)."""
    new = [
        s
        for s in _rest(spark, "stages")
        if (s["stageId"], s["attemptId"]) not in before and s["status"] == "COMPLETE"
    ]
    stage = max(new, key=lambda s: s.get("shuffleReadRecords", 0))
    tasks = _rest(spark, f"stages/{stage['stageId']}/{stage['attemptId']}/taskList?length=10000")
    rows = sorted(
        (
            t["duration"],
            t["taskMetrics"]["executorRunTime"],
            t["taskMetrics"]["shuffleReadMetrics"]["recordsRead"],
            t["index"],
        )
        for t in tasks
        if t["status"] == "SUCCESS"
    )
    durations = [r[0] for r in rows]
    med = statistics.median(durations)
    top = rows[-1]
    records = [r[2] for r in rows]
    return {
        "stage_id": stage["stageId"],
        "tasks": len(rows),
        "task_ms": sorted(durations),
        "median_task_ms": med,
        "max_task_ms": top[0],
        "max_over_median": round(top[0] / med, 3) if med else None,
        "run_ms_max_over_median": round(top[1] / statistics.median(r[1] for r in rows), 3),
        "max_task_shuffle_records": top[2],
        "median_task_shuffle_records": statistics.median(records),
        "records_max_over_median": round(max(records) / statistics.median(records), 3),
    }


def _hot_share(dirs: dict[int, str]) -> dict:
    """The most written (partition, key)'s share of each region's VT data records, read from the archives."""
    import collections

    import pyarrow.parquet as pq

    shares = {}
    for x, d in dirs.items():
        t = pq.read_table(d, columns=["partition", "key"])
        c = collections.Counter(
            (p, k)
            for p, k in zip(t.column("partition").to_pylist(), t.column("key").to_pylist(), strict=True)
            if k and k[:1] == b"\x00"
        )
        (top, n), total = c.most_common(1)[0], sum(c.values())
        shares[str(x)] = {"partition": top[0], "key": top[1][1:].decode(), "share": round(n / total, 4)}
    return shares


def hot_key_section(spark, args, work: Path) -> dict:
    n = args.hot_records
    base = {"vt_records": n, "keys": _keys(args, n)}
    cases = {
        "control": Workload(**base),
        "hot_rt10": Workload(**base, hot_keys=1, hot_share=0.1, hot_partitions=1),
        "hot_vt10": Workload(**base, hot_keys=1, hot_share=args.hot_rt_share_for_vt10, hot_partitions=1),
    }
    dirs, loads = {}, {}
    for name, w in cases.items():
        dirs[name], loads[name] = workload(work, w)
    for _ in range(args.warmup):
        run_job(spark, dirs["control"], work / "out" / "warmup")
    runs: dict[str, list[dict]] = {name: [] for name in cases}
    for _ in range(args.repeat):
        for name in cases:
            before = _stage_ids(spark)
            r = run_job(spark, dirs[name], work / "out" / f"hot-{name}")
            r["reduce"] = reduce_tasks(spark, before)
            runs[name].append(r)
    out = {"vt_records_per_region_planned": n, "cases": {}}
    for name, w in cases.items():
        rs = runs[name]
        ratios = [r["reduce"]["max_over_median"] for r in rs]
        out["cases"][name] = {
            "rt_hot_share": w.hot_share if w.hot_partitions is not None else None,
            "vt_top_key": _hot_share(dirs[name]),
            "job_s": round(_best(rs), 2),
            "max_over_median": max(ratios),
            "max_over_median_runs": ratios,
            "reduce_runs": [r["reduce"] for r in rs],
            "exit_codes": sorted({r["code"] for r in rs}),
        }
    out["worst_max_over_median"] = max(out["cases"][c]["max_over_median"] for c in ("hot_rt10", "hot_vt10"))
    out["workloads"] = loads
    return out


def chunked_section(spark, args, work: Path) -> dict:
    dirs, facts = chunked_workload(work, args.chunked_values)
    for _ in range(args.warmup):
        run_job(spark, dirs, work / "out" / "chunked", STORE_CHUNKED)
    runs = [run_job(spark, dirs, work / "out" / "chunked", STORE_CHUNKED) for _ in range(args.repeat)]
    best = _best(runs)
    s = runs[-1]["summary"]
    value_mib = 2 * facts["value_bytes"] / MIB  # both regions
    return {
        "regions": 2,
        "values_per_region": facts["values"],
        "value_mib_per_region": round(facts["value_bytes"] / MIB, 1),
        "vt_records_per_region": facts["records_per_region"],
        "job_s": round(best, 2),
        "mib_per_s": round(value_mib / best, 1),
        "runs_s": [round(r["s"], 2) for r in runs],
        "exit_codes": sorted({r["code"] for r in runs}),
        "keys": s["totals"]["keys"],
        "findings": sum(s["totals"]["findings"].values()),
        "fused": s["timings"].get("fused"),
        "workload": facts,
    }


# -- memory: a driver process of its own per size ----------------------------------------------------------------
def _status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]


class Sampler:
    """Polls /proc for this process's JVM and the Python processes below it (peaks per process: VmHWM)."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s = every_s
        self.jvm_hwm = 0
        self.py_hwm: dict[int, int] = {}  # pid -> VmHWM
        self.py_kind: dict[int, str] = {}
        self.py_rss_sum = 0
        self.py_pss_sum = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self) -> None:
        kids = _children()
        rss_sum = pss_sum = 0
        for jvm in kids.get(os.getpid(), []):
            with contextlib.suppress(OSError, IndexError):
                if os.path.basename(_cmdline(jvm)[0]) != "java":
                    continue
                self.jvm_hwm = max(self.jvm_hwm, _status(jvm)["VmHWM"])
                stack = [(p, "daemon") for p in kids.get(jvm, [])]
                while stack:
                    pid, kind = stack.pop()
                    with contextlib.suppress(OSError, KeyError):
                        st = _status(pid)
                        self.py_hwm[pid] = max(self.py_hwm.get(pid, 0), st["VmHWM"])
                        self.py_kind[pid] = kind
                        rss_sum += st["VmRSS"]
                        pss_sum += _pss(pid)
                    stack += [(c, "worker") for c in kids.get(pid, [])]
        self.py_rss_sum = max(self.py_rss_sum, rss_sum)
        self.py_pss_sum = max(self.py_pss_sum, pss_sum)
        self.samples += 1


def memory_child(out: str, store: str, root_dirs: list[str], driver_memory: str) -> None:
    """Run in a fresh process (`--memory-child`): one job under the sampler; prints the peaks as JSON."""
    spark = session(driver_memory)
    dirs = dict(enumerate(root_dirs))
    with Sampler() as sampler:
        r = run_job(spark, dirs, Path(out), store)
    execs = _rest(spark, "allexecutors")
    peak = next((e.get("peakMemoryMetrics") or {} for e in execs if e["id"] == "driver"), {})
    workers = [v for pid, v in sampler.py_hwm.items() if sampler.py_kind[pid] == "worker"]
    result = {
        "job_s": round(r["s"], 2),
        "exit_code": r["code"],
        "vt_records_per_region": _facts(r["summary"], len(dirs))["vt_records_per_region"],
        "jvm_peak_rss_mib": round(sampler.jvm_hwm / MIB),
        "jvm_peak_heap_used_mib": round(peak["JVMHeapMemory"] / MIB) if "JVMHeapMemory" in peak else None,
        "python_worker_peak_rss_mib": round(max(workers, default=0) / MIB),
        "python_daemon_peak_rss_mib": round(
            max((v for p, v in sampler.py_hwm.items() if sampler.py_kind[p] == "daemon"), default=0) / MIB
        ),
        "python_workers_seen": len(workers),
        "python_total_peak_rss_mib": round(sampler.py_rss_sum / MIB),
        "python_total_peak_pss_mib": round(sampler.py_pss_sum / MIB),
        "driver_python_peak_rss_mib": round(_status(os.getpid())["VmHWM"] / MIB),
        "samples": sampler.samples,
    }
    spark.stop()
    print(json.dumps(result))


_PEAKS = (
    "python_worker_peak_rss_mib",
    "python_total_peak_pss_mib",
    "jvm_peak_rss_mib",
    "jvm_peak_heap_used_mib",
)


def _memory_run(work: Path, dirs: dict[int, str], driver_memory: str, store: str = "bench") -> dict:
    cmd = [sys.executable, __file__, "--driver-memory", driver_memory]
    cmd += ["--memory-child", str(work / "out" / "memory"), store, *dirs.values()]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"memory run over {dirs} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratios(small: dict, large: dict, into: dict) -> None:
    for k in _PEAKS:
        if small.get(k) and large.get(k) is not None:
            into[k.replace("_mib", "_ratio")] = round(large[k] / small[k], 3)


def memory_section(args, work: Path) -> dict:
    """Peaks at two record counts (the goal), and two views of what can still grow: chunked values (records of
    ~1 MiB: a partition of them can fit in one read batch) and a hot key (the per-key stage holds one key's
    history at a time)."""
    out = {"sizes": {}, "driver_memory": args.driver_memory, "flat_limit": MEMORY_FLAT}
    for n in args.memory_sizes:
        dirs, _ = workload(work, Workload(vt_records=n, keys=_keys(args, n)))
        out["sizes"][_label(n)] = _memory_run(work, dirs, args.driver_memory)
    small, large = (out["sizes"][_label(n)] for n in (args.memory_sizes[0], args.memory_sizes[-1]))
    _ratios(small, large, out)
    out["records_ratio"] = round(large["vt_records_per_region"] / small["vt_records_per_region"], 3)
    if args.memory_chunked_values:
        chunked: dict = {}
        for v in args.memory_chunked_values:
            dirs, facts = chunked_workload(work, v)
            chunked[f"{v}v"] = {
                **_memory_run(work, dirs, args.driver_memory, STORE_CHUNKED),
                "value_mib_per_partition": round(facts["value_bytes"] / facts["partitions"] / MIB, 1),
            }
        a, b = (chunked[f"{v}v"] for v in (args.memory_chunked_values[0], args.memory_chunked_values[-1]))
        _ratios(a, b, chunked)
        chunked["value_bytes_ratio"] = round(b["value_mib_per_partition"] / a["value_mib_per_partition"], 3)
        out["chunked"] = chunked
    if args.memory_hot_key:
        n = args.hot_records
        base = {"vt_records": n, "keys": _keys(args, n)}
        hot: dict = {"vt_records_per_region_planned": n}
        hot["control"] = _memory_run(work, workload(work, Workload(**base))[0], args.driver_memory)
        hot_w = Workload(**base, hot_keys=1, hot_share=args.hot_rt_share_for_vt10, hot_partitions=1)
        hot["hot_vt10"] = _memory_run(work, workload(work, hot_w)[0], args.driver_memory)
        _ratios(hot["control"], hot["hot_vt10"], hot)
        out["hot_key"] = hot
    return out


# -- cluster: one worker vs two ------------------------------------------------------------------------------
def _event_log(d: Path) -> dict:
    """From a finished application's event log: time to the executors, before the first and after the last Spark
    job, in Spark jobs, and the tasks' run and JVM CPU time (Python workers' CPU is not in the latter)."""
    files = [f for f in d.rglob("*") if f.is_file() and f.name.startswith(("app-", "events_"))]
    events = [json.loads(line) for f in files for line in f.read_text().splitlines() if line]

    def times(name: str, field: str) -> list[int]:
        return [e[field] for e in events if e["Event"] == name]

    app = min(times("SparkListenerApplicationStart", "Timestamp"))
    app_end = max(times("SparkListenerApplicationEnd", "Timestamp"))
    jobs_start = min(times("SparkListenerJobStart", "Submission Time"))
    jobs_end = max(times("SparkListenerJobEnd", "Completion Time"))
    tasks = [e for e in events if e["Event"] == "SparkListenerTaskEnd" and e.get("Task Metrics")]
    return {
        "executors_added_after_s": round(
            (max(times("SparkListenerExecutorAdded", "Timestamp")) - app) / 1000, 2
        ),
        "before_first_spark_job_s": round((jobs_start - app) / 1000, 2),
        "spark_jobs_s": round((jobs_end - jobs_start) / 1000, 2),
        "after_last_spark_job_s": round((app_end - jobs_end) / 1000, 2),
        "spark_jobs": len(times("SparkListenerJobStart", "Submission Time")),
        "task_run_s": round(sum(t["Task Metrics"]["Executor Run Time"] for t in tasks) / 1000, 1),
        "task_jvm_cpu_s": round(sum(t["Task Metrics"]["Executor CPU Time"] for t in tasks) / 1e9, 1),
        "tasks": len(tasks),
        "executors": len({t["Task Info"]["Executor ID"] for t in tasks}),
    }


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    rest = stat[stat.rfind(b")") + 2 :].split()
    return int(rest[11]) + int(rest[12])  # utime + stime


class TreeCpu:
    """CPU seconds used by the processes below given roots (sampled every 0.5 s; each process's last reading):
    here the executors (below the cluster's Worker daemons: the executor JVM and its Python workers) and the
    driver (below the driver process). A process that lives less than a sample is missed."""

    def __init__(self, roots) -> None:
        self.roots = roots  # callable: () -> {name: [root pids]}
        self.ticks: dict[str, dict[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            kids = _children()
            for name, roots in self.roots().items():
                seen = self.ticks.setdefault(name, {})
                stack = [c for r in roots for c in kids.get(r, [])]  # below the roots, not the roots
                while stack:
                    pid = stack.pop()
                    with contextlib.suppress(OSError, IndexError, ValueError):
                        seen[pid] = _cpu_ticks(pid)
                    stack += kids.get(pid, [])

    def seconds(self) -> dict[str, float]:
        return {name: round(sum(t.values()) / _TICK, 1) for name, t in self.ticks.items()}


def _worker_daemons(root: Path) -> list[int]:
    """Pids of the standalone Worker JVMs whose work directory lies under root."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                cmd = _cmdline(int(d))
                if "org.apache.spark.deploy.worker.Worker" in cmd and any(str(root) in a for a in cmd):
                    out.append(int(d))
    return out


def cluster_run(cluster, dirs: dict[int, str], work: Path, tag: str) -> dict:
    logs = work / "eventlog" / tag
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    conf = work / "cluster-conf.yaml"
    conf.write_text(
        json.dumps(
            {
                "spark": {
                    "conf": {
                        "spark.eventLog.enabled": "true",
                        "spark.eventLog.dir": f"file://{logs}",
                        "spark.eventLog.compress": "false",
                    }
                }
            }
        )
    )
    out = work / "out" / f"cluster-{tag.split('-')[0]}"
    cmd = [sys.executable, "-m", "pipelines.cli", "leapfrog", "--master", cluster.master_url]
    cmd += ["--store", "bench", "--version", "1", "--out", str(out), "--conf", str(conf)]
    for x, d in dirs.items():
        cmd += ["--source", f"{x}={d}"]
    workers = _worker_daemons(cluster.root)
    t = time.perf_counter()
    driver = subprocess.Popen(
        cmd, cwd=REPO, env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    with TreeCpu(lambda: {"executors": workers, "driver": [driver.pid]}) as cpu:
        _, stderr = driver.communicate()
    wall = time.perf_counter() - t
    if driver.returncode not in (0, 1):
        raise SystemExit(f"cluster run {tag} exited {driver.returncode}:\n{stderr[-3000:]}")
    cpu_s = cpu.seconds()
    summary = json.loads((out / "summary.json").read_text())
    return {
        "wall_s": round(wall, 2),
        "job_s": summary["timings"]["total_s"],
        "code": driver.returncode,
        "records": summary["totals"]["records"],
        **_event_log(logs),
        # CPU of the executor JVMs and their Python workers, and of the driver's JVM and Python workers (its own
        # Python process not included); cpus_busy: executor CPU seconds per second of Spark jobs
        "executor_cpu_s": cpu_s.get("executors"),
        "driver_children_cpu_s": cpu_s.get("driver"),
    }


def cluster_section(args, work: Path) -> dict:
    from standalone_cluster import standalone_cluster

    n = args.cluster_records
    dirs, load = workload(work, Workload(vt_records=n, keys=_keys(args, n)))
    runs: dict[int, list[dict]] = {1: [], 2: []}
    with (
        standalone_cluster(work / "cluster-1w", workers=1, cores=1) as one,
        standalone_cluster(work / "cluster-2w", workers=2, cores=1) as two,
    ):
        clusters = {1: one, 2: two}
        for i in range(args.warmup):
            for w, c in clusters.items():
                cluster_run(c, dirs, work, f"{w}w-warmup{i}")
        for i in range(args.repeat):
            for w, c in clusters.items():
                runs[w].append(cluster_run(c, dirs, work, f"{w}w-{i}"))
    best = {w: min(rs, key=lambda r: r["job_s"]) for w, rs in runs.items()}
    for r in best.values():
        if r["executor_cpu_s"] is not None:
            r["executor_cpus_busy"] = round(r["executor_cpu_s"] / r["spark_jobs_s"], 2)
    return {
        "vt_records_per_region": round(best[1]["records"] / 2),
        "cores_per_worker": 1,
        "one_worker": best[1],
        "two_workers": best[2],
        "speedup": round(best[1]["job_s"] / best[2]["job_s"], 3),
        "speedup_wall": round(best[1]["wall_s"] / best[2]["wall_s"], 3),
        "speedup_spark_jobs": round(best[1]["spark_jobs_s"] / best[2]["spark_jobs_s"], 3),
        "job_runs_s": {f"{w}w": [r["job_s"] for r in rs] for w, rs in runs.items()},
        "workload": load,
    }


# -- goals and main ------------------------------------------------------------------------------------------
def goals(result: dict) -> dict:
    g = {}

    def add(name: str, value, op: str, limit: float) -> None:
        if value is None:
            return
        met = value <= limit if op == "<=" else value >= limit
        g[name] = {"value": value, "limit": f"{op} {limit}", "met": met}

    if "records" in result:
        add("records.max_doubling_ratio", result["records"]["max_doubling_ratio"], "<=", 2.1)
    if "hot_key" in result:
        add("hot_key.worst_max_over_median", result["hot_key"]["worst_max_over_median"], "<=", 2.0)
    if "memory" in result:
        m = result["memory"]
        add("memory.python_worker_peak_rss_ratio", m.get("python_worker_peak_rss_ratio"), "<=", MEMORY_FLAT)
        add("memory.jvm_peak_rss_ratio", m.get("jvm_peak_rss_ratio"), "<=", MEMORY_FLAT)
        c = m.get("chunked", {})
        add(
            "memory.chunked.python_worker_peak_rss_ratio",
            c.get("python_worker_peak_rss_ratio"),
            "<=",
            MEMORY_FLAT,
        )
        add("memory.chunked.jvm_peak_rss_ratio", c.get("jvm_peak_rss_ratio"), "<=", MEMORY_FLAT)
    if "cluster" in result:
        add("cluster.speedup", result["cluster"]["speedup"], ">=", 1.7)
    return g


def _done(section: str, figures: dict) -> None:
    """A finished section's figures on stderr, so that a later failure does not lose them."""
    print(f"{section} done (load average {os.getloadavg()[0]:.2f}): {json.dumps(figures)}", file=sys.stderr)


def _ints(text: str) -> list[int]:
    """Comma-separated counts (1e6 and 1000000 alike); `none` or nothing: none."""
    return [] if text.strip() in ("", "none") else [int(float(x)) for x in text.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    ap.add_argument("--sizes", type=_ints, default=[500_000, 1_000_000, 2_000_000, 4_000_000])
    ap.add_argument("--keys-ratio", type=float, default=0.2, help="distinct keys per VT record (default 0.2)")
    ap.add_argument("--regions", type=_ints, default=[2, 3, 5])
    ap.add_argument("--regions-records", type=int, default=1_000_000, help="VT records per region")
    ap.add_argument("--hot-records", type=int, default=2_000_000, help="VT records per region")
    ap.add_argument(
        "--hot-rt-share-for-vt10",
        type=float,
        default=0.18,
        help="share of RT writes that gives the hot key about 10 %% of each VT (default 0.18; measured)",
    )
    ap.add_argument("--chunked-values", type=int, default=100, help="values per partition (2 partitions)")
    ap.add_argument("--memory-sizes", type=_ints, default=[1_000_000, 4_000_000])
    ap.add_argument(
        "--memory-chunked-values",
        type=_ints,
        default=[25, 100],
        help="memory of chunked runs at these values per partition (default 25,100; none: skip)",
    )
    ap.add_argument(
        "--memory-hot-key",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="memory of the hot_key section's vt10 workload against its control (default on)",
    )
    ap.add_argument("--cluster-records", type=int, default=1_000_000, help="VT records per region")
    ap.add_argument("--repeat", type=int, default=2, help="timed runs per measurement (best of; default 2)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before each section (default 1)")
    ap.add_argument("--work", default="/tmp/tidegauge-bench-scale", help="workload cache and outputs")
    ap.add_argument(
        "--driver-memory",
        default=DRIVER_MEMORY,
        help=f"spark.driver.memory of the local sessions (driver and executor in one JVM; default {DRIVER_MEMORY})",
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--memory-child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.memory_child[0], args.memory_child[1], args.memory_child[2:], args.driver_memory)
        return
    if args.quick:
        args.sizes, args.regions_records, args.hot_records = [20_000, 40_000, 80_000], 20_000, 40_000
        args.chunked_values, args.memory_sizes, args.cluster_records = 3, [20_000, 80_000], 20_000
        args.memory_chunked_values = [2, 3]
        args.repeat, args.warmup = 1, 0
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; known: {SECTIONS}")
    work = Path(args.work)
    (work / "out").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result: dict = {
        "benchmark": "scale",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(terse=True),
            "load_avg_start": [round(x, 2) for x in os.getloadavg()],
        },
        "config": {
            "master": "local[2]",
            "shuffle_partitions": int(SHUFFLE_PARTITIONS),
            "driver_memory": args.driver_memory,
            "repeat": args.repeat,
            "warmup": args.warmup,
            "quick": args.quick,
            "sections": sections,
        },
    }
    in_process = [s for s in sections if s in ("records", "regions", "hot_key", "chunked")]
    if in_process:
        spark = session(args.driver_memory)
        fns = {
            "records": records_section,
            "regions": regions_section,
            "hot_key": hot_key_section,
            "chunked": chunked_section,
        }
        for s in in_process:
            t = time.perf_counter()
            result[s] = fns[s](spark, args, work)
            result[s]["section_wall_s"] = round(time.perf_counter() - t, 1)
            _done(s, result[s])
        spark.stop()
    if "memory" in sections:
        t = time.perf_counter()
        result["memory"] = memory_section(args, work)
        result["memory"]["section_wall_s"] = round(time.perf_counter() - t, 1)
        _done("memory", result["memory"])
    if "cluster" in sections:
        t = time.perf_counter()
        result["cluster"] = cluster_section(args, work)
        result["cluster"]["section_wall_s"] = round(time.perf_counter() - t, 1)
        _done("cluster", result["cluster"])
    result["goals"] = goals(result)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["machine"]["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
