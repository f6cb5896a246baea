"""Publishing a directory whole: how job outputs and the incremental state are committed, on any filesystem.

A run builds its files in a staging directory, then publishes them in one step, so a reader (a person, the report,
the next nightly run) sees the previous complete result or the new complete result, never a mix, and a run killed
at any point changes nothing a reader sees.

- On local disk and HDFS a rename is atomic: the staging directory `.NAME.staging-<pid>` beside the target replaces
  it with two renames (the previous one is set aside first; `recover` puts it back if a run died between them).
- On object stores (S3, GCS, Azure) a rename copies object by object, so nothing is renamed: each run writes under
  its own prefix `NAME/_runs/<run id>/`, and publishing is one small object, `NAME/_published.json`, naming that
  run; one object appears whole or not at all. The previous run stays until the pointer names the new one; runs
  the pointer does not name (abandoned by killed runs, or replaced) are deleted after each publication and before
  each new run. Readers follow the pointer with `current`.

A staging directory holds a `.tidegauge` marker from its first moment, so clean-up removes only what tidegauge wrote.
A run that ends early (an error, Ctrl-C) removes the staging directories it started (`abandon_unfinished`), and
Ctrl-C does not cut a publication between its two renames (`pipelines.core.interrupts.held`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
import uuid

from pipelines.core import interrupts
from pipelines.core.storage import Location

log = logging.getLogger("tidegauge")

MARKER = ".tidegauge"
POINTER = "_published.json"
RUNS = "_runs"

_unfinished: set[Publication] = set()  # staged in this process, neither published nor abandoned yet


def current(target: Location) -> Location:
    """Where the published content of `target` is: the run its pointer names on an object store, else itself (or,
    when a run died between the two renames of `publish`, the previous content it set aside)."""
    if not target.is_object_store:
        if not target.exists():
            aside = _set_aside(target)
            if aside is not None:
                return aside
        return target
    try:
        doc = json.loads((target / POINTER).read_bytes())
    except FileNotFoundError:
        return target
    except (OSError, ValueError) as exc:
        raise OSError(f"{target / POINTER}: unreadable publication pointer: {exc}") from None
    return target / RUNS / str(doc["run"])


def tidegauge_version() -> str:
    try:
        from importlib.metadata import version

        return version("tidegauge")
    except Exception:
        return "0+unknown"


def marker_text(command: str) -> str:
    """The `.tidegauge` marker: which command (and version) wrote a directory, so nothing else is replaced."""
    written = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return (
        json.dumps({"command": command, "tidegauge_version": tidegauge_version(), "written_at": written})
        + "\n"
    )


def _ours(directory: Location) -> bool:
    return (directory / MARKER).is_file()


def recover(target: Location) -> bool:
    """Local/HDFS: a run killed between the two renames of `publish` left the previous content aside as
    `.NAME.old-<pid>` and nothing at NAME; put it back. True when something was restored."""
    if target.is_object_store or target.exists():
        return False
    old = _set_aside(target)
    if old is None:
        return False
    old.move_to(target)
    log.warning(
        "%s: restored the previous content from %s (a run was killed while publishing)", target, old.name
    )
    return True


def _set_aside(target: Location) -> Location | None:
    for old in target.parent.children():
        if old.name.startswith(f".{target.name}.old-") and old.is_dir():  # a name only `publish` gives
            return old
    return None


class Publication:
    """`stage()` → a fresh staging directory (marked with `label`); write there; `publish()` makes it the content of
    `target` at once; `abandon()` removes it. Staging directories of earlier, killed runs are removed first."""

    def __init__(self, target: Location, label: str) -> None:
        self.target = target
        self.label = label
        self.staging: Location | None = None
        self.run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]

    def stage(self) -> Location:
        recover(self.target)
        self._remove_abandoned()
        if self.target.is_object_store:
            # marked first: what a killed run leaves under the target (an unpublished run) is recognisably ours
            if not (self.target / MARKER).is_file():
                (self.target / MARKER).write_text(marker_text(self.label))
            self.staging = self.target / RUNS / self.run_id
        else:
            self.staging = self.target.parent / f".{self.target.name}.staging-{os.getpid()}"
            self.staging.remove()
        _unfinished.add(self)  # before anything is written: an interrupt from here on finds it
        self.staging.makedirs()
        (self.staging / MARKER).write_text(marker_text(self.label))
        return self.staging

    def publish(self) -> None:
        assert self.staging is not None
        with interrupts.held():  # Ctrl-C between the two renames would leave the previous content aside
            self._publish()
            # (inside: on an object store the staging directory *is* the published run from now on, and a Ctrl-C
            # raised as the block ends must not have it removed as unfinished)
            _unfinished.discard(self)

    def _publish(self) -> None:
        assert self.staging is not None
        if self.target.is_object_store:
            (self.target / POINTER).write_text(
                json.dumps({"run": self.run_id, "published_at": dt.datetime.now(dt.UTC).isoformat()}) + "\n"
            )
            self._remove_abandoned()
            return
        old = None
        if self.target.exists():
            old = self.target.parent / f".{self.target.name}.old-{os.getpid()}"
            old.remove()
            self.target.move_to(old)
        self.staging.move_to(self.target)
        if old is not None:
            old.remove()

    def abandon(self) -> bool:
        """Remove the staging directory; False when it could not be removed (it stays listed as unfinished)."""
        if self.staging is not None:
            try:
                self.staging.remove()
            except OSError:
                return False
        _unfinished.discard(self)
        return True

    def _remove_abandoned(self) -> None:
        """Staging directories (local) or runs (object stores) no reader can reach: tidegauge's only."""
        if self.target.is_object_store:
            keep = current(self.target)
            for run in (self.target / RUNS).children():
                if run.path != keep.path and run != self.staging:
                    run.remove()
            return
        prefix = f".{self.target.name}.staging-"
        for d in self.target.parent.children():
            if d.name.startswith(prefix) and d != self.staging and _ours(d):
                d.remove()


def unfinished_now() -> frozenset[Publication]:
    """The publications unfinished at this moment: what a run that starts now must leave to their owners."""
    return frozenset(_unfinished)


def abandon_unfinished(attempts: int = 5, earlier: frozenset[Publication] = frozenset()) -> list[str]:
    """Remove every staging directory this process started and neither published nor abandoned, except those of
    `earlier` (started before this run, by another run in the same process: a test session, the demo): a run
    that ends early leaves none behind. A Spark task cancelled a moment ago may still be writing into one, so
    removal is tried a few times. Returns the ones that could not be removed."""
    for attempt in range(attempts):
        mine = [pub for pub in _unfinished if pub not in earlier]
        for pub in mine:
            pub.abandon()
        if not any(pub not in earlier for pub in _unfinished):
            return []
        if attempt < attempts - 1:
            time.sleep(0.2 * (attempt + 1))
    return sorted(p.staging.uri for p in _unfinished if p not in earlier and p.staging is not None)
