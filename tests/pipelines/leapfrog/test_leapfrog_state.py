"""The --state directory's commit: a run killed at any moment leaves a state the next run can continue from."""

from __future__ import annotations

import os

import pytest

from pipelines.leapfrog import state as S

IDENTITY = {"store": "s", "version": 1, "mode": "heartbeat", "pairs": [(0, 1)], "regions": [0, 1]}


def _stage(path, marker: str):
    """The next state, complete in its staging directory; `.publish()` commits it."""
    publication = S.stage(path)
    stage = publication.stage()
    meta = {"store": "s", "version": 1, "mode": "heartbeat", "pairs": [[0, 1]], "regions": [0, 1]}
    S.write_meta(stage, meta, [{"region": 0, "partition": 0, "last_offset": 5, "marker": marker}])
    return publication


def _marker(state) -> str:
    return state.regions[(0, 0)]["marker"]


def test_commit_swaps_the_new_state_in(tmp_path):
    path = tmp_path / "state"
    assert S.load(path, **IDENTITY) is None
    _stage(path, "day1").publish()
    _stage(path, "day2").publish()
    assert _marker(S.load(path, **IDENTITY)) == "day2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


def test_a_kill_between_the_two_renames_restores_the_previous_state(tmp_path):
    path = tmp_path / "state"
    _stage(path, "day1").publish()
    _stage(path, "day2")  # the next state, complete in its staging directory...
    os.replace(path, tmp_path / f".state.old-{os.getpid()}")  # ...and the kill came after the first rename
    state = S.load(path, **IDENTITY)
    assert state is not None and _marker(state) == "day1"  # the output was not committed: day 2 runs again
    assert (path / "state.json").exists()


def test_another_runs_state_is_refused(tmp_path):
    path = tmp_path / "state"
    _stage(path, "day1").publish()
    with pytest.raises(S.StateError, match="built with"):
        S.load(path, **{**IDENTITY, "store": "other"})
