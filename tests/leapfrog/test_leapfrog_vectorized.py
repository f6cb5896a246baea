"""The numpy heartbeat rule gives, key by key, exactly `compare_standing`'s verdict on generated histories."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from leapfrog_histories import generated

from leapfrog import compare_standing
from leapfrog import vectorized as vz
from leapfrog.reference import DataEntry, check_partition


def _rows(scan, log, keys: list[bytes]):
    """One region's data rows in (key, VT order) as the Spark stage sees them."""
    gid_of = {k: i for i, k in enumerate(keys)}
    entries = [e for e in log.entries if isinstance(e, DataEntry) and 0 <= e.source_region < scan.n]
    hw_before = {r.vt_offset: r.hw_before for recs in scan.new.values() for r in recs}
    entries.sort(key=lambda e: (gid_of[e.key], e.vt_offset))
    n = scan.n
    gid = np.array([gid_of[e.key] for e in entries], np.int64)
    off = np.array([e.vt_offset for e in entries], np.int64)
    cls = np.array([vz.NULL_CLASS if e.value_hash is None else e.value_hash for e in entries], np.int64)
    src = np.array([e.source_region for e in entries], np.int64)
    src_off = np.array([e.source_offset for e in entries], np.int64)
    hwb = np.array([hw_before[e.vt_offset] for e in entries], np.int64).reshape(len(entries), n)
    return gid, off, cls, src, src_off, hwb


@pytest.mark.parametrize("latest_kept", [True, False], ids=["latest-kept", "gaps-may-hide-any-key"])
def test_vectorized_equals_reference(latest_kept):
    checked = found = 0
    for h in generated(60):
        if any(
            not log.start.__class__.__name__ == "FromEndOfPush"
            and not log.start.__class__.__name__ == "FromHeartbeat"
            for log in h.logs.values()
        ):
            continue
        logs = {x: replace(log, latest_kept=latest_kept) for x, log in h.logs.items()}
        result = check_partition(logs, mode="heartbeat", n_regions=h.n_regions)
        scans = result.scans
        keys = sorted(set().union(*(s.keys() for s in scans.values())))
        groups = np.arange(len(keys), dtype=np.int64)
        hist = {x: vz.build(s.view, *_rows(s, h.logs[x], keys), groups) for x, s in scans.items()}
        for x, y in result.pairs:
            present = np.array([k in scans[x].new or k in scans[y].new for k in keys], bool)
            res = vz.compare(hist[x], hist[y], groups[present])
            for gi, g in enumerate(groups[present].tolist()):
                key = keys[g]
                ref = compare_standing(scans[x].history(key), scans[y].history(key))
                assert res.comparable_pairs[gi] == ref.comparable_pairs, (h.seed, h.mix.name, key)
                assert res.skipped[gi] == ref.skipped_pairs, (h.seed, h.mix.name, key)
                assert bool(res.pending[gi]) == ref.pending, (h.seed, h.mix.name, key)
                assert bool(res.converged[gi]) == ref.converged, (h.seed, h.mix.name, key)
                if ref.finding is None:
                    assert res.find_b[gi] == -1, (h.seed, h.mix.name, key)
                    continue
                found += 1
                ia, ib = res.find_a[gi], res.find_b[gi]
                f = ref.finding
                a_off = -1 if f.a is None else f.a.vt_offset
                b_off = -1 if f.b is None else f.b.vt_offset
                assert (int(hist[x].offset[ia]), int(hist[y].offset[ib])) == (a_off, b_off), (h.seed, key)
                assert tuple(hist[x].mark[ia]) == (f.a.high_watermark if f.a else tuple(hist[x].mark[ia]))
                assert tuple(hist[y].vector[ib]) == (f.b.vector if f.b else tuple(hist[y].vector[ib]))
                checked += 1
            checked += 1
    assert checked > 1000 and found > 50


@pytest.mark.parametrize("scale", [1, 1 << 40, 1 << 58])
def test_group_keys_order_as_pairs(scale):
    """`_group_keys` orders (gid, value) pairs as tuples do, and ties them as tuples do, whether the values fit
    as they are (no sort) or need their ranks (offsets near 2^62 in a chunk of many groups)."""
    from leapfrog.vectorized import _group_keys

    rng = np.random.default_rng(scale % 1000)
    gx, gy = rng.integers(0, 50, 300), rng.integers(0, 50, 200)
    x, y = rng.integers(-1, 20, 300) * scale, rng.integers(-1, 20, 200) * scale
    kx, ky = _group_keys(gx, x, gy, y)
    pairs = list(zip(np.concatenate([gx, gy]).tolist(), np.concatenate([x, y]).tolist(), strict=True))
    keys = np.concatenate([kx, ky]).tolist()
    for i in range(0, len(pairs), 7):
        for j in range(0, len(pairs), 5):
            assert (pairs[i] < pairs[j]) == (keys[i] < keys[j])
            assert (pairs[i] == pairs[j]) == (keys[i] == keys[j])


def test_inside_marks_exactly_the_positions_ranges_lists():
    rng = np.random.default_rng(5)
    for _ in range(50):
        # ranges apart, some empty, some touching the next (a slice ending where the next begins)
        cuts = np.sort(rng.choice(np.arange(200), size=2 * int(rng.integers(0, 20)), replace=True))
        lo, hi = cuts[0::2], cuts[1::2]
        size = 200 + int(rng.integers(0, 3))
        want = np.zeros(size, bool)
        want[vz.ranges(lo, hi)[0]] = True
        assert np.array_equal(vz.inside(size, lo, hi), want)
    assert np.array_equal(vz.inside(4, np.array([0, 2]), np.array([2, 4])), np.ones(4, bool))
    assert not vz.inside(3, np.array([], np.int64), np.array([], np.int64)).any()
