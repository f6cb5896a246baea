"""Benchmark: `tidegauge watch` (issue 19) — the VT record rate per region it sustains, and its state's size.

Workload: `--regions` regions' VT archives from bench/leapfrog_workload.py (last-writer-wins leaders, VT
heartbeats carrying `hbw` high-water-mark vectors, so Leap Frog runs in heartbeat mode and keys settle), about
`--records` VT records in all, a key per `--records-per-key` records; built once and cached under `--work`.

Throughput. The watch's query (Leap Frog and DIV in one query, reading each record once) is started as
`pipelines.watch.job.start` starts it for a user (`local[2]`, the session's defaults, RocksDB state), with
`Trigger.AvailableNow` and a fixed
`--max-records-per-trigger` over the whole archives as a backlog; Spark's progress reports of every micro-batch
give its input rows (per region, from the source's start and end offsets) and its duration. A backlog drained at
R records/s per region means the watch keeps up with R without its delay growing, as long as a micro-batch's
time does not grow as the run goes on: `batch_s_trend` is the median micro-batch time of the last third of the
run over that of the first third (after the first micro-batch, which also starts Python workers), and the rate is
given on the micro-batches after the first (`records_per_s_per_region`) and on all of them (`..._all`). The
default cap, 1,800,000, is what 3 regions at the goal rate (60k records/s each) write in the watch's default
trigger interval (10 s): the goal is met when such a micro-batch takes at most the interval. The same backlog is
read by a decode-only streaming query (the same source and cap, every record decoded as Leap Frog decodes it,
nothing else; its rows packed as the watch's are), and `ratio_to_decode_only` is the watch's rate over that one,
measured in the same run (`--queries decode,watch`; `decode` alone or `watch` alone also run). The goal is the
watch's. `records_per_s_per_region_wall` is the records per region over the wall time from its start to its end,
start-up included.

State. The watch's Leap Frog keeps one small value per VT partition in RocksDB (beside it DIV keeps a small map of
producer states per (region, topic)): `PartitionState.to_bytes()`, the region
partitions' facts, the (pair, key) already reported and the records of keys in play; the settled keys' records are
apart (`pipelines.watch.settled`: a base value, `settled_base_bytes_total`, and a log whose entries count in
`on_disk`). Which records are carried is
`leapfrog --state`'s rule (pipelines/leapfrog/state.py, carried.py, `leapfrog.settle`): per key and region only
the records that can still take part in a comparison; once every pair's current records are comparable a key is
*settled* and each region keeps only its current record (flagged settled) until a new record touches it. So a
settled key leaves the records before its current ones behind, but not the state: the state is bounded by the
keys written (times regions), not by the records. It is measured at the first micro-batches that end at or past
each of `--points` records: the largest, mean and total `PartitionState.to_bytes()` (the values themselves, LZ4
inside, read back with Spark's state data source), its carried records and distinct keys, the checkpoint bytes
on disk that version needs (its latest snapshot's RocksDB files, read from the `<version>.zip` metadata, and the
changelogs after it, summed over state partitions: this depends on where the version falls between snapshots,
which Spark makes every 10 versions), and Spark's own `stateOperators` (numRowsTotal, memoryUsedBytes, RocksDB's
SST size). `state_growth` is the last point's total value bytes over the first's, beside `records_growth` and
`keys_growth` (distinct keys carried).

Prints one JSON object (`machine.load_avg_*`: the load average when it started and ended; others share these
cores). `--records 30000 --records-per-key 15` is a smoke run of well under a minute once the session has started.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
import zipfile
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scale import _label, workload  # noqa: E402
from leapfrog_workload import Workload  # noqa: E402

GOAL_PER_REGION = 60_000  # VT records/s per region with 3 regions (issue 32; issue 19 asked for 20k)
DEFAULT_TRIGGER_S = 10  # the watch's default --trigger-interval
STATE_VAR = "partition_state"  # WatchProcessor's value state of Leap Frog


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def session(master: str):
    from pipelines.core.spark_session import get_session

    # the session a user's `tidegauge watch --master local[2]` gets; only the progress history is longer
    return get_session(master, conf={"spark.sql.streaming.numRecentProgressUpdates": "100000"})


def _options(dirs: dict[int, str], work: Path, name: str, cap: int):
    from pipelines.core.sources import SourceSpec
    from pipelines.watch.job import WatchOptions

    for d in (work / "checkpoint" / name, work / "out" / name):
        shutil.rmtree(d, ignore_errors=True)
    return WatchOptions(
        store="bench",
        version=1,
        sources=[SourceSpec(x, d) for x, d in dirs.items()],
        checkpoint=str(work / "checkpoint" / name),
        out=str(work / "out" / name),
        max_records_per_trigger=cap,
        batches_to_retain=100_000,  # the state is read back at earlier micro-batches after the run
    )


def run_watch_query(
    spark, dirs: dict[int, str], work: Path, query: str, cap: int
) -> tuple[list[dict], float, Path]:
    """The watch's query over the whole archives (AvailableNow): its progress reports, wall seconds and
    checkpoint."""
    from pipelines.watch.job import start

    opts = _options(dirs, work, query, cap)
    t = time.perf_counter()
    progress = _until_done(lambda: start(spark, opts, available_now=True, queries=(query,))[0], query)
    return progress, time.perf_counter() - t, Path(opts.checkpoint) / query


# Spark waits a fixed 10 s for a Python worker it starts to connect back (PythonWorkerFactory); on a machine
# loaded far beyond its cores a worker's imports take longer and the query stops with this error. The benchmark
# then restarts the query from its checkpoint, as a supervisor restarts `tidegauge watch`, and counts it.
_RESTARTABLE = "failed to connect back"
RESTARTS = {"count": 0}


def _until_done(launch, name: str, attempts: int = 5) -> list[dict]:
    """Run a query to its end (AvailableNow), restarting it from its checkpoint after a worker start-up timeout;
    the progress reports of every attempt, in order."""
    from pyspark.errors import StreamingQueryException

    progress: list[dict] = []
    for attempt in range(attempts):
        q = launch()
        try:
            q.awaitTermination()
        except StreamingQueryException as exc:
            progress += [json.loads(p.json) for p in q.recentProgress]
            if _RESTARTABLE not in str(exc) or attempt == attempts - 1:
                raise SystemExit(f"{name} query failed: {exc}") from exc
            RESTARTS["count"] += 1
            print(f"{name}: restarted from its checkpoint after: {_RESTARTABLE}", file=sys.stderr, flush=True)
            continue
        return progress + [json.loads(p.json) for p in q.recentProgress]
    raise AssertionError("unreachable")


def run_decode_only(spark, dirs: dict[int, str], work: Path, cap: int) -> tuple[list[dict], float]:
    """The watch's source over the same archives with the same cap, its rows packed as the watch reads them,
    every record decoded as Leap Frog's decode stage decodes it (`pipelines.leapfrog.decode.VtDecoder`), the rows
    dropped (noop sink)."""
    from pipelines.core.stream_source import read_stream, unpack
    from pipelines.leapfrog import decode as V

    opts = _options(dirs, work, "decode-only", cap)

    def fn(batches):
        import pyarrow as pa

        dec = V.VtDecoder()
        for b in batches:
            for region, partition, blob in zip(
                *(b.column(c).to_pylist() for c in ("region", "partition", "records")), strict=True
            ):
                t = unpack([blob])
                n = t.num_rows
                rows = pa.table(
                    {
                        "region": pa.array([region] * n, pa.int32()),
                        "partition": pa.array([partition] * n, pa.int32()),
                        **{c: t.column(c) for c in ("offset", "key", "value", "headers")},
                    }
                )
                for rb in rows.to_batches():
                    yield dec.decode(rb, None)

    def launch():
        df = read_stream(
            spark, {s.region: s.uri for s in opts.sources}, [opts.topic], None, "earliest", cap, packed=True
        )
        return (
            df.select("region", "partition", "records")
            .mapInArrow(fn, V.DECODED_DDL)
            .writeStream.format("noop")
            .option("checkpointLocation", opts.checkpoint)
            .trigger(availableNow=True)
            .start()
        )

    t = time.perf_counter()
    progress = _until_done(launch, "decode-only")
    return progress, time.perf_counter() - t


# -- reading the progress reports ----------------------------------------------------------------------------------
def _offsets(value) -> dict:
    if isinstance(value, str):
        value = json.loads(value) if value else {}
    return value or {}


def _by_region(progress: dict) -> dict[int, int]:
    """Records of each region in a micro-batch: its end offsets minus its start offsets, per region."""
    out: dict[int, int] = {}
    for src in progress.get("sources") or []:
        start, end = _offsets(src.get("startOffset")), _offsets(src.get("endOffset"))
        for key, stop in end.items():
            region = int(key.split("/", 1)[0])
            # the first micro-batch has no start offsets: it starts at the archives' first offset, 0
            out[region] = out.get(region, 0) + int(stop) - int(start.get(key, 0))
    return out


def batches(progress: list[dict]) -> list[dict]:
    """The micro-batches that read records, in order: rows, rows per region, seconds."""
    out = []
    for p in progress:
        if not int(p.get("numInputRows") or 0):
            continue
        by_region = _by_region(p)
        out.append(
            {
                "batch_id": p["batchId"],
                # records, from the offsets (the workload is not compacted): the watch's rows are packed batches
                "rows": sum(by_region.values()),
                "by_region": by_region,
                "start": datetime.fromisoformat(p["timestamp"]).timestamp(),
                "s": p["durationMs"]["triggerExecution"] / 1000,
                "state": (p.get("stateOperators") or [None])[0],
            }
        )
    return out


def rates(bs: list[dict], regions: int) -> dict:
    """Records/s per region over the micro-batches after the first (and over all), and how batch time trends."""
    if not bs:
        return {}
    steady = bs[1:] or bs

    def per_region(sel: list[dict]) -> dict[int, float]:
        secs = sum(b["s"] for b in sel)
        tot: dict[int, int] = {}
        for b in sel:
            for x, n in b["by_region"].items():
                tot[x] = tot.get(x, 0) + n
        return {x: n / secs for x, n in sorted(tot.items())}

    steady_rates, all_rates = per_region(steady), per_region(bs)
    secs = [b["s"] for b in steady]
    third = max(1, len(secs) // 3)
    return {
        "micro_batches": len(bs),
        "records": sum(b["rows"] for b in bs),
        "records_per_batch_median": statistics.median(b["rows"] for b in bs),
        "batch_s_sum": round(sum(b["s"] for b in bs), 2),
        "first_batch_s": round(bs[0]["s"], 2),
        "batch_s_median": round(statistics.median(secs), 2),
        "batch_s_max": round(max(secs), 2),
        "batch_s_trend": round(statistics.median(secs[-third:]) / statistics.median(secs[:third]), 3),
        "records_per_s_per_region": round(min(steady_rates.values())),
        "records_per_s_per_region_all": round(min(all_rates.values())),
        "records_per_s_by_region": {str(x): round(v) for x, v in steady_rates.items()},
        "records_per_s_total": round(sum(steady_rates.values())),
        "batch_s": [round(b["s"], 2) for b in bs],
    }


# -- the state of the watch's Leap Frog -----------------------------------------------------------------------------------
def version_bytes(checkpoint: Path, version: int) -> dict:
    """Bytes on disk that one RocksDB state version needs, summed over the state store partitions. The watch
    checkpoints with changelogs: a version is its latest snapshot at or before it (`<v>.zip`, which names its SST
    and log files, with their sizes) plus the changelogs after that snapshot up to it (`<v>.changelog`)."""
    total = files = keys = 0
    parts = 0
    for part in sorted((checkpoint / "state" / "0").iterdir()):
        if not part.name.isdigit():
            continue
        snapshots = [int(z.stem) for z in part.glob("*.zip") if z.stem.isdigit() and int(z.stem) <= version]
        if not snapshots:
            continue
        parts += 1
        snap = max(snapshots)
        z = part / f"{snap}.zip"
        with zipfile.ZipFile(z) as zf:
            meta_name = next(n for n in zf.namelist() if n.endswith("metadata"))
            text = zf.read(meta_name).decode()
        meta = json.loads(text[text.index("{") :])
        named = meta.get("sstFiles", []) + meta.get("logFiles", [])
        changelogs = [part / f"{v}.changelog" for v in range(snap + 1, version + 1)]
        changelogs = [c for c in changelogs if c.exists()]
        total += z.stat().st_size + sum(int(f.get("sizeBytes", 0)) for f in named)
        total += sum(c.stat().st_size for c in changelogs)
        files += len(named) + len(changelogs)
        keys += int(meta.get("numKeys", 0))
    return {"bytes": total, "files": files, "rocksdb_keys_at_snapshot": keys, "store_partitions": parts}


def partition_states(spark, checkpoint: Path, batch_id: int) -> dict:
    """Each VT partition's `PartitionState.to_bytes()` at a batch, read back with Spark's state data source."""
    from pipelines.watch.leapfrog_step import PartitionState

    df = (
        spark.read.format("statestore")
        .option("operatorId", 0)
        .option("stateVarName", STATE_VAR)
        .option("batchId", batch_id)
        .load(str(checkpoint))
    )
    sizes, carried, keys, reported = [], 0, 0, 0
    for row in df.select("value.state").toLocalIterator():
        data = bytes(row[0])
        sizes.append(len(data))
        s = PartitionState.from_bytes(data)
        if s.carried is not None:
            carried += s.carried.num_rows
            keys += len(
                set(
                    zip(
                        s.carried.column("partition").to_pylist(),
                        s.carried.column("key").to_pylist(),
                        strict=True,
                    )
                )
            )
        reported += len(s.reported)
    # the settled keys' records, apart since issue 42 (`pipelines.watch.settled`): their base values (the log's
    # entries since the base was written are in `on_disk`)
    base = (
        spark.read.format("statestore")
        .option("operatorId", 0)
        .option("stateVarName", "settled_base")
        .option("batchId", batch_id)
        .load(str(checkpoint))
    )
    base_sizes = [len(bytes(row[0])) for row in base.select("value.state").toLocalIterator()]
    return {
        "partitions": len(sizes),
        "settled_base_bytes_total": sum(base_sizes),
        "to_bytes_max": max(sizes, default=0),
        "to_bytes_mean": round(statistics.mean(sizes)) if sizes else 0,
        "to_bytes_total": sum(sizes),
        "carried_records": carried,
        "carried_keys": keys,
        "reported": reported,
    }


def state_points(spark, checkpoint: Path, bs: list[dict], points: list[int]) -> dict:
    out = {}
    done = 0
    ends = []
    for b in bs:
        done += b["rows"]
        ends.append((done, b))
    for point in points:
        hit = next(((n, b) for n, b in ends if n >= point), ends[-1] if ends else None)
        if hit is None:
            continue
        n, b = hit
        op = b["state"] or {}
        custom = op.get("customMetrics") or {}
        out[_label(point)] = {
            "records_read": n,
            "batch_id": b["batch_id"],
            "on_disk": version_bytes(checkpoint, b["batch_id"] + 1),
            "partition_state": partition_states(spark, checkpoint, b["batch_id"]),
            "spark_state_operator": {
                "numRowsTotal": op.get("numRowsTotal"),
                "memoryUsedBytes": op.get("memoryUsedBytes"),
                "rocksdbSstFileSize": custom.get("rocksdbSstFileSize"),
            },
        }
    if len(out) >= 2:
        first, last = out[next(iter(out))], out[list(out)[-1]]
        out["state_growth"] = round(
            last["partition_state"]["to_bytes_total"] / max(1, first["partition_state"]["to_bytes_total"]), 3
        )
        out["records_growth"] = round(last["records_read"] / first["records_read"], 3)
        out["keys_growth"] = round(
            last["partition_state"]["carried_keys"] / max(1, first["partition_state"]["carried_keys"]), 3
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--records", type=int, default=10_000_000, help="VT records in all regions (about; default 10M)"
    )
    ap.add_argument("--regions", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=Workload.partitions, help="VT partitions per region")
    ap.add_argument(
        "--records-per-key",
        type=int,
        default=25,
        help="VT records (all regions) per distinct key (default 25: 400k keys, 100k per partition, at 10M "
        "records; keys are drawn uniformly within a partition, so by 10%% of the run nearly all have been written)",
    )
    ap.add_argument(
        "--max-records-per-trigger",
        type=int,
        default=GOAL_PER_REGION * 3 * DEFAULT_TRIGGER_S,
        help="the watch's cap on a micro-batch (default 1800000: 3 regions at the goal rate for the default "
        "10 s trigger interval)",
    )
    ap.add_argument(
        "--points",
        type=_ints,
        default=None,
        help="records read at which the state is measured (default 10%%, 50%% and 100%% of --records)",
    )
    ap.add_argument(
        "--queries",
        default="decode,watch",
        help="which runs (default decode,watch; decode: the decode-only read, watch: the watch's query of Leap "
        "Frog and DIV)",
    )
    ap.add_argument("--master", default="local[2]")
    ap.add_argument(
        "--work", default="/tmp/tidegauge-bench-watch", help="workload cache, checkpoints, outputs"
    )
    args = ap.parse_args()
    runs = [q for q in args.queries.split(",") if q]
    if set(runs) - {"decode", "watch"}:
        ap.error("--queries: decode, watch")
    points = args.points or [args.records // 10, args.records // 2, args.records]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    w = Workload(
        regions=args.regions,
        partitions=args.partitions,
        vt_records=-(-args.records // args.regions),
        keys=max(
            100, args.records // args.records_per_key // args.partitions
        ),  # the generator's: per partition
    )
    dirs, built = workload(work, w)
    spark = session(args.master)
    cap = args.max_records_per_trigger
    result: dict = {
        "benchmark": "watch",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(terse=True),
            "load_avg_start": load_start,
        },
        "config": {
            "master": args.master,
            "regions": args.regions,
            "partitions": args.partitions,
            "keys_per_partition": w.keys,
            "keys": w.keys * args.partitions,
            "heartbeat_every": w.heartbeat_every,
            "max_records_per_trigger": cap,
            "records_planned": args.records,
        },
        "workload": built,
        "goal": f"watch.records_per_s_per_region >= {GOAL_PER_REGION} with 3 regions",
    }
    if "decode" in runs:
        load = os.getloadavg()[0]
        progress, wall = run_decode_only(spark, dirs, work, cap)
        _keep(work, "decode-only", progress, wall)
        result["decode_only"] = {"load_avg_before": round(load, 2), "wall_s": round(wall, 1)}
        result["decode_only"].update(rates(batches(progress), args.regions))
    if "watch" in runs:
        load = os.getloadavg()[0]
        progress, wall, checkpoint = run_watch_query(spark, dirs, work, "watch", cap)
        _keep(work, "watch", progress, wall)
        bs = batches(progress)
        records = sum(_region_records(dirs).values()) / args.regions
        r = {
            "load_avg_before": round(load, 2),
            "wall_s": round(wall, 1),
            "records_per_s_per_region_wall": round(records / wall),
            **rates(bs, args.regions),
        }
        if "decode_only" in result and r:
            r["ratio_to_decode_only"] = round(
                r["records_per_s_per_region"] / result["decode_only"]["records_per_s_per_region"], 3
            )
        r["state"] = state_points(spark, checkpoint, bs, points)
        result["watch"] = r
    spark.stop()
    watch = result.get("watch", {})
    if "records_per_s_per_region" in watch:
        result["goal_met"] = args.regions >= 3 and watch["records_per_s_per_region"] >= GOAL_PER_REGION
    result["records_per_region"] = {str(x): n for x, n in sorted(_region_records(dirs).items())}
    result["query_restarts"] = RESTARTS["count"]
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["machine"]["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result))


def _keep(work: Path, name: str, progress: list[dict], wall: float) -> None:
    """Every progress report of a run, beside the checkpoints (for a closer look), and a line on stderr."""
    (work / f"progress-{name}.json").write_text(json.dumps(progress, indent=1))
    rows = sum(b["rows"] for b in batches(progress))
    print(
        f"{name}: {rows} records in {wall:.1f} s, {len(progress)} progress reports",
        file=sys.stderr,
        flush=True,
    )


def _region_records(dirs: dict[int, str]) -> dict[int, int]:
    import pyarrow.parquet as pq

    return {
        x: sum(pq.ParquetFile(f).metadata.num_rows for f in Path(d).rglob("*.parquet"))
        for x, d in dirs.items()
    }


if __name__ == "__main__":
    main()
