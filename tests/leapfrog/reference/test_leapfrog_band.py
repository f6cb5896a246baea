"""The linear-time heartbeat rule gives exactly the reference loop's verdict (finding, counters, pending)."""

from __future__ import annotations

import random

from leapfrog_histories import generated

from leapfrog import KeyRecord, compare_standing
from leapfrog.reference import check_partition
from leapfrog.reference.band import compare_standing_linear


def _history(rng: random.Random, n_regions: int, prefix: bool) -> list[KeyRecord]:
    """A random history with growing marks and vectors, as every real history has."""
    out = []
    vec = [-1] * n_regions
    hw = [rng.randint(-1, 3) for _ in range(n_regions)]
    if prefix:
        out.append(KeyRecord(None, tuple(vec), tuple(hw), -1, absent=True))
    for off in range(rng.randint(0, 12)):
        r = rng.randrange(n_regions)
        vec[r] = max(vec[r], hw[r] + rng.randint(-2, 3))
        hw = [h + rng.choice((0, 0, 1, 2)) for h in hw]
        hw = [max(h, v) for h, v in zip(hw, vec, strict=True)]
        value = rng.choice((None, 1, 2, 3))
        out.append(KeyRecord(value, tuple(vec), tuple(hw), off))
    return out


def test_random_monotone_histories():
    rng = random.Random(42)
    for _ in range(20_000):
        n = rng.randint(1, 3)
        a = _history(rng, n, rng.random() < 0.5)
        b = _history(rng, n, rng.random() < 0.5)
        assert compare_standing_linear(a, b) == compare_standing(a, b), (a, b)


def test_every_key_of_generated_histories():
    checked = 0
    for h in generated(60):
        result = check_partition(h.logs, mode="heartbeat", n_regions=h.n_regions)
        for x, y in result.pairs:
            sx, sy = result.scans[x], result.scans[y]
            for key in sx.keys() | sy.keys():
                a, b = sx.history(key), sy.history(key)
                assert compare_standing_linear(a, b) == compare_standing(a, b)
                checked += 1
    assert checked > 1000
