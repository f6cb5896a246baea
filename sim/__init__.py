"""The reference replication harness: N regions on Kafka, a push job, online producers with DIV, A/A leaders
with deterministic conflict resolution writing heartbeats through `heartbeat`, followers with DIV checkpoints,
injected faults with ground truth, and an archive per region.

    from sim import SimConfig, run
    result = run(SimConfig(out="out", regions=3, partitions=4, records=50_000, faults={"dropped": 1}))
    result.truth["faults"], result.summary["vt_records_per_region"]

`tidegauge simulate` is the command-line face of `run`.
"""

from .config import FAULT_KINDS, ConfigError, QuietPeriod, SimConfig, parse_faults
from .runner import SimResult, SimulationError, run

__all__ = [
    "FAULT_KINDS",
    "ConfigError",
    "QuietPeriod",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "parse_faults",
    "run",
]
