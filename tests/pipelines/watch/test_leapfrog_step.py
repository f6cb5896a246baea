"""Continuous Leap Frog, micro-batch by micro-batch, names the divergences a nightly run over the same records names.

Generated histories with known divergences (tests/support/leapfrog_histories.py) are written as one archive per
region; the batch job over the whole archives is the oracle. The watch's step then reads each partition's records
cut, per region, at random offsets into micro-batches (a region may have nothing in a micro-batch), carrying its
state from one to the next through `PartitionState.to_bytes` as a state store would. Its findings must name the
same (partition, pair, key, type), each once.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from leapfrog_histories import generated
from nightly_oracle import named, nightly
from vt_fixtures import TOPIC, write_archives

from div import archive
from pipelines.watch.leapfrog_step import RECORD_COLUMNS, LeapfrogStep, PartitionState

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _micro_batches(table: pa.Table, cuts: int, rng: random.Random) -> list[pa.Table]:
    at = sorted(rng.randint(0, table.num_rows) for _ in range(cuts - 1))
    bounds = [0, *at, table.num_rows]
    return [table.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@pytest.fixture(scope="module")
def world(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("step")
    histories = [h for h in generated(30) if h.n_regions == 3][:48]
    dirs = write_archives(histories, root / "archives")
    expected = nightly(spark, dirs, root / "batch")
    assert len(expected) > 10, "too few divergences for the comparison to mean anything"
    return histories, dirs, expected


@pytest.mark.parametrize("seed,cuts", [(0, 1), (1, 2), (3, 12)])
def test_micro_batches_name_what_a_nightly_run_names(world, seed, cuts):
    histories, dirs, expected = world
    rng = random.Random(seed)
    step = LeapfrogStep(((0, 1), (0, 2), (1, 2)), 3)
    found = []
    for p in range(len(histories)):
        per_region = {
            x: _micro_batches(
                pa.Table.from_batches(list(archive.iter_partition(d, TOPIC, p, columns=RECORD_COLUMNS))),
                cuts,
                rng,
            )
            for x, d in dirs.items()
        }
        state_bytes = None
        for i in range(cuts):
            state = PartitionState.from_bytes(state_bytes) if state_bytes is not None else None
            result = step(p, {x: batches[i] for x, batches in per_region.items()}, state)
            assert not result.failed and not result.chunked
            found.extend(result.findings.to_pylist())
            state_bytes = result.state.to_bytes()
    assert named(found) == expected
