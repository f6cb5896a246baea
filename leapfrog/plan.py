"""Leap Frog's plan from split summaries: where each region's scan starts, its marks, gaps and per-key views.

Stage A (`pipelines.leapfrog.scan`) leaves one small summary per split. This module turns them into what the per-key
stage needs — each (split, segment)'s prefix mark and each region partition's `RegionView` — and into the facts
`summary.json` reports. It imports no Spark: the driver and the executors run the same code.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from leapfrog.history import RegionView
from leapfrog.vectors import nothing

MAX_LISTED_OFFSETS = 100


@dataclass
class RegionPartition:
    """What the driver learns about one region's partition before comparing."""

    region: int
    partition: int
    records_read: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    eop_offset: int | None = None
    chunked: bool = False
    chunk_rows: int = 0  # manifests and chunks seen (values stored chunked)
    undecodable: int = 0
    undecodable_offsets: list[int] = field(default_factory=list)
    # [key hex, offset] of undecodable records with a readable key, this run's and earlier runs' (--state);
    # overflow: a keyless unreadable record, or more than a scan lists: every finding about this region partition
    # is withheld
    unverified: list[list] = field(default_factory=list)
    unverified_overflow: bool = False
    start_after: int = -1
    prefix_known: bool = True
    baseline: tuple[int, ...] | None = None
    start_kind: str = "end_of_push"
    data_records: int = 0
    heartbeats: int = 0
    heartbeats_by_origin: dict[str, int] = field(default_factory=dict)
    out_of_range: int = 0
    out_of_range_offsets: list[int] = field(default_factory=list)
    # the longest heartbeat vector the scan met: wider than the run's region count means the run was planned with
    # too few of the store's regions (pipelines.leapfrog.regions) and must run again with this many
    widest_hbw: int = 0
    final_hw: tuple[int, ...] = ()
    gaps: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    # resumed runs (--state): the previous run's final mark and the mark before the first gap of any earlier run
    start_hw: tuple[int, ...] | None = None
    prefix_freeze: tuple[int, ...] | None = None
    # every key's latest record up to the end is in the scan (leapfrog.reference.entries.RegionLog.latest_kept)
    latest_kept: bool = True
    start_latest_kept: bool = True  # resumed: the previous run's latest_kept
    # the schemas the decoder learnt from `vtp` headers, by protocol version (JSON keys): a newer writer announces
    # its schema on a producer's first message only, and the next run's (or micro-batch's) records decode by it
    learned: dict[str, Any] = field(default_factory=dict)

    def next_freeze(self) -> tuple[int, ...] | None:
        """The mark before the first gap since the first run: what the next run freezes absent prefixes at."""
        if self.prefix_freeze is not None:
            return self.prefix_freeze
        return self.gaps[0][2] if self.gaps else None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> RegionPartition:
        rp = cls(**d)
        rp.final_hw = tuple(rp.final_hw)
        rp.baseline = tuple(rp.baseline) if rp.baseline is not None else None
        rp.gaps = [(g[0], g[1], tuple(g[2])) for g in rp.gaps]
        rp.start_hw = tuple(rp.start_hw) if rp.start_hw is not None else None
        rp.prefix_freeze = tuple(rp.prefix_freeze) if rp.prefix_freeze is not None else None
        return rp


def failed_reads(summaries: list[dict]) -> dict[tuple[int, int], str]:
    """(region, partition) → the first read error of its splits, for splits the source could not read to the end."""
    out: dict[tuple[int, int], str] = {}
    for sm in sorted(summaries, key=lambda sm: sm["split"]):
        if sm.get("error"):
            out.setdefault((sm["region"], sm["partition"]), sm["error"])
    return out


def plan_marks(
    summaries: list[dict],
    ends: dict[tuple[int, int], int],
    n: int,
    carried: dict[tuple[int, int], dict] | None = None,
) -> tuple[dict[tuple[int, int], RegionPartition], dict[tuple[int, int], list[int]]]:
    """From the split summaries of stage A: each region partition's scan start, gaps, final mark and counts, and
    the prefix mark of every (split, segment) that lies after the start (segments before it are left out).

    A region partition with a split that could not be read to its end (`failed_reads`) is left out altogether —
    no facts, no prefixes, so its rows are dropped — and the job reports it as failed."""
    failed = failed_reads(summaries)
    by_rp: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for sm in summaries:
        if (sm["region"], sm["partition"]) not in failed:
            by_rp[(sm["region"], sm["partition"])].append(sm)
    carried = carried or {}
    for rp_key in carried:
        if rp_key not in failed:
            by_rp.setdefault(rp_key, [])
    facts: dict[tuple[int, int], RegionPartition] = {}
    prefixes: dict[tuple[int, int], list[int]] = {}
    for (region, partition), splits in sorted(by_rp.items()):
        splits.sort(key=lambda sm: sm["first_offset"])
        rp = RegionPartition(region, partition)
        rp.records_read = sum(seg["rows"] for sm in splits for seg in sm["segments"])
        state = carried.get((region, partition))
        if splits:
            rp.first_offset, rp.last_offset = splits[0]["first_offset"], splits[-1]["last_offset"]
        else:  # resumed, nothing new
            rp.first_offset, rp.last_offset = state["last_offset"] + 1, state["last_offset"]
        eops = [sm["eop_offset"] for sm in splits if sm["eop_offset"] is not None]
        hbws = [sm for sm in splits if sm["hbw_boundary"] is not None]
        rp.chunked = any(sm["chunked"] for sm in splits)
        rp.chunk_rows = sum(sm.get("chunk_rows", 0) for sm in splits)
        rp.widest_hbw = max((sm.get("widest_hbw", 0) for sm in splits), default=0)
        rp.undecodable = sum(sm["undecodable"] for sm in splits)
        rp.undecodable_offsets = [o for sm in splits for o in sm["undecodable_offsets"]][:MAX_LISTED_OFFSETS]
        rp.unverified = [list(u) for u in (state or {}).get("unverified") or []]
        rp.unverified += [u for sm in splits for u in sm.get("unverified", [])]
        rp.unverified_overflow = bool((state or {}).get("unverified_overflow")) or any(
            sm.get("unverified_overflow") for sm in splits
        )
        # what the run it resumed had learnt, then each split's (a later header wins)
        rp.learned = dict((state or {}).get("learned") or {})
        for sm in splits:
            rp.learned.update(sm.get("learned") or {})
        if state is not None:
            rp.start_after, rp.prefix_known, rp.start_kind, start_seg = (
                state["last_offset"],
                state["prefix_known"],
                "state",
                None,
            )
            rp.eop_offset = state.get("eop_offset")
            rp.baseline = tuple(state["baseline"]) if state["baseline"] is not None else None
            rp.start_hw = init = tuple(state["final_hw"])
            rp.prefix_freeze = tuple(state["gap_hw"]) if state["gap_hw"] is not None else None
            rp.start_latest_kept = state.get("latest_kept", True)
            rp.chunked = rp.chunked or bool(state.get("chunked"))
        elif eops:
            rp.eop_offset = min(eops)
            rp.start_after, rp.prefix_known, rp.start_kind, start_seg = (
                rp.eop_offset,
                True,
                "end_of_push",
                "eop",
            )
            init = nothing(n)
        elif hbws:
            rp.start_after, rp.prefix_known, rp.start_kind, start_seg = (
                hbws[0]["hbw_boundary"],
                False,
                "heartbeat",
                "hbw",
            )
            rp.baseline = tuple(hbws[0]["baseline"])
            init = rp.baseline
        else:
            rp.start_after, rp.prefix_known, rp.start_kind, start_seg = (
                rp.first_offset - 1,
                False,
                "first_record",
                None,
            )
            rp.baseline = init = nothing(n)
        mark: list[int] | None = None
        last: int | None = None
        by_origin: Counter = Counter()
        for sm in splits:
            if mark is not None and last is not None and sm["first_offset"] > last + 1:
                rp.gaps.append((last + 1, sm["first_offset"] - 1, tuple(mark)))
            for i, seg in enumerate(sm["segments"]):
                if mark is None:
                    begins = (start_seg is None and i == 0) or (
                        seg["kind"] == start_seg and seg["after"] == rp.start_after
                    )
                    if not begins:
                        continue
                    mark = list(init)
                    if (
                        start_seg is None and sm["first_offset"] > rp.start_after + 1
                    ):  # compacted right after the start
                        rp.gaps.append((rp.start_after + 1, sm["first_offset"] - 1, tuple(mark)))
                prefixes[(sm["split"], i)] = list(mark)
                for first, lastg, local in seg["gaps"]:
                    if first > rp.start_after:
                        rp.gaps.append(
                            (first, lastg, tuple(max(a, b) for a, b in zip(local, mark, strict=True)))
                        )
                rp.data_records += seg["data"]
                rp.out_of_range += seg["out_of_range"]
                rp.out_of_range_offsets.extend(seg["out_of_range_offsets"])
                by_origin.update({int(k): v for k, v in seg["heartbeats"].items()})
                mark = [max(a, b) for a, b in zip(mark, seg["max"], strict=True)]
            last = sm["last_offset"]
        mark = mark if mark is not None else list(init)
        end = ends.get((region, partition))
        last = last if last is not None else rp.start_after
        if end is not None and end - 1 > max(last, rp.start_after):
            rp.gaps.append((max(last, rp.start_after) + 1, end - 1, tuple(mark)))  # compacted at the end
        rp.final_hw = tuple(mark)
        rp.heartbeats = sum(by_origin.values())
        rp.heartbeats_by_origin = {str(k): v for k, v in sorted(by_origin.items())}
        rp.out_of_range_offsets = rp.out_of_range_offsets[:MAX_LISTED_OFFSETS]
        rp.gaps.sort()
        facts[(region, partition)] = rp
    return facts, prefixes


def views(facts: dict, n: int, mode: str) -> dict[tuple[int, int], RegionView]:
    views = {}
    for key, rp in facts.items():
        baseline = None if rp.prefix_known else tuple(rp.baseline or nothing(n))
        default = baseline if (baseline is not None and mode == "heartbeat") else nothing(n)
        views[key] = RegionView(
            n,
            mode,
            rp.start_after,
            rp.prefix_known,
            default,
            rp.final_hw,
            tuple(g[0] for g in rp.gaps),
            tuple(g[2] for g in rp.gaps),
            prefix_freeze=rp.prefix_freeze,
            start_hw=rp.start_hw,
            latest_kept=rp.latest_kept,
            start_latest_kept=rp.start_latest_kept,
        )
    return views


def mark_latest_kept(facts: dict, deadlines: dict[int, int], now_ms: int) -> None:
    """Set each region partition's `latest_kept` once every split has been read (`now_ms`, before comparing):
    a live region read past its compaction deadline (`pipelines.leapfrog.source.compaction_deadlines`) may lack one."""
    for rp in facts.values():
        deadline = deadlines.get(rp.region)
        rp.latest_kept = deadline is None or now_ms < deadline
