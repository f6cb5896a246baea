"""Consistent cuts: one upstream time T tied to a position in every topic of a store version.

A VT heartbeat ties a position in a region's version topic to a position in every region's real-time topic (its
`hbw` vector), so one upstream time names a coherent position everywhere (docs/design.md, "Consistent cuts"). This
module is the one home of those rules; `tidegauge cut`, `tidegauge changes --from-cut` and `ChangeReader` all
call it. Pure: no Kafka, no Spark, no files.

For a time T (epoch milliseconds), a partition p and a source region r:

- **C[r]**, the cut: the highest offset of region r's RT partition p whose Kafka record timestamp is <= T, or -1
  (`exact_cut`, from the RT itself). From the VTs alone it is *heartbeat-aligned* (`aligned_cut`): the RT offset
  of region r's latest RT heartbeat at or before T that a VT heartbeat reflects. A VT heartbeat's time is the
  consumed RT heartbeat's max(broker, producer) timestamp (venice-protocol-notes §4.3), never before the RT
  record's own timestamp, so an aligned cut never lies beyond the exact one.
- In region X's VT partition p (`PositionFinder`): **floor**, the offset of the last heartbeat whose vector is
  <= C componentwise (None when none is); **ceil**, the offset of the first heartbeat whose vector is >= C (every
  record of the cut lies before it, by the heartbeat rule 3; None: X has not reached the cut, it is behind);
  **exact**, some heartbeat's vector equals C.

A vector shorter than the store's region count names nothing of the regions it leaves out (-1), as every reader of
`hbw` reads it. Floors and ceils never decrease as T grows: the heartbeats <= C only gain members as C rises, and
those >= C only lose them.

`Cut` is what `tidegauge cut` writes as cut.json and what `changes --from-cut` reads back (`Cut.from_json`, a
strict reader whose errors name the bad field).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

FROM_RT = "rt"
FROM_HEARTBEATS = "heartbeats"


class CutError(ValueError):
    """A time, a cut or a cut.json that cannot be used; the message names what is wrong."""


# -- a time --------------------------------------------------------------------------------------------------------

_EPOCH_MS = re.compile(r"-?\d+")
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def parse_time(text: str) -> int:
    """`--at`: epoch milliseconds, or ISO 8601 with a zone (`2026-11-29T00:00:00Z`, `...+02:00`) -> epoch ms.

    A time without a zone is refused: read on another machine it would name another instant."""
    s = (text or "").strip()
    if _EPOCH_MS.fullmatch(s):
        return int(s)
    try:
        t = _dt.datetime.fromisoformat(s)
    except ValueError:
        raise CutError(
            f"{text!r} is not a time: give ISO 8601 with a zone (2026-11-29T00:00:00Z, 2026-11-29T02:00+02:00) "
            "or epoch milliseconds"
        ) from None
    if t.tzinfo is None or t.utcoffset() is None:
        raise CutError(
            f"{text!r} has no zone: add Z for UTC or an offset such as +02:00 (a time without a zone names "
            "another instant on every machine)"
        )
    return (t - _EPOCH) // _dt.timedelta(milliseconds=1)  # integers: no float rounding of far-off times


def format_time(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC with milliseconds (`2026-11-29T00:00:00.000Z`)."""
    t = _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


# -- the cut -------------------------------------------------------------------------------------------------------


def exact_cut(
    offsets: np.ndarray | Sequence[int], timestamps: np.ndarray | Sequence[int], at_ms: int, current: int = -1
) -> int:
    """The highest of `offsets` whose timestamp (epoch ms) is <= `at_ms`, or `current` when that is higher: fed
    an RT partition's batches one after another (`current` the previous answer, -1 at first), it gives C[r].
    Timestamps need not rise with offsets (CreateTime): the answer is the highest offset, not the first."""
    off = np.asarray(offsets, dtype=np.int64)
    ts = np.asarray(timestamps, dtype=np.int64)
    if len(off) != len(ts):
        raise ValueError(f"{len(off)} offsets but {len(ts)} timestamps")
    inside = off[ts <= at_ms]
    return max(current, int(inside.max())) if len(inside) else current


class HeartbeatMark(NamedTuple):
    """What a VT heartbeat says of the RT heartbeat it was made from: its VT offset, the RT heartbeat's region,
    offset and time (the VT heartbeat's producer `messageTimestamp`)."""

    vt_offset: int
    origin_region: int
    origin_offset: int
    origin_ms: int


def aligned_cut(
    marks: Iterable[HeartbeatMark], at_ms: int, n_regions: int, current: Sequence[int] | None = None
) -> tuple[int, ...]:
    """The heartbeat-aligned cut: per region r, the highest RT offset of a heartbeat of r at or before `at_ms`
    that `marks` (VT heartbeats of any region's VT of the partition) reflect, -1 when none; `current` a previous
    answer to raise (marks fed in several calls)."""
    cut = list(current) if current is not None else [-1] * n_regions
    if len(cut) != n_regions:
        raise ValueError(f"current {tuple(cut)} must have {n_regions} entries")
    for m in marks:
        if (
            0 <= m.origin_region < n_regions
            and m.origin_ms <= at_ms
            and m.origin_offset > cut[m.origin_region]
        ):
            cut[m.origin_region] = m.origin_offset
    return tuple(cut)


# -- positions in a VT ---------------------------------------------------------------------------------------------


class Positions(NamedTuple):
    """Where a cut lies in one region's VT partition: `floor` the last heartbeat with hbw <= C, `ceil` the first
    with hbw >= C (None: the region is behind the cut), `exact` some heartbeat's hbw equals C."""

    floor: int | None
    ceil: int | None
    exact: bool

    @property
    def behind(self) -> bool:
        return self.ceil is None


class PositionFinder:
    """Floor, ceil and exact of one cut in one VT partition, fed the partition's heartbeats in VT order (one by
    one with `feed`, or a batch at a time with `feed_batch`): both keep only three numbers."""

    __slots__ = ("cut", "floor", "ceil", "exact")

    def __init__(self, cut: Sequence[int]) -> None:
        self.cut = np.asarray(tuple(cut), dtype=np.int64)
        if self.cut.ndim != 1 or not len(self.cut):
            raise ValueError(f"a cut has one entry per region, got {tuple(cut)}")
        self.floor: int | None = None
        self.ceil: int | None = None
        self.exact = False

    def _row(self, vector: Sequence[int]) -> np.ndarray:
        n = len(self.cut)
        row = np.full(n, -1, dtype=np.int64)
        k = min(n, len(vector))
        row[:k] = np.asarray(vector[:k], dtype=np.int64)
        return row

    def feed(self, vt_offset: int, vector: Sequence[int]) -> None:
        """One heartbeat's VT offset and `hbw` vector (heartbeats without a vector say nothing: skip them)."""
        row = self._row(vector)
        if bool(np.all(row <= self.cut)):
            self.floor = vt_offset
            if bool(np.all(row == self.cut)):
                self.exact = True
        if self.ceil is None and bool(np.all(row >= self.cut)):
            self.ceil = vt_offset

    def feed_batch(self, vt_offsets: np.ndarray | Sequence[int], vectors: np.ndarray) -> None:
        """Many heartbeats at once: `vectors` an (n, width) int64 array, -1 padded (heartbeat.changes.vector_matrix),
        rows in VT order."""
        off = np.asarray(vt_offsets, dtype=np.int64)
        if not len(off):
            return
        vec = np.asarray(vectors, dtype=np.int64)
        n = len(self.cut)
        if vec.ndim != 2 or vec.shape[0] != len(off):
            raise ValueError(f"vectors must be an ({len(off)}, width) array, got {vec.shape}")
        rows = np.full((len(off), n), -1, dtype=np.int64)
        k = min(n, vec.shape[1])
        rows[:, :k] = vec[:, :k]
        below = np.flatnonzero((rows <= self.cut).all(axis=1))
        if len(below):
            self.floor = int(off[below[-1]])
            if not self.exact and bool((rows[below] == self.cut).all(axis=1).any()):
                self.exact = True
        if self.ceil is None:
            above = np.flatnonzero((rows >= self.cut).all(axis=1))
            if len(above):
                self.ceil = int(off[above[0]])

    @property
    def positions(self) -> Positions:
        return Positions(self.floor, self.ceil, self.exact)


def positions(heartbeats: Iterable[tuple[int, Sequence[int]]], cut: Sequence[int]) -> Positions:
    """Floor, ceil and exact of `cut` given a VT partition's heartbeats as (VT offset, hbw vector), in VT order."""
    finder = PositionFinder(cut)
    for vt_offset, vector in heartbeats:
        finder.feed(vt_offset, vector)
    return finder.positions


def above(region: int, rt_offset: int, cut: Sequence[int]) -> bool:
    """Whether a write with coordinate (region, RT offset) lies above the cut. A region the cut does not name
    (out of range) has nothing in the cut: all of its writes lie above."""
    return not (0 <= region < len(cut)) or rt_offset > cut[region]


def above_many(regions: np.ndarray, rt_offsets: np.ndarray, cut: Sequence[int]) -> np.ndarray:
    """`above` for arrays of coordinates at once (a bool array): millions of records in a few numpy passes."""
    reg = np.asarray(regions, dtype=np.int64)
    off = np.asarray(rt_offsets, dtype=np.int64)
    c = np.asarray(tuple(cut), dtype=np.int64)
    named = (reg >= 0) & (reg < len(c))
    out = np.ones(len(reg), dtype=bool)
    out[named] = off[named] > c[reg[named]]
    return out


# -- cut.json ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CutPartition:
    """One partition of a cut: C per source region (`rt`), and per region whose VT was read its `Positions`."""

    partition: int
    rt: Mapping[int, int]
    regions: Mapping[int, Positions] = field(default_factory=dict)

    def vector(self, n_regions: int | None = None) -> tuple[int, ...]:
        """C as a vector indexed by region id (width: `n_regions`, else one past the highest region named; a
        region not named has -1)."""
        width = n_regions if n_regions is not None else (max(self.rt) + 1 if self.rt else 0)
        return tuple(self.rt.get(r, -1) for r in range(width))


@dataclass(frozen=True)
class Cut:
    """A consistent cut of a store version at time `at_ms`, as cut.json holds it. `source`: FROM_RT (C read from
    every region's RT: exact) or FROM_HEARTBEATS (heartbeat-aligned)."""

    store: str
    version: int
    at_ms: int
    source: str
    partitions: Mapping[int, CutPartition]

    def __post_init__(self) -> None:
        if self.source not in (FROM_RT, FROM_HEARTBEATS):
            raise CutError(f'"from" is {self.source!r}: a cut is from "{FROM_RT}" or "{FROM_HEARTBEATS}"')
        object.__setattr__(self, "partitions", dict(sorted(self.partitions.items())))

    @property
    def n_regions(self) -> int:
        """One past the highest region id the cut names (the width of its vectors)."""
        return max((max(cp.rt) + 1 for cp in self.partitions.values() if cp.rt), default=0)

    def vector(self, partition: int, n_regions: int | None = None) -> tuple[int, ...]:
        try:
            cp = self.partitions[partition]
        except KeyError:
            raise CutError(
                f"the cut has no partition {partition} (it has {sorted(self.partitions)})"
            ) from None
        return cp.vector(n_regions if n_regions is not None else self.n_regions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "version": self.version,
            "at_ms": self.at_ms,
            "at": format_time(self.at_ms),
            "from": self.source,
            "partitions": [
                {
                    "partition": p,
                    "rt": {str(r): c for r, c in sorted(cp.rt.items())},
                    "regions": {
                        str(x): {"floor": pos.floor, "ceil": pos.ceil, "exact": pos.exact}
                        for x, pos in sorted(cp.regions.items())
                    },
                }
                for p, cp in self.partitions.items()
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "cut.json") -> Cut:
        """The cut `to_json` wrote. Raises CutError naming `where` and the bad field for anything else."""
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CutError(f"{where} is not JSON: {exc}") from None
        try:
            return cls._parse(doc)
        except CutError as exc:
            raise CutError(f"{where}: {exc}") from None

    @classmethod
    def _parse(cls, doc: Any) -> Cut:
        if not isinstance(doc, dict):
            raise CutError("not a cut (a JSON object with store, version, at_ms, from and partitions)")

        def need(d: dict, name: str, kind: type | tuple[type, ...], where: str = "") -> Any:
            if name not in d:
                raise CutError(f"{where}{name!r} is missing")
            v = d[name]
            if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
                raise CutError(f"{where}{name!r} is {v!r}, not a {getattr(kind, '__name__', kind)}")
            return v

        def offset(v: Any, what: str, nullable: bool = False) -> int | None:
            if v is None and nullable:
                return None
            if not isinstance(v, int) or isinstance(v, bool) or v < -1:
                raise CutError(f"{what} is {v!r}, not an offset")
            return v

        store = need(doc, "store", str)
        version = need(doc, "version", int)
        at_ms = need(doc, "at_ms", int)
        source = need(doc, "from", str)
        parts: dict[int, CutPartition] = {}
        for i, pd in enumerate(need(doc, "partitions", list)):
            where = f"partitions[{i}]: "
            if not isinstance(pd, dict):
                raise CutError(f"{where}not an object")
            p = need(pd, "partition", int, where)
            if p < 0 or p in parts:
                raise CutError(f"{where}partition {p} is negative or repeated")
            rt_doc = need(pd, "rt", dict, where)
            rt: dict[int, int] = {}
            for r, c in rt_doc.items():
                if not str(r).isdigit():
                    raise CutError(f"{where}rt names region {r!r}, not a region id")
                rt[int(r)] = offset(c, f"{where}rt[{r}]")
            regions: dict[int, Positions] = {}
            for x, xd in (pd.get("regions") or {}).items():
                if not str(x).isdigit() or not isinstance(xd, dict):
                    raise CutError(f"{where}regions[{x!r}] is not a region's positions")
                exact = xd.get("exact", False)
                if not isinstance(exact, bool):
                    raise CutError(f"{where}regions[{x}].exact is {exact!r}, not true or false")
                regions[int(x)] = Positions(
                    offset(xd.get("floor"), f"{where}regions[{x}].floor", True),
                    offset(xd.get("ceil"), f"{where}regions[{x}].ceil", True),
                    exact,
                )
            parts[p] = CutPartition(p, rt, regions)
        return cls(store, version, at_ms, source, parts)
