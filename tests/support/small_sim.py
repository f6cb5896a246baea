"""A small simulation with known truth, the world most job-level tests start from.

Three regions and two partitions by default, heartbeats every 100 records so that every partition has several
restore points and marks, in one process (no worker pool); `faults` (e.g. {"dropped": 1, "poisoned": 1}) give
the undamaged run real findings. Returns the simulation result and the facts tests use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim import SimConfig
from sim import run as simulate


@dataclass
class SmallSim:
    result: Any
    store: str
    version: int
    archives: dict[int, str]

    @property
    def topic(self) -> str:
        return f"{self.store}_v{self.version}"


def small_sim(
    out: Path,
    *,
    seed: int = 7,
    regions: int = 3,
    partitions: int = 2,
    records: int = 1500,
    keys: int = 300,
    faults: dict[str, int] | None = None,
) -> SmallSim:
    cfg = SimConfig(
        out=str(out),
        seed=seed,
        regions=regions,
        partitions=partitions,
        records=records,
        keys=keys,
        batch_records=100,
        heartbeat_every_records=100,
        heartbeat_every_ms=400,
        default_lag_ms=100,
        faults=dict(faults or {}),
        step_records=records,
        progress=False,
        workers="inline",
    )
    result = simulate(cfg)
    t = result.truth["run"]
    return SmallSim(result, t["store"], t["version"], {int(k): v for k, v in result.archives.items()})
