"""`repair plan` and `repair verify --source` read a region's current record of the wanted keys through change
capture, but decode only the rows that can bear on them (`pipelines.repair.job.wanted_rows`): that made a plan on
2 M VT records per region go from a decode of every record to a scan. The records it skips must change nothing:
on a simulation with leader failovers, redeliveries and duplicates, and on a chunked version (where it must not
skip: chunk keys carry suffixes), the current records equal those of a full decode, for random sets of keys."""

from __future__ import annotations

import random

import pytest
from chunked_scenario import STORE as CHUNKY
from chunked_scenario import Store, scenario
from small_sim import small_sim

from pipelines.core.progress import Progress
from pipelines.core.sources import SourceSpec, open_source
from pipelines.repair import job
from pipelines.repair.job import PlanOptions, read_current

pytestmark = [pytest.mark.kafka]


def _all_keys(archive: str, topic: str) -> dict[int, set[bytes]]:
    source = open_source(SourceSpec(0, archive))
    out: dict[int, set[bytes]] = {}
    for p in source.partitions(topic):
        first, end = source.bounds(topic, p)
        for batch in source.iter_partition(topic, p, start=first, end=end):
            for k in batch.column("key").to_pylist():
                if k and k[0] == 0:
                    out.setdefault(p, set()).add(k[1:])
    return out


def _both(monkeypatch, spec: SourceSpec, opts: PlanOptions, wanted: dict[int, set[bytes]], n: int):
    rows = {"given": 0, "kept": 0}
    skip = job.wanted_rows

    def counted(batch, keys):
        kept = skip(batch, keys)
        rows["given"] += batch.num_rows
        rows["kept"] += kept.num_rows
        return kept

    with Progress("test") as progress:
        with monkeypatch.context() as m:
            m.setattr(job, "wanted_rows", counted)
            filtered, info = read_current(spec, opts, wanted, n, progress)
        info.skip = rows
        with monkeypatch.context() as m:
            m.setattr(job, "wanted_rows", lambda batch, keys: batch)  # every row decoded
            whole, _ = read_current(spec, opts, wanted, n, progress)
    return filtered, whole, info


def test_skipping_other_keys_rows_changes_no_current_record(tmp_path, monkeypatch):
    sim = small_sim(tmp_path / "sim", faults={"failover": 1, "redelivery": 1, "duplicate": 1, "dropped": 1})
    rng = random.Random(3)
    for x, archive in sim.archives.items():
        keys = _all_keys(archive, sim.topic)
        opts = PlanOptions(sim.store, sim.version, [], "", "")
        for _ in range(3):
            wanted = {p: set(rng.sample(sorted(ks), max(1, len(ks) // 10))) for p, ks in keys.items()}
            filtered, whole, info = _both(monkeypatch, SourceSpec(x, archive), opts, wanted, 3)
            assert filtered == whole and any(r is not None for r in filtered.values())
            assert info.skip["kept"] < info.skip["given"] / 2  # most rows were skipped, not decoded


def test_a_chunked_version_is_read_whole(tmp_path, monkeypatch):
    s = Store(chunked=True)
    scenario(s)
    archives = s.write(tmp_path / "chunky")
    opts = PlanOptions(CHUNKY, 1, [], "", "")
    wanted = {0: {b"big-same", b"big-diff", b"small"}}
    for x, archive in archives.items():
        filtered, whole, info = _both(monkeypatch, SourceSpec(x, archive), opts, wanted, 3)
        assert filtered == whole and info.skip["given"] == 0  # never skipped
        assert filtered[(0, b"big-same")] is not None and len(filtered[(0, b"big-same")].value) > 1000
