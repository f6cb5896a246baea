"""Leap Frog: do two regions' replicas of an active/active store agree? The pure algorithm.

No Spark, no Kafka, no files, nothing else of ours: the Spark job, the tests and a reader run the same rules.

- ``leapfrog.entries`` — decoded VT log entries and where a region's scan starts;
- ``leapfrog.vectors`` — offset vectors and coverage;
- ``leapfrog.scan`` — running and standing high-water marks, gaps, per-key histories and vectors;
- ``leapfrog.compare`` — the per-key rules on explicit histories (heartbeat mode, and Venice's lily-pad walk);
- ``leapfrog.partition`` — ``check_partition``, the whole check of one partition;
- ``leapfrog.state`` — the state carried between incremental runs;
- ``leapfrog.results`` — findings, counters and per-region facts.
"""

from leapfrog.compare import (
    FINDING_TYPES,
    MISSING_IN_A,
    MISSING_IN_B,
    VALUE_MISMATCH,
    KeyFinding,
    KeyRecord,
    KeyVerdict,
    comparable,
    compare_standing,
    lily_pad_walk,
)
from leapfrog.entries import (
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
from leapfrog.partition import check_partition
from leapfrog.results import Finding, PairCounters, PartitionResult, RegionFacts
from leapfrog.scan import MODES
from leapfrog.state import CarriedKey, IncrementalState, RegionState, carry_state, resume_logs
from leapfrog.vectors import NOTHING, Vector, covers

__all__ = [
    "FINDING_TYPES",
    "MISSING_IN_A",
    "MISSING_IN_B",
    "MODES",
    "NOTHING",
    "VALUE_MISMATCH",
    "CarriedKey",
    "DataEntry",
    "Entry",
    "Finding",
    "FromEndOfPush",
    "FromHeartbeat",
    "FromState",
    "HeartbeatEntry",
    "IncrementalState",
    "KeyFinding",
    "KeyRecord",
    "KeyVerdict",
    "OtherEntry",
    "PairCounters",
    "PartitionResult",
    "RegionFacts",
    "RegionLog",
    "RegionState",
    "ScanStart",
    "Vector",
    "carry_state",
    "check_partition",
    "comparable",
    "compare_standing",
    "covers",
    "lily_pad_walk",
    "resume_logs",
]
