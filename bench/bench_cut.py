"""Benchmark: `tidegauge cut` (issue 40) — what a cut costs against reading the archives, and a snapshot against the
change stream over the same VT.

The workload is Leap Frog's (`leapfrog_workload`: 2 regions x `--records` VT records each, 4 partitions, a heartbeat
with an `hbw` vector every 1,000 RT records per region; built once, cached under --dir). It has no RT topics, so
the cut is heartbeat-aligned (no `--rt`). In the same process, rounds alternate (round 0 warms the caches, untimed):

- `scan`: every Parquet file of both regions' archives read whole with pyarrow and every key, value and header
  value's bytes summed: a scan of every byte, the floor of any reader that looks at every record;
- `cut`: `tidegauge cut` over both regions at T, the middle of the run (its timestamps are the writes' sequence
  numbers), no snapshot: reads keys, offsets and headers, decodes only the heartbeats;
- `changes`: `tidegauge changes` over region 0's VT (every record through the change rule, Parquet written);
- `snapshot_mid`: `tidegauge cut --snapshot 0` at T (reads region 0's VT up to ceil, about half of it);
- `snapshot_end`: `tidegauge cut --snapshot 0` at the end of the run (the whole VT up to its last heartbeat that
  covers the cut: like for like with `changes`, per record read).

`cut_over_scan` = cut seconds / scan seconds (below 1: the cut reads less than every byte); `snapshot_end_over_changes`
= snapshot_end seconds / changes seconds (median of per-round ratios). Prints one JSON object. Usage:
    python bench/bench_cut.py [--records N] [--repeat R] [--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
from leapfrog_workload import LAYOUT, Workload, generate


def scan(dirs: list[str]) -> tuple[float, int, int]:
    """(seconds, records, bytes): every file read whole, every binary's bytes summed."""
    t = time.perf_counter()
    records = total = 0
    for d in dirs:
        for f in sorted(Path(d).rglob("*.parquet")):
            table = pq.read_table(f)
            records += table.num_rows
            for name in ("key", "value"):
                total += pc.sum(pc.binary_length(table.column(name))).as_py() or 0
            headers = pc.list_flatten(table.column("headers"))
            total += pc.sum(pc.binary_length(pc.struct_field(headers, "value"))).as_py() or 0
    return time.perf_counter() - t, records, total


def cli(argv: list[str], out: str) -> tuple[float, int, dict]:
    from pipelines.cli import main

    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main([*argv, "--out", out])
    s = time.perf_counter() - t
    summary = json.loads(Path(out, "summary.json").read_text())
    if code not in (0, 1):
        raise SystemExit(f"tidegauge {argv[0]} exited {code}")
    return s, code, summary


def spread(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="VT records per region (default 1M)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/tidegauge-bench-cut")
    args = ap.parse_args()
    w = Workload(regions=2, partitions=4, vt_records=args.records, keys=args.records // 5)
    root = os.path.join(args.dir, f"w{args.records}-l{LAYOUT}")
    t = time.perf_counter()
    if not os.path.isdir(os.path.join(root, "full")):
        generate(w, root)
    built_s = time.perf_counter() - t
    dirs = [f"{root}/full/dc-{x}" for x in range(w.regions)]
    sources = [a for x, d in enumerate(dirs) for a in ("--source", f"{x}={d}")]
    writes = int(w.vt_records / w.partitions * 1.15)  # the workload's timestamps: write sequence numbers
    mid, end = writes // 2, writes * 10
    out = os.path.join(args.dir, "out")
    runs: dict[str, list[float]] = {k: [] for k in ("scan", "cut", "changes", "snapshot_mid", "snapshot_end")}
    last: dict[str, dict] = {}
    records = scan_bytes = 0
    for i in range(args.repeat + 1):
        s_scan, records, scan_bytes = scan(dirs)
        s_cut, _, last["cut"] = cli(["cut", *sources, "--at", str(mid)], out)
        s_changes, _, last["changes"] = cli(
            ["changes", "--store", w.store, "--version", "1", "--source", f"0={dirs[0]}"], out
        )
        s_mid, _, last["snapshot_mid"] = cli(["cut", *sources, "--at", str(mid), "--snapshot", "0"], out)
        s_end, _, last["snapshot_end"] = cli(["cut", *sources, "--at", str(end), "--snapshot", "0"], out)
        if i:
            for k, v in zip(runs, (s_scan, s_cut, s_changes, s_mid, s_end), strict=True):
                runs[k].append(v)
    ratio = lambda a, b: round(statistics.median(x / y for x, y in zip(runs[a], runs[b], strict=True)), 3)  # noqa: E731
    result = {
        "vt_records": records,
        "vt_records_per_region": records // w.regions,
        "partitions": w.partitions,
        "regions": w.regions,
        "archive_built_s": round(built_s, 1),
        "scan_bytes": scan_bytes,
        "seconds": {k: spread(v) for k, v in runs.items()},
        "scan_s": round(statistics.median(runs["scan"]), 3),
        "cut_s": round(statistics.median(runs["cut"]), 3),
        "changes_s": round(statistics.median(runs["changes"]), 3),
        "snapshot_mid_s": round(statistics.median(runs["snapshot_mid"]), 3),
        "snapshot_end_s": round(statistics.median(runs["snapshot_end"]), 3),
        "cut_over_scan": ratio("cut", "scan"),
        "cut_records_per_s": round(records / statistics.median(runs["cut"])),
        "snapshot_mid_over_changes": ratio("snapshot_mid", "changes"),
        "snapshot_end_over_changes": ratio("snapshot_end", "changes"),
        "snapshot_rows_mid": last["snapshot_mid"]["snapshot"]["rows"],
        "snapshot_rows_end": last["snapshot_end"]["snapshot"]["rows"],
        "snapshot_vt_records_read_mid": last["snapshot_mid"]["snapshot"]["vt_records_read"],
        "snapshot_vt_records_read_end": last["snapshot_end"]["snapshot"]["vt_records_read"],
        "changes_delivered": last["changes"]["delivered"],
        "changes_records_read": last["changes"]["records_read"],
        # per record read: the snapshot at the end reads up to the last heartbeat that covers the cut, not the tail
        "changes_records_per_s": round(last["changes"]["records_read"] / statistics.median(runs["changes"])),
        "snapshot_end_records_per_s": round(
            last["snapshot_end"]["snapshot"]["vt_records_read"] / statistics.median(runs["snapshot_end"])
        ),
        "snapshot_partitions_left_out": {
            k: len(last[k]["snapshot"]["partitions_left_out"]) for k in ("snapshot_mid", "snapshot_end")
        },
        "commands": {
            "cut": f"tidegauge cut --source 0=DC0 --source 1=DC1 --at {mid} --out OUT",
            "snapshot": f"tidegauge cut --source 0=DC0 --source 1=DC1 --at {mid}|{end} --snapshot 0 --out OUT",
            "changes": f"tidegauge changes --store {w.store} --version 1 --source 0=DC0 --out OUT",
        },
        "load_avg": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
