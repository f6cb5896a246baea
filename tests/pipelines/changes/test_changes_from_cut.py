"""`tidegauge changes --from-cut`, and the two change-capture defects of issue 40: a state belongs to one region's VT,
and a run never erases what an earlier run delivered.

Truth for a cut is the one rule's rows from a fresh start (tests/support/change_oracle.py) whose coordinate lies
above the cut: the first copy of each such change is at or after the reader's start, so even its VT offset is the
same. The simulation (tests/pipelines/changes/conftest.py) has a leader failover: the VT holds re-produced copies.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pyarrow as pa
import pytest
from change_oracle import one_pass
from test_changes_cli import by_partition, changes, rows, summary, vt_tables, write_vt

from div.avro_bits import write_long
from heartbeat.changes import MAGIC, ChangeState
from heartbeat.cuts import FROM_RT, Cut, CutPartition

N_REGIONS = 3


def _cut(sim, tmp_path: Path, store: str | None = None, version: int = 1) -> tuple[Path, dict]:
    """A cut in the middle of the run: per partition and region, the median RT position of its changes."""
    everything = by_partition(one_pass(sim.archive, sim.topic, N_REGIONS))
    rt = {}
    for p, rs in everything.items():
        rt[p] = {}
        for r in range(N_REGIONS):
            qs = sorted(x["upstream_offset"] for x in rs if x["upstream_region"] == r)
            rt[p][r] = qs[len(qs) // 2] if qs else -1
    cut = Cut(
        store or sim.store,
        version,
        1_764_374_400_000,
        FROM_RT,
        {p: CutPartition(p, c) for p, c in rt.items()},
    )
    path = tmp_path / f"cut-{store or sim.store}-{version}.json"
    path.write_text(cut.to_json())
    return path, rt


def _above(sim, rt: dict) -> dict[int, list[dict]]:
    everything = by_partition(one_pass(sim.archive, sim.topic, N_REGIONS))
    return {
        p: [
            x
            for x in rs
            if x["upstream_region"] is not None and x["upstream_offset"] > rt[p][x["upstream_region"]]
        ]
        for p, rs in everything.items()
    }


def _base(sim, source) -> list:
    return ["--store", sim.store, "--version", 1, "--source", source]


def test_from_a_cut_exactly_the_changes_above_it_are_delivered_and_the_state_resumes(sim, tmp_path):
    cut, rt = _cut(sim, tmp_path)
    expected = _above(sim, rt)
    assert all(len(v) > 10 for v in expected.values())
    # first run from the cut over the first two thirds of the archive (moved elsewhere), then on from --state
    full = vt_tables(sim.archive, sim.topic)
    part = write_vt({p: t.slice(0, 2 * t.num_rows // 3) for p, t in full.items()}, tmp_path / "copy")
    state = tmp_path / "state"
    argv = [*_base(sim, f"{sim.failover_region}={part}"), "--state", state, "--from-cut", cut]
    assert changes(*argv, "--out", tmp_path / "o1") == 0
    s = summary(tmp_path / "o1")
    assert s["state"]["used"] == "cut" and s["bulk_load"] == 0
    assert s["from_cut"]["at"] == "2025-11-29T00:00:00.000Z" and s["from_cut"]["from"] == "rt"
    for pd in s["partitions"]:
        assert pd["cut"]["rt"] == [rt[pd["partition"]][r] for r in range(N_REGIONS)]
        assert pd["cut"]["start"] > 0 and pd["cut"]["records_before_start"] > 0
        assert pd["state"]["marks"] != pd["cut"]["rt"] or pd["delivered"] == 0
    second = [*_base(sim, f"{sim.failover_region}={sim.archive}"), "--state", state]
    assert changes(*second, "--out", tmp_path / "o2") == 0
    s2 = summary(tmp_path / "o2")
    assert s2["state"]["used"] == "resume" and s2["state"]["log_identity"]["checked"] == [0, 1]
    got = by_partition(pa.concat_tables([rows(tmp_path / "o1"), rows(tmp_path / "o2")]))
    assert got == expected  # every change above the cut once, VT order, nothing at or below it
    # without --state, in one run: the same rows
    assert changes(*_base(sim, sim.archive), "--from-cut", cut, "--out", tmp_path / "o3") == 0
    assert by_partition(rows(tmp_path / "o3")) == expected


@pytest.mark.spark
@pytest.mark.slow
def test_from_a_cut_the_spark_engine_gives_the_local_engine_s_rows(sim, tmp_path, spark):
    cut, rt = _cut(sim, tmp_path)
    argv = [*_base(sim, sim.archive), "--from-cut", cut, "--engine", "spark", "--out", tmp_path / "o"]
    assert changes(*argv) == 0
    assert by_partition(rows(tmp_path / "o")) == _above(sim, rt)
    assert summary(tmp_path / "o")["state"]["used"] == "cut"


def _refused(capsys, argv, *needles) -> str:
    assert changes(*argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tidegauge changes: error:"), err
    for n in needles:
        assert n in err, (n, err)
    return err


def test_a_cut_of_another_store_or_version_or_with_a_state_is_refused_naming_both(sim, tmp_path, capsys):
    other_store, _ = _cut(sim, tmp_path, store="other")
    other_version, _ = _cut(sim, tmp_path, version=2)
    for cut, needle in ((other_store, "'other'"), (other_version, "version 2")):
        _refused(
            capsys, [*_base(sim, sim.archive), "--from-cut", cut, "--out", tmp_path / "x"], needle, str(cut)
        )
    cut, _ = _cut(sim, tmp_path)
    state = tmp_path / "state"
    assert changes(*_base(sim, sim.archive), "--state", state, "--out", tmp_path / "o") == 0
    before = (state / "state.tgcc").read_bytes()
    argv = [*_base(sim, sim.archive), "--state", state, "--from-cut", cut, "--out", tmp_path / "x"]
    _refused(capsys, argv, f"--from-cut {cut}", f"--state {state}")
    assert (state / "state.tgcc").read_bytes() == before and not (tmp_path / "x").exists()
    bad = tmp_path / "bad.json"
    bad.write_text('{"store": "sim_store"}')
    _refused(
        capsys, [*_base(sim, sim.archive), "--from-cut", bad, "--out", tmp_path / "x"], "'version' is missing"
    )


# -- a state belongs to one region's VT ----------------------------------------------------------------------------


def test_another_region_s_vt_is_refused_with_the_state_naming_both_and_nothing_is_delivered(
    sim, tmp_path, capsys
):
    """Issue 40's defect: region 2's --state given with region 0's archive resumed silently (exit 0)."""
    mine, other = sim.failover_region, next(r for r in sim.archives if r != sim.failover_region)
    state = tmp_path / "state"
    argv = ["--store", sim.store, "--version", 1, "--state", state]
    assert changes(*argv, "--source", f"{mine}={sim.archive}", "--out", tmp_path / "o") == 0
    before = (state / "state.tgcc").read_bytes()
    assert ChangeState.from_bytes(before).region == mine
    # another id: refused naming both regions
    _refused(
        capsys,
        [*argv, "--source", f"{other}={sim.archives[other]}", "--out", tmp_path / "x"],
        f"region {mine}'s",
        f"region {other}'s",
    )
    # another region's VT without an id (or with the state's id): its record at the identity offset differs
    for source in (str(sim.archives[other]), f"{mine}={sim.archives[other]}"):
        _refused(
            capsys, [*argv, "--source", source, "--out", tmp_path / "x"], f"region {mine}'s version topic"
        )
    assert (state / "state.tgcc").read_bytes() == before and not (tmp_path / "x").exists()


def test_a_source_without_an_id_is_no_region_s(sim, tmp_path):
    assert changes(*_base(sim, sim.archive), "--state", tmp_path / "st", "--out", tmp_path / "o") == 0
    s = summary(tmp_path / "o")
    assert s["region"] is None and s["sources"] == {} and s["state"]["region"] is None
    assert {e["region"] for e in s["evidence"]["by_partition"]} == {None}
    assert ChangeState.from_bytes((tmp_path / "st" / "state.tgcc").read_bytes()).region is None


def _format_1(state: ChangeState) -> bytes:
    """The bytes tidegauge wrote before format 2 (no region, no log identity)."""
    body = bytearray(MAGIC) + b"\x01"
    name = state.store.encode()
    body += write_long(len(name)) + name + write_long(state.version) + write_long(state.n_regions)
    body += write_long(len(state.partitions))
    for p, ps in state.partitions.items():
        body += write_long(p) + write_long(ps.position) + write_long(int(ps.phase) | (8 if ps.ended else 0))
        body += b"".join(write_long(m) for m in ps.marks)
        body += b"".join(write_long(m - s) for m, s in zip(ps.marks, ps.seen, strict=True))
    return bytes(body) + zlib.crc32(body).to_bytes(4, "big")


def test_a_format_1_state_resumes_unchecked_and_records_the_log_it_resumed_with(sim, tmp_path):
    full = vt_tables(sim.archive, sim.topic)
    half = write_vt({p: t.slice(0, t.num_rows // 2) for p, t in full.items()}, tmp_path / "half")
    state = tmp_path / "state"
    assert changes(*_base(sim, half), "--state", state, "--out", tmp_path / "o1") == 0
    new = ChangeState.from_bytes((state / "state.tgcc").read_bytes())
    (state / "state.tgcc").write_bytes(_format_1(new))
    assert changes(*_base(sim, sim.archive), "--state", state, "--out", tmp_path / "o2") == 0
    s = summary(tmp_path / "o2")
    assert s["state"]["used"] == "resume" and s["state"]["log_identity"]["checked"] == []
    assert [u["partition"] for u in s["state"]["log_identity"]["unchecked"]] == [0, 1]
    got = by_partition(pa.concat_tables([rows(tmp_path / "o1"), rows(tmp_path / "o2")]))
    assert got == by_partition(one_pass(sim.archive, sim.topic, N_REGIONS))  # resumed as before
    resumed = ChangeState.from_bytes((state / "state.tgcc").read_bytes())
    assert all(ps.log_id is not None for ps in resumed.partitions.values())
    assert changes(*_base(sim, sim.archive), "--state", state, "--out", tmp_path / "o3") == 0
    assert summary(tmp_path / "o3")["state"]["log_identity"]["checked"] == [0, 1]


# -- a run never erases what an earlier run delivered -------------------------------------------------------------


def test_an_out_holding_unread_changes_is_refused_until_marked_read(sim, tmp_path, capsys):
    """Issue 40's defect: a second run into the same --out replaced the first run's changes with 0 rows."""
    full = vt_tables(sim.archive, sim.topic)
    half = write_vt({p: t.slice(0, t.num_rows // 2) for p, t in full.items()}, tmp_path / "half")
    out, state = tmp_path / "out", tmp_path / "state"
    assert changes(*_base(sim, half), "--state", state, "--out", out) == 0
    first = rows(out)
    s1 = summary(out)
    assert first.num_rows > 0 and s1["run"]
    before = (state / "state.tgcc").read_bytes()
    again = [*_base(sim, sim.archive), "--state", state, "--out", out]
    _refused(capsys, again, f"--out {out}", s1["run"], f"{first.num_rows} changes", "read.json")
    assert rows(out) == first and (state / "state.tgcc").read_bytes() == before  # nothing moved
    (out / "read.json").write_text(json.dumps({"run": "some-other-run"}))
    _refused(capsys, again, "read.json")  # a mark naming another run does not count
    (out / "read.json").write_text(json.dumps({"run": s1["run"]}))
    assert changes(*again) == 0
    second = summary(out)
    assert second["state"]["from"] == s1["state"]["to"] and not (out / "read.json").exists()
    got = by_partition(pa.concat_tables([first, rows(out)]))
    assert got == by_partition(one_pass(sim.archive, sim.topic, N_REGIONS))
    (out / "read.json").write_text(json.dumps({"run": second["run"]}))
    assert changes(*again) == 0 and summary(out)["delivered"] == 0
    assert changes(*again) == 0  # an output that delivered nothing needs no mark
