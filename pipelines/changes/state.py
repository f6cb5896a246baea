"""The change reader's state between runs (`tidegauge changes --state DIR`), committed after the output.

    DIR/state.tgcc     `heartbeat.changes.ChangeState` bytes: store, version, the region read, per partition the
                       next VT position, phase, W and the VT's identity (what the next run resumes from)
    DIR/pending.json   only between a run's publication of its output and the commit of its state: which
                       output (`out`), the state it started from (`from`) and the state it ends at (`to`, and its
                       bytes, `state`)
    DIR/.tidegauge     marker: a directory tidegauge wrote (`changes state`)

A run's output and its state are two writes, and a kill -9 can fall between them. The rule that makes this exact:
**an output, once published, is delivered; the state always belongs to the last published output.** Each output
names the state it started from and the one it ends at (`summary.json` `state.from` and `state.to`: digests of
the state bytes, `fresh` for none). The commit runs in this order:

1. the run builds its output in a staging directory (nothing visible);
2. it writes `pending.json` (atomically): the output it is about to publish, `from`, `to` and the new state;
3. it publishes the output (one rename, or one pointer object);
4. it writes `state.tgcc` (atomically: a temporary file renamed), then removes `pending.json`.

Every run starts by settling a `pending.json` left by a killed run (`load`):
- `state.tgcc` is already `to`: the kill fell between 4's two steps; the pending file is removed.
- the output it names is published and says `from`/`to` as the pending file does: killed between 3 and 4. That
  output was delivered, so its state is committed now (*rolled forward*), and this run reads on from it.
- otherwise (killed before 3 finished): the output was never published; the pending file is removed (*rolled
  back*) and this run reads again from the state it had, delivering what the killed run would have.

So, whatever the kill point, the published outputs together hold every change once. A consumer reads each
output once: a new `--out` per run, or one `--out` it marks read (`read.json` naming the output's `run`) before
the next run, which refuses an unread one rather than replace it (`job.check_unread`); docs/outputs.md says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass

from heartbeat.changes import ChangeState, StateError
from pipelines.core.errors import UsageError
from pipelines.core.publish import MARKER, current, marker_text, recover
from pipelines.core.storage import Location, StorageError, locate

log = logging.getLogger("tidegauge.changes")

STATE_FILE = "state.tgcc"
PENDING_FILE = "pending.json"
LABEL = "changes state"
FRESH = "fresh"  # the id of "no earlier state"
PENDING_FORMAT = 1


def state_id(data: bytes | None) -> str:
    """The name of a state in outputs and in `pending.json`: 16 hex digits of its bytes' SHA-256, or `fresh`."""
    return FRESH if data is None else hashlib.sha256(data).hexdigest()[:16]


class StateDirError(UsageError):
    """A `--state` directory this run cannot use; the message names it and why (exit code 2)."""


@dataclass
class Loaded:
    """What `--state DIR` held once settled: the state (None: none yet), its bytes and what settling did."""

    state: ChangeState | None
    data: bytes | None
    recovered: str | None = None  # a sentence when a killed run's pending commit was settled

    @property
    def id(self) -> str:
        return state_id(self.data)


def _is_temporary(name: str) -> bool:
    """A temporary file an atomic write leaves when killed mid-write (`.state.tgcc.1a2b3c4d.tmp`)."""
    return name.startswith(".") and name.endswith(".tmp")


def _read_pending(where: Location) -> dict | None:
    f = where / PENDING_FILE
    if not f.is_file():
        return None
    try:
        doc = json.loads(f.read_bytes())
        if not isinstance(doc, dict) or doc.get("format") != PENDING_FORMAT:
            raise ValueError(f"not a pending commit of format {PENDING_FORMAT}")
        bytes.fromhex(doc["state"])
        for k in ("out", "from", "to"):
            if not isinstance(doc[k], str):
                raise ValueError(f"{k!r} is not a string")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StateDirError(
            f"--state {f}: unreadable pending commit ({exc}); remove it to run again"
        ) from None
    return doc


def published_ids(out: str) -> tuple[str, str] | None:
    """(`state.from`, `state.to`) of the output published at `out`, or None when none is (or it says no ids)."""
    try:
        target = locate(out)
        recover(target)
        doc = json.loads((current(target) / "summary.json").read_bytes())
        s = doc.get("state") or {}
        return (s["from"], s["to"]) if doc.get("job") == "changes" else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _settle(where: Location, data: bytes | None) -> tuple[bytes | None, str | None]:
    """Finish or undo the commit a killed run left in `pending.json` (module docstring). Returns the state bytes
    that hold afterwards and a sentence saying what was done (None: nothing was pending)."""
    pending = _read_pending(where)
    if pending is None:
        return data, None
    have = state_id(data)
    new = bytes.fromhex(pending["state"])
    if have == pending["to"]:
        note = None  # the commit was complete but for removing the pending file
    elif have == pending["from"] and published_ids(pending["out"]) == (pending["from"], pending["to"]):
        if state_id(new) != pending["to"]:
            raise StateDirError(f"--state {where / PENDING_FILE}: its state does not match its id; remove it")
        (where / STATE_FILE).write_bytes(new)
        data = new
        note = (
            f"a run killed after publishing {pending['out']} had not committed its state: committed it now "
            f"(state {pending['to']}); that output holds the changes it delivered"
        )
    elif have == pending["from"]:
        note = (
            f"a run killed before publishing {pending['out']} left a pending commit: discarded; this run "
            f"reads again from state {have}"
        )
    else:
        note = (
            f"a pending commit from state {pending['from']} to {pending['to']} does not fit the state here "
            f"({have}): discarded"
        )
    (where / PENDING_FILE).remove()
    if note:
        log.warning("--state %s: %s", where, note)
    return data, note


def load(path: str | os.PathLike) -> Loaded:
    """The state in `--state path`, after settling what a killed run left. Raises StateDirError (exit 2) for a
    path that is not a state directory or a state file that cannot be read (naming the file and why)."""
    try:
        where = locate(path)
        if not where.exists():
            return Loaded(None, None)
        if not where.is_dir():
            raise StateDirError(f"--state {path}: exists and is not a directory")
        names = [c.name for c in where.children()]
    except StorageError as exc:
        raise StateDirError(f"--state {exc}") from None
    strangers = sorted(
        n for n in names if n not in (MARKER, STATE_FILE, PENDING_FILE) and not _is_temporary(n)
    )
    if strangers:
        raise StateDirError(
            f"--state {path}: holds files that are not a tidegauge change-capture state "
            f"({', '.join(strangers[:3])}{', ...' if len(strangers) > 3 else ''}); give an empty or new directory"
        )
    if MARKER in names:
        try:
            marked = json.loads((where / MARKER).read_bytes()).get("command")
        except (OSError, ValueError, AttributeError):
            marked = None
        if marked != LABEL:
            raise StateDirError(
                f"--state {path}: was written by `tidegauge {marked}`, not as a changes state"
            )
    f = where / STATE_FILE
    data = f.read_bytes() if STATE_FILE in names else None
    data, note = _settle(where, data)
    if data is None:
        return Loaded(None, None, note)
    try:
        state = ChangeState.from_bytes(data)
    except StateError as exc:
        raise StateDirError(f"--state {f}: {exc}") from None
    return Loaded(state, data, note)


def _prepared(path: str | os.PathLike) -> Location:
    where = locate(path)
    where.makedirs()
    if not (where / MARKER).is_file():
        (where / MARKER).write_text(marker_text(LABEL))
    return where


def prepare(path: str | os.PathLike, out: str, started: str, new: bytes) -> None:
    """Step 2 of the commit: record the output about to be published and the state it ends at."""
    doc = {"format": PENDING_FORMAT, "out": out, "from": started, "to": state_id(new), "state": new.hex()}
    (_prepared(path) / PENDING_FILE).write_text(json.dumps(doc) + "\n")


def commit(path: str | os.PathLike, new: bytes) -> None:
    """Step 4: the new state in place (atomically), then the pending commit removed."""
    where = _prepared(path)
    (where / STATE_FILE).write_bytes(new)
    (where / PENDING_FILE).remove()
