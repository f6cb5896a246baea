"""Profile of the watch's steps without Spark: what one partition's micro-batch costs in the Python worker, and where.

`bench_watch.py` measures the whole watch; its micro-batches are mostly these steps, run inside
`transformWithStateInPandas`: each region's VT records put in offset order and their envelopes read once
(`div.envelope_columns.read_envelopes`), Leap Frog's step (`pipelines.watch.leapfrog_step.LeapfrogStep`) over all
regions, then DIV's step (`pipelines.watch.div_step.DivStep`) per region, as `pipelines.watch.job.WatchProcessor`
calls them. Here they run alone in this process over bench_watch's workload (the same
archives, built and cached as it builds them): VT partition `--partition` of every region, cut into micro-batches of
`--batch-records` records per region (the goal's cap, 1.8 M records over 3 regions and 4 partitions, is 150k per
region partition). The first `--warm` micro-batches build the state (keys written, carried records); the next one
is then timed `--repeat` times from the same state, with the state's round trip through bytes included, as the
processor does it. Prints one JSON object: the micro-batch's times (and each part's: the envelopes, Leap Frog's
step, DIV's steps), its cost per record, Leap Frog's state's size, and with
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
    import pyarrow.compute as pc

    from div.envelope_columns import read_envelopes
    from pipelines.core.sources import read_range
    from pipelines.watch.div_step import RECORD_COLUMNS as DIV_COLUMNS
    from pipelines.watch.div_step import DivPartitionState, DivStep
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
    div_step = DivStep()
    columns = sorted(set(RECORD_COLUMNS) | set(DIV_COLUMNS))

    def batch(i: int) -> dict[int, pa.Table]:
        lo, hi = i * args.batch_records, (i + 1) * args.batch_records
        return {
            r: pa.Table.from_batches(list(read_range(dirs[r], None, topic, args.partition, lo, hi, columns)))
            for r in sorted(dirs)
        }

    def micro_batch(records: dict[int, pa.Table], state: bytes | None, div_states: dict[int, bytes]):
        """What WatchProcessor.handleInputRows does with one partition's VT records, and each part's time."""
        t0 = time.perf_counter()
        records = {r: t.take(pc.sort_indices(t, [("offset", "ascending")])) for r, t in records.items()}
        envelopes = {r: read_envelopes(t) for r, t in records.items()}
        t1 = time.perf_counter()
        before = PartitionState.from_bytes(state) if state is not None else None
        result = step(
            args.partition, {r: t.select(RECORD_COLUMNS) for r, t in records.items()}, before, envelopes
        )
        after = result.state.to_bytes()
        t2 = time.perf_counter()
        div_after = {}
        for r, t in records.items():
            kept = DivPartitionState.from_bytes(div_states[r]) if r in div_states else None
            found = div_step(r, topic, args.partition, t.select(DIV_COLUMNS), kept, envelopes=envelopes[r])
            div_after[r] = found.state.to_bytes()
        t3 = time.perf_counter()
        return result, after, div_after, (t1 - t0, t2 - t1, t3 - t2)

    state, div_states = None, {}
    for i in range(args.warm):
        _, state, div_states, _ = micro_batch(batch(i), state, div_states)
    timed = batch(args.warm)
    records = sum(t.num_rows for t in timed.values())
    before = state

    def once():
        return micro_batch(timed, before, div_states)

    times, parts = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        result, after, _, part = once()
        times.append(time.perf_counter() - t)
        parts.append(part)
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
        # each part's best, per record of the micro-batch (every region's)
        "us_per_record_best_parts": {
            name: round(min(p[k] for p in parts) / records * 1e6, 2)
            for k, name in enumerate(("envelopes", "leapfrog", "div"))
        },
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
