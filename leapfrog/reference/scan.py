"""One region's scan: running high-water mark, gaps, and every key's history with its vectors and marks.

Rules applied here (the numbers are the design's):

2. **Running high-water mark.** It starts at all -1 (End of Push), at the baseline (mid-stream), or at the
   carried final mark (resumed). A data entry raises ``hw[src]`` to its footer offset. In heartbeat mode a VT
   heartbeat raises every component to its watermark and ``hw[origin]`` to the RT heartbeat's own offset; in
   footer and rmd modes heartbeats are counted but ignored. Each data entry records ``hw_before`` and ``hw_at``.
3. **Gaps.** Offsets missing between the scan start (when known) and ``last_offset`` are gaps: compaction may
   have removed records of any key there. Each gap remembers the mark just before it.
4. **Per-key vector** K of a record = component-wise max of the previous record's K and its own footer
   position. Before the first record: all -1 after End of Push; in heartbeat mode the baseline after a
   mid-stream start (VIP-2's "<HWM" back-fill: what the scan cannot see is bounded by the baseline); the
   carried record's K when resumed. Footer mode never back-fills. In rmd mode K is the record's RMD vector
   (padded with -1) when it has one, else as in footer mode.
5. **Standing high-water mark** (heartbeat mode). A record's value stands until the key's next record in the
   region: ``hws`` = ``hw_before`` of that next record, or the final mark for the key's last record. If a gap
   lies inside that interval, ``hws`` is the mark just before the first such gap — except after the key's last
   record when the log keeps every key's latest record (``RegionLog.latest_kept``, as Kafka's compaction does):
   no record of the key can hide there. The absent prefix (and a carried record whose value still stands)
   stands from the scan start; a key without any record stands absent until the end under the same premise.

Data entries whose source region is outside ``0..N-1`` (and heartbeats from such an origin) are counted as
out of range and otherwise ignored; they still occupy their offset.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, replace

from leapfrog.compare import KeyRecord
from leapfrog.history import RegionView
from leapfrog.reference.entries import (
    DataEntry,
    FromEndOfPush,
    FromHeartbeat,
    FromState,
    HeartbeatEntry,
    OtherEntry,
    RegionLog,
)
from leapfrog.reference.state import RegionState
from leapfrog.results import RegionFacts
from leapfrog.vectors import Vector, checked_vector, nothing, padded_vector, raised, vmax

MODES = ("heartbeat", "footer", "rmd")


@dataclass(frozen=True)
class Gap:
    """Offsets ``first..last`` are missing; ``hw_before`` is the running mark just before them."""

    first: int
    last: int
    hw_before: Vector


@dataclass(frozen=True)
class ScannedRecord:
    """A data entry of a key as the scan saw it."""

    vt_offset: int
    value_hash: int | None
    vector: Vector
    hw_before: Vector
    hw_at: Vector


class RegionScan:
    """The result of scanning one region's log; ``history(key)`` gives the key's records for the mode."""

    def __init__(self, region: int, log: RegionLog, n_regions: int, mode: str, carried: RegionState | None):
        self.region = region
        self.n = n_regions
        self.mode = mode
        self.carried = carried
        start = log.start
        if isinstance(start, FromEndOfPush):
            hw = nothing(n_regions)
            self.first_offset = None if start.eop_offset is None else start.eop_offset + 1
            self.baseline: Vector | None = None
        elif isinstance(start, FromHeartbeat):
            hw = checked_vector(start.baseline, n_regions, f"region {region}: baseline of FromHeartbeat")
            self.first_offset = None if start.vt_offset is None else start.vt_offset + 1
            self.baseline = hw
        elif isinstance(start, FromState):
            if carried is None:
                raise ValueError(f"region {region}: FromState but the state holds no region {region}")
            hw = carried.final_hw
            self.first_offset = carried.last_offset + 1
            self.baseline = carried.baseline
        else:
            raise TypeError(f"region {region}: unknown scan start {start!r}")
        self.prefix_known = self.baseline is None
        # K before a key's first record: the heartbeat-mode back-fill uses the baseline, footer mode never does.
        if self.baseline is not None and mode == "heartbeat":
            self.default_vector = self.baseline
        else:
            self.default_vector = nothing(n_regions)

        entries = list(log.entries)
        self._check_offsets(entries)
        if log.last_offset is not None:
            self.last_offset = log.last_offset
        elif entries:
            self.last_offset = entries[-1].vt_offset
        else:
            self.last_offset = self.first_offset - 1 if self.first_offset is not None else -1
        if entries and self.last_offset < entries[-1].vt_offset:
            raise ValueError(
                f"region {region}: last_offset {self.last_offset} is before the last entry "
                f"at {entries[-1].vt_offset}"
            )
        if self.first_offset is not None and self.last_offset < self.first_offset - 1:
            raise ValueError(f"region {region}: last_offset {self.last_offset} precedes the scan start")

        if self.first_offset is not None:
            self.start_after = self.first_offset - 1
        else:
            self.start_after = entries[0].vt_offset - 1 if entries else self.last_offset
        self.gaps: list[Gap] = []
        self.new: dict[bytes, list[ScannedRecord]] = defaultdict(list)
        last_vector: dict[bytes, Vector] = {}
        if carried is not None:
            last_vector = {k: c.records[-1].vector for k, c in carried.keys.items()}
        records = heartbeats = 0
        by_origin: Counter[int] = Counter()
        out_of_range: list[int] = []
        prev = self.start_after
        for entry in entries:
            if entry.vt_offset > prev + 1:
                self.gaps.append(Gap(prev + 1, entry.vt_offset - 1, hw))
            prev = entry.vt_offset
            if isinstance(entry, DataEntry):
                if not 0 <= entry.source_region < n_regions:
                    out_of_range.append(entry.vt_offset)
                    continue
                if entry.source_offset < 0:
                    raise ValueError(
                        f"region {region}: data entry at {entry.vt_offset} has source offset {entry.source_offset}"
                    )
                records += 1
                before = hw
                hw = raised(hw, entry.source_region, entry.source_offset)
                vector = raised(
                    last_vector.get(entry.key, self.default_vector), entry.source_region, entry.source_offset
                )
                if mode == "rmd" and entry.rmd_vector is not None:
                    vector = padded_vector(
                        entry.rmd_vector, n_regions, f"region {region}: rmd_vector at {entry.vt_offset}"
                    )
                last_vector[entry.key] = vector
                self.new[entry.key].append(
                    ScannedRecord(entry.vt_offset, entry.value_hash, vector, before, hw)
                )
            elif isinstance(entry, HeartbeatEntry):
                if not 0 <= entry.origin_region < n_regions:
                    out_of_range.append(entry.vt_offset)
                    continue
                watermarks = checked_vector(
                    entry.watermarks, n_regions, f"region {region}: heartbeat at {entry.vt_offset}"
                )
                heartbeats += 1
                by_origin[entry.origin_region] += 1
                if mode == "heartbeat":
                    hw = raised(vmax(hw, watermarks), entry.origin_region, entry.origin_offset)
            elif not isinstance(entry, OtherEntry):
                raise TypeError(f"region {region}: not a log entry: {entry!r}")
        if self.last_offset > prev:
            self.gaps.append(Gap(prev + 1, self.last_offset, hw))
        self.final_hw = hw
        self._gap_firsts = [g.first for g in self.gaps]
        # The per-key rules see the scan through this view, as the distributed job does (leapfrog.history).
        self.view = RegionView(
            n_regions,
            mode,
            self.start_after,
            self.prefix_known,
            self.default_vector,
            hw,
            tuple(self._gap_firsts),
            tuple(g.hw_before for g in self.gaps),
            prefix_freeze=carried.gap_hw if carried is not None else None,
            start_hw=carried.final_hw if carried is not None else None,
            latest_kept=log.latest_kept,
            start_latest_kept=carried.latest_kept if carried is not None else True,
        )
        self._histories: dict[bytes, list[KeyRecord]] = {}
        # The mark before the first gap since the (first) scan began freezes every absent prefix.
        if carried is not None and carried.gap_hw is not None:
            self.gap_hw: Vector | None = carried.gap_hw
        else:
            self.gap_hw = self.gaps[0].hw_before if self.gaps else None
        first = (
            self.first_offset
            if self.first_offset is not None
            else (entries[0].vt_offset if entries else None)
        )
        self.facts = RegionFacts(
            region=region,
            records=records,
            heartbeats=heartbeats,
            heartbeats_by_origin=dict(sorted(by_origin.items())),
            first_offset=first,
            last_offset=self.last_offset,
            final_high_watermark=hw,
            gaps=[(g.first, g.last) for g in self.gaps],
            out_of_range=len(out_of_range),
            out_of_range_offsets=out_of_range,
        )

    def _check_offsets(self, entries: list) -> None:
        for before, after in zip(entries, entries[1:], strict=False):
            if after.vt_offset <= before.vt_offset:
                raise ValueError(
                    f"region {self.region}: entries not in increasing offset order: "
                    f"{before.vt_offset} then {after.vt_offset}"
                )
        if entries and self.first_offset is not None and entries[0].vt_offset < self.first_offset:
            raise ValueError(
                f"region {self.region}: entry at {entries[0].vt_offset} lies before the scan start "
                f"{self.first_offset}"
            )

    # -- keys and histories -------------------------------------------------------------------------------

    def keys(self) -> set[bytes]:
        """Keys with at least one real record in view (scanned now or carried)."""
        carried = set(self.carried.keys) if self.carried is not None else set()
        return carried | set(self.new)

    def _standing(self, after: int, nxt: ScannedRecord | None) -> Vector:
        """Standing mark of a value that stands from after ``after`` until ``nxt`` (None: end of scan)."""
        if nxt is None:
            return self.view.standing(after, None, None)
        return self.view.standing(after, nxt.vt_offset, nxt.hw_before)

    def _prefix_standing(self, first_new: ScannedRecord | None) -> Vector:
        if first_new is None:
            return self.view.prefix_standing(None, None)
        return self.view.prefix_standing(first_new.vt_offset, first_new.hw_before)

    def history(self, key: bytes) -> list[KeyRecord]:
        """The key's records in VT order: heartbeat mode with the known prefix and standing marks,
        footer/rmd mode real records with their point-in-time marks."""
        if key not in self._histories:
            self._histories[key] = self._history(key)
        return self._histories[key]

    def _history(self, key: bytes) -> list[KeyRecord]:
        new = self.new.get(key, [])
        if self.mode != "heartbeat":
            return [KeyRecord(r.value_hash, r.vector, r.hw_at, r.vt_offset) for r in new]
        first_new = new[0] if new else None
        out: list[KeyRecord] = []
        carried = self.carried.keys.get(key) if self.carried is not None else None
        if carried is not None:
            out.extend(carried.records[:-1])
            last = carried.records[-1]
            # still standing, or the key's last record under the latest-kept premise (a gap froze it only
            # for the case that a later record of the key turns up)
            if carried.last_open or (first_new is None and self.view.latest_kept):
                last = replace(last, high_watermark=self._standing(self.start_after, first_new))
            out.append(last)
        elif self.prefix_known:
            out.append(KeyRecord(None, nothing(self.n), self._prefix_standing(first_new), -1, absent=True))
        for i, r in enumerate(new):
            nxt = new[i + 1] if i + 1 < len(new) else None
            out.append(KeyRecord(r.value_hash, r.vector, self._standing(r.vt_offset, nxt), r.vt_offset))
        return out

    def previous_marks(self, key: bytes) -> list[Vector | None]:
        """Parallel to ``history(key)`` (heartbeat mode): each record's mark at the end of the previous run,
        None for records that run did not have."""
        new = self.new.get(key, [])
        marks: list[Vector | None] = []
        carried = self.carried.keys.get(key) if self.carried is not None else None
        latest = self.view.start_latest_kept
        if carried is not None:
            marks.extend(r.high_watermark for r in carried.records[:-1])
            # the key's last record then: the previous run's final mark under the latest-kept premise
            marks.append(self.carried.final_hw if latest else carried.records[-1].high_watermark)
        elif self.prefix_known:
            if self.carried is not None:
                marks.append(
                    self.carried.gap_hw
                    if self.carried.gap_hw is not None and not latest
                    else self.carried.final_hw
                )
            else:
                marks.append(None)
        marks.extend([None] * len(new))
        return marks

    def last_vector(self, key: bytes) -> Vector:
        """K of the key's current record here (the prefix's K when the region has no record of the key)."""
        new = self.new.get(key)
        if new:
            return new[-1].vector
        if self.carried is not None and key in self.carried.keys:
            return self.carried.keys[key].records[-1].vector
        return self.default_vector

    def frozen_mark(self, key: bytes) -> Vector:
        """For a key whose current record here has a gap after it (not ``last_open``): the mark just before the
        first such gap — its standing mark should a later record of the key turn up
        (``leapfrog.reference.state``)."""
        new = self.new.get(key)
        if new:
            return self.gaps[bisect_right(self._gap_firsts, new[-1].vt_offset)].hw_before
        carried = self.carried.keys[key]
        return carried.records[-1].high_watermark if not carried.last_open else self.gaps[0].hw_before

    def last_open(self, key: bytes) -> bool:
        """Whether the key's current record here still stands with no gap after it."""
        new = self.new.get(key)
        if new:
            return bisect_right(self._gap_firsts, new[-1].vt_offset) == len(self.gaps)
        carried = self.carried.keys[key]
        return carried.last_open and not self.gaps
