"""`tidegauge cut --snapshot` against the simulator's own truth (`sim.truth_at`, independent of the product's
rules), on a run with the faults that change what a region holds or what its VT still shows: dropped and poisoned
writes, a duplicate, a leader failover, an isolated region and a compacted VT range. At several times, every row a
snapshot marks exact is the region's true state, with or without the RTs: a compacted range may have removed a
key's newer record at or below the cut, so its older one must not be called exact.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from small_sim import small_sim

from pipelines.cli import main
from pipelines.cut.tasks import GapTracker
from sim.truth_at import RunTruth

pytestmark = [pytest.mark.kafka]

N = 3
FAULTS = {"dropped": 1, "poisoned": 1, "duplicate": 1, "failover": 1, "compaction": 1}


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    return small_sim(
        tmp_path_factory.mktemp("cut-truth") / "sim", seed=3, records=1500, keys=250, faults=FAULTS
    )


def _times(sim) -> list[int]:
    run = sim.result.truth["run"]
    return [int(t) for t in np.linspace(run["start_ms"], run["last_write_ms"], 5)[1:-1]]


@pytest.mark.parametrize("with_rt", [False, True], ids=["vt-only", "with-rt"])
def test_every_row_marked_exact_is_the_regions_true_state_compaction_included(sim, tmp_path, with_rt):
    truth = RunTruth.load(sim.result.out)
    assert any(f["kind"] == "compaction" for f in sim.result.truth["faults"])
    checked = 0
    for at_ms in _times(sim):
        for x in range(N):
            out = tmp_path / f"cut-{at_ms}-{x}"
            argv = ["cut", "--at", str(at_ms), "--snapshot", str(x), "--out", str(out)]
            for r in range(N):
                argv += ["--source", f"{r}={sim.archives[r]}"]
                if with_rt:
                    argv += ["--rt", f"{r}={sim.archives[r]}"]
            assert main(argv) == 0
            doc = json.loads((out / "cut.json").read_text())
            cut = {p["partition"]: tuple(p["rt"][str(r)] for r in range(N)) for p in doc["partitions"]}
            state = truth.state_at_cut(x, cut)
            wrong = []
            for row in pq.read_table(out / "snapshot").to_pylist():
                if not row["exact"]:
                    continue
                checked += 1
                want = state.get((row["partition"], row["key"]))
                got = (row["op"], row["value"] if row["op"] == "PUT" else None)
                if want is None or (want.op, want.value if want.op == "PUT" else None) != got:
                    wrong.append((at_ms, x, row["partition"], row["key"].hex(), got[0], want))
            assert not wrong, (
                f"{len(wrong)} rows marked exact are not the region's state at the cut: {wrong[:3]}"
            )
    assert checked > 500


def test_gap_tracker_finds_the_last_offset_after_which_records_are_missing() -> None:
    g = GapTracker(0)
    g.feed(pa.array([0, 1, 2, 5, 6]))
    g.feed(pa.array([9, 10]))
    assert g.last_gap(11) == 6  # 7, 8 missing
    assert g.last_gap(13) == 10  # and 11, 12 before ceil
    whole = GapTracker(0)
    whole.feed(pa.array([0, 1, 2]))
    assert whole.last_gap(3) == -1
