"""The repair loop on the simulator's clusters, driven from outside as an operator drives it (issue 31):
`tidegauge simulate --repair-window` holds the run open after its last heartbeats; `leapfrog`, `repair plan` and
`repair apply` (twice: applying a plan again must change nothing) run against its archives and its `kafka://`
address; creating the file live.json names closes the window; the simulation's leaders then apply the writes
through their conflict resolution. Afterwards every planned key holds the same record in every region
(`repair verify --source`), the writes are the only records others put in the RTs, and the logs stay whole
(`div validate` finds only what the injected RT faults cause: none here)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from pipelines.cli import main
from sim import run as simulate
from sim.config import SimConfig

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]


def _wait_for_window(live: Path, sim: threading.Thread, timeout_s: float = 180.0) -> dict:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if live.exists():
            info = json.loads(live.read_text())
            if info["state"] == "repair-window":
                return info
        assert sim.is_alive(), "the simulation ended without opening its repair window"
        time.sleep(0.2)
    pytest.fail(f"no repair window within {timeout_s:g} s")


def test_simulate_takes_repair_apply_in_its_window_and_every_planned_key_converges(spark, tmp_path, capsys):
    cfg = SimConfig(
        out=str(tmp_path / "sim"),
        seed=4,
        regions=3,
        partitions=2,
        records=3_000,
        keys=600,
        batch_records=200,
        heartbeat_every_records=100,
        heartbeat_every_ms=300,
        default_lag_ms=100,
        step_records=1_000,
        faults={"dropped": 2, "poisoned": 1},
        repair_window_s=300.0,
        progress=False,
    ).validate()
    result: dict = {}
    sim = threading.Thread(target=lambda: result.update(r=simulate(cfg)), daemon=True)
    sim.start()
    info = _wait_for_window(tmp_path / "sim" / "live.json", sim)
    sources = [f"--source={r['region']}={r['archive']}" for r in info["regions"]]
    rts = [f"--rt={r['region']}={r['archive']}" for r in info["regions"]]
    store = ["--store", info["store"], "--version", str(info["version"])]
    lf, plan = tmp_path / "leapfrog", tmp_path / "plan"
    assert main(["leapfrog", *store, *sources, "--out", str(lf)]) == 1  # the faults' divergences
    assert main(["repair", "plan", *store, *sources, *rts, "--leapfrog", str(lf), "--out", str(plan)]) == 0
    planned = json.loads((plan / "summary.json").read_text())
    assert planned["writes"] == planned["divergent_keys"] >= 2
    bootstrap = info["regions"][1]["uri"].removeprefix("kafka://")  # into region 1's RT this time
    for n in (1, 2):
        assert main(["repair", "apply", "--plan", str(plan), f"--kafka=1={bootstrap}", "--out", str(tmp_path / f"apply{n}")]) == 0  # fmt: skip
    assert sim.is_alive()  # still waiting: only the file closes the window
    Path(info["repair_window_done"]).touch()
    sim.join(300)
    assert not sim.is_alive()
    truth = result["r"].truth
    window = truth["repair_window"]
    assert window["closed_by"] == "done" and set(window["rt_records"]) == {"1"}  # nobody else wrote
    # two applies, each one record per write plus a StartOfSegment and an EndOfSegment per partition it wrote
    written = sum(window["rt_records"]["1"].values())
    assert 2 * planned["writes"] < written <= 2 * (planned["writes"] + 2 * cfg.partitions)

    capsys.readouterr()
    after = tmp_path / "leapfrog-after"
    # the repair converged the regions: the findings stay, healed, and the nightly alert stops (issue 41)
    assert main(["leapfrog", *store, *sources, "--out", str(after)]) == 0
    healed = json.loads((after / "summary.json").read_text())["totals"]
    assert sum(healed["open_findings"].values()) == 0 and sum(healed["healed_findings"].values()) >= 2
    verify = [
        "repair",
        "verify",
        "--plan",
        str(plan),
        "--leapfrog",
        str(after),
        "--applied",
        str(tmp_path / "apply2"),
    ]
    assert main([*verify, *sources, "--out", str(tmp_path / "verify")]) == 0, capsys.readouterr().out
    summary = json.loads((tmp_path / "verify" / "summary.json").read_text())
    assert summary["by_status"]["converged"] == summary["planned_keys"] == planned["writes"]
    # without --source, the same leapfrog run says so too: its findings are healed, so no key is divergent
    assert main(verify) == 0
    assert (
        main(["div", "validate", *sources, "--out", str(tmp_path / "div"), "--min-compaction-lag-ms", "0"])
        == 0
    )
