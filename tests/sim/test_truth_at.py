"""The simulator's truth at a time (`sim.truth_at`), checked against what the run itself left behind: at the end
every region's state equals what its VT ends with (read back from the archive: the bulk load, then each key's last
record), faults included; at any time the regions differ exactly on the keys of the dropped and poisoned writes at
or below the cut, and nowhere once those are left out; cuts and states only grow with time.

One small run (3 regions x 2 partitions) with the faults that change what a leader applies (dropped, poisoned,
duplicate) or the order and number of times it applies (failover, isolated), and a compacted VT range, shared by
the module.
"""

from __future__ import annotations

import json
import shutil
from itertools import combinations

import numpy as np
import pytest
from small_sim import small_sim

from div import archive
from div.envelope import EnvelopeCodec
from div.records import Kind, footer_source, iter_records
from div.rmd import decode_rmd
from heartbeat.records import parse_vt_heartbeat
from sim.truth_at import KeyState, RunTruth, TruthError, _Write, truth_at

pytestmark = [pytest.mark.kafka]

FAULTS = {"dropped": 2, "poisoned": 1, "duplicate": 1, "failover": 1, "isolated": 1, "compaction": 1}


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    return small_sim(
        tmp_path_factory.mktemp("truth-at") / "sim", seed=3, records=1500, keys=250, faults=FAULTS
    )


@pytest.fixture(scope="module")
def run_truth(sim):
    return RunTruth.load(sim.result.out)


def _vt_state(rec, bulk: bool) -> KeyState:
    """What a VT data record says its key holds: op, value, and after End of Push the RMD timestamp and the
    coordinates of the footer."""
    body = rec.env["payloadUnion"][1]
    k = rec.kind
    value = body["putValue"] if k is Kind.PUT else None
    if bulk:
        return KeyState(k.name, value, None, None, None)
    region, offset = footer_source(rec.env)
    return KeyState(
        k.name, value, decode_rmd(body["replicationMetadataPayload"])["timestamp"], region, offset
    )


def _vt_final_state(directory: str, topic: str, eop_offsets: dict) -> dict:
    """What a region's VT ends with, per (partition, key): the bulk load, then each key's last data record (the
    leader writes only winners, so the last one is the key's state)."""
    codec = EnvelopeCodec()
    out: dict = {}
    for info in archive.describe(directory):
        if info.topic != topic:
            continue
        p = info.partition
        for batch in archive.iter_partition(directory, topic, p):
            for rec in iter_records(batch, codec):
                if rec.kind in (Kind.PUT, Kind.DELETE):
                    out[(p, rec.key[1:])] = _vt_state(rec, rec.offset < eop_offsets[str(p)])
    return out


def _faults(truth: dict, kind: str) -> list[dict]:
    return [f for f in truth["faults"] if f["kind"] == kind]


def test_the_run_has_what_the_checks_need(sim):
    truth = sim.result.truth
    assert truth["faults_shortfall"] == {}
    f = _faults(truth, "failover")[0]
    assert f["vt_offsets"][str(f["region"])], "the successor re-applied writes"


@pytest.mark.parametrize("region", [0, 1, 2])
def test_the_state_at_the_end_is_what_each_vt_ends_with(sim, run_truth, region):
    truth = sim.result.truth
    vt = _vt_final_state(sim.archives[region], sim.topic, truth["run"]["eop_offsets"])
    final = run_truth.final_state(region)
    assert final == vt
    assert run_truth.state_at(region, truth["run"]["end_ms"] + 60_000) == final
    # every winner is a write the region's leaders wrote (truth.json's own record of them)
    applied = truth["changes"]["regions"][str(region)][str(sim.version)]["applied"]
    for (p, _), st in final.items():
        if not st.from_bulk_load:
            assert st.upstream_offset in applied[str(p)][str(st.upstream_region)]


def test_the_state_at_a_vt_heartbeat_is_what_the_vt_holds_there(sim, run_truth):
    """A VT heartbeat's `hbw` vector is exactly what its leader had processed (the simulator flushes first), so the
    VT up to it holds the state at the cut equal to that vector: an independent check of the state mid-run, every
    fault of the partition included. Partitions with a failover (the predecessor's records can lie above its
    successor's first vectors) or a compacted range (records removed for later ones) are left out."""
    truth = sim.result.truth
    eop = truth["run"]["eop_offsets"]
    skip = {(f["region"], f["partition"]) for f in truth["faults"] if f["kind"] in ("failover", "compaction")}
    checked = 0
    for x in range(run_truth.regions):
        codec = EnvelopeCodec()
        for p in range(run_truth.partitions):
            if (x, p) in skip:
                continue
            held: dict = {}
            for batch in archive.iter_partition(sim.archives[x], sim.topic, p):
                for rec in iter_records(batch, codec):
                    k = rec.kind
                    if k is Kind.HEARTBEAT and rec.offset > eop[str(p)]:
                        hb = parse_vt_heartbeat(rec.key, rec.env, rec.headers, decode_div_state=False)
                        cut = {q: (-1,) * run_truth.regions for q in range(run_truth.partitions)}
                        cut[p] = tuple(hb.watermarks.high_watermarks)
                        state = run_truth.state_at_cut(x, cut)
                        assert {k: v for k, v in state.items() if k[0] == p} == held, (x, p, rec.offset)
                        checked += 1
                    elif k is Kind.PUT or k is Kind.DELETE:
                        held[(p, rec.key[1:])] = _vt_state(rec, rec.offset < eop[str(p)])
    assert checked > 20


def _fault_keys(truth: dict, cut: dict, a: int, b: int) -> set[tuple[int, bytes]]:
    """Keys where regions a and b must differ at `cut`: a dropped write at or below it applied in one of them
    only, a poisoned one changed in one of them only."""
    out = set()
    for f in _faults(truth, "dropped"):
        origin = f["region"]
        if f["rt_offset"] <= cut[f["partition"]][origin] and (origin in (a, b)):
            out.add((f["partition"], bytes.fromhex(f["key"])))
    for f in _faults(truth, "poisoned"):
        origin, x = f["detail"]["origin_region"], f["detail"]["poisoned_in"]
        if f["rt_offset"] <= cut[f["partition"]][origin] and (x in (a, b)):
            out.add((f["partition"], bytes.fromhex(f["key"])))
    return out


def _times(truth: dict) -> list[int]:
    """Times from before the first write to after the last: each dropped or poisoned write's own millisecond and
    the one before it, and evenly spaced ones."""
    run = truth["run"]
    t0, t1 = run["start_ms"], run["last_write_ms"]
    times = {t0 - 1, t1, run["end_ms"]} | {t0 + (t1 - t0) * i // 6 for i in range(1, 6)}
    for f in _faults(truth, "dropped") + _faults(truth, "poisoned"):
        times |= {f["time_ms"] - 1, f["time_ms"]}
    return sorted(times)


def test_regions_differ_exactly_on_the_faults_keys_at_any_time(sim, run_truth):
    truth = sim.result.truth
    seen_fault_keys = 0
    for t in _times(truth):
        at = run_truth.at(t)
        for a, b in combinations(range(run_truth.regions), 2):
            sa, sb = at.states[a], at.states[b]
            differ = {k for k in sa.keys() | sb.keys() if sa.get(k) != sb.get(k)}
            expected = _fault_keys(truth, at.cut, a, b)
            assert differ == expected, (t, a, b)
            seen_fault_keys += len(expected)
    assert seen_fault_keys, "some times lie after the faults"
    # before a dropped write, every region holds what the origin held before it; at its time the origin has it
    f = _faults(truth, "dropped")[0]
    key = (f["partition"], bytes.fromhex(f["key"]))
    before, at = run_truth.at(f["time_ms"] - 1), run_truth.at(f["time_ms"])
    assert at.states[f["region"]][key].upstream_offset == f["rt_offset"]
    for x in f["detail"]["dropped_in"]:
        assert at.states[x].get(key) == before.states[x].get(key) == before.states[f["region"]].get(key)


def test_cuts_and_states_only_grow_with_time(sim, run_truth):
    truth = sim.result.truth
    times = _times(truth)
    first = run_truth.at(times[0])
    assert all(c == (-1,) * run_truth.regions for c in first.cut.values()), "nothing before the first write"
    assert all(st.from_bulk_load for s in first.states.values() for st in s.values())
    assert len(first.states[0]) == truth["run"]["batch_records"]
    previous = first
    for t in times[1:]:
        now = run_truth.at(t)
        for p, c in now.cut.items():
            assert all(x >= y for x, y in zip(c, previous.cut[p], strict=True)), (t, p)
        for x, state in now.states.items():
            old = previous.states[x]
            assert old.keys() <= state.keys()
            for k, st in old.items():
                assert (state[k].logical_ts or -1) >= (st.logical_ts or -1), (t, x, k)
        previous = now
    assert previous.cut == run_truth.end_cut()
    assert previous.states == {x: run_truth.final_state(x) for x in range(run_truth.regions)}
    # the one-call form reads the directory again and says the same
    mid = times[len(times) // 2]
    assert truth_at(sim.result.out, mid, regions=[1]).states == {1: run_truth.state_at(1, mid)}


def test_what_cannot_give_a_truth_is_refused(sim, run_truth, tmp_path):
    truth = sim.result.truth
    with pytest.raises(TruthError, match="no truth.json"):
        RunTruth.load(tmp_path)
    unfinished = dict(truth, run=dict(truth["run"], end_ms=None))
    (tmp_path / "truth.json").write_text(json.dumps(unfinished))
    with pytest.raises(TruthError, match="has not finished"):
        RunTruth.load(tmp_path)
    swapped = dict(truth, faults=[*truth["faults"], {"id": 99, "kind": "swap"}])
    (tmp_path / "truth.json").write_text(json.dumps(swapped))
    with pytest.raises(TruthError, match="version swap"):
        RunTruth.load(tmp_path)
    # an RT partition with a missing file: a write of the cut could be in it
    (tmp_path / "truth.json").write_text(json.dumps(truth))
    shutil.copytree(sim.result.out + "/archive", tmp_path / "archive")
    rt = truth["run"]["rt_topic"]
    victim = sorted((tmp_path / "archive" / "dc-1").glob(f"{rt}+00001+*.parquet"))[0]
    victim.unlink()
    with pytest.raises(TruthError, match=rf"dc-1: {rt}\[1\] should hold offsets 0\.\."):
        RunTruth.load(tmp_path)
    with pytest.raises(TruthError, match="regions 0..2"):
        run_truth.final_state(3)


# -- the rules on hand-made histories ----------------------------------------------------------------------------

# ByteBuffer.hashCode folds the bytes from the last: 31 * 0x61 + 0x41 == 31 * 0x62 + 0x22, so these two values tie
# on DCR's hash and the write applied first stays.
TIE_A, TIE_B = b"\x41\x61", b"\x22\x62"
KEY = b"\x02k1"


def _hand_made(writes: list[_Write], faults: list[dict], lag: int = 100) -> RunTruth:
    truth = {
        "run": {"store": "s", "version": 1, "regions": 2, "partitions": 1},
        "regions": [
            {"region": x, "lag_ms_from": {str(r): 0 if r == x else lag for r in range(2)}} for x in range(2)
        ],
        "faults": faults,
    }
    offsets, times, by_rt = {}, {}, {}
    for r in range(2):
        mine = [w for w in writes if w.region == r]
        offsets[(r, 0)] = np.array([w.offset for w in mine], dtype=np.int64)
        times[(r, 0)] = np.array([w.broker_ms for w in mine], dtype=np.int64)
        by_rt[(r, 0)] = mine
    return RunTruth(truth, offsets, times, by_rt, {})


def test_the_second_copy_of_a_duplicate_is_dropped():
    # a DELETE wins a tie on timestamps, so an applied copy would take the key's coordinates
    writes = [
        _Write(0, 0, 10, KEY, TIE_A, 10),
        _Write(0, 1, 20, KEY, None, 20),
        _Write(0, 2, 20, KEY, None, 20),
    ]
    dup = {"kind": "duplicate", "region": 0, "partition": 0, "rt_offset": 1, "detail": {"copy_offset": 2}}
    for x in range(2):
        assert _hand_made(writes, [dup]).final_state(x) == {(0, KEY): KeyState("DELETE", None, 20, 0, 1)}
        assert _hand_made(writes, []).final_state(x)[(0, KEY)].upstream_offset == 2


def test_ties_are_broken_in_the_order_the_leaders_process_records():
    # equal logical timestamps and hashes: each region keeps the write it processed first. Region 1 processes
    # region 0's write (written at 1000) at 1100, its own (written at 1150) at 1150; isolated from 1050 to 1200,
    # it gets region 0's at 1200, after its own.
    writes = [_Write(0, 0, 1000, KEY, TIE_A, 5), _Write(1, 0, 1150, KEY, TIE_B, 5)]
    plain = _hand_made(writes, [])
    assert plain.final_state(0)[(0, KEY)].value == TIE_A
    assert plain.final_state(1)[(0, KEY)].value == TIE_A
    isolated = {"kind": "isolated", "region": 1, "time_ms": 1050, "end_ms": 1200}
    cut_off = _hand_made(writes, [isolated])
    assert cut_off.final_state(0)[(0, KEY)].value == TIE_A
    assert cut_off.final_state(1)[(0, KEY)].value == TIE_B
    # the cut leaves out what was written after T, whatever the order: at 1100 region 1 holds region 0's write
    assert cut_off.state_at(1, 1100) == {(0, KEY): KeyState("PUT", TIE_A, 5, 0, 0)}
