"""Continuous DIV, micro-batch by micro-batch, finds exactly what `div validate` finds over the same records.

`div validate`'s local engine over whole archives is the oracle: its errors table (findings, undecodable records
and what they explain, record-validator rows) is what the watch's step must return, spread over the micro-batches,
each row once. Partitions are cut at random offsets into 1, 2, 5 and 20 micro-batches, at every offset, and around
every faulty record; between two micro-batches the state goes through `DivPartitionState.to_bytes` as a state store
keeps it. The worlds: the simulator with RT faults (gap, corrupt, duplicate), a compacted VT range and a failover,
VT and RT topics of three regions; tests/support/div_faults.py, one partition holding every fault kind, also as a
newer Venice writer (protocol 16) writes it; and a long clean partition, whose state must not grow as it is read.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass

import div_faults as D
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from newer_protocol import reencode_archive
from small_sim import small_sim

from div import archive
from div.checkpoint import CorruptCheckpointError
from div.validator import ValidatorConfig
from div.writer import SegmentWriter, deterministic_guid
from pipelines.core.sources import SourceSpec, open_source
from pipelines.div.validate import ValidateOptions, plan, run_local
from pipelines.watch.div_step import ERROR_COLUMNS, DivCounts, DivPartitionState, DivStep

COLUMNS = [name for name, _ in ERROR_COLUMNS]
NOW_MS = 1_800_000_000_000


def _rows(rows: list[dict]) -> list[tuple]:
    return sorted(tuple(r[c] for c in COLUMNS) for r in rows)


class World:
    """Archives, what `div validate` wrote for them, and a step configured as it was."""

    def __init__(self, sources: dict[int, str], out, opts: ValidateOptions) -> None:
        assert run_local(opts) in (0, 1, 3)
        self.sources = sources
        self.expected = pq.read_table(out / "errors").to_pylist()
        self.summary = json.loads((out / "summary.json").read_text())
        opened = [open_source(s) for s in opts.sources]
        configs = {(t.region, t.topic): t.config for t in plan(opts, opened)}
        self.step = DivStep(topic_configs=configs, record_validators=opts.record_validators)
        self.partitions: dict[tuple[int, str, int], pa.Table] = {}
        for x, d in sources.items():
            for info in archive.describe(d):
                batches = list(archive.iter_partition(d, info.topic, info.partition))
                self.partitions[(x, info.topic, info.partition)] = pa.Table.from_batches(batches)

    def expected_in(self, x: int, topic: str, p: int) -> list[tuple]:
        return _rows([r for r in self.expected if (r["region"], r["topic"], r["partition"]) == (x, topic, p)])


@dataclass
class Fed:
    rows: list[dict]  # the findings rows of every micro-batch
    counts: list[DivCounts]  # per micro-batch
    states: list[bytes]  # the state after each micro-batch, as a state store keeps it

    @property
    def state(self) -> bytes:
        return self.states[-1]


def feed(step: DivStep, where: tuple[int, str, int], table: pa.Table, bounds: list[int], **kw) -> Fed:
    """The partition cut at `bounds` (row indexes) into micro-batches, the state through bytes between them."""
    fed = Fed([], [], [])
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        state = DivPartitionState.from_bytes(fed.state) if fed.states else None
        result = step(*where, table.slice(a, b - a), state, **kw)
        fed.rows.extend(result.findings.to_pylist())
        fed.counts.append(result.counts)
        fed.states.append(result.state.to_bytes())
    return fed


def random_bounds(n: int, pieces: int, rng: random.Random) -> list[int]:
    return [0, *sorted(rng.randint(0, n) for _ in range(pieces - 1)), n]


def assert_once(found: list[dict]) -> None:
    ids = [r["finding_id"] for r in found]
    assert len(set(ids)) == len(ids), "a row was emitted twice"


# ------------------------------------------------------------------------------------- simulated traffic


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("watch-div")
    s = small_sim(
        root / "sim",
        seed=5,
        records=1500,
        keys=300,
        faults={"gap": 1, "corrupt": 1, "duplicate": 1, "compaction": 1, "failover": 1},
    )
    specs = [SourceSpec(x, d) for x, d in s.archives.items()]
    world = World(
        s.archives, root / "div", ValidateOptions(sources=specs, out=str(root / "div"), now_ms=NOW_MS)
    )
    kinds = {(r["topic"].endswith("_rt"), r["type"]) for r in world.expected}
    # both topic kinds, the three RT faults and the compacted VT range are there to be found
    assert {(True, "MISSING"), (True, "CORRUPT"), (True, "DUPLICATE"), (False, "MISSING")} <= kinds
    return world


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.parametrize("pieces", [1, 2, 5, 20])
def test_micro_batches_find_what_div_validate_finds(sim, pieces):
    rng = random.Random(pieces)
    found = []
    for where, table in sorted(sim.partitions.items()):
        fed = feed(sim.step, where, table, random_bounds(table.num_rows, pieces, rng))
        assert _rows(fed.rows) == sim.expected_in(*where), where
        summary = next(
            s for s in sim.summary["partitions"] if (s["region"], s["topic"], s["partition"]) == where
        )
        assert sum(c.records for c in fed.counts) == summary["records"]
        assert sum(c.fatal for c in fed.counts) == summary["fatal_findings"]
        assert sum(c.undecodable for c in fed.counts) == summary["undecodable"]
        assert sum((Counter(c.findings) for c in fed.counts), Counter()) == Counter(summary["findings"])
        found.extend(fed.rows)
    assert _rows(found) == _rows(sim.expected)
    assert_once(found)


@pytest.mark.kafka
@pytest.mark.slow
def test_every_cut_around_simulated_faults_finds_the_same(sim):
    faulty = {(r["region"], r["topic"], r["partition"]) for r in sim.expected}
    for where in sorted(faulty):
        table = sim.partitions[where]
        offsets = table.column("offset").to_pylist()
        expected = sim.expected_in(*where)
        for offset in sorted({r[3] for r in expected}):
            i = offsets.index(offset)
            fed = feed(sim.step, where, table, [0, i, i + 1, table.num_rows])
            assert _rows(fed.rows) == expected, (where, offset)
    # the partition with most findings, one record per micro-batch: every offset is a cut
    where = max(faulty, key=lambda w: len(sim.expected_in(*w)))
    table = sim.partitions[where]
    fed = feed(sim.step, where, table, list(range(table.num_rows + 1)))
    assert _rows(fed.rows) == sim.expected_in(*where)
    assert_once(fed.rows)


# ------------------------------------------------------------------------------ every fault, every offset


def _faulty_world(root, archive_dir: str) -> World:
    opts = ValidateOptions(
        sources=[SourceSpec(0, archive_dir)],
        out=str(root / "div"),
        min_compaction_lag_ms=D.LAG,
        now_ms=D.NOW,
        max_age_ms=D.MAX_AGE,
        record_validators=D.RECORD_VALIDATORS,
    )
    world = World({0: archive_dir}, root / "div", opts)
    fatal = {r["type"] for r in world.expected if r["fatal"]}
    assert fatal == {"UNREGISTERED_PRODUCER", "MISSING", "CORRUPT", "DATA_AFTER_SEGMENT_END"}
    assert any(r["type"].startswith("VALIDATOR:") for r in world.expected)
    return world


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("watch-div-faulty")
    return _faulty_world(root, D.write(root / "dc-0"))


@pytest.fixture(scope="module")
def newer(tmp_path_factory) -> World:
    """The same partition from a Venice writer newer than us (protocol 16): only records that open a producer's
    first segment carry the `vtp` header its schema is learnt from, so a cut after them must carry what the
    codec learnt."""
    root = tmp_path_factory.mktemp("watch-div-newer")
    assert reencode_archive(D.write(root / "v14"), root / "v16", 16) > 0
    world = _faulty_world(root, str(root / "v16"))
    assert sum(r["type"] == "UNDECODABLE" for r in world.expected) == 6  # the three damaged records, twice
    return world


@pytest.mark.parametrize("world", ["faulty", "newer"])
@pytest.mark.parametrize("topic", [D.VT, D.RT])
def test_every_cut_point_finds_what_div_validate_finds_and_ends_in_the_same_state(request, world, topic):
    faulty = request.getfixturevalue(world)
    where = (0, topic, 0)
    table = faulty.partitions[where]
    n = table.num_rows
    expected = faulty.expected_in(*where)
    whole = feed(faulty.step, where, table, [0, n])
    assert _rows(whole.rows) == expected
    assert_once(whole.rows)
    for k in range(n + 1):
        cut = feed(faulty.step, where, table, [0, k, n])
        assert cut.rows == whole.rows, f"cut before row {k}"  # the same rows, ids included, in the same order
        assert cut.state == whole.state, f"cut before row {k}"
    every = feed(faulty.step, where, table, list(range(n + 1)))
    assert every.rows == whole.rows and every.state == whole.state


def test_partitions_do_not_share_what_their_codecs_learnt(newer):
    # a partition read from offset 10 on has missed the vtp headers of the producers it meets: their records are
    # undecodable to it, even when the same step has read another partition that announced the schema
    table = newer.partitions[(0, D.VT, 0)]
    config = newer.step.config_for(0, D.VT)
    alone = DivStep(config)(0, D.VT, 1, table.slice(10))
    step = DivStep(config)
    assert step(0, D.VT, 0, table).counts.undecodable == 3
    after = step(0, D.VT, 1, table.slice(10))
    assert after.counts.undecodable == alone.counts.undecodable > 3
    assert after.findings.equals(alone.findings)


def test_now_given_per_micro_batch_decides_as_a_fixed_now(faulty):
    # compaction tolerance compares record times with "now": a watch gives each micro-batch its own
    where = (0, D.VT, 0)
    table = faulty.partitions[where]
    config = faulty.step.config_for(0, D.VT)
    assert config.now_ms == D.NOW and config.min_compaction_lag_ms == D.LAG
    unfixed = DivStep(
        ValidatorConfig(min_compaction_lag_ms=D.LAG, max_age_ms=D.MAX_AGE),
        record_validators=D.RECORD_VALIDATORS,
    )
    fed = feed(unfixed, where, table, [0, 20, table.num_rows], now_ms=D.NOW)
    assert _rows(fed.rows) == faulty.expected_in(*where)
    later = feed(unfixed, where, table, [0, 20, table.num_rows], now_ms=D.NOW + 10**9)
    assert len(later.rows) < len(fed.rows)  # once everything is past the compaction lag, gaps are tolerated


def test_records_already_validated_or_out_of_order_are_taken_once(faulty):
    where = (0, D.VT, 0)
    table = faulty.partitions[where]
    n = table.num_rows
    whole = feed(faulty.step, where, table, [0, n])
    rng = random.Random(3)
    first = faulty.step(*where, table.slice(0, 30))
    # the next micro-batch reads 10 records again (a range read twice), in shuffled order, one of them twice
    again = table.slice(20)
    order = list(range(again.num_rows)) + [5]
    rng.shuffle(order)
    second = faulty.step(
        *where, again.take(pa.array(order)), DivPartitionState.from_bytes(first.state.to_bytes())
    )
    assert second.counts.skipped == 11 and second.counts.records == n - 30
    assert first.findings.to_pylist() + second.findings.to_pylist() == whole.rows
    assert second.state.to_bytes() == whole.state
    empty = faulty.step(*where, table.slice(0, 0), second.state)
    assert empty.findings.num_rows == 0 and empty.state.to_bytes() == whole.state


def test_rows_of_one_record_and_type_have_ids_of_their_own(faulty):
    # two record validators of one name reject the same records: one row each, told apart by their rank
    twice = [*D.RECORD_VALIDATORS, {**D.RECORD_VALIDATORS[0], "name": "timestamp_drift"}]
    step = DivStep(faulty.step.config_for(0, D.VT), record_validators=twice)
    table = faulty.partitions[(0, D.VT, 0)]
    rows = feed(step, (0, D.VT, 0), table, [0, 17, table.num_rows]).rows
    drift = [r for r in rows if r["type"] == "VALIDATOR:timestamp_drift"]
    assert len(drift) == 2 * len({r["offset"] for r in drift}) > 0
    assert_once(rows)


def test_a_damaged_state_is_refused(faulty):
    where = (0, D.VT, 0)
    data = faulty.step(*where, faulty.partitions[where].slice(0, 25)).state.to_bytes()
    assert DivPartitionState.from_bytes(data).to_bytes() == data
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    for bad in (data[:-1], data[: len(data) // 2], bytes(flipped), b"", b"not a state"):
        with pytest.raises(CorruptCheckpointError):
            DivPartitionState.from_bytes(bad)


# ------------------------------------------------------------------------------------------ state size


def test_the_state_grows_with_producers_not_with_records():
    """A long clean VT partition of three producers, segments rolling, read in 100 micro-batches: the state's size
    stays where it was once every producer had written; a fourth producer makes it larger."""
    clock = [NOW_MS]

    def tick() -> int:
        clock[0] += 1
        return clock[0]

    push = SegmentWriter(deterministic_guid(1, 0), clock=tick, max_segment_age_ms=-1)
    writers = [
        SegmentWriter(deterministic_guid(2, i), clock=tick, max_segment_age_ms=2_000) for i in range(4)
    ]
    out = push.start_of_push(0)
    rng = random.Random(0)
    for i in range(40_000):
        w = writers[rng.randrange(3) if i < 30_000 else 3 if i == 30_000 else rng.randrange(4)]
        out += w.put(0, b"k%d" % rng.randrange(1000), b"v" * rng.randrange(1, 40))
        if i == 100:
            out += push.end_of_push(0)
    rows = [
        ("t_v1", 0, o, r.key, r.value, NOW_MS, 0, [{"key": k, "value": v} for k, v in r.headers] or None)
        for o, r in enumerate(out)
    ]
    table = pa.Table.from_batches([archive.records_to_batch(rows)])
    n = table.num_rows
    fed = feed(
        DivStep(ValidatorConfig(now_ms=NOW_MS)), (0, "t_v1", 0), table, [n * i // 100 for i in range(101)]
    )
    assert fed.rows == [] and sum(c.records for c in fed.counts) == n > 40_000
    sizes = {c.producers: [] for c in fed.counts}
    for data, c in zip(fed.states, fed.counts, strict=True):
        sizes[c.producers].append(len(data))
    three, four = sizes[4][3:], sizes[5]  # the push job and three writers, then four
    assert len(three) > 50 and len(four) > 15
    # many times the records, nearly the same bytes: a digit or a varint byte more for larger offsets and sequence
    # numbers (a state that kept anything per record would grow by kilobytes here)
    assert max(three) - min(three) <= 32, (min(three), max(three))
    assert max(four) - min(four) <= 32, (min(four), max(four))
    assert min(four) > max(three) + 80  # a producer more is a ProducerPartitionState more
