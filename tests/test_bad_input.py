"""Bad input, as a property: every job, on archives damaged every way tests/support/damage.py knows, keeps the contract.

One small simulation (3 regions, a dropped and a poisoned write, so the undamaged run has real findings) is the
truth. Hypothesis damages one region's archive (random bytes, truncation, bit flips and nulls in keys, values and
headers; reordered, foreign-topic and repeated rows; files in another schema, empty and zero-byte files) and runs
each job on it through the CLI, in this process. The properties:

- no traceback and no "internal error": the exit code is one of the contract's (0, 1, 2, 3) and the one the
  damage calls for: 2 when the source is unusable, else 1 with findings, else 3 when a record was undecodable;
- every undecodable record is counted with its offset (leapfrog's and div validate's summaries, or an
  UNDECODABLE row);
- Safe under damage: no finding the undamaged input would not produce, except about a record that was altered
  so that it still decodes (its offset or its key) — no reader can tell such a record from the truth.

Bounded for CI: a few examples per job (the simulation and the baselines are computed once per module).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from damage import ALTERED, KINDS, RECORD_KINDS, UNDECODABLE, UNUSABLE, Damage, damage_archive, read_archive
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from small_sim import small_sim

from div.validator import NOT_FINDINGS
from pipelines.cli import main
from pipelines.core.evidence import MAX_LISTED_OFFSETS

pytestmark = [pytest.mark.slow]
REGIONS = 3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-input")
    sim = small_sim(root / "sim", regions=REGIONS, faults={"dropped": 1, "poisoned": 1})
    return {
        "root": root,
        "archives": sim.archives,
        "store": sim.store,
        "version": sim.version,
        "topic": sim.topic,
        "n": [0],
    }


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def _fresh(world, name: str) -> Path:
    world["n"][0] += 1
    return world["root"] / f"{name}-{world['n'][0]}"


def _damaged_sources(world, region: int, damages: list[Damage]):
    dst = _fresh(world, f"dc-{region}-damaged")
    other = world["archives"][(region + 1) % REGIONS]
    truth = damage_archive(world["archives"][region], dst, damages, other=other)
    archives = dict(world["archives"])
    archives[region] = str(dst)
    return archives, truth


def _check_contract(code: int, err: str, truth) -> None:
    assert "Traceback" not in err and "internal error" not in err, err
    assert code in (0, 1, 2, 3), err
    if truth.unusable:
        assert code == 2, f"an unusable source must be exit 2, got {code}: {err}"
        assert len([ln for ln in err.splitlines() if "error" in ln.lower()]) >= 1


# ---- leapfrog ----------------------------------------------------------------------------------------------------


def _leapfrog(world, archives, out: Path) -> tuple[int, str]:
    argv = ["leapfrog", "--store", world["store"], "--version", str(world["version"]), "--out", str(out)]
    for r, a in sorted(archives.items()):
        argv += ["--source", f"{r}={a}"]
    return _cli(argv)


def _leapfrog_findings(out: Path) -> list[dict]:
    return pq.read_table(out / "inconsistencies").to_pylist()


def _finding_id(f: dict) -> tuple:
    return (f["type"], f["region_a"], f["region_b"], f["partition"], f["key"])


@pytest.fixture(scope="module")
def leapfrog_baseline(world, spark):
    out = _fresh(world, "leapfrog-baseline")
    code, err = _leapfrog(world, world["archives"], out)
    assert code == 1, err  # the simulation's dropped and poisoned writes
    return {_finding_id(f) for f in _leapfrog_findings(out)}


damages = st.lists(
    st.builds(
        Damage, kind=st.sampled_from(sorted(KINDS)), row=st.integers(0, 10**6), seed=st.integers(0, 10**6)
    ),
    min_size=1,
    max_size=4,
)
record_damages = st.lists(
    st.builds(
        Damage,
        kind=st.sampled_from(sorted(RECORD_KINDS)),
        row=st.integers(0, 10**6),
        seed=st.integers(0, 10**6),
    ),
    min_size=1,
    max_size=6,
)
SETTINGS = settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _undecodable_offsets_in(summary: dict) -> set[tuple[int, int]]:
    """(partition, offset) of every undecodable record a summary lists, wherever the job lists them."""
    out = set()
    for e in (summary.get("evidence") or {}).get("by_partition", []):
        out |= {(e["partition"], o) for o in e.get("undecodable_offsets", [])}
    for e in summary.get("by_region", []):
        out |= {(e["partition"], o) for o in e.get("undecodable_offsets", [])}
    return out


@pytest.mark.spark
@SETTINGS
@given(region=st.integers(0, REGIONS - 1), damage=damages)
def test_leapfrog_keeps_the_contract_under_damage(world, leapfrog_baseline, region, damage):
    archives, truth = _damaged_sources(world, region, damage)
    out = _fresh(world, "leapfrog")
    code, err = _leapfrog(world, archives, out)
    _check_contract(code, err, truth)
    if truth.unusable:
        assert not (out / "inconsistencies").exists()
        return
    found = _leapfrog_findings(out)
    altered_offsets = {(p, o) for t, p, o in truth.offsets(ALTERED) if t == world["topic"]}
    for f in found:
        if _finding_id(f) in leapfrog_baseline:
            continue
        own = (
            f["a_vt_offset"]
            if f["region_a"] == region
            else f["b_vt_offset"]
            if f["region_b"] == region
            else None
        )
        damaged_keys = truth.keys()  # Venice keys: the findings name them without their header byte
        assert (
            (f["partition"], own) in altered_offsets
            or f["key"] in damaged_keys
            or b"\x00" + f["key"] in damaged_keys
        ), f"finding not in the undamaged run and not about an altered record: {f}"
    summary = json.loads((out / "summary.json").read_text())
    listed = _undecodable_offsets_in(summary)
    unreadable = {
        (p, o) for t, p, o in truth.offsets(UNDECODABLE) if t == world["topic"]
    }  # leapfrog reads the VT
    for p, o in unreadable:
        assert (p, o) in listed, f"undecodable record at partition {p} offset {o} not counted"
    # the exit code follows the open findings (healed ones are history)
    expected = 1 if any(f["status"] == "open" for f in found) else (3 if unreadable else None)
    if expected is not None:
        assert code == expected, err
    assert summary.get("verdict") == {0: "clean", 1: "findings", 3: "partial"}[code]


# ---- div validate ------------------------------------------------------------------------------------------------


def _div(world, source: str, out: Path, engine: str = "local") -> tuple[int, str]:
    return _cli(
        [
            "div",
            "validate",
            "--source",
            f"0={source}",
            "--topic",
            world["topic"],
            "--out",
            str(out),
            "--now-ms",
            "1800000000000",
            "--engine",
            engine,
        ]
    )


def _div_findings(out: Path) -> list[dict]:
    path = out / "errors"
    return pq.read_table(path).to_pylist() if path.exists() else []


def _div_id(f: dict) -> tuple:
    return (f["topic"], f["partition"], f["offset"], f["type"])


@pytest.fixture(scope="module")
def div_baselines(world):
    base = {}
    for region, src in world["archives"].items():
        out = _fresh(world, f"div-baseline-{region}")
        code, err = _div(world, src, out)
        assert code in (0, 1), err
        base[region] = {_div_id(f) for f in _div_findings(out) if f["type"] != "UNDECODABLE"}
    return base


def _check_div_under_damage(world, div_baselines, region, damage, engine):
    archives, truth = _damaged_sources(world, region, damage)
    out = _fresh(world, f"div-{engine}")
    code, err = _div(world, archives[region], out, engine)
    _check_contract(code, err, truth)
    if truth.unusable:
        return
    rows = _div_findings(out)
    undecodable_rows = {(f["partition"], f["offset"]) for f in rows if f["type"] == "UNDECODABLE"}
    summary = json.loads((out / "summary.json").read_text())
    listed = _undecodable_offsets_in(summary) | undecodable_rows
    unreadable = {(p, o) for t, p, o in truth.offsets(UNDECODABLE) if t == world["topic"]}  # --topic: the VT
    for p, o in unreadable:
        assert (p, o) in listed, f"undecodable record at partition {p} offset {o} not counted"
    first_altered = {}
    for t, p, o in truth.offsets(ALTERED):
        if t == world["topic"]:
            first_altered[p] = min(o, first_altered.get(p, o))
    for f in rows:
        if f["type"] in NOT_FINDINGS or _div_id(f) in div_baselines[region]:
            continue
        # an altered record that still decodes may break its producer's sequence or checksum from there on
        assert f["partition"] in first_altered and f["offset"] >= first_altered[f["partition"]], (
            f"DIV finding not in the undamaged run and before any altered record: {f}"
        )
    fatal = [f for f in rows if f["fatal"]]
    if not fatal and unreadable:
        assert code == 3, err
    assert summary.get("verdict") == {0: "clean", 1: "findings", 3: "partial"}[code]


@SETTINGS
@given(region=st.integers(0, REGIONS - 1), damage=damages)
def test_div_validate_keeps_the_contract_under_damage(world, div_baselines, region, damage):
    _check_div_under_damage(world, div_baselines, region, damage, "local")


@pytest.mark.spark
@settings(SETTINGS, max_examples=3)
@given(region=st.integers(0, REGIONS - 1), damage=damages)
def test_div_validate_on_spark_keeps_the_contract_under_damage(world, div_baselines, spark, region, damage):
    _check_div_under_damage(world, div_baselines, region, damage, "spark")


# ---- div restore -------------------------------------------------------------------------------------------------

RESTORE_PARTITION = 1


def _restore(world, archives, region: int, at: int, out: Path) -> tuple[int, str]:
    argv = [
        "div",
        "restore",
        "--store",
        world["store"],
        "--version",
        str(world["version"]),
        "--partition",
        str(RESTORE_PARTITION),
        "--at-offset",
        str(at),
        "--out",
        str(out),
        "--source",
        f"{region}={archives[region]}",
    ]
    for r, a in sorted(archives.items()):
        argv += ["--rt-source", f"{r}={a}"]
    return _cli(argv)


@SETTINGS
@given(region=st.integers(0, REGIONS - 1), damage=damages, where=st.floats(0.3, 1.0))
def test_div_restore_keeps_the_contract_under_damage(world, region, damage, where):
    rows = read_archive(world["archives"][region]).to_pylist()  # in the order Damage.row indexes
    vt = [r["offset"] for r in rows if r["topic"] == world["topic"] and r["partition"] == RESTORE_PARTITION]
    at = vt[min(len(vt) - 1, int(where * len(vt)))]
    # aim the record damage at the last records before the offset, where the replay reads
    window = [
        i
        for i, r in enumerate(rows)
        if r["topic"] == world["topic"]
        and r["partition"] == RESTORE_PARTITION
        and at - 30 <= r["offset"] <= at
    ]
    damage = [
        Damage(d.kind, window[d.row % len(window)], d.seed) if d.kind in RECORD_KINDS else d for d in damage
    ]
    archives, truth = _damaged_sources(world, region, damage)
    out = _fresh(world, "restore")
    code, err = _restore(world, archives, region, at, out)
    _check_contract(code, err, truth)
    assert code in (0, 2, 3), err  # a restore reports no findings
    if truth.unusable:
        return
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == {0: "clean", 3: "partial"}[code]
    replays = summary["evidence"]["by_partition"]
    # every undecodable record inside a replayed range is counted with its offset, and makes the restore partial
    for topic, p, o in truth.offsets(UNDECODABLE):
        for e in replays:  # the damaged archive is `region`'s: its VT replay and its RT replay read it
            start, end = e["planned_offsets"]
            if p == RESTORE_PARTITION and e["topic"] == topic and e["region"] == region and start <= o < end:
                assert o in e["undecodable_offsets"] or len(e["undecodable_offsets"]) == MAX_LISTED_OFFSETS, (
                    f"undecodable record {topic}[{p}]@{o} in a replayed range not counted: {e}"
                )
                assert code == 3, err
    if code == 0:
        assert all(e["undecodable"] == 0 and not e["short"] for e in replays)
    assert (out / "partition_state.bin").exists() and (out / "state.json").exists()


# ---- report ------------------------------------------------------------------------------------------------------


@pytest.mark.spark
@settings(SETTINGS, max_examples=3)
@given(region=st.integers(0, REGIONS - 1), damage=record_damages)
def test_report_keeps_the_contract_over_damaged_runs(world, spark, region, damage):
    """The report over the jobs' outputs on a damaged archive: no traceback, FAIL only for what the jobs found,
    PARTIAL when they read partial evidence, never PASS over records they could not decode."""
    archives, truth = _damaged_sources(world, region, damage)
    lf, dv, rep = _fresh(world, "rep-lf"), _fresh(world, "rep-div"), _fresh(world, "rep")
    lf_code, err = _leapfrog(world, archives, lf)
    _check_contract(lf_code, err, truth)
    div_code, err = _div(world, archives[region], dv)
    _check_contract(div_code, err, truth)
    code, err = _cli(["report", "--leapfrog", str(lf), "--div", str(dv), "--out", str(rep)])
    _check_contract(code, err, truth)
    report = json.loads((rep / "report.json").read_text())
    assert report["verdict"]["overall"] == {0: "PASS", 1: "FAIL", 3: "PARTIAL"}[code]
    if 1 in (lf_code, div_code):
        assert code == 1, err  # the simulation's divergences (and any DIV finding) are checks that fail
    elif 3 in (lf_code, div_code):
        assert code == 3, err
    if any(t == world["topic"] for t, _, _ in truth.offsets(UNDECODABLE)):
        assert code != 0 and report["verdict"]["overall"] != "PASS"


# ---- lag ---------------------------------------------------------------------------------------------------------


@SETTINGS
@given(region=st.integers(0, REGIONS - 1), damage=damages)
def test_lag_keeps_the_contract_under_damage(world, region, damage):
    archives, truth = _damaged_sources(world, region, damage)
    out = _fresh(world, "lag")
    argv = ["lag", "--store", world["store"], "--version", str(world["version"]), "--out", str(out)]
    for r, a in sorted(archives.items()):
        argv += ["--source", f"{r}={a}"]
    code, err = _cli(argv)
    _check_contract(code, err, truth)
    if not truth.unusable and any(t == world["topic"] for t, _, _ in truth.offsets(UNDECODABLE)):
        assert code == 3, err  # lag reads the VT; the archives' RT records are not its evidence


def test_damage_kinds_are_all_applied(world, tmp_path):
    """The generator itself: every record kind changes the record it names, and the truth says so."""
    src = world["archives"][0]
    before = read_archive(src).to_pylist()
    for i, kind in enumerate(sorted(RECORD_KINDS)):
        row = next(j for j, r in enumerate(before) if r["headers"]) if kind.startswith("header") else 17
        truth = damage_archive(src, tmp_path / kind, [Damage(kind, row=row, seed=i)])
        after = read_archive(tmp_path / kind).to_pylist()
        assert len(truth.records) == 1 and truth.records[0].cls == KINDS[kind]
        changed = [j for j, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
        assert changed == [row], kind
    truth = damage_archive(src, tmp_path / "dup", [Damage("duplicate_offsets")], other=world["archives"][1])
    assert truth.unusable and UNUSABLE in truth.classes
    shutil.rmtree(tmp_path / "dup")
