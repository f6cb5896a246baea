"""Continuous Leap Frog, micro-batch by micro-batch, names the divergences a nightly run over the same records names.

Generated histories with known divergences (tests/support/leapfrog_histories.py) are written as one archive per
region; the batch job over the whole archives is the oracle. The watch's step then reads each partition's records
cut, per region, at random offsets into micro-batches (a region may have nothing in a micro-batch), carrying its
state from one to the next through `PartitionState.to_bytes` as a state store would. Its findings must name the
same (partition, pair, key, type), each once.

The same histories written as a chunked version (tests/support/chunked_histories.py: some values stored as chunks
and a manifest, every key suffixed, old chunks deleted) must give the same findings, to the nightly job and to
the watch, whether a micro-batch cut falls between a manifest and its chunks or not.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from chunked_histories import write_chunked_archives
from leapfrog_histories import generated
from newer_protocol import announced_first, reencode_archive
from nightly_oracle import named, nightly
from vt_fixtures import TOPIC, write_archives

from div import archive
from div.envelope_columns import read_envelopes
from pipelines.watch import settled
from pipelines.watch.leapfrog_step import RECORD_COLUMNS, LeapfrogStep, PartitionState
from pipelines.watch.settled import MemoryBackend, PartitionStore, forget_cached

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _micro_batches(
    table: pa.Table, cuts: int, rng: random.Random, not_at: int | None = None
) -> list[pa.Table]:
    """`table` cut at random into `cuts` micro-batches (some may be empty); no cut right after row `not_at`."""
    at = sorted(rng.randint(0, table.num_rows) for _ in range(cuts - 1))
    at = [a + 1 if not_at is not None and a == not_at + 1 else a for a in at]
    bounds = [0, *at, table.num_rows]
    return [table.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _step_once(
    step, p: int, records: dict, state_bytes, backend: MemoryBackend, rng: random.Random, split: bool
):
    """One micro-batch of the step. `split`: the state kept as the watch keeps it (`settled.PartitionStore` over
    `backend`), now and then after an attempt that failed (Spark runs it again from the state before it) or with a
    worker that forgot its cache (a restart, another worker); else the state as one value, `state_bytes`."""
    if split:
        if rng.random() < 0.2:
            PartitionStore(backend.copy(), p).run(step, p, records)  # an attempt that failed
        if rng.random() < 0.2:
            forget_cached()
        return PartitionStore(backend, p).run(step, p, records)
    state = PartitionState.from_bytes(state_bytes) if state_bytes is not None else None
    return step(p, records, state)


def _watched(
    dirs: dict,
    partitions: int | range,
    cuts: int,
    rng: random.Random,
    strict: bool = True,
    statuses: dict | None = None,
    split: bool = False,
    split_from: int = 0,
) -> list[dict]:
    """The findings of the watch's step over every partition's records cut into `cuts` micro-batches, the state
    round-tripped through bytes between them (`strict`: no region may fail, no partition turn chunked late).
    `statuses` receives each finding's latest status: the one it was found with, then its changes.

    `split`: the state kept as the watch keeps it (`settled.PartitionStore`: the small value, the settled keys'
    base and log, the worker's cache), with now and then a micro-batch run twice (a failed attempt, then Spark's
    re-run from the state before it) or a worker that forgot its cache (a restart, another worker); from
    micro-batch `split_from` on, the micro-batches before it keeping the state as one value, as the watch did
    before issue 42 (the split layout goes on from such a value)."""
    step = LeapfrogStep(((0, 1), (0, 2), (1, 2)), 3)
    found = []
    for p in range(partitions) if isinstance(partitions, int) else partitions:
        per_region = {
            x: _micro_batches(
                pa.Table.from_batches(list(archive.iter_partition(d, TOPIC, p, columns=RECORD_COLUMNS))),
                cuts,
                rng,
            )
            for x, d in dirs.items()
        }
        state_bytes = None
        backend = MemoryBackend()
        for i in range(cuts):
            records = {x: batches[i] for x, batches in per_region.items()}
            if split and i == split_from and state_bytes is not None:
                backend.small = state_bytes
            result = _step_once(step, p, records, state_bytes, backend, rng, split and i >= split_from)
            if strict:
                assert not result.failed and not result.chunked_late
            found.extend(result.findings.to_pylist())
            if statuses is not None:
                for f in result.findings.to_pylist():
                    statuses[(p, f["region_a"], f["region_b"], f["key"])] = f["status"]
                for a, b, key, status in result.status_changes:
                    assert (p, a, b, key) in statuses, "a status change of a finding never reported"
                    statuses[(p, a, b, key)] = status
            state_bytes = result.state.to_bytes()
    return found


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
    found = _watched(dirs, len(histories), cuts, random.Random(seed))
    assert named(found) == expected


def test_settled_keys_kept_apart_give_the_nightly_findings_and_status(world, nightly_status, monkeypatch):
    """With the settled keys' records apart from the small value (only the touched keys' taken into a
    micro-batch), through cached and rebuilt records, re-run micro-batches and compactions of the base (a low
    threshold makes them frequent), the findings and their statuses are the nightly run's (over 24 of the
    partitions, to keep the test short) — also when it goes on from a value written before the split."""
    monkeypatch.setattr(settled, "MIN_COMPACTION_ROWS", 40)
    _, dirs, expected = world
    statuses: dict = {}
    some = range(16, 40)
    found = _watched(dirs, some, 10, random.Random(4), statuses=statuses, split=True, split_from=3)
    assert named(found) == [f for f in expected if f[0] in some]
    assert statuses == {k: v for k, v in nightly_status.items() if k[0] in some}
    assert "healed" in statuses.values() and "open" in statuses.values()


def test_a_micro_batch_writes_what_its_keys_touch_not_what_the_partition_holds(world):
    """A partition whose state holds many settled keys: a micro-batch reads the small value only (its worker
    holds the settled records) and writes the small value and a log entry of the keys it touched, of the same
    size as on a partition holding few; the base is not rewritten."""
    histories, dirs, _ = world
    step = LeapfrogStep(((0, 1), (0, 2), (1, 2)), 3)
    written = {}
    for extra in (0, 50_000):
        forget_cached()
        tables = {
            x: pa.Table.from_batches(list(archive.iter_partition(d, TOPIC, 0, columns=RECORD_COLUMNS)))
            for x, d in dirs.items()
        }
        half = {x: t.slice(0, t.num_rows // 2) for x, t in tables.items()}
        rest = {x: t.slice(t.num_rows // 2) for x, t in tables.items()}
        backend = MemoryBackend()
        PartitionStore(backend, "p0").run(step, 0, half)
        if extra:  # keys no record touches, settled in every region, as `leapfrog.settle` leaves them
            backend.rewrite(settled.ipc_bytes(_settled_rows(extra, 3)))
            settled._CACHE["p0"] = (
                PartitionState.from_bytes(backend.small).settled["token"],
                settled.SettledRecords(settled.ipc_table(backend.base_value)),
            )
        backend.read_bytes = backend.written_bytes = 0
        store = PartitionStore(backend, "p0")
        store.run(step, 0, rest)
        assert store.stats.cached and store.stats.base_bytes == 0
        assert store.stats.settled_rows >= 3 * extra
        written[extra] = (backend.read_bytes, backend.written_bytes, store.stats.entry_rows)
    small, large = written[0], written[50_000]
    assert large[2] == small[2] > 0  # the same log entry: the touched keys
    assert large[0] <= small[0] * 1.1 and large[1] <= small[1] * 1.1, written
    assert len(settled.ipc_bytes(_settled_rows(50_000, 3))) > 20 * large[1]  # what a whole value would write


def test_split_state_is_the_whole_state_micro_batch_by_micro_batch(tmp_path):
    """bench's workload (last-writer-wins leaders with hot keys, so settled keys are written again and again),
    cut into micro-batches: with the settled records apart, every micro-batch gives the whole value's findings,
    counters and status changes, and its records in play plus the settled ones — from the worker's memory, and
    rebuilt from the base and the log — are the whole value's carried records."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from leapfrog_workload import Workload, generate

    w = Workload(regions=3, partitions=1, vt_records=3000, keys=200, hot_keys=20, heartbeat_every=100)
    generate(w, str(tmp_path))
    step = LeapfrogStep(((0, 1), (0, 2), (1, 2)), 3)
    cut = {
        x: _micro_batches(
            pa.Table.from_batches(
                list(
                    archive.iter_partition(
                        str(tmp_path / "full" / f"dc-{x}"), "bench_v1", 0, columns=RECORD_COLUMNS
                    )
                )
            ),
            8,
            random.Random(x),
        )
        for x in range(3)
    }
    order = ["key", "region", "offset"]
    backend, whole_bytes, taken = MemoryBackend(), None, 0
    for i in range(8):
        records = {x: batches[i] for x, batches in cut.items()}
        whole = step(0, records, PartitionState.from_bytes(whole_bytes) if whole_bytes else None)
        whole_bytes = whole.state.to_bytes()
        store = PartitionStore(backend, "whole-vs-split")
        split = store.run(step, 0, records)
        taken += store.stats.taken_rows
        assert split.findings.equals(whole.findings)
        assert split.counters.equals(whole.counters)
        assert split.status_changes == whole.status_changes
        held = settled._CACHE["whole-vs-split"][1].table()
        state = PartitionState.from_bytes(backend.small)
        rebuilt = PartitionStore(backend.copy(), "other")._settled(state, settled.StoreStats())[0].table()
        in_play = (
            split.state.carried if split.state.carried is not None else settled.CARRIED_SCHEMA.empty_table()
        )
        expected = whole.state.carried.select(order).sort_by([(c, "ascending") for c in order])
        for kept in (held, rebuilt):
            both = pa.concat_tables([in_play, kept]).select(order).sort_by([(c, "ascending") for c in order])
            assert both.equals(expected), i
    assert taken > 100, "too few settled keys written again for the comparison to mean anything"


def _settled_rows(keys: int, n: int) -> pa.Table:
    import numpy as np

    from pipelines.leapfrog.carried import CARRIED_SCHEMA, sortkeys
    from pipelines.leapfrog.state import pack_carry_array

    m = keys * n
    key = pa.array([b"settled-%08d" % i for i in range(keys) for _ in range(n)], pa.binary())
    part = pa.array(np.zeros(m, np.int32))
    zero = np.zeros(m, bool)
    marks = np.arange(m * n, dtype=np.int64).reshape(m, n)
    return pa.table(
        {
            "partition": part,
            "key": key,
            "region": pa.array(np.tile(np.arange(n, dtype=np.int32), keys)),
            "offset": pa.array(np.arange(m, dtype=np.int64)),
            "value_hash": pa.array(np.arange(m, dtype=np.int64)),
            "carry": pack_carry_array(zero, zero, marks, marks, np.ones(m, bool)),
            "bucket": pa.array(np.full(m, -1, np.int32)),
            "sortkey": sortkeys(part, key),
        },
        schema=CARRIED_SCHEMA,
    )


@pytest.fixture(scope="module")
def nightly_status(spark, tmp_path_factory, world):
    """(partition, region A, region B, key) → the status a nightly run over the whole archives gives."""
    import pyarrow.parquet as pq

    out = tmp_path_factory.mktemp("status") / "batch"
    nightly(spark, world[1], out)
    rows = pq.read_table(out / "inconsistencies").to_pylist()
    return {(r["partition"], r["region_a"], r["region_b"], r["key"]): r["status"] for r in rows}


@pytest.mark.parametrize("seed,cuts", [(1, 2), (3, 12)])
def test_micro_batches_end_with_the_status_a_nightly_run_gives(world, nightly_status, seed, cuts):
    """A finding healed by later records (a newer write converged its key) is reported healed by the watch too,
    through a status change when it was found open in an earlier micro-batch."""
    histories, dirs, _ = world
    statuses: dict = {}
    _watched(dirs, len(histories), cuts, random.Random(seed), statuses=statuses)
    assert statuses == nightly_status
    assert "healed" in statuses.values() and "open" in statuses.values(), "both statuses must be exercised"


@pytest.fixture(scope="module")
def chunked_world(spark, tmp_path_factory, world):
    histories, _, expected = world
    root = tmp_path_factory.mktemp("chunked")
    dirs, manifests = write_chunked_archives(histories, root / "archives")
    assert sum(len(m) for m in manifests.values()) > 100
    # the nightly job over the chunked version names what it names over the unchunked one
    assert nightly(spark, dirs, root / "batch") == expected
    return histories, dirs, manifests, expected


def _cut_at(table: pa.Table, offsets: list[int]) -> list[pa.Table]:
    """Micro-batches that end right before each of `offsets` (a manifest's: its chunks go in the batch before)."""
    at = table.column("offset").to_numpy().searchsorted(sorted(offsets)).tolist()
    bounds = [0, *at, table.num_rows]
    return [table.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@pytest.mark.parametrize(
    "seed,cuts,split",
    [
        (0, 1, False),
        (5, 3, False),
        (7, 10, False),
        ("manifests", 4, False),
        ("manifests", 4, True),
    ],
)
def test_chunked_micro_batches_name_what_a_nightly_run_names(chunked_world, seed, cuts, split):
    """`split`: with the state kept as the watch keeps it (see `_watched`)."""
    histories, dirs, manifests, expected = chunked_world
    rng = random.Random(seed)
    step = LeapfrogStep(((0, 1), (0, 2), (1, 2)), 3)
    found = []
    split_from_chunks = held_max = 0
    for p in range(len(histories)):
        tables = {
            x: pa.Table.from_batches(list(archive.iter_partition(d, TOPIC, p, columns=RECORD_COLUMNS)))
            for x, d in dirs.items()
        }
        if seed == "manifests":  # every cut between a manifest and its chunks
            chosen = {
                x: sorted(rng.sample(manifests[(x, p)], min(cuts - 1, len(manifests[(x, p)])))) for x in dirs
            }
            per_region = {x: _cut_at(t, chosen[x]) for x, t in tables.items()}
            per_region = {
                x: b + [t.slice(0, 0)] * (cuts - len(b))
                for (x, b), t in zip(per_region.items(), tables.values(), strict=True)
            }
        else:
            # A region's first micro-batch with its StartOfPush and not the record after it (End of Push or the
            # heartbeat a mid-stream scan starts at) would make the step start that region's scan at its first
            # record, where the nightly job starts after End of Push: a limitation of the step's planning, not
            # of chunked values, which these cuts leave out.
            per_region = {x: _micro_batches(t, cuts, rng, not_at=0) for x, t in tables.items()}
        state_bytes = None
        backend = MemoryBackend()
        for i in range(cuts):
            records = {x: batches[i] for x, batches in per_region.items()}
            result = _step_once(step, p, records, state_bytes, backend, rng, split)
            assert not result.failed and not result.chunked_late
            found.extend(result.findings.to_pylist())
            if result.state.chunks is not None:
                split_from_chunks += 1
                held_max = max(held_max, result.state.chunks.num_rows)
            state_bytes = result.state.to_bytes()
        # nothing is held once every manifest has come: the state holds only chunks in flight
        assert PartitionState.from_bytes(state_bytes).chunks is None
    assert named(found) == expected
    if cuts > 1:
        assert split_from_chunks > 0, "no cut fell between a manifest and its chunks"
    assert held_max <= 20


@pytest.fixture(scope="module")
def damaged_world(spark, tmp_path_factory, world):
    """The same archives with 15 data records of region 1 and 15 of region 2 made undecodable."""
    from damage import Damage, damage_archive, read_archive

    histories, dirs, _ = world
    root = tmp_path_factory.mktemp("damaged")
    damaged = dict(dirs)
    for region, kind in ((1, "value_random"), (2, "value_truncate")):
        rows = read_archive(dirs[region]).to_pylist()
        data = [i for i, r in enumerate(rows) if r["key"] and r["key"][0] == 0]
        picked = random.Random(region).sample(data, 15)
        damaged[region] = str(root / f"dc-{region}")
        damage_archive(dirs[region], damaged[region], [Damage(kind, row=i, seed=i) for i in picked])
    return histories, damaged, nightly(spark, damaged, root / "batch")


@pytest.mark.parametrize("seed,cuts", [(0, 1), (5, 7)])
def test_no_finding_rests_on_an_undecodable_record(world, damaged_world, seed, cuts):
    """As the nightly job, the watch withholds a finding whose key has an unreadable record after the record it
    names (or anywhere, when it names none). It knows the unreadable records read so far, which include every
    one before the heartbeats that let it compare; the nightly job also withholds for those after them. So in
    one micro-batch the two name the same; in several, the watch may name more, only ever about keys the
    nightly job left unverified."""
    histories, damaged, expected = damaged_world
    assert expected != world[2], "the damage changed nothing: the test would prove nothing"
    found = _watched(damaged, len(histories), cuts, random.Random(seed), strict=False)
    if cuts == 1:
        assert named(found) == expected
    else:
        assert set(expected) <= set(named(found))
        clean = set(world[2])
        assert set(named(found)) - set(expected) <= clean, "a finding the undamaged records do not support"


@pytest.fixture(scope="module")
def newer_world(spark, tmp_path_factory, world):
    """The same archives from Venice writers newer than us: region 1's as protocol 16 (a version we do not ship),
    region 2's with another schema for version 14 (a fork). Each announces its schema in a `vtp` header on each
    partition's first record only, as a producer does on its first message; every later record decodes by what
    that header taught."""
    histories, dirs, expected = world
    root = tmp_path_factory.mktemp("newer")
    newer = dict(dirs)
    for region, version in ((1, 16), (2, 14)):
        newer[region] = str(root / f"dc-{region}")
        assert reencode_archive(dirs[region], newer[region], version, announced_first()) > 0
    assert nightly(spark, newer, root / "batch") == expected  # the nightly job reads them as it read ours
    return histories, newer, expected


@pytest.mark.parametrize("seed,cuts", [(0, 1), (2, 5)])
def test_what_a_vtp_header_taught_lasts_into_later_micro_batches(newer_world, seed, cuts):
    """A micro-batch after the one with a producer's `vtp` header decodes its records by what the header taught
    (the step's state carries it), so the watch names what the nightly job names."""
    histories, dirs, expected = newer_world
    found = _watched(dirs, len(histories), cuts, random.Random(seed))
    assert named(found) == expected


def test_records_without_headers_are_held_beside_records_with_them(world):
    """A micro-batch whose records all lack headers reaches the step with a null-typed headers column (pandas);
    held until every region has sent records, it must join the next micro-batch's typed ones."""
    histories, dirs, _ = world
    step = LeapfrogStep(((0, 1), (0, 2), (1, 2)), 3)
    whole = {
        x: pa.Table.from_batches(list(archive.iter_partition(d, TOPIC, 0, columns=RECORD_COLUMNS)))
        for x, d in dirs.items()
    }
    first = step(0, {0: whole[0].slice(0, 2)}, None)
    assert first.waiting
    state = PartitionState.from_bytes(first.state.to_bytes())
    bare = whole[0].slice(2, 2)
    bare = bare.set_column(
        3, "headers", pa.nulls(2)
    )  # what pandas gives for a frame of records without headers
    rest = whole[0].slice(4)
    second = step(0, {0: bare, 1: whole[1], 2: whole[2]}, state)
    assert not second.waiting and not second.failed
    third = step(0, {0: rest}, PartitionState.from_bytes(second.state.to_bytes()))
    assert not third.failed
    assert third.state.facts


def _in_offset_order(table: pa.Table) -> pa.Table:
    return table.take(pc.sort_indices(table, [("offset", "ascending")]))


@pytest.mark.parametrize("which", ["plain", "damaged", "chunked", "newer"])
def test_envelopes_read_once_give_the_same_steps(world, damaged_world, chunked_world, newer_world, which):
    """The watch reads each VT record's envelope once (`read_envelopes`, in offset order) and hands it to Leap
    Frog's step and to DIV's. Given them, the step must return what it returns reading the records itself, micro-
    batch by micro-batch: findings, counters and state, byte for byte. Region 2 sends nothing in the first
    micro-batch, so the others' records wait, and are read again when they join the next one."""
    dirs = {
        "plain": world[1],
        "damaged": damaged_world[1],
        "chunked": chunked_world[1],
        "newer": newer_world[1],
    }[which]
    partitions = len(world[0])
    rng = random.Random(which)
    step = LeapfrogStep(((0, 1), (0, 2), (1, 2)), 3)
    compared = found = 0
    for p in range(0, partitions, 4):
        per_region = {}
        for x, d in dirs.items():
            whole = pa.Table.from_batches(list(archive.iter_partition(d, TOPIC, p, columns=RECORD_COLUMNS)))
            per_region[x] = _micro_batches(whole, 4, rng)
        per_region[2] = [
            per_region[2][0].slice(0, 0),
            *per_region[2][:-2],
            pa.concat_tables(per_region[2][-2:]),
        ]
        own = shared = None
        for i in range(4):
            records = {x: _in_offset_order(batches[i]) for x, batches in per_region.items()}
            envelopes = {x: read_envelopes(t) for x, t in records.items()}
            a = step(p, records, PartitionState.from_bytes(own) if own else None)
            b = step(p, records, PartitionState.from_bytes(shared) if shared else None, envelopes)
            assert b.findings.equals(a.findings) and b.counters.equals(a.counters)
            assert (b.failed, b.chunked_late, b.waiting, b.widest_hbw) == (
                a.failed,
                a.chunked_late,
                a.waiting,
                a.widest_hbw,
            )
            own, shared = a.state.to_bytes(), b.state.to_bytes()
            assert shared == own
            compared += 1
            found += a.findings.num_rows
    assert compared >= 4 * (partitions // 4) and found > 0
