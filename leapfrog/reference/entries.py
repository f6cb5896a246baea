"""What Leap Frog reads: one region's version-topic log for one partition, already decoded.

The algorithm never sees Kafka records. A caller (the Spark job, the simulator, a test) turns each VT record
after End of Push into one of three entries, in VT offset order:

- ``DataEntry`` — a PUT or DELETE with its leader footer: the region its write came from
  (``upstreamKafkaClusterId``) and that write's RT offset, plus the RMD checkpoint vector when one was written;
- ``HeartbeatEntry`` — a VT heartbeat with its ``hbw`` vector, the region whose RT heartbeat it copies and that
  RT heartbeat's offset;
- ``OtherEntry`` — anything else (control message, chunk, undecodable record): it only occupies an offset, so
  that the offsets it holds are not mistaken for records removed by compaction.

A ``RegionLog`` is those entries plus where the scan started and where it ended. The start is one of

- ``FromEndOfPush`` — the scan starts right after EOP: every key was absent before it;
- ``FromHeartbeat`` — a mid-stream scan starting right after a VT heartbeat whose vector is the baseline: the
  keys' earlier state is unknown, but everything at or below the baseline had been processed;
- ``FromState`` — an incremental scan resuming from the state an earlier run carried (``leapfrog.reference.state``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DataEntry:
    """A PUT (``value_hash`` = 64-bit hash of the value) or DELETE (``value_hash`` None) after EOP."""

    vt_offset: int
    key: bytes
    value_hash: int | None
    source_region: int
    source_offset: int
    rmd_vector: tuple[int, ...] | None = None


@dataclass(frozen=True)
class HeartbeatEntry:
    """A VT heartbeat: ``watermarks[r]`` = RT offset of region r the leader had processed (-1 = nothing yet)."""

    vt_offset: int
    watermarks: tuple[int, ...]
    origin_region: int
    origin_offset: int


@dataclass(frozen=True)
class OtherEntry:
    """Any other record: it carries nothing Leap Frog uses, but its offset is not a gap."""

    vt_offset: int


Entry = DataEntry | HeartbeatEntry | OtherEntry


@dataclass(frozen=True)
class FromEndOfPush:
    """The scan starts right after End of Push; ``eop_offset`` (when known) lets a leading gap be seen."""

    eop_offset: int | None = None


@dataclass(frozen=True)
class FromHeartbeat:
    """A mid-stream scan starting right after the VT heartbeat at ``vt_offset`` whose vector is ``baseline``."""

    baseline: tuple[int, ...]
    vt_offset: int | None = None


@dataclass(frozen=True)
class FromState:
    """An incremental scan resuming right after the last offset the carried ``state`` had read in this region.

    ``state`` is a ``leapfrog.reference.state.IncrementalState``; it is typed loosely because that module builds on
    this one (and an import back would be a cycle)."""

    state: Any = field(repr=False)


ScanStart = FromEndOfPush | FromHeartbeat | FromState


@dataclass(frozen=True)
class RegionLog:
    """One region's scan of one VT partition: entries in strictly increasing offset order.

    ``last_offset`` is the last offset the scan covers (default: the last entry's); offsets missing between the
    scan start and ``last_offset`` are gaps left by compaction.

    ``latest_kept``: every key's latest record up to ``last_offset`` is in ``entries``. Kafka's log compaction
    keeps each key's latest record, so this holds for a log read as compaction left it — unless the cleaner
    removed a record while the scan was reading because of a record beyond the scan's end. Then a gap after a
    key's last record here cannot hide a record of that key, and a key with no record at all had none since the
    scan started (Venice's lily-pad checker, our footer mode, makes the same assumption for absent keys). False:
    every gap may hide a record of any key, and heartbeat mode freezes standing marks at the first gap.
    """

    entries: Sequence[Entry]
    start: ScanStart = FromEndOfPush()
    last_offset: int | None = None
    latest_kept: bool = True
