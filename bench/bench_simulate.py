"""Benchmark of `tidegauge simulate`: VT records per region and wall time at the goal size, and the bytes of
replication metadata per VT record with heartbeats versus Venice's legacy per-record vector on the same traffic.

Goal (issue 3): >= 2M VT records per region for 3 regions in under 10 minutes on a 2-core machine.

    python bench/bench_simulate.py                      # goal size, then the same seed with --legacy-rmd
    python bench/bench_simulate.py --records 200000     # quicker
    python bench/bench_simulate.py --skip-legacy

Prints one JSON document. Metadata bytes are measured by the followers from the VT records themselves:
footer = Avro bytes of leaderMetadataFooter; rmd = Avro bytes of replicationMetadataVersionId +
replicationMetadataPayload; heartbeat headers = our hbw + hbd headers (names and values) amortised over the
VT data records. Venice's own `vtp` header (~17 KB on every heartbeat) is reported apart: both schemes pay it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from sim import SimConfig, run


def one_run(out: str, args, legacy: bool) -> dict:
    cfg = SimConfig(
        out=out,
        seed=args.seed,
        regions=3,
        partitions=args.partitions,
        records=args.records,
        keys=args.keys,
        key_skew=args.key_skew,
        legacy_rmd=legacy,
        progress=not args.quiet,
        workers=args.workers,
    )
    t0 = time.monotonic()
    result = run(cfg)
    wall = time.monotonic() - t0
    s = result.summary
    vt = {int(k): v for k, v in s["vt_records_per_region"].items()}
    rt = sum(s["topics"][x][cfg.rt_topic]["records"] for x in s["topics"])
    meta = s["metadata_bytes"]
    return {
        "wall_s": round(wall, 1),
        "vt_records_per_region": vt,
        "rt_records": rt,
        "records_per_s": round((rt + sum(vt.values())) / wall),
        "vt_records_per_s_per_region": round(min(vt.values()) / wall),
        "goal_met": min(vt.values()) >= 2_000_000 and wall < 600,
        "metadata_bytes": meta,
        "leader_stats_region0": s["leaders"]["0"]["stats"],
        "timings": s["timings"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--records", type=int, default=2_150_000, help="online writes (default: enough for 2M VT/region)"
    )
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--key-skew", type=float, default=0.8)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", choices=["process", "inline"], default="process")
    p.add_argument("--skip-legacy", action="store_true", help="only the heartbeat run")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--keep", metavar="DIR", help="keep the outputs under DIR (default: a temporary directory)"
    )
    args = p.parse_args(argv)
    base = args.keep or tempfile.mkdtemp(prefix="bench-simulate-")
    report: dict = {
        "machine": {"cpus": os.cpu_count(), "load_avg_before": list(os.getloadavg())},
        "config": {
            "regions": 3,
            "partitions": args.partitions,
            "records": args.records,
            "keys": args.keys,
            "key_skew": args.key_skew,
            "seed": args.seed,
            "workers": args.workers,
        },
    }
    try:
        report["heartbeats"] = one_run(os.path.join(base, "heartbeats"), args, legacy=False)
        if not args.skip_legacy:
            report["legacy_rmd"] = one_run(os.path.join(base, "legacy"), args, legacy=True)
            hb = report["heartbeats"]["metadata_bytes"]["per_record"]
            lg = report["legacy_rmd"]["metadata_bytes"]["per_record"]
            report["comparison_bytes_per_vt_record"] = {
                "heartbeat_scheme": {
                    "footer": hb["footer"],
                    "rmd_empty_vector": hb["rmd"],
                    "hbw_hbd_amortised": hb["heartbeat_headers_amortised"],
                    "total": round(hb["footer"] + hb["rmd"] + hb["heartbeat_headers_amortised"], 3),
                },
                "legacy_vector_scheme": {
                    "footer": lg["footer"],
                    "rmd_with_vector": lg["rmd"],
                    "total": round(lg["footer"] + lg["rmd"], 3),
                },
                "vector_bytes": round(lg["rmd"] - hb["rmd"], 3),
                "saving_per_record": round(
                    lg["footer"] + lg["rmd"] - (hb["footer"] + hb["rmd"] + hb["heartbeat_headers_amortised"]),
                    3,
                ),
            }
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
