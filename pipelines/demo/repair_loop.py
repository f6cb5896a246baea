"""The demo's repair loop: detect, plan, apply, replicate, verify (issue 31), on the simulation's own clusters.

The simulation runs in a thread of its own with a repair window (`SimConfig.repair_window_s`): after its last
write and its leaders' last heartbeats it stops, leaders up and archives complete, and calls back here. The demo
then runs `leapfrog` on the archives, plans the repair and applies it into region 0's RT through the cluster's
own `kafka://` address — what an operator runs — and lets the simulation go on: every region's leaders apply
the writes through their conflict resolution, heartbeat and step down. After the usual jobs, `leapfrog` runs
again and `repair verify` reads the regions' current records of the planned keys.

`WindowedSimulation` is the thread and its two meeting points; the steps themselves stay in `pipelines.demo.job`.
"""

from __future__ import annotations

import threading
from typing import Any

from sim.config import SimConfig

# The window's length when nothing closes it: the demo closes it itself, so this only bounds a demo whose main
# thread died without saying so.
WINDOW_S = 3600.0
APPLY_REGION = 0


class WindowedSimulation:
    """`sim.run(cfg)` in a thread, stopping in its repair window until `go_on()`."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg.with_(repair_window_s=WINDOW_S)
        self.window: dict[str, Any] | None = None  # live.json's content once the window opened
        self.result: Any = None
        self.error: BaseException | None = None
        self._opened = threading.Event()
        self._go_on = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-simulation", daemon=True)

    def start(self) -> WindowedSimulation:
        self._thread.start()
        return self

    def _run(self) -> None:
        from sim import run as simulate

        try:
            self.result = simulate(self.cfg, stop=self._stop, on_repair_window=self._in_window)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by wait_for_window/finish
            self.error = exc
        finally:
            self._opened.set()

    def _in_window(self, info: dict[str, Any]) -> None:
        self.window = info
        self._opened.set()
        while not (self._go_on.is_set() or self._stop.is_set()):
            self._go_on.wait(0.2)

    def wait_for_window(self) -> dict[str, Any]:
        """Block until the simulation's history is written and its window is open; its live.json content."""
        while not self._opened.wait(0.2):
            pass
        if self.error is not None:
            raise self.error
        if self.window is None:
            raise RuntimeError("the simulation ended without opening its repair window")
        return self.window

    def go_on(self) -> Any:
        """Close the window and wait for the simulation to end; its `SimResult`."""
        self._go_on.set()
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.result

    def abandon(self) -> None:
        """The demo failed or was interrupted: let the simulation end (and its clusters close) at once."""
        self._stop.set()
        self._go_on.set()
        self._thread.join(120)
