"""Cost of heartbeats in a leader loop: RT records/s turned into VT records on the mock cluster, with heartbeats
every second (each region's RT heartbeat consumed and re-emitted to the VT with hbw/hbd, the leader's own RT
heartbeat written) versus none. Runs alternate in one process; prints one JSON object with the ratio
(goal ≥ 0.98). Run: `python bench/bench_heartbeat_leader.py [--records N] [--runs K]`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time


def rt_input(n: int, regions: int, producers: int, value_size: int) -> list[tuple[int, bytes, bytes, list]]:
    """Pre-built RT data records (region, key, value, headers), round-robin over regions and producers."""
    from div.writer import SegmentWriter

    writers = [
        [
            SegmentWriter(bytes([r, p]) * 8, host_name=f"p{r}-{p}", max_segment_age_ms=-1)
            for p in range(producers)
        ]
        for r in range(regions)
    ]
    value = bytes(value_size)
    out = []
    i = 0
    while len(out) < n:
        r = i % regions
        w = writers[r][(i // regions) % producers]
        for rec in w.put(0, b"key-%d" % (i % 50_000), value):
            out.append((r, rec.key, rec.value, list(rec.headers)))
        i += 1
    return out[:n]


def one_run(k, records, regions: int, heartbeats: bool, run_id: int) -> dict:
    from heartbeat import HeartbeatLeader
    from heartbeat.records import rt_heartbeat

    vt, rt = f"bench_v{run_id}", f"bench_rt{run_id}"
    k.create_topic(vt, 1)
    k.create_topic(rt, 1)
    leader = HeartbeatLeader(
        {
            "bootstrap.servers": k.bootstrap_servers,
            "linger.ms": 5,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
        },
        vt_topic=vt,
        rt_topic=rt,
        partition=0,
        region=0,
        n_regions=regions,
        host="bench:1",
        interval_ms=1000 if heartbeats else 0,
    )
    offsets = [0] * regions
    hb_every_s = 1.0
    next_hb = time.perf_counter() + hb_every_s
    fed_heartbeats = 0
    t0 = time.perf_counter()
    c0 = time.process_time()  # all threads of the process, librdkafka's included
    for i, (region, key, value, headers) in enumerate(records):
        rec = leader.on_rt_record(region, offsets[region], key, value, headers, 1)
        offsets[region] += 1
        if rec.is_data:
            leader.put(rec.key, value[-8:])
        leader.done()
        if i % 64 == 0:
            leader.poll(0)
            if heartbeats and time.perf_counter() >= next_hb:
                # Every region's leader wrote an RT heartbeat this second; ours consumes them all.
                now_ms = int(time.time() * 1000)
                for r in range(regions):
                    hb = rt_heartbeat(f"leader-{r}:1", now_ms)
                    leader.on_rt_record(r, offsets[r], hb.key, hb.value, hb.headers, now_ms)
                    offsets[r] += 1
                    fed_heartbeats += 1
                next_hb += hb_every_s
    # the 200 heartbeats built to measure one's cost are not part of the loop: keep them out of its time
    tb, cb = time.perf_counter(), time.process_time()
    build_us = heartbeat_build_us(leader) if heartbeats else None
    aside_wall, aside_cpu = time.perf_counter() - tb, time.process_time() - cb
    left = leader.close(120)
    elapsed = time.perf_counter() - t0 - aside_wall
    cpu = time.process_time() - c0 - aside_cpu
    assert left == 0 and leader.pending_heartbeats == 0, "run did not drain"
    return {
        "heartbeats": heartbeats,
        "records": len(records),
        "elapsed_s": round(elapsed, 3),
        "records_per_s": round(len(records) / elapsed),
        "cpu_us_per_record": round(cpu / len(records) * 1e6, 2),
        "vt_heartbeats": leader.stats.vt_heartbeats,
        "rt_heartbeats": leader.stats.rt_heartbeats,
        "rt_heartbeats_consumed": fed_heartbeats,
        "vt_heartbeat_build_us": build_us,
    }


def heartbeat_build_us(leader, n: int = 200) -> float:
    """CPU cost of building one VT heartbeat (hbd of the run's DIV state, hbw, the record) — what each VT
    heartbeat adds to the loop besides one produce call."""
    from div.heartbeat_headers import Watermarks, encode_hbw
    from heartbeat.records import vt_heartbeat

    t = time.process_time()
    for _ in range(n):
        hbd = leader._encode_div_state()
        hbw = encode_hbw(Watermarks(1, 0, leader.watermarks(), leader.host, leader.term_id, 0))
        vt_heartbeat(leader.host, origin_region=1, origin_rt_offset=0, timestamp_ms=0, hbw=hbw, hbd=hbd)
    return round((time.process_time() - t) / n * 1e6, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--records",
        type=int,
        default=300_000,
        help="RT records per run (default 300000: ~10 s a run, so that heartbeats every second happen "
        "several times and one run's noise does not decide)",
    )
    ap.add_argument("--runs", type=int, default=4, help="runs per mode, alternating (default 4)")
    ap.add_argument("--regions", type=int, default=3)
    ap.add_argument("--producers", type=int, default=8, help="RT producers per region (DIV state size)")
    ap.add_argument("--value-size", type=int, default=100)
    args = ap.parse_args()

    from sim.embedded_kafka import EmbeddedKafka

    records = rt_input(args.records, args.regions, args.producers, args.value_size)
    runs = []
    with EmbeddedKafka(brokers=1) as k:
        one_run(k, records[: min(5_000, len(records))], args.regions, True, 0)  # warm-up: connections, caches
        for i in range(args.runs):
            for hb in (True, False) if i % 2 == 0 else (False, True):
                runs.append(one_run(k, records, args.regions, hb, len(runs) + 1))
    with_hb = [r["records_per_s"] for r in runs if r["heartbeats"]]
    without = [r["records_per_s"] for r in runs if not r["heartbeats"]]
    ratio = statistics.median(with_hb) / statistics.median(without)
    cpu_with = statistics.median(r["cpu_us_per_record"] for r in runs if r["heartbeats"])
    cpu_without = statistics.median(r["cpu_us_per_record"] for r in runs if not r["heartbeats"])
    print(
        json.dumps(
            {
                "benchmark": "heartbeat_leader",
                "records_per_run": args.records,
                "regions": args.regions,
                "rt_producers_per_region": args.producers,
                "value_size": args.value_size,
                "heartbeat_interval_ms": 1000,
                "median_records_per_s_with_heartbeats": round(statistics.median(with_hb)),
                "median_records_per_s_without": round(statistics.median(without)),
                "ratio": round(ratio, 4),
                "goal": 0.98,
                "meets_goal": ratio >= 0.98,
                # Best run of each mode: the least disturbed by other processes.
                "best_ratio": round(max(with_hb) / max(without), 4),
                # Direct estimate, immune to machine noise: VT heartbeats per second (one per region) times their cost.
                "vt_heartbeat_build_us": statistics.median(
                    r["vt_heartbeat_build_us"] for r in runs if r["heartbeats"]
                ),
                "estimated_overhead_fraction": round(
                    args.regions
                    * statistics.median(r["vt_heartbeat_build_us"] for r in runs if r["heartbeats"])
                    / 1e6,
                    6,
                ),
                # CPU per record is less sensitive to other processes on a shared machine than wall-clock throughput.
                "median_cpu_us_per_record_with_heartbeats": cpu_with,
                "median_cpu_us_per_record_without": cpu_without,
                "cpu_ratio": round(cpu_without / cpu_with, 4),
                "runs": runs,
                "python": platform.python_version(),
                "machine": platform.machine(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
