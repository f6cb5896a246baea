"""Benchmark: the peak RSS of one one-pass task (`pipelines.leapfrog.onepass.PartitionPass`) at N and 2N records per
partition over the same keys, in memory and with a budget that makes it spill.

Uses bench/leapfrog_workload.py's archives (2 regions, 4 partitions, 400k keys; built and cached under --dir as
bench_leapfrog.py builds them) at `--records` and twice that per region. Each measurement runs partition 0 of every
region in a fresh Python process, exactly as a Spark task's Python worker runs it (read, scan, sort, compare;
heartbeat mode, pair 0-1), and reports the process's peak RSS (`ru_maxrss`), its RSS after the imports (what a
worker holds before any record), the records read and the seconds. Prints one JSON object; goal (issue 42):
peak RSS at 2N ≤ 1.3× the peak at N.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))

from leapfrog_workload import LAYOUT, Workload, generate  # noqa: E402

_TASK = """
import json, resource, sys, time
from pipelines.leapfrog.onepass import PartitionPass
from pipelines.leapfrog.source import plan
root, memory_mb = sys.argv[1], float(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
splits = plan({0: f"{root}/dc-0", 1: f"{root}/dc-1"}, "bench_v1")
ends = {}
for sp in splits:
    ends[(sp.region, sp.partition)] = max(ends.get((sp.region, sp.partition), 0), sp.end)
reduce_args = {"mode": "heartbeat", "pairs": ((0, 1),), "n_regions": 2, "ends": ends, "state_out": None,
               "deadlines": {}, "watched": {}}
task = PartitionPass([(0,)], splits, "bench_v1", {}, "heartbeat", 2, reduce_args, task_memory_mb=memory_mb)
t = time.perf_counter()
out = sum(b.num_rows for b in task.group((0,)))
print(json.dumps({
    "records": sum(sp.end - sp.start for sp in splits if sp.partition == 0),
    "seconds": round(time.perf_counter() - t, 2),
    "rss_after_imports_mib": round(before / 1024, 1),
    "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    "output_rows": out,
}))
"""


def _task(root: str, memory_mb: float) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _TASK, root, str(memory_mb)], check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="N: VT records per region (default 1 M)")
    ap.add_argument("--dir", default="/tmp/tidegauge-bench-leapfrog")
    ap.add_argument(
        "--spill-mb", type=float, default=32.0, help="the budget of the spilling runs (default 32 MiB)"
    )
    args = ap.parse_args()
    result: dict = {"benchmark": "onepass_rss", "keys": Workload.keys, "spill_budget_mib": args.spill_mb}
    for name, records in (("n", args.records), ("2n", 2 * args.records)):
        root = os.path.join(args.dir, f"w{records}-l{LAYOUT}")
        if not os.path.isdir(os.path.join(root, "full")):
            generate(Workload(vt_records=records), root)
        full = os.path.join(root, "full")
        result[name] = {"in_memory": _task(full, 1024.0), "spilling": _task(full, args.spill_mb)}
    for kind in ("in_memory", "spilling"):
        result[f"{kind}_peak_rss_ratio"] = round(
            result["2n"][kind]["peak_rss_mib"] / result["n"][kind]["peak_rss_mib"], 3
        )
        result[f"{kind}_time_ratio"] = round(result["2n"][kind]["seconds"] / result["n"][kind]["seconds"], 3)
    result["peak_rss_ratio_goal"] = "<= 1.3"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
