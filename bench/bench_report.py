"""Benchmark: what `tidegauge report` costs, and how much of it is Great Expectations' startup.

Measures, in a fresh interpreter each, `import great_expectations` (GX's fixed startup cost), then in this
process: loading conf/expectations.yaml, building the ephemeral GX context and running every suite over
synthetic check tables of realistic size (N partitions x 3 regions), and rendering plots. Prints one JSON object.
Usage: python bench/bench_report.py [--partitions N] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np
import pandas as pd


def fresh_import_seconds(repeat: int) -> list[float]:
    code = (
        "import time, os; os.environ['GX_ANALYTICS_ENABLED'] = 'false'; t = time.perf_counter(); "
        "import great_expectations; print(time.perf_counter() - t)"
    )
    # a script file, not -c: under -c PySpark's Spark Connect module would exit the interpreter (see expectations.py)
    out = []
    for _ in range(repeat):
        proc = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, check=True)
        out.append(float(proc.stdout.strip().splitlines()[-1]))
    return out


def synthetic_tables(partitions: int, regions: int = 3) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(1)
    pairs = [(a, b) for a in range(regions) for b in range(a + 1, regions)]
    rows = [(a, b, p) for a, b in pairs for p in range(partitions)]
    pair_table = pd.DataFrame(rows, columns=["region_a", "region_b", "partition"])
    for col in (
        "keys",
        "comparable_pairs",
        "skipped_pairs",
        "pending_keys",
        "summary_divergences",
        "divergences",
        "value_mismatch",
        "missing_in_a",
        "missing_in_b",
    ):
        pair_table[col] = rng.integers(0, 3, len(rows)).astype("int64")
    pair_table["keys"] += 100_000
    pair_table["pending_percent"] = 100.0 * pair_table["pending_keys"] / pair_table["keys"]
    grid = pd.DataFrame(
        [(r, p) for r in range(regions) for p in range(partitions)], columns=["region", "partition"]
    )
    grid["heartbeats"] = 100
    grid["min_heartbeats_from_a_region"] = 30
    div = grid.assign(
        topic="s_v1", records=10_000, findings=0, fatal_findings=0, warnings=0, read_ok=True, error=""
    )
    lag = pd.DataFrame(
        [(r, p, s) for r in range(regions) for p in range(partitions) for s in range(regions)],
        columns=["vt_region", "partition", "source_region"],
    )
    for col in (
        "heartbeats",
        "last_heartbeat_vt_offset",
        "last_heartbeat_origin_ms",
        "watermark",
        "rt_end_offset",
    ):
        lag[col] = 1.0
    lag["time_lag_ms"] = rng.uniform(100, 5000, len(lag))
    lag["offset_lag"] = rng.uniform(0, 100, len(lag))
    decoding = div[["region", "topic", "partition"]].assign(
        job="leapfrog", undecodable=0, out_of_range=0, offsets=""
    )
    return {
        "pairs": pair_table,
        "div_partitions": div,
        "heartbeat_grid": grid,
        "lag": lag,
        "decoding": decoding,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    imports = fresh_import_seconds(args.repeat)
    from pipelines.report import plots
    from pipelines.report.expectations import load_expectations, run_suites

    t = time.perf_counter()
    config = load_expectations()  # imports GX in this process
    load_s = time.perf_counter() - t
    tables = synthetic_tables(args.partitions)
    runs = [run_suites(config, tables).timings for _ in range(args.repeat)]
    t = time.perf_counter()
    plots.coverage(tables["pairs"], 5.0)
    plots.divergences_heatmap(tables["pairs"])
    plot_s = time.perf_counter() - t
    print(
        json.dumps(
            {
                "partitions": args.partitions,
                "rows": {name: len(frame) for name, frame in tables.items()},
                "gx_import_fresh_process_s": {"median": statistics.median(imports), "all": imports},
                "load_expectations_with_gx_import_s": load_s,
                "gx_context_s": statistics.median(r["gx_context_s"] for r in runs),
                "gx_validate_all_suites_s": statistics.median(r["gx_validate_s"] for r in runs),
                "two_plots_s": plot_s,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
