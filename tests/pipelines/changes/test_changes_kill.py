"""`tidegauge changes --state` killed at any point, then run again: the published outputs together hold every change
once (pipelines/changes/state.py: an output, once published, is delivered; the state always belongs to the last
published output).

Every change a run makes to storage goes through a few `Location` methods (tests/support/kill_points.py), so
counting them names every point where a run can die. In-process, the run is stopped there (a BaseException nothing
catches); in a subprocess, it is killed with SIGKILL there (no clean-up of any kind runs).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from change_oracle import one_pass
from kill_points import Killed, kill_at
from test_changes_cli import by_partition, changes, rows, summary, vt_tables, write_vt

from pipelines.changes.state import PENDING_FILE, state_id

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def world(sim, tmp_path_factory):
    """A state that read the first part of each partition, and the rows the rest of the archive must deliver."""
    root = tmp_path_factory.mktemp("kill")
    full = vt_tables(sim.archive, sim.topic)
    first = write_vt({p: t.slice(0, t.num_rows // 3) for p, t in full.items()}, root / "first")
    state = root / "mid-state"
    assert (
        changes(
            "--store",
            sim.store,
            "--version",
            1,
            "--source",
            first,
            "--out",
            root / "o0",
            "--state",
            state,
            "--regions",
            3,
        )
        == 0
    )
    everything = by_partition(one_pass(sim.archive, sim.topic, 3))
    already = by_partition(rows(root / "o0"))
    rest = {p: rs[len(already.get(p, [])) :] for p, rs in everything.items()}
    assert all(rs for rs in rest.values())
    return {"root": root, "state": state, "rest": rest, "everything": everything}


def _argv(sim, state: Path, out: Path) -> list:
    return ["--store", sim.store, "--version", 1, "--source", sim.archive, "--out", out, "--state", state]


def _published(out: Path) -> pa.Table | None:
    return rows(out) if (out / "summary.json").exists() else None


def _check_after_kill(sim, state: Path, killed_out: Path, expected: dict, start_id: str, where: str) -> None:
    """Run again into a new --out; the killed run's output (if it was published) and the new one hold `expected`."""
    again = killed_out.parent / f"{killed_out.name}-again"
    assert changes(*_argv(sim, state, again)) == 0, where
    delivered = [t for t in (_published(killed_out), rows(again)) if t is not None]
    assert by_partition(pa.concat_tables(delivered)) == expected, where
    s = summary(again)
    if (killed_out / "summary.json").exists():  # published: the re-run went on from the state it ended at
        killed = summary(killed_out)["state"]
        assert (killed["from"], s["state"]["from"]) == (start_id, killed["to"]), where
        assert killed["to"] != start_id, where  # (so the re-run did go on from the killed run's end)
    else:
        assert s["state"]["from"] == start_id, where
    assert not (state / PENDING_FILE).exists(), where
    last = killed_out.parent / f"{killed_out.name}-last"  # and the state carries on: nothing more to deliver
    assert changes(*_argv(sim, state, last)) == 0 and rows(last).num_rows == 0, where


@pytest.mark.parametrize("start", ["resume", "fresh"])
def test_a_run_stopped_at_any_storage_step_then_run_again_delivers_each_change_once(
    sim, world, tmp_path, start, monkeypatch
):
    expected = world["rest"] if start == "resume" else world["everything"]
    start_id = state_id((world["state"] / "state.tgcc").read_bytes()) if start == "resume" else "fresh"

    def fresh_state(name: str) -> Path:
        state = tmp_path / name
        if start == "resume":
            shutil.copytree(world["state"], state)
        return state

    with monkeypatch.context() as m:
        counter = kill_at(m, step=-1)
        assert changes(*_argv(sim, fresh_state("ref-state"), tmp_path / "ref")) == 0
        steps = counter[0]
    assert steps >= 10, steps
    published_at = None
    for step in range(1, steps + 1):
        state, out = fresh_state(f"s{step}"), tmp_path / f"o{step}"
        with monkeypatch.context() as m:
            kill_at(m, step)
            with pytest.raises(Killed):
                changes(*_argv(sim, state, out))
        if published_at is None and (out / "summary.json").exists():
            published_at = step
        _check_after_kill(sim, state, out, expected, start_id, f"stopped at storage step {step} of {steps}")
    # both sides of the window between publishing the output and committing the state were hit
    assert published_at is not None and published_at < steps


_KILLER = """
import os, signal, sys
from pipelines.core.storage import Location
step, calls = int(sys.argv[1]), [0]
for name in ("write_bytes", "remove", "move_to", "makedirs"):
    def wrapped(self, *a, _original=getattr(Location, name), **k):
        calls[0] += 1
        if calls[0] == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return _original(self, *a, **k)
    setattr(Location, name, wrapped)
from pipelines.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_a_run_killed_with_sigkill_then_run_again_delivers_each_change_once(sim, world, tmp_path):
    """The same with a real kill -9 (nothing of the run's own clean-up runs), at points around the commit."""
    start_id = state_id((world["state"] / "state.tgcc").read_bytes())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    for step in (
        2,
        9,
        10,
        11,
        12,
        13,
    ):  # staging; the pending commit; publishing; the state; the pending removed
        state, out = tmp_path / f"s{step}", tmp_path / f"o{step}"
        shutil.copytree(world["state"], state)
        argv = ["changes", *map(str, _argv(sim, state, out))]
        proc = subprocess.run([sys.executable, "-c", _KILLER, str(step), *argv], env=env, capture_output=True)
        assert proc.returncode == -signal.SIGKILL, (step, proc.stderr.decode()[-2000:])
        _check_after_kill(sim, state, out, world["rest"], start_id, f"SIGKILL at storage step {step}")
    assert json.loads((tmp_path / "o13" / "summary.json").read_text())["state"]["from"] == start_id
