"""The reference replication harness: N regions on Kafka, a push job, online producers with DIV, A/A leaders
with deterministic conflict resolution writing heartbeats through `heartbeat`, followers with DIV checkpoints,
injected faults with ground truth, and an archive per region.

    from sim import SimConfig, run
    result = run(SimConfig(out="out", regions=3, partitions=4, records=50_000, faults={"dropped": 1}))
    result.truth["faults"], result.summary["vt_records_per_region"]

    # the same paced by the wall clock, with a fault at a set time, until `stop` is set (a signal handler or
    # another thread sets it) or duration_s is over; on_ready gets each region's kafka:// URI and topics
    cfg = SimConfig(out="live", live=True, write_rate=[50.0], fault_times=[TimedFault("silent", 30, 20)])
    stop = threading.Event()
    run(cfg, stop=stop, on_ready=lambda info: print(info["regions"]))

    # on Apache Kafka brokers started on loopback (sim.brokers) instead of librdkafka's mock cluster
    run(SimConfig(out="out-real", brokers="real"))

`tidegauge simulate` (and `simulate --live`) is the command-line face of `run`. `sim.truth_at` says, for a finished
run and a time, the exact cut and every region's exact state there (`RunTruth.load(out).state_at(region, at_ms)`).
"""

from .config import (
    FAULT_KINDS,
    ConfigError,
    QuietPeriod,
    SimConfig,
    TimedFault,
    parse_fault_spec,
    parse_faults,
)
from .runner import SimResult, SimulationError, run
from .truth_at import KeyState, RunTruth, TruthAt, TruthError

__all__ = [
    "FAULT_KINDS",
    "ConfigError",
    "KeyState",
    "QuietPeriod",
    "RunTruth",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "TimedFault",
    "TruthAt",
    "TruthError",
    "parse_fault_spec",
    "parse_faults",
    "run",
]
