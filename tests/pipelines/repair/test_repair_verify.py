"""`tidegauge repair verify` on a plan, the output of `repair apply --out` and a later leapfrog output, written as
those commands publish them: each planned key's status follows from whether leapfrog still finds it and whether the
regions' final marks cover the repair write's RT offset."""

from __future__ import annotations

import json

import pyarrow as pa
from repair_plans import write_plan

from pipelines.cli import main
from pipelines.core.output import OutputDir
from pipelines.repair.apply import WRITES_SCHEMA

STORE = "verify_store"
APPLY_REGION = 1


def _row(p, key, op="PUT", cause="missed"):
    return {
        "partition": p,
        "key": key,
        "op": op,
        "value": b"v" if op == "PUT" else None,
        "logical_ts": None if op == "NONE" else 1000,
        "source_region": None,
        "source_offset": None,
        "regions_to_fix": [] if op == "NONE" else [0],
        "cause": "undecidable" if op == "NONE" else cause,
    }


PLAN = [
    _row(0, b"conv"),  # converged
    _row(0, b"pend"),  # region 0's mark for RT[1] in partition 0 is below the write: pending
    _row(1, b"again"),  # marks cover the write, still divergent: diverging again
    _row(1, b"ign", cause="poisoned"),  # marks cover it, an old plan warned: ignored by DCR
    _row(1, b"none", op="NONE"),  # no write
]
OFFSETS = {b"conv": 3, b"pend": 50, b"again": 4, b"ign": 5}


def _leapfrog(path, found: list[tuple[int, bytes]], store: str = STORE) -> None:
    rows = [
        {"partition": p, "region_a": 0, "region_b": 2, "type": "VALUE_MISMATCH", "key": k} for p, k in found
    ]
    schema = pa.schema(
        [
            ("partition", pa.int32()),
            ("region_a", pa.int32()),
            ("region_b", pa.int32()),
            ("type", pa.string()),
            ("key", pa.binary()),
        ]
    )
    by_region = [
        {"region": x, "partition": p, "final_high_watermark": [9, 10 if p == 1 or x == 2 else 40, 9]}
        for x in (0, 2)
        for p in (0, 1)
    ]
    with OutputDir(str(path), "leapfrog") as out:
        out.write_table("inconsistencies", pa.Table.from_pylist(rows, schema=schema))
        out.write_json(
            "summary.json",
            {
                **out.common_fields("leapfrog", 1 if rows else 0),
                "store": store,
                "version": 1,
                "by_region": by_region,
            },
        )


def _applied(path, finished_at_ms: int = 1) -> None:
    rows = [
        {
            "partition": r["partition"],
            "key": r["key"],
            "op": r["op"],
            "logical_ts": 1000,
            "rt_offset": OFFSETS[r["key"]],
        }
        for r in PLAN
        if r["op"] != "NONE"
    ]
    with OutputDir(str(path), "repair apply") as out:
        out.write_table("writes", pa.Table.from_pylist(rows, schema=WRITES_SCHEMA))
        out.write_json(
            "summary.json",
            {
                **out.common_fields("repair apply", 0),
                "store": STORE,
                "region": APPLY_REGION,
                "dry_run": False,
                "finished_at_ms": finished_at_ms,
            },
        )


def _world(tmp_path, found):
    write_plan(tmp_path / "plan", STORE, PLAN, ignore=[{"partition": 1, "key": b"ign".hex(), "regions": [2]}])
    _leapfrog(tmp_path / "lf", found)
    _applied(tmp_path / "applied")


def _verify(tmp_path, *extra) -> tuple[int, dict]:
    out = tmp_path / "verify"
    argv = ["repair", "verify", "--plan", str(tmp_path / "plan"), "--leapfrog", str(tmp_path / "lf")]
    code = main([*argv, *extra, "--out", str(out)])
    return code, (json.loads((out / "summary.json").read_text()) if code != 2 else {})


def test_statuses_with_the_applied_offsets(tmp_path, capsys):
    _world(tmp_path, [(0, b"pend"), (1, b"again"), (1, b"ign"), (1, b"none"), (2, b"other")])
    code, s = _verify(tmp_path, "--applied", str(tmp_path / "applied"))
    assert code == 1
    assert s["by_status"] == {
        "converged": 1,
        "pending": 1,
        "ignored_by_dcr": 1,
        "diverging_again": 1,
        "still_divergent": 0,
        "no_write": 1,
    }
    status = {bytes.fromhex(e["key"]): e["status"] for e in s["not_converged"]}
    assert status == {
        b"pend": "pending",
        b"again": "diverging_again",
        b"ign": "ignored_by_dcr",
        b"none": "no_write",
    }
    assert s["outside_plan_keys"] == 1 and s["job"] == "repair verify" and s["verdict"] == "not_converged"
    page = capsys.readouterr().out
    assert f"pending: partition 0 key {b'pend'.hex()}" in page
    assert (tmp_path / "verify" / "verify.txt").read_text().strip() == page.strip()


def test_a_plan_that_stamps_above_the_winner_warns_of_nothing_so_a_key_still_divergent_diverges_again(
    tmp_path,
):
    """Plans made since writes are stamped one above the winner where a region's DCR would keep its record carry no
    `writes_dcr_would_ignore`: `ignored_by_dcr` is only for plans made before."""
    write_plan(tmp_path / "plan", STORE, PLAN)
    _leapfrog(tmp_path / "lf", [(1, b"ign")])
    _applied(tmp_path / "applied")
    code, s = _verify(tmp_path, "--applied", str(tmp_path / "applied"))
    assert code == 1 and s["by_status"]["ignored_by_dcr"] == 0
    assert {bytes.fromhex(e["key"]): e["status"] for e in s["not_converged"]} == {b"ign": "diverging_again"}


def test_without_the_applied_offsets_it_says_what_it_cannot_tell(tmp_path, capsys):
    _world(tmp_path, [(0, b"pend"), (1, b"again")])
    code, s = _verify(tmp_path)
    assert code == 1
    assert s["by_status"]["still_divergent"] == 2 and s["by_status"]["converged"] == 3
    assert not s["can_tell_pending"]
    assert "cannot tell" in capsys.readouterr().out


def test_all_converged_exits_0(tmp_path):
    PLAN_NO_NONE = [r for r in PLAN if r["op"] != "NONE"]
    write_plan(tmp_path / "plan", STORE, PLAN_NO_NONE)
    _leapfrog(tmp_path / "lf", [])
    code, s = _verify(tmp_path)
    assert code == 0 and s["verdict"] == "converged" and s["by_status"]["converged"] == 4


def test_usage_errors(tmp_path):
    _world(tmp_path, [])
    _leapfrog(tmp_path / "lf-other", [], store="other")
    argv = ["repair", "verify", "--plan", str(tmp_path / "plan")]
    assert main([*argv, "--leapfrog", str(tmp_path / "lf-other")]) == 2  # another store
    assert main([*argv, "--leapfrog", str(tmp_path / "applied")]) == 2  # not a leapfrog output
    assert main([*argv, "--leapfrog", str(tmp_path / "lf"), "--applied", str(tmp_path / "lf")]) == 2
    assert main([*argv, "--leapfrog", str(tmp_path / "lf"), "--out", str(tmp_path / "lf" / "x")]) == 2
    assert not (tmp_path / "lf" / "x").exists()
    lf = ["--leapfrog", str(tmp_path / "lf")]
    assert main([*argv, *lf, "--store", "other"]) == 2  # a copied command line of another store
    assert main([*argv, *lf, "--version", "9"]) == 2
    own = main([*argv, *lf, "--store", STORE, "--version", "1"])
    assert own in (0, 1)  # the plan's own store and version: checked, accepted
    (tmp_path / "empty").mkdir()
    assert (
        main([*argv, *lf, "--source", f"0={tmp_path / 'empty'}"]) == 2
    )  # no topic of the plan's version there


def test_a_leapfrog_run_older_than_the_apply_is_called_out(tmp_path, capsys):
    _world(tmp_path, [(0, b"pend")])
    _applied(tmp_path / "late", finished_at_ms=4_102_444_800_000)  # 2100: after the leapfrog run
    code, s = _verify(tmp_path, "--applied", str(tmp_path / "late"))
    assert code == 1 and s["leapfrog_before_apply"] is True
    assert "started before the apply finished" in capsys.readouterr().out
    code, s = _verify(tmp_path, "--applied", str(tmp_path / "applied"))
    assert s["leapfrog_before_apply"] is False
