"""Resumed runs in numpy equal the reference: logs split in two, the second run FromState, key by key.

For every generated history split at a random offset, the reference runs part 1, carries its state and runs
part 2; the vectorized rule, given the same carried records, must build the same histories' verdicts (finding,
comparable pairs net of those counted before, skipped, pending) and carry exactly the same records on.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from leapfrog_histories import generated
from test_leapfrog_vectorized import _rows

from leapfrog import vectorized as vz
from leapfrog.reference import FromState, RegionLog, carry_state, check_partition


def _split(h, rng, latest_kept: bool):
    first, second = {}, {}
    for x, log in h.logs.items():
        last = (
            log.last_offset
            if log.last_offset is not None
            else (log.entries[-1].vt_offset if log.entries else 0)
        )
        begin = getattr(log.start, "eop_offset", None)
        begin = getattr(log.start, "vt_offset", begin) if begin is None else begin
        begin = begin if begin is not None else -1
        cut = rng.randint(begin, max(last, begin))
        first[x] = RegionLog([e for e in log.entries if e.vt_offset <= cut], log.start, cut, latest_kept)
        second[x] = [e for e in log.entries if e.vt_offset > cut], log.last_offset
    return first, second


def _carried(state_region, keys) -> vz.Carried:
    gid_of = {k: i for i, k in enumerate(keys)}
    rows = []
    for key, ck in state_region.keys.items():
        for j, r in enumerate(ck.records):
            rows.append((gid_of[key], r, ck.last_open if j == len(ck.records) - 1 else False))
    rows.sort(key=lambda t: (t[0], t[1].vt_offset))
    n = len(state_region.final_hw)
    return vz.Carried(
        np.array([t[0] for t in rows], np.int64),
        np.array([vz.NULL_CLASS if t[1].value_hash is None else t[1].value_hash for t in rows], np.int64),
        np.array([t[1].absent for t in rows], bool),
        np.array([t[1].vt_offset for t in rows], np.int64),
        np.array([t[1].vector for t in rows], np.int64).reshape(len(rows), n),
        np.array([t[1].high_watermark for t in rows], np.int64).reshape(len(rows), n),
        np.array([t[2] for t in rows], bool),
    )


@pytest.mark.parametrize("kept_1, kept_2", [(True, True), (False, False), (False, True), (True, False)])
def test_resumed_runs_equal_reference(kept_1, kept_2):
    """`kept_*`: whether each run's logs keep every key's latest record (a live read may lose the promise)."""
    rng = random.Random(11)
    compared = 0
    for h in generated(40):
        first, second = _split(h, rng, kept_1)
        run1 = check_partition(first, mode="heartbeat", n_regions=h.n_regions)
        state = carry_state(run1)
        logs2 = {x: RegionLog(second[x][0], FromState(state), second[x][1], kept_2) for x in second}
        run2 = check_partition(logs2, mode="heartbeat", n_regions=h.n_regions)
        state2 = carry_state(run2)
        scans = run2.scans
        keys = sorted(set().union(*(s.keys() for s in scans.values())))
        groups = np.arange(len(keys), dtype=np.int64)
        carried = {x: _carried(state.regions[x], keys) for x in scans}
        hist, prev, real = {}, {}, {}
        for x, s in scans.items():
            rows = _rows(s, logs2[x], keys)
            hist[x] = vz.build(s.view, *rows, groups, carried[x])
            prev[x] = vz.previous(s.view, carried[x], groups)
            real[x] = np.union1d(rows[0], carried[x].gid)
        for (x, y), counters in run2.pair_counters.items():
            present = np.union1d(real[x], real[y])
            res = vz.compare(hist[x], hist[y], present)
            in_state = np.array(
                [g in set(carried[x].gid.tolist()) | set(carried[y].gid.tolist()) for g in present.tolist()],
                bool,
            )
            before = (
                vz.compare(prev[x], prev[y], present[in_state]).comparable_pairs.sum()
                if in_state.any()
                else 0
            )
            assert res.comparable_pairs.sum() - before == counters.comparable_pairs, (h.seed, h.mix.name)
            assert res.skipped.sum() == counters.skipped_pairs, (h.seed, h.mix.name)
            assert res.pending.sum() == counters.pending_keys, (h.seed, h.mix.name)
            # findings: this run's, merged with the carried ones by (b offset, a offset)
            got = {}
            for gi in np.flatnonzero(res.find_b >= 0).tolist():
                ia, ib = int(res.find_a[gi]), int(res.find_b[gi])
                a_off = -1 if hist[x].absent[ia] else int(hist[x].offset[ia])
                b_off = -1 if hist[y].absent[ib] else int(hist[y].offset[ib])
                got[keys[int(present[gi])]] = (b_off, a_off)
            for (a, b, key), f in state.findings.items():
                if (a, b) == (x, y) and (key not in got or f.order < got[key]):
                    got[key] = f.order
            want = {f.key: f.order for f in run2.findings if (f.region_a, f.region_b) == (x, y)}
            assert got == want, (h.seed, h.mix.name)
        # what is carried on
        for x, s in scans.items():
            partners = [z for pair in run2.pairs for z in pair if x in pair and z != x]
            last_k = [vz.last_vectors(hist[z], scans[z].view, groups) for z in partners]
            had = None
            c = carried[x]
            if len(c):
                starts = np.flatnonzero(np.concatenate([[True], c.gid[1:] != c.gid[:-1]]))
                lasts = np.concatenate([starts[1:], [len(c)]]) - 1
                had = (c.gid[lasts], c.last_open[lasts], c.mark[lasts])
            keep, last_open, marks = vz.carry(hist[x], s.view, real[x], last_k, groups, had)
            got = {}
            for i, lo, mk in zip(keep.tolist(), last_open.tolist(), marks.tolist(), strict=True):
                got.setdefault(keys[int(hist[x].gid[i])], []).append((int(hist[x].offset[i]), tuple(mk), lo))
            want = {}
            for key, ck in state2.regions[x].keys.items():
                recs = [(r.vt_offset, tuple(r.high_watermark), False) for r in ck.records]
                recs[-1] = recs[-1][:2] + (ck.last_open,)
                want[key] = recs
            assert got == want, (h.seed, h.mix.name, x)
        compared += 1
    assert compared > 400
