"""The reference model: Leap Frog record by record over whole logs, which the tests check the Spark job against.

The job (``pipelines.leapfrog``) never sees a region's whole log in one place and runs the rules of ``leapfrog``
on batches of keys; this package runs the same rules the plain way, on one partition's decoded logs, so that
every property is stated once on something small enough to read. Only the tests import it; no other module of
``leapfrog`` does, and the job does not need it.

- ``leapfrog.reference.entries`` — decoded VT log entries and where a region's scan starts;
- ``leapfrog.reference.scan`` — one region's scan: running and standing high-water marks, gaps, per-key
  histories and vectors;
- ``leapfrog.reference.partition`` — ``check_partition``, the whole check of one partition;
- ``leapfrog.reference.state`` — the state carried between incremental runs;
- ``leapfrog.reference.band`` — the heartbeat-mode rule in linear time (two pointers), checked against
  ``leapfrog.compare.compare_standing``.
"""

from leapfrog.reference.entries import (
    DataEntry,
    Entry,
    FromEndOfPush,
    FromHeartbeat,
    FromState,
    HeartbeatEntry,
    OtherEntry,
    RegionLog,
    ScanStart,
)
from leapfrog.reference.partition import check_partition
from leapfrog.reference.scan import MODES
from leapfrog.reference.state import CarriedKey, IncrementalState, RegionState, carry_state, resume_logs

__all__ = [
    "MODES",
    "CarriedKey",
    "DataEntry",
    "Entry",
    "FromEndOfPush",
    "FromHeartbeat",
    "FromState",
    "HeartbeatEntry",
    "IncrementalState",
    "OtherEntry",
    "RegionLog",
    "RegionState",
    "ScanStart",
    "carry_state",
    "check_partition",
    "resume_logs",
]
