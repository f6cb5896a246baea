"""What a job planned to read, what it read and decoded, and the verdict that follows from it.

A checker's verdict is only as good as the evidence behind it: a job may say CLEAN only when every record it
planned to read was read and decoded. Every job (leapfrog, div validate on either engine, div restore, lag)
records one `PartitionEvidence` per (source, topic, partition) — planned on the driver from archive metadata or
Kafka offsets fixed at planning, filled in wherever the records were read (executors too) — reconciles them on
the driver and derives its exit code and `summary.json`'s `verdict` and `evidence` from them here, so the rule is
written once.

The rule: findings → 1 (`findings`); else any planned record not read, not decoded, or any partition that failed
→ 3 (`partial`); else 0 (`clean`). Findings outrank partial: what was found over the evidence read stands.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pipelines.core.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_PARTIAL

CLEAN, FINDINGS, PARTIAL = "clean", "findings", "partial"
MAX_LISTED_OFFSETS = 100  # offsets listed per partition in summary.json; the counts are always whole


@dataclass
class PartitionEvidence:
    """One (source region, topic, partition): the planned offset range [start, end) and what was read of it.

    `planned_records` is exact for archives (Parquet metadata) and None for Kafka, where compaction may leave
    holes in [start, end): there, a read is whole when it reached `end` (`reached_end`)."""

    region: int | None
    topic: str
    partition: int
    start: int
    end: int
    planned_records: int | None = None
    read_records: int = 0
    undecodable: int = 0
    undecodable_offsets: list[int] = field(default_factory=list)
    reached_end: bool = False
    error: str | None = None
    newest_ms: int | None = None  # broker time of the newest record read (lag measures archives against it)

    @property
    def short(self) -> bool:
        """Some planned record was not read (an error, a read that stopped before the planned end, or fewer
        records than the archive's metadata promised)."""
        if self.error is not None:
            return True
        if self.end <= self.start:
            return False  # nothing was planned
        if self.planned_records is not None and self.read_records < self.planned_records:
            return True
        return not self.reached_end

    @property
    def whole(self) -> bool:
        """Every planned record read and decoded."""
        return not self.short and self.undecodable == 0

    def note_undecodable(self, offsets: Iterable[int]) -> None:
        for o in offsets:
            self.undecodable += 1
            if len(self.undecodable_offsets) < MAX_LISTED_OFFSETS:
                self.undecodable_offsets.append(int(o))

    def to_json(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "topic": self.topic,
            "partition": self.partition,
            "planned_offsets": [self.start, self.end],
            "planned_records": self.planned_records,
            "read_records": self.read_records,
            "undecodable": self.undecodable,
            "undecodable_offsets": list(self.undecodable_offsets),
            "reached_end": self.reached_end,
            "short": self.short,
            "error": self.error,
        }


def verdict(
    findings: int, evidence: Iterable[PartitionEvidence], failed_partitions: int = 0
) -> tuple[str, int]:
    """(verdict, exit code) from the number of findings and the evidence behind them."""
    if findings > 0:
        return FINDINGS, EXIT_FINDINGS
    if failed_partitions > 0 or any(not e.whole for e in evidence):
        return PARTIAL, EXIT_PARTIAL
    return CLEAN, EXIT_CLEAN


def summary_fields(
    findings: int, evidence: list[PartitionEvidence], failed_partitions: int = 0
) -> dict[str, Any]:
    """`verdict` and `evidence` for summary.json: the counts behind the verdict, totals first."""
    name, code = verdict(findings, evidence, failed_partitions)
    short = [e for e in evidence if e.short]
    return {
        "verdict": name,
        "exit_code": code,
        "evidence": {
            "partitions_planned": len(evidence),
            "partitions_read_short": len(short),
            "planned_records": sum(e.planned_records or 0 for e in evidence),
            "read_records": sum(e.read_records for e in evidence),
            "undecodable_records": sum(e.undecodable for e in evidence),
            "by_partition": [e.to_json() for e in evidence],
        },
    }


def describe_short(evidence: Iterable[PartitionEvidence]) -> list[str]:
    """One line per partition that was read short or not decoded whole, for stderr."""
    lines = []
    for e in evidence:
        # (a source given without a region id is named by its topic only: it is no region's by default)
        where = (
            f"source {e.region} {e.topic}[{e.partition}]"
            if e.region is not None
            else f"{e.topic}[{e.partition}]"
        )
        if e.error is not None:
            lines.append(f"{where}: not read: {e.error}")
        elif e.short:
            expected = (
                f"{e.planned_records} records"
                if e.planned_records is not None
                else f"offsets {e.start}..{e.end - 1}"
            )
            lines.append(f"{where}: read {e.read_records} of {expected}")
        if e.undecodable:
            shown = ", ".join(str(o) for o in e.undecodable_offsets[:5])
            more = "" if e.undecodable <= 5 else ", ..."
            lines.append(f"{where}: {e.undecodable} record(s) could not be decoded (offsets {shown}{more})")
    return lines
