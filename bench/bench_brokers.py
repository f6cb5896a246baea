"""Benchmark: what real Apache Kafka brokers on loopback cost the tests, `simulate --brokers real` and the demo.

Every real-Kafka test and run starts `sim.brokers.KafkaCluster`s; docs/guides/real-kafka.md quotes their start
times, and the tests' budget depends on them. This measures, `--repeat` times each (default 3), on a cluster
started afresh:

- a 1-node and a 3-node cluster's start, from the constructor to every broker registered (`start_s`), split into
  its phases: `prepare` (ports, server.properties), `format` (a `kafka.tools.StorageTool` JVM per node, at once)
  and `launch_to_ready` (the nodes' JVMs until the AdminClient sees every broker); then its `close` (SIGTERM,
  a controlled shutdown);
- the jars' resolution when they are cached (`resolve_jars`, what every start calls first);
- on each 3-node cluster, a topic of one partition with 3 replicas: its leader killed with SIGKILL, and the
  seconds until the metadata names another leader (`election_s`: the controller fences the dead broker after
  `broker.session.timeout.ms`, 3 s in `sim.brokers`, then moves its leadership); then `restart_broker` on it
  until it is registered again (`restart_to_registered_s`) and until it is back in the partition's ISR
  (`restart_to_isr_s`).

Prints one JSON object (per figure: every run's seconds, and their median, min and max). Usage:
    python bench/bench_brokers.py [--repeat N]
The first run on a machine resolves the jars from Maven Central (not timed here: `resolve_jars` says so once).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from sim.brokers import KafkaCluster, kafka_version, resolve_jars

POLL_S = 0.05  # how often the metadata is asked while waiting for a new leader or the ISR


def stats(values: list[float], digits: int = 3) -> dict[str, Any]:
    """Every run's figure and their median, min and max (seconds rounded to milliseconds by default)."""
    return {
        "runs": [round(v, digits) for v in values],
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def _timed(phases: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, adding the seconds each call takes to phases[name] (start() calls prepare, format, launch, wait_ready)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t

    return wrapper


def start_cluster(brokers: int) -> tuple[KafkaCluster, dict[str, float]]:
    """A started cluster, and the seconds of its start and of each phase."""
    cluster = KafkaCluster(brokers, name=f"bench-{brokers}", start=False)
    phases: dict[str, float] = {}
    for name in ("prepare", "format", "launch", "wait_ready"):
        setattr(cluster, name, _timed(phases, name, getattr(cluster, name)))
    t = time.perf_counter()
    try:
        cluster.start()
    except BaseException:
        cluster.close(graceful=False)
        raise
    phases["start"] = time.perf_counter() - t
    phases["launch_to_ready"] = phases.pop("launch") + phases.pop("wait_ready")
    return cluster, phases


def _leader_and_isr(cluster: KafkaCluster, topic: str) -> tuple[int, list[int]]:
    p = cluster.partitions(topic, timeout_s=5)[0]
    return p["leader"], p["isr"]


def wait_for(
    cluster: KafkaCluster, topic: str, done: Callable[[int, list[int]], bool], timeout_s: float
) -> float:
    """Seconds until the metadata's (leader, ISR) of the topic's partition satisfies `done`."""
    t = time.perf_counter()
    while True:
        try:
            if done(*_leader_and_isr(cluster, topic)):
                return time.perf_counter() - t
        except Exception:  # noqa: BLE001 - a broker that just died: ask again
            pass
        if time.perf_counter() - t > timeout_s:
            raise TimeoutError(f"{topic}: not done after {timeout_s:.0f} s")
        time.sleep(POLL_S)


def election(cluster: KafkaCluster) -> dict[str, Any]:
    """Kill the leader of a 3-replica partition; time the new leader's election and the node's way back."""
    topic = "bench_election"
    cluster.create_topics({topic: 1})
    leader, isr = _leader_and_isr(cluster, topic)
    assert len(isr) == 3, isr
    t = time.perf_counter()
    cluster.kill_broker(leader)
    kill_s = time.perf_counter() - t
    elected = wait_for(cluster, topic, lambda new, _: new >= 0 and new != leader, timeout_s=120)
    t = time.perf_counter()
    cluster.restart_broker(leader)
    registered = time.perf_counter() - t
    in_isr = registered + wait_for(cluster, topic, lambda _, isr_now: leader in isr_now, timeout_s=120)
    return {
        "killed_node": leader,
        "election_s": kill_s + elected,
        "restart_to_registered_s": registered,
        "restart_to_isr_s": in_isr,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="clusters started of each size (default 3)")
    args = ap.parse_args(argv)
    load = list(os.getloadavg())
    t = time.perf_counter()
    resolve_jars(progress=lambda line: print(line, file=sys.stderr))  # the first run resolves, uncounted
    first_resolve_s = time.perf_counter() - t
    cached = []  # a stamp file read and each jar's existence checked: milliseconds, so timed in ms
    for _ in range(5):
        t = time.perf_counter()
        resolve_jars()
        cached.append(time.perf_counter() - t)
    runs: dict[int, list[dict[str, float]]] = {1: [], 3: []}
    elections: list[dict[str, Any]] = []
    for i in range(args.repeat):
        for brokers in (1, 3):
            cluster, phases = start_cluster(brokers)
            try:
                if brokers == 3:
                    elections.append(election(cluster))
            finally:
                t = time.perf_counter()
                cluster.close()
                phases["close"] = time.perf_counter() - t
            runs[brokers].append(phases)
            print(
                f"run {i + 1}/{args.repeat}: {brokers} node(s) started in {phases['start']:.1f} s",
                file=sys.stderr,
            )
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "load_avg_before": load, "python": platform.python_version()},
        "kafka_version": kafka_version(),
        "repeat": args.repeat,
        "jars_first_call_s": round(first_resolve_s, 3),
        "jars_cached_ms": stats([c * 1000 for c in cached]),
    }
    for brokers, name in ((1, "one_node"), (3, "three_nodes")):
        phases = runs[brokers]
        result[name] = {
            f"{k}_s": stats([p[k] for p in phases])
            for k in ("start", "prepare", "format", "launch_to_ready", "close")
        }
    result["election"] = {
        **{
            k: stats([e[k] for e in elections])
            for k in ("election_s", "restart_to_registered_s", "restart_to_isr_s")
        },
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
