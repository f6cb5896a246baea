"""The simulator's truth at a time: for a finished run and a time T, the exact cut and each region's exact state.

`tidegauge cut --snapshot X` answers "what did region X hold at T" from the product's reading of X's VT (and the
RTs). This module answers the same question from the simulator's side, to check it against: it recomputes what
each region's leaders applied from the RT archives, with the simulator's own conflict resolution (`sim.dcr`) and
the faults `truth.json` records. No product code (pipelines/, leapfrog's snapshot, heartbeat's cut rules) is used;
everything it needs is in the output directory, so the answer is deterministic by seed like the run itself.

For a time T (epoch ms), a partition p and a source region r (the definitions `heartbeat/cuts.py` states):

* **the cut** C[p][r]: the highest offset of region r's RT partition p whose Kafka record timestamp is <= T
  (any record: data, control, heartbeat), or -1;
* **the state of region X at the cut**, per key: the bulk load, then the winner of X's conflict resolution among
  the writes at or below the cut, as X's leaders resolved them: in the order they process records (arrival =
  write time + lag(r -> X), an isolation holding other regions' records back to its end; then region, offset),
  without the writes they dropped (a `dropped` fault in X, the second copy of a `duplicate` that RT DIV drops),
  with the value they stored (a `poisoned` fault in X). A leader failover changes nothing here: the successor
  repeats its partition's faults and re-applies writes its predecessor applied, which DCR keeps as they were.
  Writes above the cut are left out, even those X processed before some of the cut's: the state at a cut is what
  the cut's writes alone give.

`RunTruth.load(out)` reads the archives once; `cut(T)`, `state_at(X, T)` and `final_state(X)` (the state once
every write is in: what X's VT ends with) are then cheap to ask for many times and regions. `truth_at(out, T)`
does it all at once.

Keys and values are bytes as `tidegauge changes` and `cut --snapshot` write them: the key content without
Venice's one-byte key header (the Avro-serialized user key), the value as the leader wrote it (the Avro-serialized
value, without schema id). Limits: a run with a version swap is refused (its new version's bulk load is a snapshot
of one region mid-run and its leaders replay from a rewind point, which this does not model), and so is a run that
has not finished (truth.json's `run.end_ms` null).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from div import archive
from div.envelope import EnvelopeCodec
from div.records import Kind, iter_records

from .dcr import ReplicaStore
from .traffic import poison


class TruthError(ValueError):
    """The output directory cannot give a truth at a time (not a finished run, a run with a swap, an archive with
    records missing); the message names what and where."""


class KeyState(NamedTuple):
    """What a region holds for one key. Field names are `cut --snapshot`'s columns.

    `op` `PUT` or `DELETE`; `value` the bytes the region's leader wrote (None for a DELETE); `logical_ts` the
    winning write's DCR timestamp (its logical timestamp); `upstream_region`, `upstream_offset` its RT coordinates.
    A key that only the bulk load wrote has None for all three."""

    op: str
    value: bytes | None
    logical_ts: int | None
    upstream_region: int | None
    upstream_offset: int | None

    @property
    def from_bulk_load(self) -> bool:
        return self.upstream_region is None


State = dict[tuple[int, bytes], KeyState]
"""A region's state: (partition, key) -> what it holds. A key nothing wrote (or whose every write the region
dropped, without a bulk value) is absent; a deleted key is there with op DELETE."""

Cut = dict[int, tuple[int, ...]]
"""partition -> C per source region (index = region id); -1 where the region's RT had nothing at or before T."""


@dataclass(frozen=True)
class TruthAt:
    """The truth of a run at `at_ms`: the cut and every region's state at it."""

    at_ms: int
    cut: Cut
    states: dict[int, State]


class _Write(NamedTuple):
    """One RT data record: its coordinates, broker time, key content, value (None: DELETE) and DCR timestamp."""

    region: int
    offset: int
    broker_ms: int
    key: bytes
    value: bytes | None
    timestamp: int


class _FaultTable(NamedTuple):
    """The faults that decide what a leader of (region, partition) applies, as RT coordinates (region, offset)."""

    dropped: frozenset[tuple[int, int]]
    poisoned: frozenset[tuple[int, int]]


class RunTruth:
    """A finished simulation's RTs, bulk load and faults, ready to say the cut and the state at any time."""

    def __init__(
        self,
        truth: Mapping,
        rt_offsets: dict[tuple[int, int], np.ndarray],
        rt_times: dict[tuple[int, int], np.ndarray],
        writes: dict[tuple[int, int], list[_Write]],
        bulk: dict[int, State],
    ) -> None:
        run = truth["run"]
        self.truth = truth
        self.store: str = run["store"]
        self.version: int = int(run["version"])
        self.regions: int = int(run["regions"])
        self.partitions: int = int(run["partitions"])
        self._rt_offsets = rt_offsets
        self._rt_times = rt_times
        self._writes = writes
        self._bulk = bulk
        self._lags = {
            int(reg["region"]): {int(r): int(ms) for r, ms in reg["lag_ms_from"].items()}
            for reg in truth["regions"]
        }
        self._faults = _fault_tables(truth, self.regions, self.partitions)
        self._order: dict[tuple[int, int], list[_Write]] = {}

    # -- loading -----------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, out_dir: str | os.PathLike) -> RunTruth:
        """Read `out_dir/truth.json`, every region's RT from `out_dir/archive/dc-<id>/` and the bulk load from each
        region's VT. Raises TruthError for what cannot give a truth (the message says why)."""
        out = Path(out_dir)
        path = out / "truth.json"
        try:
            truth = json.loads(path.read_text())
        except FileNotFoundError:
            raise TruthError(f"{out}: no truth.json (not the output directory of a simulation)") from None
        except (OSError, ValueError) as exc:
            raise TruthError(f"{path}: cannot be read as JSON ({exc})") from None
        run = truth.get("run") or {}
        if run.get("end_ms") is None or run.get("end_offsets") is None:
            raise TruthError(
                f"{path}: the run has not finished (run.end_ms is null); ask again once it stopped"
            )
        swaps = [f for f in truth.get("faults", []) if f.get("kind") == "swap"]
        if swaps:
            raise TruthError(
                f"{path}: the run has a version swap (fault {swaps[0]['id']}); the truth at a time covers runs "
                "without one"
            )
        n, parts = int(run["regions"]), int(run["partitions"])
        rt, vt = run["rt_topic"], run["vt_topic"]
        codec = EnvelopeCodec()
        offsets: dict[tuple[int, int], np.ndarray] = {}
        times: dict[tuple[int, int], np.ndarray] = {}
        writes: dict[tuple[int, int], list[_Write]] = {}
        bulk: dict[int, State] = {}
        for r in range(n):
            directory = out / "archive" / f"dc-{r}"
            ends = run["end_offsets"].get(str(r), {})
            for p in range(parts):
                end = ends.get(f"{rt}[{p}]")
                if end is None:
                    raise TruthError(f"{path}: run.end_offsets names no end of {rt}[{p}] in region {r}")
                offsets[(r, p)], times[(r, p)], writes[(r, p)] = _read_rt(
                    codec, directory, rt, p, r, int(end)
                )
                eop = run["eop_offsets"].get(str(p))
                if eop is None:
                    raise TruthError(f"{path}: run.eop_offsets names no End of Push of partition {p}")
                bulk.setdefault(r, {}).update(_read_bulk(codec, directory, vt, p, int(eop)))
        return cls(truth, offsets, times, writes, bulk)

    # -- the cut -----------------------------------------------------------------------------------------------
    def cut(self, at_ms: int) -> Cut:
        """C[p][r] at `at_ms` (epoch ms): the highest offset of region r's RT partition p whose Kafka record
        timestamp is <= at_ms, or -1."""
        out: Cut = {}
        for p in range(self.partitions):
            row = []
            for r in range(self.regions):
                offs = self._rt_offsets[(r, p)][self._rt_times[(r, p)] <= at_ms]
                row.append(int(offs.max()) if offs.size else -1)
            out[p] = tuple(row)
        return out

    def end_cut(self) -> Cut:
        """The cut that holds every RT record: the last offset of every RT partition."""
        return {
            p: tuple(
                int(self._rt_offsets[(r, p)][-1]) if self._rt_offsets[(r, p)].size else -1
                for r in range(self.regions)
            )
            for p in range(self.partitions)
        }

    # -- the state ---------------------------------------------------------------------------------------------
    def state_at_cut(self, region: int, cut: Mapping[int, Iterable[int]]) -> State:
        """Region `region`'s state at `cut` (partition -> C per source region): the bulk load, then the DCR winner
        among the writes at or below the cut that its leaders applied (module docstring)."""
        if not 0 <= region < self.regions:
            raise TruthError(f"region {region}: the run has regions 0..{self.regions - 1}")
        state: State = dict(self._bulk.get(region, {}))
        for p in range(self.partitions):
            c = tuple(cut[p]) if p in cut else ()
            if len(c) != self.regions:
                raise TruthError(
                    f"the cut of partition {p} has {len(c)} positions; the run has {self.regions}"
                )
            faults = self._faults[(region, p)]
            store = ReplicaStore()
            for w in self._processing_order(region, p):
                if w.offset > c[w.region]:
                    continue
                coord = (w.region, w.offset)
                if coord in faults.dropped:
                    continue
                bad = poison(w.value) if w.value is not None and coord in faults.poisoned else None
                if store.resolve(w.key, w.timestamp, w.region, w.offset, w.value, bad) is None:
                    continue  # lost conflict resolution: not written
                state[(p, w.key)] = KeyState(
                    "PUT" if w.value is not None else "DELETE",
                    bad if bad is not None else w.value,
                    w.timestamp,
                    w.region,
                    w.offset,
                )
        return state

    def state_at(self, region: int, at_ms: int) -> State:
        """Region `region`'s state at the cut of `at_ms`."""
        return self.state_at_cut(region, self.cut(at_ms))

    def final_state(self, region: int) -> State:
        """Region `region`'s state once every write is in: what its VT ends with (the state at the end cut)."""
        return self.state_at_cut(region, self.end_cut())

    def at(self, at_ms: int, regions: Iterable[int] | None = None) -> TruthAt:
        """The cut at `at_ms` and the state there of every region (or of `regions`)."""
        cut = self.cut(at_ms)
        wanted = range(self.regions) if regions is None else regions
        return TruthAt(at_ms, cut, {x: self.state_at_cut(x, cut) for x in wanted})

    def _processing_order(self, region: int, partition: int) -> list[_Write]:
        """The RT writes of a partition in the order region `region`'s leaders process them: by arrival (write
        time + lag; a record of another region due inside one of the region's isolations arrives at its end),
        then source region, then offset (`sim.leader`)."""
        key = (region, partition)
        order = self._order.get(key)
        if order is None:
            lags = self._lags[region]
            isolations = [
                (int(f["time_ms"]), _NEVER if f.get("end_ms") is None else int(f["end_ms"]))
                for f in self.truth.get("faults", [])
                if f.get("kind") == "isolated" and f.get("region") == region
            ]

            def arrival(w: _Write) -> int:
                t = w.broker_ms + lags.get(w.region, 0)
                if w.region != region:
                    for start, end in isolations:
                        if start <= t < end:
                            return end
                return t

            events = [w for r in range(self.regions) for w in self._writes[(r, partition)]]
            order = sorted(events, key=lambda w: (arrival(w), w.region, w.offset))
            self._order[key] = order
        return order


_NEVER = 1 << 62


def truth_at(out_dir: str | os.PathLike, at_ms: int, regions: Iterable[int] | None = None) -> TruthAt:
    """The cut of a finished run at `at_ms` and every region's (or `regions`') state there (`RunTruth`)."""
    return RunTruth.load(out_dir).at(at_ms, regions)


def _fault_tables(truth: Mapping, n_regions: int, partitions: int) -> dict[tuple[int, int], _FaultTable]:
    """Per (region, partition): the RT writes its leaders drop (dropped there; a duplicate's second copy, which
    RT DIV drops everywhere) and those they poison."""
    dropped: dict[tuple[int, int], set[tuple[int, int]]] = {}
    poisoned: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for f in truth.get("faults", []):
        kind, p = f.get("kind"), f.get("partition")
        if kind == "dropped":
            for x in f["detail"]["dropped_in"]:
                dropped.setdefault((int(x), p), set()).add((int(f["region"]), int(f["rt_offset"])))
        elif kind == "poisoned":
            d = f["detail"]
            poisoned.setdefault((int(d["poisoned_in"]), p), set()).add(
                (int(d["origin_region"]), int(f["rt_offset"]))
            )
        elif kind == "duplicate":
            copy = (int(f["region"]), int(f["detail"]["copy_offset"]))
            for x in range(n_regions):
                dropped.setdefault((x, p), set()).add(copy)
    return {
        (x, p): _FaultTable(frozenset(dropped.get((x, p), ())), frozenset(poisoned.get((x, p), ())))
        for x in range(n_regions)
        for p in range(partitions)
    }


def _read_rt(
    codec: EnvelopeCodec, directory: Path, topic: str, partition: int, region: int, end: int
) -> tuple[np.ndarray, np.ndarray, list[_Write]]:
    """Offsets and broker times of every record of an RT partition, and its data records. Every offset below
    `end` (truth.json's end offset) must be in the archive: a missing one could be a write of the cut."""
    offsets: list[int] = []
    times: list[int] = []
    writes: list[_Write] = []
    for batch in archive.iter_partition(str(directory), topic, partition):
        for rec in iter_records(batch, codec):
            offsets.append(rec.offset)
            times.append(rec.ms)
            k = rec.kind
            if k is not Kind.PUT and k is not Kind.DELETE:
                continue
            pm = rec.env["producerMetadata"]
            lts = pm["logicalTimestamp"]
            value = rec.env["payloadUnion"][1]["putValue"] if k is Kind.PUT else None
            writes.append(
                _Write(
                    region,
                    rec.offset,
                    rec.ms,
                    rec.key[1:],
                    value,
                    lts if lts >= 0 else pm["messageTimestamp"],  # the leader's DCR timestamp (sim.leader)
                )
            )
    off = np.asarray(offsets, dtype=np.int64)
    if len(off) != end or (end and (off[0] != 0 or off[-1] != end - 1)):
        have = f"{len(off)} records" + (f", offsets {off[0]}..{off[-1]}" if len(off) else "")
        raise TruthError(
            f"{directory}: {topic}[{partition}] should hold offsets 0..{end - 1} (truth.json run.end_offsets), "
            f"it holds {have}: the archive is incomplete"
        )
    return off, np.asarray(times, dtype=np.int64), writes


def _read_bulk(codec: EnvelopeCodec, directory: Path, topic: str, partition: int, eop: int) -> State:
    """The bulk load of a VT partition: its data records before End of Push (the push job's, the same in every
    region; compaction faults only touch records after End of Push)."""
    out: State = {}
    for batch in archive.iter_partition(str(directory), topic, partition, end=eop):
        for rec in iter_records(batch, codec):
            k = rec.kind
            if k is Kind.PUT:
                out[(partition, rec.key[1:])] = KeyState(
                    "PUT", rec.env["payloadUnion"][1]["putValue"], None, None, None
                )
            elif k is Kind.DELETE:
                out[(partition, rec.key[1:])] = KeyState("DELETE", None, None, None, None)
    return out
