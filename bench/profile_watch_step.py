"""Profile of the watch's Leap Frog step (`pipelines.watch.leapfrog_step.LeapfrogStep`) without Spark: what one
partition's micro-batch costs in the Python worker, and where.

`bench_watch.py` measures the whole watch; its micro-batches are mostly this step (and DIV's), run inside
`transformWithStateInPandas`. Here the step runs alone in this process over bench_watch's workload (the same
archives, built and cached as it builds them): VT partition `--partition` of every region, cut into micro-batches of
`--batch-records` records per region (the goal's cap, 1.8 M records over 3 regions and 4 partitions, is 150k per
region partition). The first `--warm` micro-batches build the state (keys written, carried records); the next one
is then timed `--repeat` times from the same state, with the state's round trip through bytes included, as the
processor does it. Prints one JSON object: the step's times, its cost per record, the state's size, and with
`--top N` the functions taking the most own time under cProfile (a separate run: the profiler slows the step).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_scale import workload  # noqa: E402
from leapfrog_workload import Workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10_000_000, help="bench_watch's --records (default 10M)")
    ap.add_argument("--regions", type=int, default=3)
    ap.add_argument("--records-per-key", type=int, default=25, help="bench_watch's --records-per-key")
    ap.add_argument("--partition", type=int, default=0)
    ap.add_argument("--batch-records", type=int, default=150_000, help="records per region per micro-batch")
    ap.add_argument("--warm", type=int, default=1, help="micro-batches run before the timed one")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument(
        "--top", type=int, default=0, help="also profile the timed micro-batch: the N top functions"
    )
    ap.add_argument("--work", default="/tmp/tidegauge-bench-watch", help="bench_watch's workload cache")
    args = ap.parse_args()

    import pyarrow as pa

    from pipelines.core.sources import read_range
    from pipelines.watch.leapfrog_step import RECORD_COLUMNS, LeapfrogStep, PartitionState

    w = Workload(
        regions=args.regions,
        partitions=Workload.partitions,
        vt_records=-(-args.records // args.regions),
        keys=max(100, args.records // args.records_per_key // Workload.partitions),
    )
    load_before = round(os.getloadavg()[0], 2)
    dirs, built = workload(Path(args.work), w)
    topic = f"{w.store}_v1"
    pairs = tuple((a, b) for a in range(args.regions) for b in range(a + 1, args.regions))
    step = LeapfrogStep(pairs, args.regions)

    def batch(i: int) -> dict[int, pa.Table]:
        lo, hi = i * args.batch_records, (i + 1) * args.batch_records
        return {
            r: pa.Table.from_batches(
                list(read_range(dirs[r], None, topic, args.partition, lo, hi, RECORD_COLUMNS))
            )
            for r in sorted(dirs)
        }

    state = None
    for i in range(args.warm):
        state = PartitionState.from_bytes(step(args.partition, batch(i), state).state.to_bytes())
    timed = batch(args.warm)
    records = sum(t.num_rows for t in timed.values())
    before = state.to_bytes() if state is not None else None

    def once():
        s = PartitionState.from_bytes(before) if before is not None else None
        result = step(args.partition, timed, s)
        return result, result.state.to_bytes()

    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        result, after = once()
        times.append(time.perf_counter() - t)
    out = {
        "benchmark": "profile_watch_step",
        "workload": {"records": args.records, "regions": args.regions, "cached": built.get("cached")},
        "partition": args.partition,
        "micro_batch_records": records,
        "warm_micro_batches": args.warm,
        "load_avg_before": load_before,
        "step_s": [round(x, 3) for x in times],
        "step_s_best": round(min(times), 3),
        "step_s_median": round(statistics.median(times), 3),
        "us_per_record_best": round(min(times) / records * 1e6, 2),
        "findings": result.findings.num_rows,
        "state_bytes_before": len(before) if before is not None else 0,
        "state_bytes_after": len(after),
    }
    if args.top:
        prof = cProfile.Profile()
        prof.runcall(once)
        stats = pstats.Stats(prof)
        rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[: args.top]
        out["top_own_time"] = [
            {
                "function": f"{os.path.relpath(f, HERE.parent) if f.startswith('/') else f}:{line}({name})",
                "calls": nc,
                "own_s": round(tt, 3),
                "cumulative_s": round(ct, 3),
            }
            for (f, line, name), (_cc, nc, tt, ct, _callers) in rows
        ]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
