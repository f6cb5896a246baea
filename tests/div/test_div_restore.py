"""DIV restore acceptance: on VTs and RTs built outside the product (tests/support/div_restore_fixtures.py), the state
restored at an offset is exactly the state a full replay from offset 0 computes — and the independent oracle's —
for every GUID and field; validation resumed there reports exactly the full validation's findings after it; the
search reads back only as far as the heartbeat; unusable heartbeats are skipped and said so; the CLI writes
Venice's PartitionState and state.json; the live-follower API continues where a restart left off.
"""

from __future__ import annotations

import json
import pathlib

import div_restore_fixtures as F
import fastavro
import pyarrow.parquet as pq
import pytest
import venice_reference as V

from div import archive
from div import partition_state as ps
from div.batch import PartitionRun
from div.restore import (
    FIRST_WINDOW,
    LastHeartbeat,
    from_heartbeat,
    restore_rt,
    restore_vt,
    state_json,
)
from pipelines.cli import main as cli_main

SEEDS = [1, 2, 3]
FIELDS = (
    "segmentNumber",
    "messageSequenceNumber",
    "segmentStatus",
    "isRegistered",
    "checksumType",
    "checksumState",
    "messageTimestamp",
    "aggregates",
    "debugInfo",
)


@pytest.fixture(scope="module", params=SEEDS)
def scenario(request, tmp_path_factory):
    scen = F.build(seed=request.param)
    root = tmp_path_factory.mktemp(f"restore-{request.param}")
    scen.vt_dir, scen.rt_dirs = scen.write(root)
    scen.seed = request.param
    scen.full = full_replay(scen.vt_dir)
    return scen


def reader(directory: str, topic: str, counter: list | None = None):
    def read(start, end, columns):
        for batch in archive.iter_partition(directory, topic, 0, start, end, columns):
            if counter is not None:
                counter.append(batch.num_rows)
            yield batch

    return read


def full_replay(vt_dir: str) -> dict:
    """Our validator over the whole VT from offset 0 (PartitionRun: the validate job's path): states after every
    offset and the findings."""
    run = PartitionRun(0, F.VT, 0)
    states = []
    for batch in archive.iter_partition(vt_dir, F.VT, 0, batch_size=1):
        run.feed(batch)
        states.append(run.validator.producer_states())
    run.finish()
    return {"states": states, "rows": run.rows, "eop": run.validator.eop_offset}


def assert_same_states(got: dict[bytes, dict], want: dict[bytes, dict], where: str) -> None:
    assert set(got) == set(want), (
        f"{where}: GUIDs {sorted(g.hex() for g in got)} != {sorted(g.hex() for g in want)}"
    )
    for g in want:
        for f in FIELDS:
            assert got[g][f] == want[g][f], (
                f"{where}: GUID {g.hex()} {f}: restored {got[g][f]!r}, want {want[g][f]!r}"
            )


def offsets_of_interest(scen) -> list[int]:
    """Every offset for the first seed; for the others every 5th plus the neighbourhoods of heartbeats,
    failovers and End of Push (where off-by-one mistakes live)."""
    n = len(scen.vt)
    if scen.seed == SEEDS[0]:
        return list(range(n))
    picked = set(range(0, n, 5))
    for o in [*scen.heartbeats, *scen.failover_offsets, scen.eop_offset]:
        picked.update(x for x in (o - 1, o, o + 1) if 0 <= x < n)
    return sorted(picked)


# ------------------------------------------------------------------------------------------- the scenarios


def test_the_scenarios_oracle_is_venices_rules(scenario):
    """The independent oracle (which wrote every hbd) agrees with a full replay at every offset, so restoring from
    its heartbeats is a real test; and the scenario has what it claims: faults, failovers, unusable heartbeats."""
    for o, want in enumerate(scenario.vt_states):
        assert_same_states(scenario.full["states"][o], want, f"offset {o}")
    kinds = {r[7] for r in scenario.full["rows"]}
    assert {"MISSING", "CORRUPT", "DUPLICATE"} <= kinds
    assert any(r[8] for r in scenario.full["rows"])  # a fatal finding before End of Push
    assert len(scenario.failover_offsets) == 2
    assert set(scenario.heartbeats.values()) == {"usable", "plain", "truncated", "broken"}
    # failovers leave the old leader's segment open: the next term starts mid-segment for that GUID
    for f in scenario.failover_offsets:
        assert any(s["segmentStatus"] == 1 for s in scenario.vt_states[f - 1].values())


def test_restored_vt_state_equals_full_replay_at_every_offset(scenario):
    read = reader(scenario.vt_dir, F.VT)
    from_hb = 0
    for o in offsets_of_interest(scenario):
        restored = restore_vt(read, o)
        assert_same_states(
            restored.vt_producer_states(), scenario.full["states"][o], f"seed {scenario.seed} at {o}"
        )
        assert_same_states(restored.vt_producer_states(), scenario.vt_states[o], f"oracle at {o}")
        usable = [h for h, k in scenario.heartbeats.items() if k == "usable" and h <= o]
        if usable:
            assert restored.heartbeat is not None and restored.heartbeat.offset == max(usable)
            assert restored.vt_replayed == o - max(usable)
            assert restored.vt.end_of_push
            from_hb += 1
        else:
            assert restored.heartbeat is None and restored.fallback_reason
            assert restored.replayed_from == 0 and restored.vt_replayed == o + 1
            assert restored.vt.end_of_push == (o >= scenario.eop_offset)
    assert from_hb > 0.8 * len(offsets_of_interest(scenario))


def test_restored_rt_states_are_at_the_replicas_resume_offsets(scenario):
    read = reader(scenario.vt_dir, F.VT)
    for o in offsets_of_interest(scenario)[::3]:
        restored = restore_vt(read, o)
        want_resume = F.resume_offsets(scenario, o)
        for r in range(scenario.regions):
            entry = restore_rt(restored, r, reader(scenario.rt_dirs[r], F.RT))
            assert entry.resume_offset == want_resume.get(r, -1), (o, r)
            # never beyond what the VT reflects; below it only after a failover re-applied an old term's writes
            assert entry.resume_offset <= F.highest_upstream(scenario, o).get(r, -1)
            assert entry.state_offset == (
                entry.resume_offset if entry.resume_offset >= 0 else entry.watermark
            )
            want = scenario.rt_states[r][entry.resume_offset] if entry.resume_offset >= 0 else {}
            assert_same_states(
                entry.validator.producer_states(), want, f"RT {r} at {entry.resume_offset} (VT {o})"
            )
            assert entry.warning is None
            if restored.heartbeat is not None:
                mark = restored.heartbeat.watermark(r)
                assert entry.watermark == mark
                assert entry.replayed == max(0, entry.resume_offset - mark)


def test_validation_resumed_from_a_restored_state_reports_exactly_the_full_findings_after_it(scenario):
    full = scenario.full["rows"]
    read = reader(scenario.vt_dir, F.VT)
    points = sorted(
        {
            *range(10, len(scenario.vt), 23),
            *scenario.failover_offsets,
            *(r[3] - 1 for r in full),
            *(r[3] for r in full),
        }
    )
    for o in points:
        run = PartitionRun(0, F.VT, 0)
        restore_vt(read, o, validator=run.validator)
        for batch in archive.iter_partition(scenario.vt_dir, F.VT, 0, start=o + 1, batch_size=37):
            run.feed(batch)
        run.finish()
        assert run.rows == [r for r in full if r[3] > o], f"seed {scenario.seed}, resumed after {o}"


def test_a_cold_resume_reports_false_errors_and_misses_real_ones(scenario):
    """What restoring avoids: a follower resuming with no state reports producers it joins mid-segment as
    UNREGISTERED_PRODUCER (fatal: it does not even know End of Push passed) and cannot verify their checksums."""
    o = scenario.failover_offsets[0] + 5
    run = PartitionRun(0, F.VT, 0)
    for batch in archive.iter_partition(scenario.vt_dir, F.VT, 0, start=o + 1):
        run.feed(batch)
    full_after = {(r[3], r[7]) for r in scenario.full["rows"] if r[3] > o}
    cold = {(r[3], r[7]) for r in run.rows}
    false, missed = cold - full_after, full_after - cold
    assert false and {t for _, t in false} == {"UNREGISTERED_PRODUCER"}
    # every fault is fatal: a cold follower does not even know that End of Push has passed
    assert all(r[8] for r in run.rows if r[7] != "DUPLICATE")
    assert {t for _, t in missed} <= {"CORRUPT"}  # checksums of segments joined mid-way are never verified


# ------------------------------------------------------------------------------------ choosing the heartbeat


def test_unusable_heartbeats_are_skipped_and_reported(scenario):
    read = reader(scenario.vt_dir, F.VT)
    for h, kind in scenario.heartbeats.items():
        if kind == "usable":
            continue
        restored = restore_vt(read, h)
        assert [s.offset for s in restored.skipped][:1] == [h]
        reason = restored.skipped[0].reason
        assert {"plain": "no hbd header", "truncated": "truncated", "broken": "hbd header"}[kind] in reason
        assert_same_states(restored.vt_producer_states(), scenario.vt_states[h], f"after skipping {h}")
        earlier = [x for x, k in scenario.heartbeats.items() if k == "usable" and x < h]
        assert restored.heartbeat.offset == max(earlier)


def test_without_a_usable_heartbeat_it_replays_from_the_first_offset_and_says_so(tmp_path):
    scen = F.build(seed=7, hb_every=10_000)  # RT heartbeats never come: no VT heartbeat at all
    vt_dir, _ = scen.write(tmp_path)
    assert not scen.heartbeats
    o = len(scen.vt) - 3
    restored = restore_vt(reader(vt_dir, F.VT), o)
    assert restored.heartbeat is None and restored.source == "full_replay"
    assert restored.fallback_reason == f"no heartbeat with an hbd header at or before offset {o}"
    assert restored.replayed_from == 0 and restored.vt_replayed == o + 1
    assert_same_states(restored.vt_producer_states(), scen.vt_states[o], "fallback")
    assert restored.vt.eop_offset == scen.eop_offset


def test_the_search_reads_back_only_as_far_as_the_heartbeat(tmp_path):
    """Cost does not grow with the topic: on a long VT, restoring near its end reads at most twice the distance
    to the heartbeat plus the first window (doubling windows), and replays only the records after it."""
    scen = F.build(seed=5, per_region=2500, failovers=1)
    vt_dir, _ = scen.write(tmp_path)
    n = len(scen.vt)
    assert n > 7000
    for o in (n // 2, n - 40, n - 1):
        counted: list[int] = []
        restored = restore_vt(reader(vt_dir, F.VT, counted), o, first_window=16)
        dist = o + 1 - restored.heartbeat.offset
        assert restored.search_records <= 2 * dist + 16
        assert restored.vt_replayed == o - restored.heartbeat.offset
        # + 1: the heartbeat itself, read again with its value for the writer schema its `vtp` header announces
        assert sum(counted) == restored.search_records + restored.vt_replayed + 1
        assert sum(counted) < n / 20
        assert_same_states(restored.vt_producer_states(), scen.vt_states[o], f"long VT at {o}")
    assert FIRST_WINDOW >= 16


# -------------------------------------------------------------------------------------- live follower / leader


def test_a_live_follower_restarts_from_the_last_heartbeat_it_consumed(scenario):
    """A follower consumed up to O and lost its state: it reloads the last heartbeat it consumed and re-consumes
    from there; it reports exactly what a follower that never stopped reports, and a new leader promoted there
    gets the RT states at its resume offsets."""
    o = scenario.failover_offsets[1] + 7
    last = LastHeartbeat()
    for off, rec in enumerate(scenario.vt[: o + 1]):
        last.observe(off, rec.key, rec.headers)
    restored = last.restore()
    h = restored.heartbeat.offset
    assert h == max(x for x, k in scenario.heartbeats.items() if k == "usable" and x <= o)
    found = []
    for off in range(h + 1, len(scenario.vt)):
        rec = scenario.vt[off]
        for f in restored.feed_vt_record(off, rec.key, rec.value, rec.headers, rec.ts):
            found.append((f.offset, f.type, f.fatal))
        if off == o:
            assert_same_states(restored.vt_producer_states(), scenario.vt_states[o], "live follower")
            for r in range(scenario.regions):
                restore_rt(restored, r, reader(scenario.rt_dirs[r], F.RT))
            vt_states, rt_states, marks = restored.take_over_args(scenario.regions)
            resume = F.resume_offsets(scenario, o)
            assert marks == [resume.get(r, -1) for r in range(scenario.regions)]
            for r in range(scenario.regions):
                assert_same_states(rt_states[r], scenario.rt_states[r][marks[r]], f"new leader RT {r}")
    assert restored.at == len(scenario.vt) - 1
    assert found == [(r[3], r[7], r[8]) for r in scenario.full["rows"] if r[3] > h]


def test_a_new_leader_takes_over_with_the_restored_state(scenario):
    """The restored state plugs into `heartbeat.HeartbeatLeader.take_over`: the leader resumes each RT right after
    the resume offset and validates the next RT records against the restored RT state (no false findings)."""
    from heartbeat_fixtures import FakeProducer

    from heartbeat import HeartbeatLeader

    o = scenario.failover_offsets[0] + 9
    restored = restore_vt(reader(scenario.vt_dir, F.VT), o)
    for r in range(scenario.regions):
        restore_rt(restored, r, reader(scenario.rt_dirs[r], F.RT))
    vt_states, rt_states, marks = restored.take_over_args(scenario.regions)
    leader = HeartbeatLeader(
        FakeProducer(),
        vt_topic=F.VT,
        rt_topic=F.RT,
        partition=0,
        region=0,
        n_regions=scenario.regions,
        host="new-leader",
        term_id=9,
        interval_ms=0,
    )
    leader.take_over(vt_states, rt_states, marks)
    assert leader.watermarks() == marks
    full_rt = {}
    for r in range(scenario.regions):
        run = PartitionRun(r, F.RT, 0)
        for batch in archive.iter_partition(scenario.rt_dirs[r], F.RT, 0):
            run.feed(batch)
        full_rt[r] = {(f[3], f[7]) for f in run.rows}
    for r in range(scenario.regions):
        for off in range(marks[r] + 1, len(scenario.rts[r])):
            rec = scenario.rts[r][off]
            got = leader.on_rt_record(r, off, rec.key, rec.value, rec.headers, rec.ts)
            assert {(f.offset, f.type) for f in got.findings} == {x for x in full_rt[r] if x[0] == off}, (
                r,
                off,
            )
            if not got.is_heartbeat:
                leader.done()


def test_from_heartbeat_refuses_what_it_cannot_use(scenario):
    from div.restore import UnusableHeartbeat

    kinds = {k: h for h, k in scenario.heartbeats.items()}
    for kind in ("plain", "truncated", "broken"):
        h = kinds[kind]
        with pytest.raises(UnusableHeartbeat):
            from_heartbeat(h, scenario.vt[h].headers)
    with pytest.raises(UnusableHeartbeat, match="no heartbeat"):
        LastHeartbeat().restore()


# ------------------------------------------------------------------------------------------------- the CLI


def _venice_partition_state(data: bytes, shared_dir: pathlib.Path) -> dict:
    """Decode with Venice's own PartitionState v24 schema file (not the product's copy)."""
    import io

    assert data[:2] == bytes([24, 24])
    schema = fastavro.parse_schema(
        json.loads((shared_dir / "reference" / "schemas" / "PartitionState.v24.avsc").read_text())
    )
    buf = io.BytesIO(data[2:])
    state = fastavro.schemaless_reader(buf, schema, None)
    assert buf.tell() == len(data) - 2
    return state


def test_cli_writes_venices_partition_state_and_state_json(scenario, tmp_path, shared_dir):
    o = scenario.failover_offsets[0] + 11
    out = tmp_path / "restore"
    args = [
        "div",
        "restore",
        "--source",
        f"0={scenario.vt_dir}",
        "--store",
        F.STORE,
        "--version",
        "1",
        "--partition",
        "0",
        "--at-offset",
        str(o),
        "--out",
        str(out),
    ]
    for r, d in scenario.rt_dirs.items():
        args += ["--rt-source", f"{r}={d}"]
    assert cli_main(args) == 0
    want = scenario.vt_states[o]
    state = _venice_partition_state((out / "partition_state.bin").read_bytes(), shared_dir)
    assert (
        state["offset"] == o and state["lastConsumedVersionTopicOffset"] == o and state["endOfPush"] is True
    )
    got = {k.encode("latin-1"): v for k, v in state["producerStates"].items()}
    assert_same_states(got, want, "partition_state.bin")
    assert ps.producer_states(ps.decode((out / "partition_state.bin").read_bytes())) == got
    resume = F.resume_offsets(scenario, o)
    assert state["upstreamOffsetMap"] == {str(r): resume[r] for r in range(scenario.regions)}

    js = json.loads((out / "state.json").read_text())
    hb = max(x for x, k in scenario.heartbeats.items() if k == "usable" and x <= o)
    assert js["vt_offset"] == o and js["next_vt_offset"] == o + 1
    assert (
        js["heartbeat_offset"] == hb and js["restored_from"] == "heartbeat" and js["fallback_reason"] is None
    )
    assert js["vt_records_replayed"] == o - hb
    assert js["vt_producers"] == {g.hex(): _json_state(s) for g, s in sorted(want.items())}
    for r in range(scenario.regions):
        assert js["rt"][str(r)]["resume_offset"] == resume[r]
        assert js["rt"][str(r)]["state_offset"] == resume[r]
        assert js["rt_producers"][str(r)] == {
            g.hex(): _json_state(s) for g, s in sorted(scenario.rt_states[r][resume[r]].items())
        }
    summary = json.loads((out / "summary.json").read_text())
    assert summary["job"] == "div restore" and summary["exit_code"] == 0
    assert summary["restored_from"] == "heartbeat" and summary["heartbeat_offset"] == hb
    assert summary["vt_records_replayed"] == o - hb


def _json_state(s: dict) -> dict:
    """state.json's form of a ProducerPartitionState, written out independently."""
    return {
        "segment": s["segmentNumber"],
        "sequence": s["messageSequenceNumber"],
        "status": ["NOT_STARTED", "IN_PROGRESS", "END_OF_INTERMEDIATE_SEGMENT", "END_OF_FINAL_SEGMENT"][
            s["segmentStatus"]
        ],
        "registered": s["isRegistered"],
        "checksum_type": {0: "NONE", 1: "MD5", 4: "ADHASH"}[s["checksumType"]],
        "checksum_state": s["checksumState"].hex(),
        "timestamp": s["messageTimestamp"],
    }


def test_state_json_producer_form():
    s = {
        "segmentNumber": 3,
        "messageSequenceNumber": 9,
        "segmentStatus": 2,
        "isRegistered": True,
        "checksumType": 4,
        "checksumState": b"\x00\x01",
        "messageTimestamp": 5,
        "aggregates": {},
        "debugInfo": {},
    }
    assert state_json(s) == {
        "segment": 3,
        "sequence": 9,
        "status": "END_OF_INTERMEDIATE_SEGMENT",
        "registered": True,
        "checksum_type": "ADHASH",
        "checksum_state": "0001",
        "timestamp": 5,
    }


def test_cli_falls_back_and_says_so(scenario, tmp_path, caplog):
    o = min(h for h, k in scenario.heartbeats.items() if k == "usable") - 1
    out = tmp_path / "fallback"
    assert (
        cli_main(
            [
                "div",
                "restore",
                "--source",
                f"0={scenario.vt_dir}",
                "--store",
                F.STORE,
                "--version",
                "1",
                "--partition",
                "0",
                "--at-offset",
                str(o),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    js = json.loads((out / "state.json").read_text())
    assert js["restored_from"] == "full_replay" and js["heartbeat_offset"] is None
    assert "no heartbeat with an hbd header" in js["fallback_reason"] and js["vt_records_replayed"] == o + 1
    assert js["eop_offset"] == scenario.eop_offset
    assert js["vt_producers"] == {g.hex(): _json_state(s) for g, s in sorted(scenario.vt_states[o].items())}
    assert "replayed the partition from offset 0" in caplog.text


def test_cli_usage_errors_and_a_missing_rt_source(scenario, tmp_path, capsys):
    base = [
        "div",
        "restore",
        "--source",
        f"0={scenario.vt_dir}",
        "--store",
        F.STORE,
        "--version",
        "1",
        "--partition",
        "0",
        "--out",
        str(tmp_path / "x"),
    ]
    assert cli_main([*base, "--at-offset", str(len(scenario.vt))]) == 2
    assert f"holds offsets 0..{len(scenario.vt) - 1}" in capsys.readouterr().err
    assert cli_main([*base[:-2], "--partition", "3", "--out", str(tmp_path / "x"), "--at-offset", "5"]) == 2
    assert "no partition 3" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    o = len(scenario.vt) - 1
    assert cli_main([*base, "--at-offset", str(o), "--rt-source", f"1={tmp_path / 'nowhere'}"]) == 3
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["failed_rt_sources"][0]["region"] == 1 and summary["exit_code"] == 3
    assert (tmp_path / "x" / "partition_state.bin").exists()


def test_validate_restore_at_equals_the_full_run_after_the_offset(scenario, tmp_path):
    full_out, out = tmp_path / "full", tmp_path / "resumed"
    o = scenario.failover_offsets[0] - 3
    assert cli_main(["div", "validate", "--source", f"0={scenario.vt_dir}", "--out", str(full_out)]) == 1
    code = cli_main(
        ["div", "validate", "--source", f"0={scenario.vt_dir}", "--restore-at", str(o), "--out", str(out)]
    )
    full = pq.read_table(full_out / "errors").to_pylist()
    resumed = pq.read_table(out / "errors").to_pylist()
    assert resumed == [r for r in full if r["offset"] > o] and resumed
    assert code == 0  # every fatal finding (before End of Push) lies before the offset
    part = json.loads((out / "summary.json").read_text())["partitions"][0]
    hb = max(x for x, k in scenario.heartbeats.items() if k == "usable" and x <= o)
    assert part["start"] == {"offset": o + 1, "restored_from_heartbeat": hb}
    assert part["first_offset"] == o + 1 and part["records"] == len(scenario.vt) - o - 1


def test_validate_restore_at_before_any_heartbeat_replays(scenario, tmp_path):
    fatal = min(r[3] for r in scenario.full["rows"] if r[8])  # the push job's lost record, before End of Push
    for o, code in ((fatal - 3, 1), (scenario.eop_offset - 2, 0)):
        out = tmp_path / f"early-{o}"
        assert (
            cli_main(
                [
                    "div",
                    "validate",
                    "--source",
                    f"0={scenario.vt_dir}",
                    "--restore-at",
                    str(o),
                    "--out",
                    str(out),
                ]
            )
            == code
        )
        part = json.loads((out / "summary.json").read_text())["partitions"][0]
        assert part["start"] == {"offset": o + 1, "restored_from_heartbeat": None}
        resumed = pq.read_table(out / "errors").to_pylist()
        assert [(r["offset"], r["type"], r["fatal"]) for r in resumed] == [
            (r[3], r[7], r[8]) for r in scenario.full["rows"] if r[3] > o
        ]


def test_reference_records_are_what_the_fixture_says():
    """Guard: the fixture's heartbeats use Venice's heartbeat key (so the product recognises them)."""
    from div import keys

    assert V.HB_KEY == keys.HEARTBEAT_KEY
