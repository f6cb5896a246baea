"""Killing a run at its n-th storage step: every change tidegauge makes to a filesystem goes through a few
`Location` methods, so counting their calls names every point where a run can die between two writes.
"""

from __future__ import annotations

from pipelines.core.storage import Location

MUTATIONS = ("write_bytes", "remove", "move_to", "makedirs")


class Killed(BaseException):
    """The driver dying mid-step (a BaseException: nothing in the product may catch it)."""


def kill_at(monkeypatch, step: int) -> list[int]:
    """Make the `step`-th storage change raise Killed (-1: never); returns the counter of changes made."""
    calls = [0]
    for name in MUTATIONS:
        original = getattr(Location, name)

        def wrapped(self, *args, _original=original, **kwargs):
            calls[0] += 1
            if calls[0] == step:
                raise Killed()
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(Location, name, wrapped)
    return calls
