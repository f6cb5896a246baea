"""The demo's consistent cut (issue 40): `tidegauge cut` in the middle of the run, checked against the simulator.

A cut is only worth trusting if "what region X held at T" is right for every key, the keys a fault touched
included, and if the changes after the cut complete it into what X ends with. The simulator knows both answers on
its own (`sim.truth_at`: it recomputes each region's state from the RT archives, its conflict resolution and the
faults, with no product code), so the demo asks the product and compares:

* `tidegauge cut --rt ... --snapshot X` at T, the middle of the online writes (exact: C from the RT timestamps),
  for two regions: one where an injected fault lost or poisoned a write at or below the cut (the faulted region)
  and one the same fault spared. Each snapshot must equal the simulator's state of that region at T, key for key
  (the fault's key then differs between the two, as it did in the stores); cut.json's C must be the simulator's;
* `tidegauge changes --from-cut` on each region's VT: the snapshot with those changes applied in VT order must
  equal the region's final state (the simulator's, once every write, the repair's too, is in).

Outputs: OUT/cut/region-<X>/ (the cut's output: cut.json, snapshot/, summary.json) and OUT/cut/changes-<X>/.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from div import keys
from heartbeat.cuts import Cut, format_time

Row = tuple[str, bytes | None, int | None, int | None, int | None]
"""What a region holds for a key, as the snapshot columns say it: op, value, logical_ts, upstream_region,
upstream_offset (`sim.truth_at.KeyState`'s fields, so both sides compare as tuples)."""

States = Mapping[tuple[int, bytes], Row]


class CutFault(NamedTuple):
    """The injected fault the two snapshots are chosen for: its key, the RT write it is about, the region where
    that write was lost or poisoned and one that applied it as written."""

    id: int
    kind: str
    partition: int
    key: bytes
    origin: tuple[int, int]  # the write's (region, RT offset)
    faulted: int
    spared: int
    written: Row | None = None  # what the spared region holds for the key at the cut (the write, as written)

    def title(self) -> str:
        return f"#{self.id} {self.kind}"


def midpoint(run: Mapping[str, Any]) -> int:
    """The cut's time: the middle of the online writes (simulated clock, epoch ms)."""
    return (int(run["start_ms"]) + int(run["last_write_ms"])) // 2


def _candidates(truth: Mapping[str, Any], at_ms: int) -> list[CutFault]:
    """The dropped and poisoned faults whose write is at or before `at_ms`, earliest first (a write dropped in
    several regions: one candidate per region that lost it)."""
    out = []
    for f in sorted(truth.get("faults", []), key=lambda f: f.get("time_ms") or 0):
        if f.get("time_ms") is None or f["time_ms"] > at_ms or f.get("key") is None:
            continue
        d = f.get("detail") or {}
        if f["kind"] == "dropped":
            origin = int(f["region"])
            for lost in sorted({int(x) for x in d.get("dropped_in", [])} - {origin}):
                out.append(
                    CutFault(
                        f["id"],
                        "dropped",
                        int(f["partition"]),
                        bytes.fromhex(f["key"]),
                        (origin, int(f["rt_offset"])),
                        lost,
                        origin,
                    )
                )
        elif f["kind"] == "poisoned":
            origin, bad = int(d["origin_region"]), int(d["poisoned_in"])
            if origin != bad:
                out.append(
                    CutFault(
                        f["id"],
                        "poisoned",
                        int(f["partition"]),
                        bytes.fromhex(f["key"]),
                        (origin, int(f["rt_offset"])),
                        bad,
                        origin,
                    )
                )
    return out


def compacted_regions(truth: Mapping[str, Any]) -> set[int]:
    """The regions whose VT a compaction fault shortened. There `tidegauge cut --snapshot` resolves every key whose
    newer record the cleaner may have removed from the RT writes (the store's state at the cut, not this region's:
    a write the region dropped would be back in its snapshot), so the demo shows a fault in other regions."""
    return {int(f["region"]) for f in truth.get("faults", []) if f.get("kind") == "compaction"}


def choose_fault(truth: Mapping[str, Any], at_ms: int, state_at: Any) -> CutFault | None:
    """The first dropped or poisoned fault still visible at the cut, in regions no compaction touched: the spared
    region holds the fault's write (no later write at or below the cut replaced it) and the faulted region holds
    something else for the key. `state_at(region)` gives the simulator's state of a region at the cut."""
    avoid = compacted_regions(truth)
    for f in _candidates(truth, at_ms):
        if f.spared in avoid or f.faulted in avoid:
            continue
        spared, faulted = state_at(f.spared), state_at(f.faulted)
        held = spared.get((f.partition, f.key))
        if held is not None and tuple(held[3:5]) == f.origin and faulted.get((f.partition, f.key)) != held:
            return f._replace(written=tuple(held))
    return None


AFTER_FAULT_MS = 250  # a cut this long after a fault's write holds it in every region's C


def choose_cut(truth: Mapping[str, Any], state_at: Any) -> tuple[int, CutFault | None]:
    """The cut's time and the fault it shows: the middle of the online writes, or, when no fault is visible there
    yet, just after the first later fault's write that is. `state_at(region, at_ms)`: the simulator's state."""
    run = truth["run"]
    times = [midpoint(run)] + sorted(
        int(f["time_ms"]) + AFTER_FAULT_MS
        for f in truth.get("faults", [])
        if f.get("kind") in ("dropped", "poisoned")
        and f.get("time_ms") is not None
        and midpoint(run) < int(f["time_ms"]) + AFTER_FAULT_MS <= int(run["last_write_ms"])
    )
    for at_ms in times:
        fault = choose_fault(truth, at_ms, lambda x, t=at_ms: state_at(x, t))
        if fault is not None:
            return at_ms, fault
    return times[0], None


# -- reading the product's outputs -------------------------------------------------------------------------------


def read_snapshot(snapshot_dir: Path) -> tuple[dict[tuple[int, bytes], Row], int]:
    """A `cut --snapshot` table as {(partition, key): row}, and how many of its rows are not exact."""
    import pyarrow.parquet as pq

    rows = pq.read_table(snapshot_dir).to_pylist()
    state = {
        (r["partition"], r["key"]): (
            r["op"],
            r["value"],
            r["logical_ts"],
            r["upstream_region"],
            r["upstream_offset"],
        )
        for r in rows
    }
    return state, sum(1 for r in rows if not r["exact"])


def apply_changes(state: States, changes_dir: Path) -> tuple[dict[tuple[int, bytes], Row], int]:
    """`state` with the change events of a `changes --from-cut` output applied in VT order (per partition) with
    Venice's DCR, as a client applies them onto a snapshot (docs/cut.md); and how many. Not by replacing the row: a
    write of the cut that beat one above it which reached the leader first is in the snapshot, but comes after that
    one in the VT, where the stream (W = C) drops it."""
    import pyarrow.parquet as pq

    from leapfrog.repair import Record, dcr_apply

    out = dict(state)
    files = sorted(changes_dir.glob("*.parquet"))
    events = [r for f in files for r in pq.read_table(f).to_pylist()]
    events.sort(key=lambda r: (r["partition"], r["vt_offset"]))
    for e in events:
        k = (e["partition"], e["key"])
        row = out.get(k)
        stored = (
            None if row is None else Record(row[0], row[1], row[2] if row[2] is not None else -1, *row[3:])
        )
        incoming = Record(e["op"], e["value"], e["logical_ts"], e["upstream_region"], e["upstream_offset"])
        won = dcr_apply(stored, incoming)
        out[k] = (won.op, won.value if won.op == "PUT" else None, won.logical_ts, won.region, won.offset)
    return out, len(events)


# -- the checks -------------------------------------------------------------------------------------------------


def _key_text(key: bytes) -> str:
    text = keys.readable(key)
    return key.hex() if text is None else repr(text)


def _row_text(row: Row | None) -> str:
    if row is None:
        return "absent"
    where = "bulk load" if row[3] is None else f"dc-{row[3]}@{row[4]}"
    return f"{row[0]} from {where}"


FIELDS = ("op", "value", "logical_ts", "upstream_region", "upstream_offset")


def _comparable(row: Row | None) -> tuple | None:
    """A row as compared: a bulk-load record's logical_ts left out (the snapshot carries the push job's
    timestamp, the simulator's truth none: neither is a write's DCR timestamp)."""
    if row is None:
        return None
    row = tuple(row)
    return row if row[3] is not None else (row[0], row[1], None, None, None)


def differences(got: States, want: States) -> list[str]:
    """The keys on which two states disagree, each as `partition:key is ..., the truth ...`, in key order."""
    out = []
    for k in sorted(set(got) | set(want)):
        a, b = _comparable(got.get(k)), _comparable(want.get(k))
        if a != b:
            if a is None or b is None or a[3:] != b[3:]:
                detail = _row_text(a)
            else:
                fields = [f for f, x, y in zip(FIELDS, a, b, strict=True) if x != y]
                detail = f"{_row_text(a)} with another {' and '.join(fields)}"
            out.append(f"{k[0]}:{_key_text(k[1])} is {detail}, the truth {_row_text(b)}")
    return out


def _some(items: list[str], n: int = 3) -> str:
    return "; ".join(items[:n]) + (f"; ... ({len(items) - n} more)" if len(items) > n else "")


def check_snapshot(
    region: int, got: States, want: States, not_exact: int, fault: CutFault | None
) -> tuple[bool, str]:
    """Region `region`'s snapshot against the simulator's state of that region at the cut: every key equal, none
    left not exact, and the fault's key as the fault left it. Returns (ok, the check's detail)."""
    diff = differences(got, want)
    problems = []
    if diff:
        problems.append(f"{len(diff)} of {len(want):,} keys differ from the truth: {_some(diff)}")
    if not_exact:
        problems.append(f"{not_exact} rows not exact (with --rt every key must be)")
    note = ""
    if fault is not None:
        k = (fault.partition, fault.key)
        held = None if got.get(k) is None else tuple(got[k])
        origin = f"dc-{fault.origin[0]}@{fault.origin[1]}"
        if region == fault.spared:
            shows = held == fault.written
            how = f"holds its write {origin}" if shows else f"{_row_text(held)}, not its write {origin}"
        else:
            shows = held != fault.written
            lost = "poisoned" if fault.kind == "poisoned" else "lost"
            how = (
                f"{_row_text(held)}{' with another value' if held and held[3:5] == fault.origin else ''} "
                f"(its write {origin} {lost} here)"
                if shows
                else f"holds the write {origin} as written: the fault is not seen"
            )
        note = f"; {fault.title()} key {_key_text(fault.key)}: {how}"
        if not shows:
            problems.append(f"{fault.title()} key {_key_text(fault.key)}: {how}")
    if problems:
        return False, "; ".join(problems)
    return True, f"{len(got):,} keys, each equal to the simulator's state of region {region} at the cut{note}"


def check_replay(region: int, got: States, want: States, changes: int) -> tuple[bool, str]:
    """A snapshot with `changes --from-cut`'s events applied against the region's final state."""
    diff = differences(got, want)
    if diff:
        return False, f"{len(diff)} of {len(want):,} keys differ from the final state: {_some(diff)}"
    return (
        True,
        f"{changes:,} changes after the cut applied on the snapshot give its final state ({len(want):,} keys)",
    )


# -- the step --------------------------------------------------------------------------------------------------


class CutStep(NamedTuple):
    """What the step did: its one-line result and its checks, as (ok, subject, detail)."""

    result: str
    checks: list[tuple[bool, str, str]]


def run_cut_step(out: Path, truth: Mapping[str, Any]) -> CutStep:
    """`tidegauge cut` (exact, --rt) at the middle of the run with a snapshot of the faulted and the spared region,
    `changes --from-cut` on each region's VT, all in this process; then the checks against `sim.truth_at`."""
    from pipelines.changes.job import ChangesOptions
    from pipelines.changes.job import run_local as changes
    from pipelines.core.sources import SourceSpec
    from pipelines.cut.job import CutOptions
    from pipelines.cut.job import run_local as cut
    from sim.truth_at import RunTruth

    run = truth["run"]
    sim_truth = RunTruth.load(out / "sim")
    states: dict[tuple[int, int], Any] = {}

    def state_at(x: int, at_ms: int) -> Any:
        if (x, at_ms) not in states:
            states[(x, at_ms)] = sim_truth.state_at(x, at_ms)
        return states[(x, at_ms)]

    at_ms, fault = choose_cut(truth, state_at)
    true_cut = sim_truth.cut(at_ms)
    if fault is None:
        regions = [x for x in range(sim_truth.regions) if x not in compacted_regions(truth)][:2]
        checks = [
            (
                False,
                "cut",
                f"no dropped or poisoned fault is visible at {format_time(at_ms)}: nothing to show",
            )
        ]
    else:
        regions = sorted({fault.faulted, fault.spared})
        checks = []
    archives = [SourceSpec(x, str(out / "sim" / "archive" / f"dc-{x}")) for x in range(run["regions"])]
    snapshots, replays = {}, {}
    for x in regions:
        cut_dir, changes_dir = out / "cut" / f"region-{x}", out / "cut" / f"changes-{x}"
        with contextlib.redirect_stdout(sys.stderr):  # their pages go to demo.log with the logs
            code = cut(
                CutOptions(
                    sources=archives,
                    rts=archives,
                    at_ms=at_ms,
                    out=str(cut_dir),
                    store=run["store"],
                    version=run["version"],
                    snapshot=x,
                )
            )
            if code != 0:
                raise RuntimeError(
                    f"tidegauge cut --snapshot {x} exited with {code} (see {cut_dir}/summary.json)"
                )
            code = changes(
                ChangesOptions(
                    store=run["store"],
                    version=run["version"],
                    source=archives[x],
                    out=str(changes_dir),
                    region_given=True,
                    from_cut=str(cut_dir / "cut.json"),
                )
            )
            if code != 0:
                raise RuntimeError(f"tidegauge changes --from-cut exited with {code} (see {changes_dir})")
        snapshots[x] = read_snapshot(cut_dir / "snapshot")
        replays[x] = apply_changes(snapshots[x][0], changes_dir / "changes")
    got_cut = Cut.from_json((out / "cut" / f"region-{regions[0]}" / "cut.json").read_text())
    c_diff = [p for p in true_cut if tuple(got_cut.vector(p, sim_truth.regions)) != tuple(true_cut[p])]
    subject = f"cut at {format_time(at_ms)}"
    checks.append(
        (
            not c_diff,
            subject,
            f"C differs from the simulator's in partition(s) {', '.join(map(str, c_diff))}"
            if c_diff
            else f"C, exact from the RT timestamps, equals the simulator's in all {len(true_cut)} partitions",
        )
    )
    for x in regions:
        state, not_exact = snapshots[x]
        ok, detail = check_snapshot(x, state, state_at(x, at_ms), not_exact, fault)
        checks.append((ok, f"region {x}'s snapshot at the cut", detail))
    for x in regions:
        final, n = replays[x]
        ok, detail = check_replay(x, final, sim_truth.final_state(x), n)
        checks.append((ok, f"region {x}'s snapshot + changes --from-cut", detail))
    result = (
        f"at {format_time(at_ms)}, exact (--rt: C from the RT timestamps); snapshots: "
        + ", ".join(f"region {x} {len(snapshots[x][0]):,} keys" for x in regions)
        + (
            f" ({fault.title()}'s write lost in region {fault.faulted})"
            if fault and fault.kind == "dropped"
            else ""
        )
        + (
            f" ({fault.title()}'s write poisoned in region {fault.faulted})"
            if fault and fault.kind == "poisoned"
            else ""
        )
        + "; changes after the cut: "
        + ", ".join(f"region {x} {replays[x][1]:,}" for x in regions)
    )
    return CutStep(result, checks)
