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

`--settled-keys 10000,1000000` (issue 42: a micro-batch's cost must follow the keys it touches) times Leap Frog's
part of the same micro-batch on a partition whose state also holds that many more settled keys (synthetic: keys
no record of the workload touches, each with a settled record per region, as `leapfrog.settle` leaves them), in
both state layouts: `whole` (today's before issue 42: one value, read, decoded, encoded and written whole) and
`split` (`pipelines.watch.settled.PartitionStore` over an in-memory backend: the small value and the touched keys'
settled records; `cached` when the Python worker holds the partition's records, `rebuilt` when it reads the base
and the log again, as after a restart). Each is broken into read (and decode), step, and write (encode and
write), with the bytes written, and `ratio` is each layout's best time at the largest count over the smallest.
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
    ap.add_argument(
        "--settled-keys",
        default="",
        help="comma-separated counts of extra settled keys: time Leap Frog's micro-batch in both state layouts",
    )
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
    if args.settled_keys:
        out["settled_keys"] = settled_keys_figures(
            step, args, timed, before, [int(x) for x in args.settled_keys.split(",") if x]
        )
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


def padded(state_bytes: bytes, extra: int, n: int, partition: int) -> bytes:
    """A whole-layout state with `extra` more settled keys, each with a settled record per region."""
    import numpy as np
    import pyarrow as pa

    from pipelines.leapfrog.carried import CARRIED_SCHEMA, sortkeys
    from pipelines.leapfrog.state import pack_carry_array
    from pipelines.watch.leapfrog_step import PartitionState

    state = PartitionState.from_bytes(state_bytes)
    rng = np.random.default_rng(42)
    raw = rng.integers(0, 256, (extra, 20), np.uint8)
    keys = [b"synthetic-settled-" + bytes(r) for r in raw]  # no workload key has this prefix
    m = extra * n
    key = pa.array([k for k in keys for _ in range(n)], pa.binary())
    part = pa.array(np.full(m, partition, np.int32))
    zero = np.zeros(m, bool)
    vectors = rng.integers(0, 1 << 40, (m, n), np.int64)
    rows = pa.table(
        {
            "partition": part,
            "key": key,
            "region": pa.array(np.tile(np.arange(n, dtype=np.int32), extra)),
            "offset": pa.array(rng.integers(0, 1 << 30, m, np.int64)),
            "value_hash": pa.array(rng.integers(-(1 << 62), 1 << 62, m, np.int64)),
            "carry": pack_carry_array(zero, zero, vectors, vectors, np.ones(m, bool)),
            "bucket": pa.array(np.full(m, -1, np.int32)),
            "sortkey": sortkeys(part, key),
        },
        schema=CARRIED_SCHEMA,
    )
    carried = (
        state.carried.cast(CARRIED_SCHEMA) if state.carried is not None else CARRIED_SCHEMA.empty_table()
    )
    state.carried = pa.concat_tables([carried, rows])
    return state.to_bytes()


def settled_keys_figures(step, args, timed: dict, before: bytes, counts: list[int]) -> dict:
    """Leap Frog's part of the timed micro-batch at each count of extra settled keys, in both layouts."""

    from pipelines.watch.leapfrog_step import RECORD_COLUMNS, PartitionState
    from pipelines.watch.settled import MemoryBackend, PartitionStore, forget_cached

    records = {r: t.select(RECORD_COLUMNS) for r, t in timed.items()}
    n = args.regions
    per_count = {}
    for extra in counts:
        whole_value = padded(before, extra, n, args.partition)
        keys = _keys_of(PartitionState.from_bytes(whole_value))
        whole = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            state = PartitionState.from_bytes(whole_value)
            t1 = time.perf_counter()
            result = step(args.partition, records, state)
            t2 = time.perf_counter()
            written = result.state.to_bytes()
            t3 = time.perf_counter()
            whole.append(
                {"read_s": t1 - t0, "step_s": t2 - t1, "write_s": t3 - t2, "bytes_written": len(written)}
            )
        # the split layout, from the same state converted once (its first micro-batch writes the base)
        first = MemoryBackend(small=whole_value)
        PartitionStore(first, "bench").run(
            step, args.partition, {r: t.slice(0, 0) for r, t in records.items()}
        )
        split = {"cached": [], "rebuilt": []}
        for _ in range(args.repeat):
            for how in ("rebuilt", "cached"):
                backend = first.copy()
                store = PartitionStore(backend, "bench")
                forget_cached()
                if how == "cached":  # what the worker held after the conversion
                    _warm_cache(first, "bench")
                store.run(step, args.partition, dict(records))
                st = store.stats
                assert st.cached == (how == "cached"), how
                split[how].append(
                    {
                        "read_s": st.read_s,
                        "step_s": st.step_s,
                        "write_s": st.write_s,
                        "of_which_lookup_s": st.lookup_s,
                        "bytes_written": backend.written_bytes,
                        "settled_rows_taken": st.taken_rows,
                        "log_entry_rows": st.entry_rows,
                    }
                )
        per_count[str(extra)] = {
            "keys_held": keys,
            "whole": _best(whole),
            **{f"split_{how}": _best(v) for how, v in split.items()},
        }
    lo, hi = str(min(counts)), str(max(counts))
    return {
        "micro_batch_records": sum(t.num_rows for t in records.values()),
        "per_count": per_count,
        "ratio": {
            layout: round(per_count[hi][layout]["total_s"] / per_count[lo][layout]["total_s"], 2)
            for layout in ("whole", "split_cached", "split_rebuilt")
        },
    }


def _warm_cache(backend, key) -> None:
    """This worker's cache as the micro-batch that wrote `backend`'s value left it."""
    from pipelines.watch import settled as S
    from pipelines.watch.leapfrog_step import PartitionState

    state = PartitionState.from_bytes(backend.small)
    records, _ = S.PartitionStore(backend.copy(), key)._settled(state, S.StoreStats())
    S._CACHE[key] = (state.settled["token"], records)


def _keys_of(state) -> int:
    import pyarrow.compute as pc

    return pc.count_distinct(state.carried.column("key")).as_py() if state.carried is not None else 0


def _best(runs: list[dict]) -> dict:
    """The run with the best total time, rounded."""
    best = min(runs, key=lambda r: r["read_s"] + r["step_s"] + r["write_s"])
    total = best["read_s"] + best["step_s"] + best["write_s"]
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in {**best, "total_s": total}.items()}


if __name__ == "__main__":
    main()
