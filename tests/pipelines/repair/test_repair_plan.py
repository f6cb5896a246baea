"""`tidegauge repair plan` on a small simulation with one dropped and one poisoned write (truth.json says which key,
which regions): `leapfrog` finds them, the plan names exactly those keys, the cause, the regions to fix and the
fault-free value (the RT write the fault hit), with and without the RTs."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from small_sim import small_sim

from div import envelope as E
from div.records import Kind, iter_records
from pipelines.cli import main
from pipelines.core.sources import SourceSpec
from pipelines.leapfrog.job import LeapfrogOptions
from pipelines.leapfrog.job import run as run_leapfrog
from pipelines.repair.job import PLAN_SCHEMA

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture(scope="module")
def world(tmp_path_factory, spark):
    root = tmp_path_factory.mktemp("repair")
    sim = small_sim(root / "sim", faults={"dropped": 1, "poisoned": 1})
    faults = {f["kind"]: f for f in sim.result.truth["faults"]}
    assert set(faults) == {"dropped", "poisoned"}
    code = run_leapfrog(
        LeapfrogOptions(
            store=sim.store,
            version=sim.version,
            out=str(root / "leapfrog"),
            sources=[SourceSpec(x, d) for x, d in sorted(sim.archives.items())],
        ),
        spark=spark,
    )
    assert code == 1
    return root, sim, faults


def _rt_value(sim, region: int, partition: int, offset: int) -> bytes:
    """The value of the RT write a fault hit: what every region holds in the fault-free history."""
    t = pq.read_table(sim.archives[region], filters=[("topic", "=", f"{sim.store}_rt")])
    t = t.filter((t["partition"].to_numpy() == partition) & (t["offset"].to_numpy() == offset))
    (rec,) = list(iter_records(t, E.EnvelopeCodec()))
    assert rec.kind is Kind.PUT
    return rec.env["payloadUnion"][1]["putValue"]


def _plan(world, name: str, *extra: str) -> tuple[int, dict, dict, str]:
    root, sim, _ = world
    out = root / name
    argv = ["repair", "plan", "--store", sim.store, "--version", str(sim.version)]
    for x, d in sorted(sim.archives.items()):
        argv += ["--source", f"{x}={d}"]
    code = main([*argv, "--leapfrog", str(root / "leapfrog"), "--out", str(out), *extra])
    if code == 2:
        return code, {}, {}, ""
    table = pq.read_table(out / "plan")
    assert table.schema.equals(PLAN_SCHEMA, check_metadata=False)
    rows = {(r["partition"], r["key"].hex()): r for r in table.to_pylist()}
    return code, rows, json.loads((out / "summary.json").read_text()), (out / "plan.txt").read_text()


def _rts(sim) -> list[str]:
    return [a for x, d in sorted(sim.archives.items()) for a in ("--rt", f"{x}={d}")]


def _check_dropped(sim, rows, f):
    r = rows[(f["partition"], f["key"])]
    assert r["cause"] == "missed" and r["op"] == "PUT"
    assert r["regions_to_fix"] == sorted(f["detail"]["dropped_in"])
    assert (r["source_region"], r["source_offset"]) == (f["region"], f["rt_offset"])
    assert r["value"] == _rt_value(sim, f["region"], f["partition"], f["rt_offset"])
    assert r["logical_ts"] == f["time_ms"]


def test_with_the_rts_every_fault_has_its_write(world):
    _, sim, faults = world
    code, rows, summary, text = _plan(world, "plan-rt", *_rts(sim))
    assert code == 0
    assert set(rows) == {(f["partition"], f["key"]) for f in faults.values()}, "exactly the faulted keys"
    _check_dropped(sim, rows, faults["dropped"])
    f = faults["poisoned"]
    r = rows[(f["partition"], f["key"])]
    origin = f["detail"]["origin_region"]
    assert r["cause"] == "poisoned" and r["op"] == "PUT"
    assert r["regions_to_fix"] == [f["detail"]["poisoned_in"]]
    assert (r["source_region"], r["source_offset"]) == (origin, f["rt_offset"])
    assert r["value"] == _rt_value(sim, origin, f["partition"], f["rt_offset"])
    # stamped one above the winner exactly when the poisoned region's value would win Venice's tie at its own
    stamped = {(e["partition"], e["key"]): e for e in summary["writes_stamped_above_winner"]}
    bump = (f["partition"], f["key"]) in stamped
    assert r["logical_ts"] == f["time_ms"] + bump and summary["stamped_above_winner"] == bump
    if bump:
        assert stamped[(f["partition"], f["key"])]["regions"] == [f["detail"]["poisoned_in"]]
        assert f"above the winner's own {f['time_ms']}" in text
    assert summary["verdict"] == "clean" and summary["exit_code"] == 0
    assert (summary["divergent_keys"], summary["writes"], summary["undecidable"]) == (2, 2, 0)
    assert summary["by_cause"]["missed"] == 1 and summary["by_cause"]["poisoned"] == 1
    assert summary["rt_writes"]["unreadable"] == 0
    assert f["key"] in text and "cause: poisoned" in text and "pair 0-1" in text


def test_without_the_rts_the_poisoned_key_is_undecidable_and_named(world, caplog):
    _, sim, faults = world
    code, rows, summary, text = _plan(world, "plan-dcr")
    assert code == 1
    _check_dropped(sim, rows, faults["dropped"])
    f = faults["poisoned"]
    r = rows[(f["partition"], f["key"])]
    assert (r["op"], r["value"], r["cause"], r["regions_to_fix"]) == ("NONE", None, "undecidable", [])
    (named,) = summary["undecidable_keys"]
    assert named["key"] == f["key"] and f["detail"]["poisoned_in"] in named["regions"]
    assert any(f["key"] in m and "undecidable" in m for m in caplog.messages)  # on stderr
    assert summary["verdict"] == "findings"


def test_a_tie_break_region_decides_the_undecidable(world):
    _, sim, faults = world
    f = faults["poisoned"]
    healthy = next(x for x in sorted(sim.archives) if x != f["detail"]["poisoned_in"])
    code, rows, summary, _ = _plan(world, "plan-tie", "--tie-break", str(healthy))
    assert code == 0
    r = rows[(f["partition"], f["key"])]
    assert r["cause"] == "tie_break" and r["regions_to_fix"] == [f["detail"]["poisoned_in"]]
    assert r["value"] == _rt_value(sim, f["detail"]["origin_region"], f["partition"], f["rt_offset"])
    assert summary["tie_break"] == healthy


def test_usage_errors_write_nothing(world, tmp_path):
    root, sim, _ = world
    base = ["repair", "plan", "--version", str(sim.version), "--leapfrog", str(root / "leapfrog")]
    srcs = [a for x, d in sorted(sim.archives.items()) for a in ("--source", f"{x}={d}")]
    out = tmp_path / "o"
    assert (
        main([*base, "--store", "other_store", *srcs, "--out", str(out)]) == 2
    )  # a plan against the wrong store
    assert main([*base, "--store", sim.store, *srcs, "--out", str(out), "--tie-break", "9"]) == 2
    assert main([*base, "--store", sim.store, *srcs[:2], "--out", str(out)]) == 2  # one source
    assert (
        main([*base, "--store", sim.store, *srcs, "--out", str(root / "leapfrog" / "x")]) == 2
    )  # inside an input
    assert not out.exists()
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    assert main([*base, "--store", sim.store, *srcs, "--out", str(user)]) == 2  # --out on user files
    assert [p.name for p in user.iterdir()] == ["notes.txt"]


def test_the_plan_applied_on_a_real_broker_makes_every_region_converge(world, real_kafka, tmp_path):
    """The loop without simulator support: the plan (with --rt) is applied into `<store>_rt` on a real broker;
    each region's current record of each planned key (read from its VT, as the plan reads it) then takes the
    applied RT write through Venice's value-level DCR (`leapfrog.repair.dcr_apply`). Every region ends with the
    fault-free record — a poisoned region whose value would win the tie at the winner's timestamp too, the write
    being stamped one above it (`writes_stamped_above_winner`); a second apply changes nothing."""
    from leapfrog.repair import DELETE, PUT, Record, dcr_apply
    from pipelines.core.progress import Progress
    from pipelines.repair.job import PlanOptions, read_current

    root, sim, faults = world
    code, rows, summary, _ = _plan(world, "plan-apply", *_rts(sim))
    assert code == 0
    real_kafka.create_topics({f"{sim.store}_rt": 2})
    bootstrap = f"1={real_kafka.bootstrap_servers}"
    for _ in range(2):
        assert main(["repair", "apply", "--plan", str(root / "plan-apply"), "--kafka", bootstrap]) == 0
    from pipelines.core.sources import open_source

    source = open_source(SourceSpec(0, real_kafka.uri))
    applied: dict[tuple[int, bytes], list[Record]] = {}
    try:
        for p in range(2):
            first, end = source.bounds(f"{sim.store}_rt", p)
            for batch in source.iter_partition(f"{sim.store}_rt", p, start=first, end=end):
                for r in iter_records(batch, E.EnvelopeCodec()):
                    if r.kind in (Kind.PUT, Kind.DELETE):
                        pm, body = r.env["producerMetadata"], r.env["payloadUnion"][1]
                        value = body["putValue"] if r.kind is Kind.PUT else None
                        op = PUT if r.kind is Kind.PUT else DELETE
                        applied.setdefault((p, r.key[1:]), []).append(
                            Record(op, value, pm["logicalTimestamp"])
                        )
    finally:
        source.close()
    assert {(p, k.hex()) for p, k in applied} == set(rows), "one key per planned write, nothing else"
    assert all(len(w) == 2 for w in applied.values()), "once per apply"
    opts = PlanOptions(sim.store, sim.version, [], "", "")
    wanted: dict[int, set[bytes]] = {}
    for p, k in applied:
        wanted.setdefault(p, set()).add(k)
    assert "writes_dcr_would_ignore" not in summary
    stamped = {(e["partition"], e["key"]): e for e in summary["writes_stamped_above_winner"]}
    assert summary["stamped_above_winner"] == len(stamped)
    for (p, k), e in stamped.items():
        assert rows[(p, k)]["logical_ts"] == e["winner_ts"] + 1 == e["logical_ts"] and e["regions"]
    with Progress("test") as progress:
        for x, d in sorted(sim.archives.items()):
            current, _ = read_current(SourceSpec(x, d), opts, wanted, len(sim.archives), progress)
            for (p, k), writes in applied.items():
                row = rows[(p, k.hex())]
                once = dcr_apply(current[(p, k)], writes[0])
                assert dcr_apply(once, writes[1]) == once, "applying twice equals applying once"
                assert once.content == (row["op"], row["value"]), f"region {x} converges on key {k.hex()}"
