"""`tidegauge simulate`: run the reference replication harness (`sim.run`) with a `sim.config.SimConfig` (the
command's typed options; `cli` builds it from --conf and flags). A live run (`--live`) also turns SIGINT and
SIGTERM into a clean stop and prints where each region's cluster can be reached as soon as it is up."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from pipelines.core import interrupts
from pipelines.core.errors import EXIT_CLEAN, EXIT_PARTIAL, UsageError
from pipelines.core.progress import duration
from sim.config import SimConfig


def _check_clusters(cfg) -> None:
    """Given clusters (--kafka) must answer before anything is written: an unreachable one is a usage error
    naming the region and bootstrap (exit 2), not a run that failed half-way. Real brokers started here
    (--brokers real) need Java and their jars: resolved now (once, from Maven Central), else exit 2 saying why."""
    if cfg.kafka is None and cfg.brokers == "real":
        from sim.brokers import BrokersError, resolve_jars

        try:
            resolve_jars(progress=lambda line: print(f"[simulate] {line}", file=sys.stderr, flush=True))
        except BrokersError as exc:
            raise UsageError(f"--brokers real: {exc}") from None
    if not cfg.kafka:
        return
    from div.kafka_log import KafkaLog, KafkaLogError

    for region, bootstrap in sorted(cfg.kafka.items()):
        conf = {**cfg.kafka_conf, **cfg.kafka_conf_by_region.get(region, {})}
        try:
            with KafkaLog(bootstrap, conf) as kl:
                kl.topics()
        except KafkaLogError as exc:
            raise UsageError(f"--kafka {region}={bootstrap}: {exc}") from None


def run(cfg: SimConfig) -> int:
    from pipelines.core.output import MARKER, check_output, write_marker
    from pipelines.core.storage import is_local
    from sim import run
    from sim.cluster import ClusterError
    from sim.runner import SimulationError
    from sim.worker import WorkerError

    if not is_local(cfg.out):  # the simulator's writers (archives, checkpoints) are local-disk ones
        raise UsageError(
            f"--out {cfg.out}: simulate writes to local disk; copy its archive/ to the store afterwards"
        )
    cfg = dataclasses.replace(cfg, out=str(cfg.out).removeprefix("file://"))
    check_output(cfg.out, "simulate")
    _check_clusters(cfg)
    out = Path(cfg.out)
    fresh = not out.exists() or not any(out.iterdir())
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).exists():
        write_marker(out, "simulate")
    try:
        if cfg.live:
            with _stop_on_signals() as stop:
                result = run(cfg, stop=stop, on_ready=_print_endpoints)
        else:
            result = run(cfg)
    except BaseException as exc:
        interrupted = interrupts.interrupted() or interrupts.caused_by_interrupt(exc)
        if not interrupted and isinstance(exc, (SimulationError, WorkerError, ClusterError)):
            print(f"tidegauge simulate: the run failed: {exc}", file=sys.stderr)
            return EXIT_PARTIAL
        if interrupted and fresh and not cfg.live:
            # the simulator writes in place (a live run's archives grow where a watch reads them): Ctrl-C of a batch
            # run into a new directory leaves nothing, as a staged output would; a live run aborted by a second
            # signal keeps what it wrote, as its --help says
            shutil.rmtree(out, ignore_errors=True)
        raise
    print(format_summary(result.summary, result.truth_path, result.summary_path))
    return EXIT_CLEAN


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """SIGINT and SIGTERM ask a live run to stop cleanly; a second one aborts it (archives left incomplete)."""
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        print(
            f"tidegauge simulate: {signal.Signals(signum).name}: stopping cleanly "
            f"(send it again to abort without completing the archives)",
            file=sys.stderr,
            flush=True,
        )
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _print_endpoints(info: dict) -> None:
    """One line per region a watch can attach to, then the sources as `tidegauge` flags (stdout)."""
    for r in info["regions"]:
        print(f"dc-{r['region']} {r['uri']} {' '.join(r['topics'])}")
    print(
        " ".join(f"--source {r['region']}={r['uri']}" for r in info["regions"])
        + f" --store {info['store']} --version {info['version']}"
    )
    print(
        f"live: {info['heartbeat_every_ms']} ms heartbeats; faults appear in {info['truth']} as they happen"
    )
    sys.stdout.flush()


def format_summary(s: dict, truth_path: str, summary_path: str) -> str:
    """The human summary printed at the end of a run."""
    lines = [
        f"simulated {s['regions']} regions x {s['partitions']} partitions, {s['records']:,} writes, seed "
        f"{s['seed']}{' (legacy RMD vectors)' if s['legacy_rmd'] else ''} in {duration(s['elapsed_s'] * 1000)} "
        f"({s['records_per_s']:,} records/s)"
    ]
    rt_topic = f"{s['store']}_rt"
    vt_topic = f"{s['store']}_v{s['version']}"
    lines.append(
        f"{'region':<7} {'RT records':>11} {'VT records':>11} {'VT heartbeats':>14} "
        f"{'leader RT DIV':>14} {'follower DIV':>13}  archive"
    )
    for x, topics in sorted(s["topics"].items(), key=lambda kv: int(kv[0])):
        fol = s["followers"][x]
        leader_findings = sum(s["leaders"][x]["rt_div_findings"].values())
        lines.append(
            f"dc-{x:<4} {topics[rt_topic]['records']:>11,} {topics[vt_topic]['records']:>11,} "
            f"{fol['metadata_bytes']['vt_heartbeats']:>14,} {leader_findings:>14,} "
            f"{sum(fol['div_findings'].values()):>13,}  {s['archives'][x]}"
        )
    injected = s["faults_injected"]
    lines.append(
        "faults injected: " + (", ".join(f"{k} x{v}" for k, v in sorted(injected.items())) or "none")
    )
    for kind, why in sorted(s.get("faults_shortfall", {}).items()):
        lines.append(f"  {kind}: {why}")
    m = s["metadata_bytes"]["per_record"]
    lines.append(
        f"replication metadata per VT record: footer {m['footer']:.1f} B + RMD {m['rmd']:.1f} B + "
        f"heartbeat headers {m['heartbeat_headers_amortised']:.2f} B = {m['total']:.1f} B"
    )
    lines.append(f"truth: {truth_path}")
    lines.append(f"summary: {summary_path}")
    lines.append(f"followers: {os.path.dirname(s['followers']['0']['checkpoint_dir'])}")
    return "\n".join(lines)
