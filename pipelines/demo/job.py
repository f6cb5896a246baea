"""`tidegauge demo`: the whole nightly job on embedded defaults, for someone who has just installed tidegauge.

It simulates a three-region store on embedded Kafka clusters (or, with `--kafka real`, on an Apache Kafka broker
per region started on loopback) with faults whose consequences are known
(`sim`, which writes them to truth.json), runs every job on the archives in one process — `lag`, `leapfrog`,
`div validate`, `div restore`, `report`, `cut`, the Spark ones on one SparkSession — and then checks the jobs
against the truth: every injected fault must be found by the finding truth.json names, and nothing else may be found.
That check is what makes the demo worth more than a screenshot: it is a small end-to-end acceptance test that
anyone can run and read.

Layout of the output directory (the same as a nightly deployment would have, one directory per job):

    OUT/sim/        the simulation: archive/dc-<id>/ (Parquet), truth.json, summary.json, followers/
    OUT/lag/        `tidegauge lag`          OUT/leapfrog/   `tidegauge leapfrog`
    OUT/div/        `tidegauge div validate` OUT/restore/    `tidegauge div restore`
    OUT/report/     report.html, report.json OUT/history/    the report's history (kept across demo runs)
    OUT/cut/        `tidegauge cut` at the middle of the run (region-<X>/: cut.json, snapshot/) and
                    `tidegauge changes --from-cut` (changes-<X>/), checked against the simulator's truth
    OUT/demo.json   steps, timings and the fault check;      OUT/demo.log   everything the jobs logged
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from div import keys
from pipelines.core import interrupts
from pipelines.core.errors import EXIT_CLEAN as EXIT_MATCH
from pipelines.core.errors import EXIT_FINDINGS as EXIT_MISMATCH
from pipelines.core.errors import EXIT_INTERRUPTED
from pipelines.core.errors import EXIT_PARTIAL as EXIT_STEP_FAILED
from pipelines.core.progress import duration
from sim.config import QuietPeriod, SimConfig

DEMO_FAULTS = {
    "dropped": 2,
    "poisoned": 1,
    "failover": 1,
    "duplicate": 1,
    "gap": 1,
    "corrupt": 1,
    "compaction": 1,
}
"""Every fault kind the jobs can find (dropped, poisoned: leapfrog; gap, corrupt, duplicate: div validate) and
the ones they must stay quiet about (failover, compaction). Broker outages are left out: they only cost time."""

MARKER = "demo.json"  # an output directory holding it is a demo's, which a new demo run may replace


class DemoError(Exception):
    """The demo cannot start (a bad --out, no Java); the message says what to do. Exit code 2."""


@dataclass
class DemoOptions:
    out: str = "tidegauge-demo"
    seed: int = 1
    records: int = 12_000  # online writes, all regions together
    partitions: int = 3
    verbose: bool = False  # leave job logs on stderr instead of OUT/demo.log
    master: str | None = None  # Spark master (default local[*])
    kafka: str = "mock"  # the regions' clusters: librdkafka's mock ("mock") or Apache Kafka brokers ("real")
    brokers_per_region: int = 1  # with kafka="real"


@dataclass
class Check:
    """One line of the fault check: `ok`, what was checked and which findings prove it. `judged`: False for a
    measure the run could not judge fairly (the live demo's timing goals on an overloaded host): shown with `–`,
    and it does not fail the run."""

    ok: bool
    subject: str
    detail: str
    judged: bool = True

    def line(self) -> str:
        mark = "✓" if self.ok else ("✗" if self.judged else "–")
        return f"{mark} {self.subject}: {self.detail}"


@dataclass
class Step:
    name: str
    seconds: float
    result: str
    ok: bool = True


@dataclass
class DemoResult:
    out: Path
    exit_code: int
    elapsed_s: float
    steps: list[Step] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    report_html: Path | None = None

    @property
    def matched(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


def demo_config(
    out: str,
    seed: int = 1,
    records: int = 12_000,
    partitions: int = 3,
    kafka: str = "mock",
    brokers_per_region: int = 1,
) -> SimConfig:
    """The demo's simulation: small enough for a couple of minutes on 2 cores, with every fault kind the jobs
    can find, a leader failover, uneven replication lag and a quiet region (which keeps heartbeating); on the
    mock or on real brokers (`kafka`)."""
    return SimConfig(
        out=out,
        brokers=kafka,
        brokers_per_region=brokers_per_region,
        seed=seed,
        regions=3,
        partitions=partitions,
        records=records,
        keys=max(1_000, records // 3),
        batch_records=300,
        write_rate=[1000.0],
        heartbeat_every_records=200,
        heartbeat_every_ms=500,
        default_lag_ms=150,
        lag_ms={(0, 2): 600},
        quiet=[QuietPeriod(2, 0.3, 0.5, None)],
        failover_delay_ms=300,
        faults=dict(DEMO_FAULTS),
        step_records=5_000,
        progress=False,
    ).validate()


def _clusters_text(cfg: SimConfig) -> str:
    if cfg.brokers == "mock":
        return "one embedded Kafka cluster each (librdkafka's mock)"
    n = cfg.brokers_per_region
    return "one Apache Kafka broker each" if n == 1 else f"{n} Apache Kafka brokers each"


# -- the fault check ---------------------------------------------------------------------------------------
def _key_text(hex_key: str | None) -> str:
    """A key for people: the Avro string it encodes when it is one (`'key-00000042'`), else its hex."""
    if not hex_key:
        return "-"
    text = keys.readable(bytes.fromhex(hex_key))
    return hex_key if text is None else repr(text)


LeapfrogFinding = tuple[str, int, int, int, str]  # type, region_a, region_b, partition, key hex
DivFinding = tuple[int, str, int, int, str, bool]  # region, topic, partition, offset, type, fatal


def _lf_text(f: LeapfrogFinding) -> str:
    return f"{f[0]} regions {f[1]}-{f[2]} partition {f[3]} key {_key_text(f[4])}"


def _div_text(f: DivFinding) -> str:
    return f"{f[4]}{' (fatal)' if f[5] else ''} in region {f[0]} {f[1]}[{f[2]}] at offset {f[3]}"


def _fault_title(fault: dict) -> str:
    where = f"region {fault['region']}" + (
        "" if fault.get("partition") is None else f" partition {fault['partition']}"
    )
    return f"#{fault['id']} {fault['kind']} ({where})"


def _quiet_fault_detail(fault: dict) -> str:
    d = fault.get("detail") or {}
    if fault["kind"] == "failover":
        return (
            f"the successor (term {d.get('new_leader', {}).get('term')}) resumed from the VT heartbeat at "
            f"offset {d.get('resumed_from_vt_heartbeat_offset')} and re-applied {d.get('reapplied_vt_records')} "
            f"records; no false alarm"
        )
    if fault["kind"] == "compaction":
        lo, hi = (d.get("range") or [None, None])[:2]
        return (
            f"{d.get('removed_records')} superseded records removed from VT offsets {lo}-{hi}; "
            f"no false alarm (DIV with compaction tolerance)"
        )
    if fault["kind"] == "broker":
        return "the region's broker went down and came back; no false alarm"
    return "nothing expected, nothing reported"


def _at(fault: dict, region: int, partition: int) -> bool:
    """Whether a finding in `region` and `partition` is where `fault` happened (None: anywhere)."""
    return (fault.get("region") is None or region == fault["region"]) and (
        fault.get("partition") is None or partition == fault["partition"]
    )


def check_faults(
    truth: dict,
    leapfrog: set[LeapfrogFinding],
    div: set[DivFinding],
    names: tuple[str, str] = ("leapfrog", "div validate"),
) -> list[Check]:
    """Compare the findings of `leapfrog` and `div validate` with truth.json's expectations.

    One check per injected fault — found by exactly the findings its `expect` names, or, for a fault that must
    cause nothing (failover, compaction, broker), no unexpected finding in its region and partition — and one
    per job saying whether it found anything else. Every expected finding belongs to one fault, so a finding
    that no fault expects is a false alarm.
    """
    expected_lf: set[LeapfrogFinding] = set()
    expected_div: set[DivFinding] = set()
    for fault in truth.get("faults", []):
        expected_lf |= {
            (e["type"], e["region_a"], e["region_b"], e["partition"], e["key"])
            for e in fault["expect"]["leapfrog"]
        }
        expected_div |= {
            (e["region"], e["topic"], e["partition"], e["offset"], e["type"], bool(e["fatal"]))
            for e in fault["expect"]["div"]
        }
    # A divergence reported at the expected key and region pair but with another type is the fault's, found
    # wrongly: one ✗ on the fault says so, instead of a false alarm blamed on a neighbour.
    claimed: set[LeapfrogFinding] = set()
    for e in expected_lf - leapfrog:
        claimed |= {f for f in leapfrog - expected_lf if f[1:] == e[1:]}
    extra_lf, extra_div = leapfrog - expected_lf - claimed, div - expected_div
    checks: list[Check] = []
    for fault in truth.get("faults", []):
        want_lf = {
            (e["type"], e["region_a"], e["region_b"], e["partition"], e["key"])
            for e in fault["expect"]["leapfrog"]
        }
        want_div = {
            (e["region"], e["topic"], e["partition"], e["offset"], e["type"], bool(e["fatal"]))
            for e in fault["expect"]["div"]
        }
        title = _fault_title(fault)
        if want_lf or want_div:
            missed: list[str] = []
            for m in sorted(want_lf - leapfrog):
                instead = sorted(f[0] for f in claimed if f[1:] == m[1:])
                missed.append(
                    _lf_text(m) + (f" (reported as {', '.join(instead)} instead)" if instead else "")
                )
            missed += [_div_text(m) for m in sorted(want_div - div)]
            if missed:
                checks.append(Check(False, title, "NOT found: " + "; ".join(missed)))
                continue
            proof = [f"{names[0]} {_lf_text(f)}" for f in sorted(want_lf)]
            proof += [f"{names[1]} {_div_text(f)}" for f in sorted(want_div)]
            checks.append(Check(True, title, "found by " + "; ".join(proof)))
            continue
        near = [
            f"{names[0]} {_lf_text(f)}"
            for f in sorted(extra_lf)
            if _at(fault, f[1], f[3]) or _at(fault, f[2], f[3])
        ]
        near += [f"{names[1]} {_div_text(f)}" for f in sorted(extra_div) if _at(fault, f[0], f[2])]
        if near:
            checks.append(Check(False, title, "a false alarm where it happened: " + _some(near)))
        else:
            checks.append(Check(True, title, _quiet_fault_detail(fault)))
    checks.append(_nothing_else(names[0], len(leapfrog), [_lf_text(f) for f in sorted(extra_lf)]))
    checks.append(_nothing_else(names[1], len(div), [_div_text(f) for f in sorted(extra_div)]))
    return checks


def _nothing_else(job: str, total: int, extra: list[str]) -> Check:
    if not extra:
        return Check(
            True, f"{job}: nothing else", f"each of its {total} finding(s) belongs to an injected fault"
        )
    return Check(False, f"{job}: nothing else", f"{len(extra)} finding(s) no fault explains: {_some(extra)}")


def _some(items: list[str], n: int = 5) -> str:
    return "; ".join(items[:n]) + (f"; ... ({len(items) - n} more)" if len(items) > n else "")


def read_leapfrog_findings(leapfrog_dir: Path) -> set[LeapfrogFinding]:
    import pyarrow.parquet as pq

    path = leapfrog_dir / "inconsistencies"
    if not path.exists():
        return set()
    t = pq.read_table(path, columns=["type", "region_a", "region_b", "partition", "key"]).to_pylist()
    return {(r["type"], r["region_a"], r["region_b"], r["partition"], r["key"].hex()) for r in t}


def read_open_findings(leapfrog_dir: Path) -> set[tuple[int, str]]:
    """(partition, key hex) of the findings a leapfrog output holds open (healed ones: the regions agree again)."""
    import pyarrow.parquet as pq

    path = leapfrog_dir / "inconsistencies"
    if not path.exists():
        return set()
    t = pq.read_table(path, columns=["partition", "key", "status"]).to_pylist()
    return {(r["partition"], r["key"].hex()) for r in t if r["status"] != "healed"}


def read_div_findings(div_dir: Path) -> set[DivFinding]:
    import pyarrow.parquet as pq

    path = div_dir / "errors"
    if not path.exists():
        return set()
    t = pq.read_table(path, columns=["region", "topic", "partition", "offset", "type", "fatal"]).to_pylist()
    return {(r["region"], r["topic"], r["partition"], r["offset"], r["type"], bool(r["fatal"])) for r in t}


def check_repair(truth: dict, repair_dir: Path) -> list[Check]:
    """The repair loop, judged against the truth: the plan holds a write for every divergence an injected fault
    caused and for nothing else, every planned key agrees in every region afterwards (the regions' current
    records, read by `repair verify --source`), and `leapfrog` after the repair finds nothing it had not found
    before it (the repair diverged no key)."""
    import pyarrow.parquet as pq

    plan = {
        (r["partition"], r["key"].hex()): r["op"]
        for r in pq.read_table(repair_dir / "plan" / "plan", columns=["partition", "key", "op"]).to_pylist()
    }
    injected = {
        (e["partition"], e["key"])
        for f in truth.get("faults", [])
        for e in (f.get("expect") or {}).get("leapfrog", [])
    }
    checks = []
    unplanned = sorted(k for k in injected if plan.get(k) in (None, "NONE"))
    extra = sorted(k for k in plan if k not in injected)
    checks.append(
        Check(
            not unplanned and not extra,
            "repair plan: a write for every injected divergence, and nothing else",
            f"{len(plan)} keys planned, {len(injected)} injected"
            + (
                f"; without a write: {_some([f'{p}:{_key_text(k)}' for p, k in unplanned])}"
                if unplanned
                else ""
            )
            + (f"; not injected: {_some([f'{p}:{_key_text(k)}' for p, k in extra])}" if extra else ""),
        )
    )
    verified = json.loads((repair_dir / "verify" / "summary.json").read_text())
    converged = verified["by_status"]["converged"]
    checks.append(
        Check(
            verified["verdict"] == "converged" and verified["current_records_read"],
            "repair verify: every planned key agrees in every region after the repair",
            f"{converged} of {verified['planned_keys']} converged"
            + "".join(f", {v} {k}" for k, v in verified["by_status"].items() if v and k != "converged"),
        )
    )
    before = {f[3:] for f in read_leapfrog_findings(repair_dir.parent / "leapfrog")}
    after = {f[3:] for f in read_leapfrog_findings(repair_dir / "leapfrog-after")}
    new = sorted(after - before)
    still_open = sorted(read_open_findings(repair_dir / "leapfrog-after"))
    checks.append(
        Check(
            not new and not still_open,
            "leapfrog after the repair: every finding healed, none new",
            f"{len(after)} keys listed, each found before the repair and healed since (Leap Frog lists what it "
            "saw in its range)"
            if not new and not still_open
            else f"{len(new)} new: {_some([f'{p}:{_key_text(k)}' for p, k in new])}; {len(still_open)} still open: "
            f"{_some([f'{p}:{_key_text(k)}' for p, k in still_open])}",
        )
    )
    return checks


def check_report(truth: dict, report_json: dict) -> Check:
    """The report must fail exactly the checks the injected faults break: consistency when a fault expects a
    divergence, nothing else (RT findings are warnings, heartbeats cover every partition, lag and coverage
    stay within their limits in a run that ended cleanly)."""
    divergent = any(f["expect"]["leapfrog"] for f in truth.get("faults", []))
    fatal = any(e["fatal"] for f in truth.get("faults", []) for e in f["expect"]["div"])
    expected = ({"consistency"} if divergent else set()) | ({"integrity"} if fatal else set())
    suites = report_json.get("expectations", {}).get("suites", [])
    failed = {s["name"] for s in suites if s.get("success") is False}
    not_run = {s["name"] for s in suites if s.get("success") is None}
    verdict = report_json.get("verdict", {})
    summary = (
        f"{verdict.get('overall')}: regions {verdict.get('regions', {}).get('status')}, "
        f"logs {verdict.get('logs', {}).get('status')}"
    )
    if failed == expected and not not_run:
        what = ", ".join(sorted(failed)) or "none"
        return Check(
            True, "report", f"{summary}; failed suites: {what} (as the faults require), every other passed"
        )
    problems = []
    if failed - expected:
        problems.append(f"failed {', '.join(sorted(failed - expected))} that no fault breaks")
    if expected - failed:
        problems.append(f"passed {', '.join(sorted(expected - failed))} that the faults break")
    if not_run:
        problems.append(f"did not run {', '.join(sorted(not_run))}")
    return Check(False, "report", f"{summary}; " + "; ".join(problems))


# -- running -------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _logs_to(path: Path, enabled: bool) -> Iterator[None]:
    """Send file descriptor 2 (Python logging, the JVM that Spark starts, worker processes) to `path`, so the
    demo's own lines stay readable; everything is kept there for when something goes wrong."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


class _Progress:
    def __init__(self, total: int, emit: Callable[[str], None]) -> None:
        self.total = total
        self.emit = emit
        self.t0 = time.perf_counter()
        self.steps: list[Step] = []

    @contextlib.contextmanager
    def step(self, name: str, what: str) -> Iterator[list[str]]:
        """Run one step; the caller appends its one-line result to the yielded list."""
        n = len(self.steps) + 1
        self.emit(f"[{n}/{self.total}] {name:<13} {what}")
        result: list[str] = []
        t = time.perf_counter()
        try:
            yield result
        except BaseException:
            self.steps.append(Step(name, time.perf_counter() - t, "failed", ok=False))
            raise
        s = time.perf_counter() - t
        self.steps.append(Step(name, s, "; ".join(result)))
        self.emit(
            f"      {'; '.join(result)}  ({duration(s * 1000)}, {duration((time.perf_counter() - self.t0) * 1000)} so far)"
        )


def prepare_out(out: Path) -> None:
    """Make `out` ready: a new or empty directory, or an earlier demo's (replaced; its report history kept)."""
    if out.exists() and not out.is_dir():
        raise DemoError(f"--out {out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():
            raise DemoError(
                f"--out {out}: the directory is not empty and holds no earlier demo ({MARKER}); "
                f"choose a new or empty directory"
            )
        for child in out.iterdir():
            if child.name == "history":
                continue
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _lag_step(out: Path, truth: dict) -> str:
    """`tidegauge lag` on the archives, measured at the simulation's end (its clock is simulated)."""
    from pipelines.core.sources import SourceSpec
    from pipelines.lag.job import LagOptions
    from pipelines.lag.job import run as lag

    run = truth["run"]
    archives = [SourceSpec(x, str(out / "sim" / "archive" / f"dc-{x}")) for x in range(run["regions"])]
    options = LagOptions(
        sources=archives,
        store=run["store"],
        version=run["version"],
        now_ms=run["end_ms"],
        out=str(out / "lag"),
    )
    table = io.StringIO()
    with contextlib.redirect_stdout(table):  # the full table is kept beside the outputs
        code = lag(options)
    (out / "lag" / "lag.txt").write_text(table.getvalue(), encoding="utf-8")
    if code != EXIT_MATCH:
        raise RuntimeError(f"tidegauge lag exited with {code}")
    rows = json.loads((out / "lag" / "lag.json").read_text())["lag"]
    worst: dict[int, int] = {}
    for r in rows:
        if r["time_lag_ms"] is not None:
            worst[r["vt_region"]] = max(worst.get(r["vt_region"], 0), r["time_lag_ms"])
    behind = sum(r["offset_lag"] or 0 for r in rows)
    return (
        "worst heartbeat lag per region: "
        + ", ".join(f"dc-{x} {ms} ms" for x, ms in sorted(worst.items()))
        + f"; {behind} RT records not yet replicated"
    )


def _replayed_vt_state(archive: str, topic: str, partition: int, upto: int, now_ms: int) -> dict[str, dict]:
    """The VT DIV state after offset `upto` by the slow way — replaying the partition from its first record —
    keyed as in a PartitionState (GUID bytes as Latin-1 text). Compacted ranges are tolerated as a follower of a
    compacted topic tolerates them."""
    from div import archive as A
    from div import envelope as E
    from div.records import iter_records
    from div.validator import PartitionValidator, ValidatorConfig

    codec = E.EnvelopeCodec()
    val = PartitionValidator(config=ValidatorConfig(min_compaction_lag_ms=0, now_ms=now_ms))
    for batch in A.iter_partition(
        archive, topic, partition, None, upto + 1, ["offset", "key", "value", "headers", "timestamp"]
    ):
        for rec in iter_records(batch, codec):
            if rec.env is None:  # the demo's own simulation writes no undecodable record: one is a bug
                raise E.UndecodableError(f"{topic}[{partition}]@{rec.offset}: {rec.error}")
            val.process(rec.offset, rec.key, rec.env, rec.ms, len(rec.value or b""))
    return {g.decode("latin-1"): st for g, st in val.producer_states().items()}


def _same_states(restored: dict[str, dict], reference: dict[str, dict]) -> list[str]:
    """Differences between two producer-state maps, on the fields the reference holds."""
    out = []
    for guid in sorted(set(restored) | set(reference)):
        a, b = restored.get(guid), reference.get(guid)
        if a is None or b is None:
            out.append(
                f"producer {guid.encode('latin-1').hex()} only in the {'reference' if a is None else 'restore'}"
            )
            continue
        out += [
            f"producer {guid.encode('latin-1').hex()} {f}: restored {a.get(f)!r}, expected {b[f]!r}"
            for f in b
            if a.get(f) != b[f]
        ]
    return out


def _restore_step(out: Path, truth: dict, checks: list[Check]) -> str:
    """`tidegauge div restore` for every region and partition, at two offsets: two thirds into the partition
    (compared with a full DIV replay from its first record) and at the follower's last checkpoint (compared with
    that checkpoint, written by the simulated follower that replayed everything). Appends its check to `checks`;
    returns the step's one-line result."""
    from div import partition_state as ps
    from div.checkpoint import CheckpointStore
    from pipelines.core.sources import SourceSpec
    from pipelines.div.restore import RestoreOptions, run_restore

    run = truth["run"]
    topic = run["vt_topic"]
    archives = {x: str(out / "sim" / "archive" / f"dc-{x}") for x in range(run["regions"])}
    rt_sources = [SourceSpec(x, a) for x, a in archives.items()]
    # A replay across a compacted range cannot rebuild the checksums the removed records fed (the heartbeat's
    # state can: its leader saw them), so compacted partitions are compared with their checkpoints only.
    compacted = {(f["region"], f["partition"]) for f in truth.get("faults", []) if f["kind"] == "compaction"}
    problems: list[str] = []
    replayed = restored = 0
    for x, arch in archives.items():
        followers = CheckpointStore(out / "sim" / "followers" / f"dc-{x}")
        for q in range(run["partitions"]):
            checkpoint = followers.load(topic, q)
            end = run["end_offsets"][str(x)][f"{topic}[{q}]"]
            targets = [("the follower's checkpoint", checkpoint["offset"])]
            if (x, q) not in compacted:
                targets.insert(0, ("a full replay", end * 2 // 3))
            for against, at in targets:
                where = out / "restore" / f"dc-{x}" / f"p{q}-at-{at}"
                code = run_restore(
                    RestoreOptions(
                        source=SourceSpec(x, arch),
                        store=run["store"],
                        version=run["version"],
                        partition=q,
                        at=at,
                        out=str(where),
                        rt_sources=rt_sources,
                    )
                )
                summary = json.loads((where / "summary.json").read_text())
                restored += 1
                replayed += summary["vt_records_replayed"]
                if code != EXIT_MATCH or summary["restored_from"] != "heartbeat":
                    problems.append(
                        f"region {x} {topic}[{q}] at {at}: exit {code}, restored from "
                        f"{summary['restored_from']} ({summary.get('fallback_reason')})"
                    )
                    continue
                state = ps.decode((where / "partition_state.bin").read_bytes())["producerStates"]
                if at == checkpoint["offset"]:
                    reference = checkpoint["producerStates"]
                else:
                    reference = _replayed_vt_state(arch, topic, q, at, run["end_ms"])
                diffs = _same_states(state, reference)
                if diffs:
                    problems.append(
                        f"region {x} {topic}[{q}] at {at} differs from {against}: " + "; ".join(diffs[:3])
                    )
    total = sum(
        run["end_offsets"][str(x)][f"{topic}[{q}]"] for x in archives for q in range(run["partitions"])
    )
    if problems:
        checks.append(Check(False, "div restore", _some(problems, 3)))
    else:
        checks.append(
            Check(
                True,
                "div restore",
                f"{restored} states restored from heartbeats equal a full DIV "
                f"replay (two thirds into each partition not compacted) and the "
                f"followers' checkpoints (at the end)",
            )
        )
    return (
        f"{restored} VT DIV states restored from heartbeats ({replayed} records replayed instead of up to "
        f"{total:,}); {'all' if not problems else len(problems)} "
        f"{'equal the reference' if not problems else 'differ from the reference'}"
    )


def check_brokers() -> None:
    """Real brokers need Java and their jars: resolved now (once, from Maven Central; the progress line says
    so), else DemoError saying what to install."""
    from sim.brokers import BrokersError, resolve_jars

    try:
        resolve_jars(progress=lambda line: print(f"tidegauge demo: {line}", flush=True))
    except BrokersError as exc:
        raise DemoError(f"--kafka real: {exc}") from None


def run_demo(opts: DemoOptions, emit: Callable[[str], None] | None = None, spark: Any = None) -> DemoResult:
    """Run the demo; `emit` receives every line meant for the user (default: print). `spark`: a session to use
    (the tests pass theirs); otherwise one is started. Raises DemoError when the demo cannot start."""
    emit = emit or (lambda line: print(line, flush=True))
    from pipelines.core.storage import is_local

    if not is_local(opts.out):
        raise DemoError(f"--out {opts.out}: the demo writes to local disk; give a directory")
    out = Path(str(opts.out).removeprefix("file://")).resolve()
    prepare_out(out)
    from pipelines.core.spark_session import JavaMissingError, check_java

    try:
        java = check_java()
    except JavaMissingError as exc:
        raise DemoError(str(exc)) from None
    log_path = out / "demo.log"
    if opts.kafka == "real":
        check_brokers()
    cfg = demo_config(
        str(out / "sim"), opts.seed, opts.records, opts.partitions, opts.kafka, opts.brokers_per_region
    )
    progress = _Progress(13, emit)
    result = DemoResult(out=out, exit_code=EXIT_STEP_FAILED, elapsed_s=0.0)
    on = "embedded Kafka" if opts.kafka == "mock" else "Apache Kafka brokers"
    emit(f"tidegauge demo: 3 regions on {on}, {cfg.records:,} writes, seed {cfg.seed} -> {out}")
    try:
        with _logs_to(log_path, not opts.verbose):
            _run_steps(opts, cfg, out, progress, result, spark, java)
    except BaseException as exc:
        if interrupts.interrupted() or interrupts.caused_by_interrupt(exc):
            # Ctrl-C (whatever error it turned into in the step it cut short): the marker says so, so that the next
            # demo may replace what this one wrote
            result.exit_code = EXIT_INTERRUPTED
            result.steps = progress.steps
            result.elapsed_s = time.perf_counter() - progress.t0
            _write_marker(out, opts, result)
            raise
        if not isinstance(exc, Exception):
            raise
        # a step crashed: say which, keep the traceback in the log
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(traceback.format_exc())
        where = progress.steps[-1].name if progress.steps and not progress.steps[-1].ok else "setup"
        emit(f"✗ {where} failed: {type(exc).__name__}: {exc}")
        emit(f"  details: {log_path}")
        result.exit_code = EXIT_STEP_FAILED
    result.steps = progress.steps
    result.elapsed_s = time.perf_counter() - progress.t0
    _write_marker(out, opts, result)
    if result.checks:
        _final_block(result, emit)
    return result


def _run_steps(
    opts: DemoOptions,
    cfg: SimConfig,
    out: Path,
    progress: _Progress,
    result: DemoResult,
    spark: Any,
    java: str,
) -> None:
    from pipelines.core.sources import SourceSpec
    from pipelines.core.spark_session import get_session
    from pipelines.demo.repair_loop import WindowedSimulation

    kinds = ", ".join(f"{k}" if v == 1 else f"{k} x{v}" for k, v in cfg.faults.items())
    own_session = spark is None
    simulation = WindowedSimulation(cfg)
    try:
        with progress.step(
            "simulate",
            f"{cfg.regions} regions x {cfg.partitions} partitions, {_clusters_text(cfg)}; faults: {kinds}",
        ) as res:
            window = simulation.start().wait_for_window()
            res.append(
                f"{cfg.records:,} writes replicated; leaders wait in a repair window on the clusters "
                f"({', '.join(r['uri'] for r in window['regions'])})"
            )
        sources = [SourceSpec(r["region"], r["archive"]) for r in window["regions"]]
        with progress.step("spark", f"start one local Spark session for the Spark jobs ({java})") as res:
            spark = spark or get_session(opts.master, app_name="tidegauge-demo")
            res.append(f"Spark {spark.version} on {spark.sparkContext.master}")
        _detect_and_repair(out, window, sources, spark, progress)
        with progress.step(
            "replicate", "every region's leaders apply the repair writes through conflict resolution"
        ) as res:
            sim = simulation.go_on()
            rw = sim.truth.get("repair_window") or {}
            n = sum(v for by_q in (rw.get("rt_records") or {}).values() for v in by_q.values())
            res.append(
                f"{n} records taken from the RTs; VT records per region: "
                + ", ".join(f"dc-{x} {n:,}" for x, n in sorted(sim.summary["vt_records_per_region"].items()))
            )
    except BaseException:
        simulation.abandon()
        raise
    try:
        _run_jobs(out, sim.truth, sources, spark, progress, result)
    finally:
        if own_session and not interrupts.interrupted():  # interrupted: the process ends, and Spark with it
            spark.stop()


def _leapfrog_step(out_dir: Path, run: dict, sources: list, spark: Any, res: list[str]) -> None:
    from pipelines.leapfrog.job import LeapfrogOptions
    from pipelines.leapfrog.job import run as leapfrog

    code = leapfrog(
        LeapfrogOptions(
            store=run["store"], version=run["version"], sources=sources, out=str(out_dir), mode="heartbeat"
        ),
        spark=spark,
    )
    lf = json.loads((out_dir / "summary.json").read_text())
    found = {k: v for k, v in lf["totals"]["open_findings"].items() if v}
    healed = sum(lf["totals"]["healed_findings"].values())
    res.append(
        f"exit {code}: "
        + (", ".join(f"{v} {k}" for k, v in found.items()) or "no open divergence")
        + (f" ({healed} healed)" if healed else "")
        + f"; {lf['totals']['comparable_pairs']:,} value pairs compared, "
        f"{lf['totals']['pending_keys']} keys pending"
    )


def _detect_and_repair(out: Path, window: dict, sources: list, spark: Any, progress: _Progress) -> None:
    """In the simulation's repair window: find the divergences, plan their repair with the RTs as the truth,
    and write the plan into region 0's RT through its cluster, as an operator would."""
    from pipelines.demo.repair_loop import APPLY_REGION
    from pipelines.repair.apply import ApplyOptions
    from pipelines.repair.apply import run as apply
    from pipelines.repair.job import PlanOptions
    from pipelines.repair.job import run as plan

    run = {"store": window["store"], "version": window["version"]}
    with progress.step("leapfrog", "are the regions consistent? (every key, every region pair)") as res:
        _leapfrog_step(out / "leapfrog", run, sources, spark, res)
    with progress.step(
        "repair plan", "for each divergent key, the write that makes every region agree"
    ) as res:
        code = plan(
            PlanOptions(
                store=run["store"],
                version=run["version"],
                sources=sources,
                rts=sources,
                leapfrog=str(out / "leapfrog"),
                out=str(out / "repair" / "plan"),
            )
        )
        ps = json.loads((out / "repair" / "plan" / "summary.json").read_text())
        causes = ", ".join(f"{v} {k}" for k, v in ps["by_cause"].items() if v) or "nothing to repair"
        res.append(f"exit {code}: {ps['divergent_keys']} divergent keys, {ps['writes']} writes ({causes})")
    target = next(r for r in window["regions"] if r["region"] == APPLY_REGION)
    with progress.step(
        "repair apply", f"produce the writes into region {APPLY_REGION}'s RT ({target['uri']})"
    ) as res:
        with contextlib.redirect_stdout(sys.stderr):  # its page goes to demo.log with the logs
            code = apply(
                ApplyOptions(
                    plan=str(out / "repair" / "plan"),
                    region=APPLY_REGION,
                    bootstrap=target["uri"].removeprefix("kafka://"),
                    out=str(out / "repair" / "apply"),
                )
            )
        ap = json.loads((out / "repair" / "apply" / "summary.json").read_text())
        res.append(f"exit {code}: {ap['writes_acknowledged']} of {ap['writes']} writes acknowledged")


def _run_jobs(
    out: Path, truth: dict, sources: list, spark: Any, progress: _Progress, result: DemoResult
) -> None:
    from pipelines.div.validate import ValidateOptions, run_local
    from pipelines.repair.verify import VerifyOptions
    from pipelines.repair.verify import run as verify
    from pipelines.report.job import run_report

    run = truth["run"]

    with progress.step("lag", "how far behind is each region? (VT heartbeats)") as res:
        res.append(_lag_step(out, truth))

    with progress.step("div validate", "are the logs whole? (DIV on every RT and VT of every region)") as res:
        code = run_local(
            ValidateOptions(
                sources=sources, out=str(out / "div"), min_compaction_lag_ms=0, now_ms=run["end_ms"]
            )
        )
        dv = json.loads((out / "div" / "summary.json").read_text())
        res.append(
            f"exit {code}: {dv['records_read']:,} records, "
            + (", ".join(f"{v} {k}" for k, v in dv["findings_by_type"].items()) or "no finding")
            + f", {dv['fatal_findings']} fatal"
        )

    restore_checks: list[Check] = []
    with progress.step(
        "div restore", "rebuild replicas' DIV state from heartbeats, not from offset 0"
    ) as res:
        res.append(_restore_step(out, truth, restore_checks))

    with progress.step("report", "morning report (Great Expectations suites, HTML page)") as res:
        report = run_report(
            out / "leapfrog", out / "div", out / "report", lag_dir=out / "lag", history_dir=out / "history"
        )
        v = report.verdict
        res.append(
            f"{v['overall']}: {v['checks_failed']} of {v['checks_evaluated']} checks failed; regions "
            f"{v['regions']['status']}, logs {v['logs']['status']}"
        )
        result.report_html = report.html_path.local

    with progress.step("leapfrog", "again, on the logs after the repair replicated") as res:
        _leapfrog_step(out / "repair" / "leapfrog-after", run, sources, spark, res)
        before = {f[3:] for f in read_leapfrog_findings(out / "leapfrog")}
        new = {f[3:] for f in read_leapfrog_findings(out / "repair" / "leapfrog-after")} - before
        res.append(
            f"{len(new)} keys not found before the repair"
            + ("" if new else " (it lists what it saw in the whole log, the time before the repair too)")
        )
    with progress.step("repair verify", "does every planned key agree in every region now?") as res:
        with contextlib.redirect_stdout(sys.stderr):  # its page goes to demo.log; verify.txt keeps it
            code = verify(
                VerifyOptions(
                    plan=str(out / "repair" / "plan"),
                    leapfrog=str(out / "repair" / "leapfrog-after"),
                    applied=str(out / "repair" / "apply"),
                    out=str(out / "repair" / "verify"),
                    sources=sources,
                )
            )
        vs = json.loads((out / "repair" / "verify" / "summary.json").read_text())
        res.append(
            f"exit {code}: "
            + ", ".join(f"{v} {k}" for k, v in vs["by_status"].items() if v or k == "converged")
            + f" of {vs['planned_keys']} planned keys"
        )

    cut_checks = _cut_step(out, truth, progress)

    result.checks = check_faults(
        truth, read_leapfrog_findings(out / "leapfrog"), read_div_findings(out / "div")
    )
    result.checks += check_repair(truth, out / "repair")
    result.checks += restore_checks
    result.checks.append(check_report(truth, json.loads(report.json_path.read_text())))
    result.checks += cut_checks
    if truth.get("faults_shortfall"):
        for kind, why in truth["faults_shortfall"].items():
            result.checks.append(Check(False, f"{kind} not injected as requested", why))
    result.exit_code = EXIT_MATCH if result.matched else EXIT_MISMATCH


def _cut_step(out: Path, truth: dict, progress: _Progress) -> list[Check]:
    """`tidegauge cut` in the middle of the run and `changes --from-cut`, checked against the simulator's truth
    at that time (`pipelines.demo.cut_step`)."""
    from pipelines.demo.cut_step import run_cut_step

    with progress.step(
        "cut", "what did two regions hold in the middle of the run? (snapshots, then the changes after)"
    ) as res:
        step = run_cut_step(out, truth)
        res.append(step.result)
    return [Check(ok, subject, detail) for ok, subject, detail in step.checks]


def _final_block(result: DemoResult, emit: Callable[[str], None]) -> None:
    emit("")
    emit("Fault check (OUT/sim/truth.json vs the findings of the jobs):")
    for c in result.checks:
        emit("  " + c.line())
    emit("")
    if result.report_html is not None:
        emit(f"Report: {result.report_html}")
        emit(f"        {result.report_html.as_uri()}")
    ok = result.exit_code == EXIT_MATCH
    emit(
        f"{'Every injected fault was found, nothing else, and the repair made the regions agree' if ok else 'MISMATCH: see the ✗ lines above'} "
        f"({duration(result.elapsed_s * 1000)}). Outputs of every job: {result.out}"
    )


def _write_marker(out: Path, opts: DemoOptions, result: DemoResult) -> None:
    data = {
        "job": "demo",
        "options": asdict(opts),
        "exit_code": result.exit_code,
        "elapsed_s": round(result.elapsed_s, 3),
        "steps": [asdict(s) | {"seconds": round(s.seconds, 3)} for s in result.steps],
        "fault_check": [asdict(c) for c in result.checks],
        "all_faults_found_and_nothing_else": result.matched,
        "report": str(result.report_html) if result.report_html else None,
    }
    tmp = out / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, out / MARKER)
