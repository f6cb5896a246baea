"""Benchmark: change capture (issue 30) — its throughput against decoding alone, its state's size, and the duplicates
a heartbeat-free at-least-once reader (Venice's changelog consumer today) delivers where the rule delivers none.

1. Throughput. A synthetic VT archive (`leapfrog_workload`, one region, `--partitions` partitions, a heartbeat with
   an `hbw` vector every 1,000 records; built once, cached under --dir). In the same process, rounds alternate:
   - `decode`: every record through `div.records.iter_records` (the envelope decoded, nothing else): the floor a
     change reader cannot go below;
   - `changes`: every partition through `heartbeat.change_events.PartitionChanges` (decode, the rule, the events);
   - `changes_cli`: `tidegauge changes` on the local engine end to end (Parquet written, summary, state), when
     the command exists in this checkout.
   `ratio` = decode seconds / changes seconds per round (throughput of changes as a share of decoding alone;
   goal >= 0.8), median and spread over the rounds.
2. State size: the bytes `ChangeState.to_bytes` gives per partition for the run's final state, and for 3 and 5
   regions with positions near 10^9 (what a long-lived store reaches).
3. Beyond Venice: simulations (`sim.run`, 3 regions x 2 partitions, VT redeliveries, a leader failover and a version
   swap while writes go on) read from every region's archives two ways: the rule, following version 2 at version
   1's VersionSwap, and a naive reader (every data record after End of Push, and on the swap a seek to version 2's
   End of Push: Venice's behaviour). Counts the changes each delivered more than once (the rule's must be 0) and
   checks both against truth.json.

Prints one JSON object. Usage:
    python bench/bench_changes.py [--records N] [--partitions P] [--repeat R] [--sims K] [--skip-sim]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from leapfrog_workload import LAYOUT, Workload, generate

from div import archive
from div.envelope import EnvelopeCodec
from div.records import iter_records
from heartbeat.change_events import PartitionChanges
from heartbeat.changes import ChangeState, PartitionState, Phase

REPO = Path(__file__).resolve().parent.parent


def decode_pass(directory: str, topic: str, partitions: list[int]) -> tuple[float, int]:
    codec = EnvelopeCodec()
    t = time.perf_counter()
    n = 0
    for p in partitions:
        for batch in archive.iter_partition(directory, topic, p):
            for _ in iter_records(batch, codec):
                n += 1
    return time.perf_counter() - t, n


def changes_pass(
    directory: str, topic: str, partitions: list[int], n_regions: int
) -> tuple[float, int, dict]:
    t = time.perf_counter()
    events = 0
    states = {}
    for p in partitions:
        stream = PartitionChanges(p, PartitionState.fresh(n_regions))
        for batch in archive.iter_partition(directory, topic, p):
            events += len(stream.feed(batch))
        states[p] = stream.state()
    return time.perf_counter() - t, events, states


def cli_pass(directory: str, store: str, out: str) -> float | None:
    try:
        from pipelines.cli import main as cli_main
    except ImportError:
        return None
    shutil.rmtree(out, ignore_errors=True)
    argv = ["changes", "--store", store, "--version", "1", "--source", directory, "--out", out]
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = cli_main(argv)
        except SystemExit as exc:
            code = exc.code
    if code not in (0, None):
        raise SystemExit(f"tidegauge changes exited {code}")
    return time.perf_counter() - t


def _spread(xs: list[float]) -> dict:
    return {
        "median": round(statistics.median(xs), 3),
        "min": round(min(xs), 3),
        "max": round(max(xs), 3),
    }


def throughput(args) -> dict:
    w = Workload(regions=2, partitions=args.partitions, vt_records=args.records, keys=args.records // 5)
    root = os.path.join(args.dir, f"w{args.records}-p{args.partitions}-l{LAYOUT}")
    if not os.path.isdir(os.path.join(root, "full")):
        generate(w, root)
    directory = f"{root}/full/dc-0"
    topic = f"{w.store}_v1"
    partitions = sorted(i.partition for i in archive.describe(directory) if i.topic == topic)
    has_cli = _has_changes_command()
    rounds: dict[str, list[float]] = {"decode": [], "changes": [], "changes_cli": []}
    records = events = 0
    states: dict = {}
    for i in range(args.repeat + 1):  # round 0 warms the caches, untimed
        d, records = decode_pass(directory, topic, partitions)
        c, events, states = changes_pass(directory, topic, partitions, w.regions)
        cli = cli_pass(directory, w.store, os.path.join(args.dir, "cli-out")) if has_cli else None
        if i:
            rounds["decode"].append(d)
            rounds["changes"].append(c)
            if cli is not None:
                rounds["changes_cli"].append(cli)
    ratio = [d / c for d, c in zip(rounds["decode"], rounds["changes"], strict=True)]
    out = {
        "records": records,
        "partitions": len(partitions),
        "events": events,
        "decode_s": _spread(rounds["decode"]),
        "changes_s": _spread(rounds["changes"]),
        "decode_records_per_s": round(records / statistics.median(rounds["decode"])),
        "changes_records_per_s": round(records / statistics.median(rounds["changes"])),
        "ratio": _spread(ratio),
        "goal_ratio": 0.8,
        "goal_met": statistics.median(ratio) >= 0.8,
    }
    if rounds["changes_cli"]:
        cli_ratio = [d / c for d, c in zip(rounds["decode"], rounds["changes_cli"], strict=True)]
        out["changes_cli_s"] = _spread(rounds["changes_cli"])
        out["cli_ratio"] = _spread(cli_ratio)
    state = ChangeState(w.store, 1, w.regions, states)
    out["state_bytes_per_partition"] = round(len(state.to_bytes()) / len(states), 1)
    return out


def _has_changes_command() -> bool:
    try:
        import pipelines.changes  # noqa: F401
    except ImportError:
        return False
    return True


def state_sizes() -> dict:
    """Bytes per partition of a 100-partition state, positions near 10^9 (every mark 5 bytes), no gap to `seen`."""
    out = {}
    for n in (3, 5):
        big = 1_000_000_007
        ps = PartitionState(
            big, Phase.ONLINE, tuple(big + r for r in range(n)), tuple(big + r for r in range(n))
        )
        empty = len(ChangeState("store", 1, n).to_bytes())
        full = len(ChangeState("store", 1, n, {p: ps for p in range(100)}).to_bytes())
        out[f"{n}_regions"] = round((full - empty) / 100, 1)
    return out


def beyond_venice(sims: int) -> dict:
    sys.path.insert(0, str(REPO / "tests" / "support"))
    from change_truth import expected_changes, read_naively, read_with_the_rule, swap_sim_config

    from sim import run

    per_run = []
    for seed in range(1, sims + 1):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = swap_sim_config(os.path.join(tmp, "out"), seed=seed, lag_ms={})
            sim = run(cfg)
            archives = {int(k): v for k, v in sim.archives.items()}
            for region in range(3):
                expected = expected_changes(sim.truth, region)
                delivered, verdicts = read_with_the_rule(sim.truth, archives, region)
                naive = read_naively(sim.truth, archives, region)
                rule_counts = Counter(delivered)
                per_run.append(
                    {
                        "seed": seed,
                        "region": region,
                        "changes": len(expected),
                        "naive_delivered": sum(naive.values()),
                        "naive_duplicates": sum(k - 1 for k in naive.values()),
                        "naive_missing": len(expected - set(naive)),
                        "tidegauge_delivered": len(delivered),
                        "tidegauge_duplicates": sum(k - 1 for k in rule_counts.values()),
                        "tidegauge_missing": len(expected - set(rule_counts)),
                        "tidegauge_unexpected": len(set(rule_counts) - expected),
                    }
                )
    total = {k: sum(r[k] for r in per_run) for k in per_run[0] if k not in ("seed", "region")}
    return {"runs": per_run, "total": total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--records", type=int, default=500_000, help="VT records of the region read (default 500k)"
    )
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds after one untimed (default 3)")
    ap.add_argument("--sims", type=int, default=3, help="simulations for the duplicate count (default 3)")
    ap.add_argument("--skip-sim", action="store_true")
    ap.add_argument("--dir", default="/tmp/tidegauge-bench-changes")
    args = ap.parse_args()
    result = {
        "machine": {"cpus": os.cpu_count(), "load_avg_before": list(os.getloadavg())},
        "throughput": throughput(args),
        "state_bytes_per_partition_at_1e9": state_sizes(),
    }
    if not args.skip_sim:
        result["beyond_venice"] = beyond_venice(args.sims)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
