"""Leap Frog: do two regions' replicas of an active/active store agree? The pure algorithm.

No Spark, no Kafka, no files, nothing else of ours: the Spark job, the tests and a reader run the same rules.
The modules the job runs:

- ``leapfrog.vectors`` — offset vectors and coverage;
- ``leapfrog.compare`` — the per-key rules on explicit histories (heartbeat mode, and Venice's lily-pad walk);
- ``leapfrog.history`` — a key's history in one region from its own records and the region's ``RegionView``;
- ``leapfrog.vectorized`` — the heartbeat-mode rule for many keys at once, in numpy;
- ``leapfrog.settle`` — the finding a comparison yields, the records an incremental run carries, settled keys;
- ``leapfrog.plan`` — the driver's plan from the scan's split summaries (marks, views, failed reads);
- ``leapfrog.unverified`` — findings that rest on an undecodable record are withheld;
- ``leapfrog.results`` — findings, counters and per-region facts.

``leapfrog.reference`` is the per-record model (whole logs, ``check_partition``) that the tests check the job
against; nothing above imports it.
"""

from leapfrog.compare import (
    FINDING_STATUSES,
    FINDING_TYPES,
    HEALED,
    MISSING_IN_A,
    MISSING_IN_B,
    OPEN,
    VALUE_MISMATCH,
    KeyFinding,
    KeyRecord,
    KeyVerdict,
    comparable,
    compare_standing,
    lily_pad_walk,
    status_of,
)
from leapfrog.results import Finding, PairCounters, PartitionResult, RegionFacts, divergent_keys
from leapfrog.vectors import NOTHING, Vector, covers

__all__ = [
    "FINDING_STATUSES",
    "FINDING_TYPES",
    "HEALED",
    "MISSING_IN_A",
    "MISSING_IN_B",
    "NOTHING",
    "OPEN",
    "VALUE_MISMATCH",
    "Finding",
    "KeyFinding",
    "KeyRecord",
    "KeyVerdict",
    "PairCounters",
    "PartitionResult",
    "RegionFacts",
    "Vector",
    "comparable",
    "compare_standing",
    "covers",
    "divergent_keys",
    "lily_pad_walk",
    "status_of",
]
