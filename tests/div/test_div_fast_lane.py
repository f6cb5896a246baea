"""The vectorised fast lane of `PartitionRun` (`vectorised=True`) decides exactly as the reference path
(`vectorised=False`: every record through the codec), on every input the tests can make.

Each input is one partition's records, fed to both paths cut into batches at several sizes (the whole partition
at once, 333 rows, 7 rows). For every cut, the fast lane's outcome must equal the reference path's: the error rows
row for row, the summary (`finish().to_json()`), the validator's state after the run (`producer_states()`,
`run_state()`, `end_of_push`) and what the codec learnt from `vtp` headers (`codec.learned()`). The reference
path's outcome at each cut must also equal its own for the whole partition (a run does not depend on batching).

The inputs:

1. `sim.div_traffic` traffic with faults put in (gaps before and after End of Push, duplicates, records out of
   order, a tampered value and a tampered EndOfSegment checksum, unknown producers, data after an EndOfSegment,
   undecodable values, a bad and a missing key, an undecodable record that explains a gap, offset holes, records
   without a broker timestamp, an incremental push), for each checksum type (ADHASH and NONE, the fast lane's;
   MD5 and CRC32, the codec's), as a VT and as an RT, with no tolerance, with max age, with compaction lag; with
   values large enough that byte counting reaches Venice's 32 MiB checkpoint (max-age expiry by bytes);
   and the hand-built partition of tests/support/div_faults.py (every fault a resumed run must carry);
2. the archives of Leap Frog's generated histories, of chunked histories and of a small simulation (VT and RT
   topics);
3. the bad-input suite's damaged archives (tests/support/damage.py), several seeds;
4. fuzzed envelopes (bytes flipped, cut, inserted; the version byte changed), several seeds;
5. a newer producer (`vtp` headers announcing another schema for our v14, on every record, on the first only, or
   midway; and a v16), and data records of other versions we know (15, 13, 11, 5) without `vtp`;
6. data records of odd shapes a fixed-layout reader could misread (other key header bytes, a message type that is
   not the payload's, empty and long values, large and negative schema ids, replication metadata, no footer or a
   long one, extreme timestamps, other headers, empty key content, Deletes, chunk schema ids, Updates);
7. record validators configured (`div.validators.registry.build_chain`);
8. `pipelines.watch.div_step.DivStep` over micro-batches (state saved as bytes between them, ranges read again,
   rows shuffled) against one uninterrupted reference run.

A sanity test shows the comparison can fail (one sequence number changed changes the rows), the inputs are checked
to hold findings of the types the fast lane must leave to the full procedure, and the fast lane is checked to
decode far fewer records through the codec than the reference path (so two different paths are compared).
"""

from __future__ import annotations

import copy
import functools
import io
import random
from collections import Counter

import div_faults as D
import fastavro
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from chunked_histories import write_chunked_archives
from damage import damage_at_random
from leapfrog_histories import generated
from newer_protocol import newer_schema, newer_vtp, reencode_rows
from vt_fixtures import write_archives

from div import archive
from div import checksum as cks
from div import envelope as E
from div import envelope_versions as ev
from div import keys as K
from div.archive import KAFKA_ARROW_SCHEMA, records_to_batch
from div.batch import PartitionRun
from div.envelope_columns import EnvelopeReader, read_envelopes
from div.validator import (
    CORRUPT,
    DATA_AFTER_SEGMENT_END,
    DUPLICATE,
    EXPLAINED,
    MISSING,
    UNDECODABLE,
    UNREGISTERED_PRODUCER,
    ValidatorConfig,
)
from div.validators.registry import build_chain
from div.writer import SegmentWriter
from pipelines.watch.div_step import DivPartitionState, DivStep
from sim.div_traffic import TrafficSpec, generate

SIZES = (None, 333, 7)  # None: the whole partition in one batch
T0 = 1_700_000_000_000
LAG = 1_000
VALIDATORS = [
    {"class": "builtin:offsets_increasing"},
    {"class": "builtin:timestamp_drift", "max_drift_ms": 60_000, "max_ahead_ms": -1},
    {"class": "builtin:key_present"},
    {"class": "builtin:schema_ids", "allowed": [1]},
]


# -- running both paths ------------------------------------------------------------------------------


def _batches(table: pa.Table, size: int | None) -> list[pa.RecordBatch]:
    table = table.combine_chunks()
    return table.to_batches(max_chunksize=size or max(1, table.num_rows))


def _run(
    topic: str,
    table: pa.Table,
    *,
    vectorised: bool,
    size: int | None = None,
    config: ValidatorConfig | None = None,
    validators: list | None = None,
) -> PartitionRun:
    run = PartitionRun(
        0,
        topic,
        0,
        config=config,
        record_validators=build_chain(validators) if validators else None,
        vectorised=vectorised,
    )
    for b in _batches(table, size):
        run.feed(b)
    run.finish()
    return run


def _outcome(run: PartitionRun) -> dict:
    return {
        "table": run.table().to_pylist(),
        "summary": run.finish().to_json(),
        "producer_states": run.validator.producer_states(),
        "run_state": run.validator.run_state(),
        "end_of_push": run.validator.end_of_push,
        "learned": run.codec.learned(),
    }


def _assert_same(want: dict, got: dict, what: str) -> None:
    assert got.keys() == want.keys()
    w, g = want["table"], got["table"]
    if w != g:
        diffs = [(i, a, b) for i, (a, b) in enumerate(zip(w, g, strict=False)) if a != b]
        first = diffs[0] if diffs else (min(len(w), len(g)), "(end)", "(end)")
        raise AssertionError(
            f"{what}: error rows differ ({len(w)} vs {len(g)} rows); first at row {first[0]}:\n"
            f"  reference {first[1]}\n  got       {first[2]}"
        )
    for k in want:
        if k == "table":
            continue
        if want[k] != got[k]:
            if isinstance(want[k], dict) and isinstance(got[k], dict):
                keys = sorted(
                    (str(x) for x in set(want[k]) | set(got[k]) if want[k].get(x) != got[k].get(x)),
                )
                raise AssertionError(f"{what}: {k} differs (at {keys[:5]})")
            raise AssertionError(f"{what}: {k} differs: reference {want[k]!r}, got {got[k]!r}")


def _check(
    topic: str,
    table: pa.Table,
    *,
    config: ValidatorConfig | None = None,
    validators: list | None = None,
    sizes: tuple = SIZES,
) -> dict:
    """Both paths at every cut against each other, and the reference at every cut against its whole run.
    Returns the reference outcome of the whole partition."""
    kw = dict(config=config, validators=validators)
    whole = _outcome(_run(topic, table, vectorised=False, **kw))
    for size in sizes:
        ref = whole if size is None else _outcome(_run(topic, table, vectorised=False, size=size, **kw))
        got = _outcome(_run(topic, table, vectorised=True, size=size, **kw))
        _assert_same(ref, got, f"{topic}: vectorised=True vs False, batches of {size or 'all'} rows")
        _assert_same(whole, ref, f"{topic}: the reference in batches of {size} rows vs in one batch")
    return whole


def _types(outcome: dict) -> set[str]:
    return {r["type"] for r in outcome["table"]}


def _partitions(dirs: dict[int, str]) -> list[tuple[str, pa.Table]]:
    """Every (topic, partition) of every region's archive, as div validate reads it (offset order, each once)."""
    out = []
    for _, d in sorted(dirs.items()):
        for info in archive.describe(d):
            batches = list(archive.iter_partition(d, info.topic, info.partition))
            out.append((info.topic, pa.Table.from_batches(batches, KAFKA_ARROW_SCHEMA)))
    return out


def _as_rt(topic: str) -> str:
    return topic.rsplit("_v", 1)[0] + "_rt"


# -- DIV traffic with faults ---------------------------------------------------------------------------

_CODEC = E.EnvelopeCodec()


def _decode(rec: list) -> dict | None:
    key, value, headers, _ = rec
    if not key or key[0] not in (0, 1, 2):
        return None
    try:
        return _CODEC.decode(value, headers)
    except E.UndecodableError:
        return None


def _reencode(rec: list, change) -> list:
    env = copy.deepcopy(_decode(rec))
    change(env)
    return [rec[0], _CODEC.encode(env), rec[2], rec[3]]


def _find(recs: list[list], start: int, pred) -> int:
    for i in range(start, len(recs)):
        env = _decode(recs[i])
        if env is not None and pred(recs[i], env):
            return i
    raise AssertionError(f"no such record after {start}")


def _is_put(rec, env) -> bool:
    return rec[0][0] == 0 and E.payload_kind(env) == "PUT" and not rec[2]


def _is_eop(rec, env) -> bool:
    return E.payload_kind(env) == "CONTROL" and E.control_type(env) == E.END_OF_PUSH


def _is_eos(rec, env) -> bool:
    return E.payload_kind(env) == "CONTROL" and E.control_type(env) == E.END_OF_SEGMENT


def _guid(env: dict) -> bytes:
    return env["producerMetadata"]["producerGUID"]


def _stranger(ts: int, segment: int, seed: int) -> list[list]:
    """Records of a producer nobody saw start: segment `segment`, its StartOfSegment missing."""
    w = SegmentWriter(random.Random(seed).randbytes(16), clock=lambda: ts, send_vtp=False)
    recs = []
    for _ in range(segment + 1):
        recs = w.put(0, b"key-x", b"v") + w.end_segment(0, final=False)
    return [[r.key, r.value, None, ts] for r in recs[1:]]


def traffic(
    checksum_type: int = cks.ADHASH,
    seed: int = 5,
    records: int = 1200,
    value_size: int = 40,
    faults: bool = True,
) -> pa.Table:
    """One partition of `sim.div_traffic` traffic (a push job, then three producers rolling segments), with every
    fault put in that the generator's records can be turned into; offsets with holes; some timestamps null."""
    spec = TrafficSpec(
        topic="store_v1",
        partitions=1,
        producers=3,
        records=records,
        batch_records=80,
        value_size=value_size,
        keys=60,
        segment_every=70,
        checksum_type=checksum_type,
        seed=seed,
        start_ms=T0,
    )
    recs = [[r.key, r.value, list(r.headers) or None, r.timestamp_ms] for r in generate(spec)]
    holes: set[int] = set()
    if faults:
        garbage = b"\x17\x0e not an envelope"
        # before End of Push (fatal): a gap, a duplicate, an undecodable value, an unknown producer
        del recs[_find(recs, 10, _is_put)]
        d = _find(recs, 25, _is_put)
        recs.insert(d + 1, list(recs[d]))
        recs[40:40] = _stranger(T0 + 40, segment=2, seed=seed + 1000)
        recs.insert(60, [b"\x00key-u", garbage, None, T0 + 60])
        eop = _find(recs, 0, _is_eop)
        # after End of Push (warnings), each fault after the one before
        s = _find(recs, eop + 20, _is_eos)  # an EndOfSegment whose checksum is wrong (not for NONE: empty is)
        recs[s] = _reencode(recs[s], lambda env: E.control_body(env).update(checksumValue=b"\x01" * 8))
        s = _find(
            recs, s + 1, _is_eos
        )  # data after an EndOfSegment: the ended segment's next sequence number
        put = _decode(recs[_find(recs, s, _is_put)])
        eos_pm = _decode(recs[s])["producerMetadata"]
        late = copy.deepcopy(put)
        late["producerMetadata"] = dict(eos_pm, messageSequenceNumber=eos_pm["messageSequenceNumber"] + 1)
        recs.insert(s + 1, [b"\x00key-late", _CODEC.encode(late), None, recs[s][3]])
        del recs[_find(recs, s + 10, _is_put)]  # a gap
        d = _find(recs, s + 20, _is_put)
        recs.insert(d + 1, list(recs[d]))  # a duplicate, right after the original
        d = _find(recs, d + 10, _is_put)
        recs.insert(d + 9, list(recs[d]))  # a duplicate, later
        # out of order: a producer's record swapped with its next one
        i = _find(recs, d + 20, _is_put)
        g = _guid(_decode(recs[i]))
        j = _find(recs, i + 1, lambda r, e: _guid(e) == g and _is_put(r, e))
        recs[i], recs[j] = recs[j], recs[i]
        # a value changed after it was checksummed: CORRUPT at its segment's end (not for NONE); another with a
        # schema id the record validators do not allow; a record whose broker time is an hour off
        t = _find(recs, j + 10, _is_put)
        recs[t] = _reencode(recs[t], lambda env: env["payloadUnion"][1].update(putValue=b"tampered"))
        t = _find(recs, t + 10, _is_put)
        recs[t] = _reencode(recs[t], lambda env: env["payloadUnion"][1].update(schemaId=5))
        recs[t + 5][3] -= 3_600_000
        # an undecodable record where a lost one was: explains the gap after it
        u = _find(recs, t + 10, _is_put)
        recs[u] = [recs[u][0], garbage, None, recs[u][3]]
        # an unknown producer after End of Push (tolerated), a bad key, a missing key
        recs[u + 20 : u + 20] = _stranger(recs[u + 20][3], segment=3, seed=seed + 1001)
        recs.insert(u + 30, [b"\x63nope", recs[u + 30][1], None, recs[u + 30][3]])
        recs.insert(u + 40, [None, recs[u + 40][1], None, recs[u + 40][3]])
        assert u + 100 < len(recs)
        # an incremental push starts late: its control message is a checkpoint (max-age expiry)
        at = len(recs) - 60
        ts = recs[at][3]
        w = SegmentWriter(random.Random(seed + 2).randbytes(16), clock=lambda: ts, send_vtp=False)
        recs[at:at] = [
            [r.key, r.value, None, ts]
            for r in w.control(0, E.START_OF_INCREMENTAL_PUSH, {"version": "inc-1"})
        ]
        holes = {5, 6, len(recs) // 2}
    offsets, off = [], 0
    for _ in recs:
        while off in holes:
            off += 1
        offsets.append(off)
        off += 1
    rows = [("store_v1", 0, o, k, v, ts, 0, h) for o, (k, v, h, ts) in zip(offsets, recs, strict=True)]
    batch = records_to_batch(rows)
    table = pa.Table.from_batches([batch])
    if faults:  # records without a broker timestamp (the producer's is used)
        ts = table.column("timestamp").combine_chunks()
        mask = pa.array([i % 97 == 50 for i in range(table.num_rows)])
        table = table.set_column(
            table.schema.get_field_index("timestamp"), "timestamp", pc.if_else(mask, None, ts)
        )
    return table


def _configs(table: pa.Table) -> dict[str, ValidatorConfig | None]:
    times = archive.timestamps_ms(table)
    early = next(t for t in times[200:] if t is not None)
    return {
        "plain": None,
        # small enough that the incremental push's checkpoint expires producers
        "max_age": ValidatorConfig(max_age_ms=5),
        # gaps in the first 200 records are tolerated, later ones are not
        "compaction": ValidatorConfig(min_compaction_lag_ms=LAG, now_ms=early + LAG),
    }


TRAFFIC_TYPES = {MISSING, DUPLICATE, CORRUPT, DATA_AFTER_SEGMENT_END, UNDECODABLE, EXPLAINED}


@pytest.fixture(scope="module")
def traffic_tables() -> dict[int, pa.Table]:
    return {t: traffic(t) for t in (cks.ADHASH, cks.NONE, cks.MD5, cks.CRC32)}


@pytest.mark.parametrize("config", ["plain", "max_age", "compaction"])
@pytest.mark.parametrize("topic", ["store_v1", "store_rt"])
@pytest.mark.parametrize("checksum_type", [cks.ADHASH, cks.NONE, cks.MD5, cks.CRC32], ids=cks.NAMES.get)
def test_div_traffic_with_faults(traffic_tables, checksum_type, topic, config):
    table = traffic_tables[checksum_type]
    out = _check(topic, table, config=_configs(table)[config])
    types = _types(out)
    # the comparison is over the faults the fast lane must hand to the full procedure (an RT has no End of
    # Push: it tolerates producers that join late)
    want = TRAFFIC_TYPES if topic.endswith("_rt") else TRAFFIC_TYPES | {UNREGISTERED_PRODUCER}
    assert want <= types, f"missing finding types {want - types}"
    if config == "max_age":  # producers were expired (and some write on, unknown to the validator)
        plain = _run(topic, table, vectorised=False).validator.producer_states()
        assert len(out["producer_states"]) < len(plain)


@pytest.mark.parametrize("topic", ["store_v1", "store_rt"])
def test_byte_counting_reaches_a_checkpoint(topic):
    """Values large enough that Venice's 32 MiB checkpoint is reached by bytes alone, with a max age that then
    expires producers (their next records come from producers the validator no longer knows)."""
    table = traffic(cks.ADHASH, seed=9, records=1800, value_size=24_000, faults=False)
    assert sum(len(v) for v in table.column("value").to_pylist()) > 36 << 20
    config = ValidatorConfig(max_age_ms=3)
    out = _check(topic, table, config=config, sizes=(None, 333))
    plain = _outcome(_run(topic, table, vectorised=False))
    assert out["run_state"]["bytes_since_checkpoint"] < 32 << 20
    assert out["producer_states"] != plain["producer_states"]  # expiry happened


@pytest.mark.parametrize("topic", ["store_v1", "store_rt"])
def test_record_validators_chain(traffic_tables, topic):
    table = traffic_tables[cks.ADHASH]
    out = _check(topic, table, config=_configs(table)["compaction"], validators=VALIDATORS)
    assert any(t.startswith("VALIDATOR:") for t in _types(out))


@pytest.fixture(scope="module")
def faulty_partition(tmp_path_factory) -> dict[str, pa.Table]:
    d = D.write(tmp_path_factory.mktemp("faulty"))
    return {t: pa.Table.from_batches(list(archive.iter_partition(d, t, 0))) for t in (D.VT, D.RT)}


FAULTY_CONFIG = ValidatorConfig(min_compaction_lag_ms=D.LAG, now_ms=D.NOW, max_age_ms=D.MAX_AGE)


@pytest.mark.parametrize("validators", [None, D.RECORD_VALIDATORS], ids=["div", "chain"])
@pytest.mark.parametrize("topic", [D.VT, D.RT])
def test_hand_built_faults(faulty_partition, topic, validators):
    out = _check(topic, faulty_partition[topic], config=FAULTY_CONFIG, validators=validators)
    assert {MISSING, CORRUPT, DUPLICATE, UNDECODABLE, EXPLAINED} <= _types(out)


# -- archives of the other suites ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def generated_archives(tmp_path_factory) -> dict[int, str]:
    return write_archives(generated(2), tmp_path_factory.mktemp("fast-lane") / "generated")


@pytest.fixture(scope="module")
def sim_archives(tmp_path_factory) -> dict[int, str]:
    from small_sim import small_sim

    root = tmp_path_factory.mktemp("fast-lane-sim")
    faults = {"dropped": 1, "poisoned": 1, "duplicate": 1, "gap": 1, "corrupt": 1}
    return small_sim(root / "sim", records=600, keys=100, faults=faults).archives


def _check_all(parts: list[tuple[str, pa.Table]], *, rt_too: bool = False, **kw) -> Counter:
    types: Counter = Counter()
    for topic, table in parts:
        for t in (topic, _as_rt(topic)) if rt_too else (topic,):
            types.update(r["type"] for r in _check(t, table, **kw)["table"])
    return types


def test_generated_histories(generated_archives):
    parts = _partitions(generated_archives)
    assert parts
    _check_all(parts, rt_too=True, config=ValidatorConfig(max_age_ms=1_000))


def test_chunked_histories(tmp_path):
    dirs, _ = write_chunked_archives(generated(2), tmp_path / "chunked")
    _check_all(_partitions(dirs), config=ValidatorConfig(min_compaction_lag_ms=0, now_ms=T0))


def test_small_sim(sim_archives):
    parts = _partitions(sim_archives)
    assert {t.endswith("_rt") for t, _ in parts} == {True, False}  # RT and VT topics
    types = _check_all(parts)
    assert len(set(types) - {UNDECODABLE}) >= 2, types


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("source", ["generated", "sim"])
def test_damaged_archives(generated_archives, sim_archives, tmp_path, source, seed):
    rng = random.Random(seed)
    dirs = generated_archives if source == "generated" else sim_archives
    damaged = damage_at_random(dirs, tmp_path, rng)
    types = _check_all(_partitions(damaged), config=ValidatorConfig(max_age_ms=10_000))
    assert types[UNDECODABLE] > 0


def _fuzz(value: bytes | None, rng: random.Random) -> bytes | None:
    """tests/pipelines/leapfrog/test_vector_decode.py's fuzz: bytes replaced, a bit flipped, cut short, bytes
    inserted, the version byte changed, the tail replaced."""
    if not value:
        return value
    v = bytearray(value)
    op = rng.randrange(6)
    if op == 0:
        for _ in range(rng.randint(1, 3)):
            v[rng.randrange(2, len(v)) if len(v) > 2 else 0] = rng.randrange(256)
    elif op == 1:
        pos = rng.randrange(len(v) * 8)
        v[pos // 8] ^= 1 << (pos % 8)
    elif op == 2:
        del v[rng.randrange(len(v)) :]
    elif op == 3:
        pos = rng.randrange(len(v))
        v[pos:pos] = rng.randbytes(rng.randint(1, 4))
    elif op == 4:
        if len(v) > 1:
            v[1] = rng.choice([1, 5, 9, 13, 15, 16, 99, 200])
    else:
        pos = max(2, len(v) - rng.randint(1, 24))
        v[pos:] = rng.randbytes(len(v) - pos)
    return bytes(v)


def _fuzzed(table: pa.Table, rng: random.Random, rate: float = 0.2) -> pa.Table:
    values = [_fuzz(v, rng) if rng.random() < rate else v for v in table.column("value").to_pylist()]
    return table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))


@pytest.mark.parametrize("seed", range(4))
def test_fuzzed_envelopes(generated_archives, traffic_tables, seed):
    rng = random.Random(100 + seed)
    parts = [(t, _fuzzed(table, rng)) for t, table in _partitions(generated_archives)]
    parts.append(("store_v1", _fuzzed(traffic_tables[cks.ADHASH], rng, rate=0.05)))
    parts.append(("store_v1", _fuzzed(traffic_tables[cks.NONE], rng, rate=0.05)))
    types = _check_all(parts)
    assert types[UNDECODABLE] > 0
    assert len(types) >= 3, types


# -- a newer producer ----------------------------------------------------------------------------------


def _newer(table: pa.Table, version: int, every_vtp: bool) -> pa.Table:
    """`table` as a newer producer writes it under protocol `version`: the newer schema in a `vtp` header on every
    record (`every_vtp`), or on the first record and where the records had one (a segment's first message), as the
    newer writers announce it; the others decode by what it taught."""
    rows = table.to_pylist()
    first = [True]
    vtp = {"key": "vtp", "value": newer_vtp()}

    def headers_of(r: dict) -> list:
        was_first, first[0] = first[0], False
        if not (every_vtp or was_first):
            return [vtp if h["key"] == "vtp" else h for h in (r["headers"] or [])]
        return [h for h in (r["headers"] or []) if h["key"] != "vtp"] + [vtp]

    assert reencode_rows(rows, version, headers_of)
    return pa.Table.from_pylist(rows, table.schema)


@pytest.mark.parametrize(("version", "every_vtp"), [(16, True), (16, False), (14, False), (14, True)])
def test_newer_producer(generated_archives, traffic_tables, version, every_vtp):
    parts = [(t, _newer(table, version, every_vtp)) for t, table in _partitions(generated_archives)[:3]]
    for topic, table in parts:
        out = _check(topic, table)
        assert version in out["learned"]
        assert UNDECODABLE not in _types(out), topic  # every record decodes by what the headers taught
    # with faults, undecodable records among them: as many as in the traffic as we write it
    out = _check("store_v1", _newer(traffic_tables[cks.ADHASH], version, every_vtp))
    assert version in out["learned"]
    as_written = _outcome(_run("store_v1", traffic_tables[cks.ADHASH], vectorised=False))
    assert _count(out, UNDECODABLE) == _count(as_written, UNDECODABLE) > 0


def _count(outcome: dict, type_: str) -> int:
    return sum(r["type"] == type_ for r in outcome["table"])


def test_newer_schema_announced_midway(traffic_tables):
    """The first half as we write it (data records for the fast lane), then a `vtp` header on one record that
    announces another schema for v14: every later v14 record must decode by what it taught."""
    table = traffic_tables[cks.ADHASH]
    half = table.num_rows // 2
    rows = table.to_pylist()
    later = rows[half:]
    taught = [False]

    def headers_of(r: dict) -> list:
        if taught[0]:
            return r["headers"]
        taught[0] = True
        return [h for h in (r["headers"] or []) if h["key"] != "vtp"] + [{"key": "vtp", "value": newer_vtp()}]

    reencode_rows(later, 14, headers_of)
    out = _check("store_v1", pa.Table.from_pylist(rows[:half] + later, table.schema))
    assert 14 in out["learned"]


def _other_version(value: bytes, version: int) -> bytes:
    """`value` as a writer of another protocol version we know (no `vtp` header needed) writes it."""
    buf = io.BytesIO()
    buf.write(bytes([E.MAGIC, version]))
    fastavro.schemaless_writer(buf, _writer(version), _CODEC.decode(value))
    return buf.getvalue()


@functools.cache
def _writer(version: int):
    return fastavro.parse_schema(ev.writer_schema(version))


def test_other_known_versions(traffic_tables):
    """Data records written under other protocol versions we know (15, 13, 11, 5), without a `vtp` header, among
    v14 ones: the same records, so the same decisions, whichever path reads them."""
    for ct in (cks.ADHASH, cks.NONE):
        table = traffic_tables[ct]
        rows = table.to_pylist()
        versions = [15, 13, 11, 5]
        n = 0
        for r in rows:
            env = _decode([r["key"], r["value"], r["headers"], 0])
            if env is not None and r["key"][0] == 0 and not r["headers"] and E.payload_kind(env) == "PUT":
                n += 1
                if n % 3 == 0:
                    r["value"] = _other_version(r["value"], versions[n // 3 % len(versions)])
        assert n > 300
        for topic in ("store_v1", "store_rt"):
            out = _check(topic, pa.Table.from_pylist(rows, table.schema))
            assert out["learned"] == {}
            assert out["table"] == _outcome(_run(topic, table, vectorised=False))["table"]


def _odd(env: dict, key: bytes, headers, k: int) -> tuple[dict, bytes, list | None]:
    """Shapes a data record can take that a fixed-layout reader could get wrong; some change its checksum
    contribution (a CORRUPT at its segment's end, on both paths)."""
    pm, (name, body) = env["producerMetadata"], env["payloadUnion"]
    if k == 0:
        key = bytes([1]) + key[1:]  # a header byte that is not a data key's
    elif k == 1:
        key = bytes([8]) + key[1:]  # Global-RT-DIV key: validated like a Put
    elif k == 2:
        env["messageType"] = 1 if name == E.PUT else 0  # a message type that is not the payload's
    elif k == 3 and name == E.PUT:
        body["putValue"] = b""
    elif k == 4 and name == E.PUT:
        body["putValue"] = bytes(range(256)) * 3  # a multi-byte length
    elif k == 5:
        body["schemaId"] = 1_000_000 if name == E.PUT else -1_000_000
    elif k == 6:
        body.update(replicationMetadataVersionId=3, replicationMetadataPayload=b"rmd" * 30)
    elif k == 7:
        env["leaderMetadataFooter"] = None
    elif k == 8:
        env["leaderMetadataFooter"] = E.leader_footer("leader-" * 40, 1 << 40, 2, 7, T0)
    elif k == 9:
        pm["logicalTimestamp"] = 1 << 50
        pm["messageTimestamp"] = -5
    elif k == 10:
        headers = [{"key": "other", "value": b"x"}]  # a header, but no `vtp`
    elif k == 11:
        headers = []
    elif k == 12:
        key = key[:1]  # no key content
    elif k == 13:
        env["payloadUnion"] = (
            E.DELETE,
            {"schemaId": -1, "replicationMetadataVersionId": -1, "replicationMetadataPayload": b""},
        )
    elif k == 14 and name == E.PUT:
        body["schemaId"] = -10  # a chunk's schema id
    elif k == 15:
        env["payloadUnion"] = (E.UPDATE, {"schemaId": 1, "updateSchemaId": 1, "updateValue": b"u"})
        env["messageType"] = 3
    return env, key, headers


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("checksum_type", [cks.ADHASH, cks.NONE], ids=cks.NAMES.get)
def test_odd_data_records(traffic_tables, checksum_type, seed):
    rng = random.Random(seed)
    table = traffic_tables[checksum_type]
    rows = table.to_pylist()
    changed = 0
    for r in rows:
        env = _decode([r["key"], r["value"], r["headers"], 0])
        if env is None or r["key"][0] != 0 or E.payload_kind(env) == "CONTROL" or rng.random() > 0.15:
            continue
        env, r["key"], r["headers"] = _odd(env, r["key"], r["headers"], rng.randrange(16))
        r["value"] = _CODEC.encode(env)
        changed += 1
    assert changed > 100
    for topic in ("store_v1", "store_rt"):
        config = ValidatorConfig(max_age_ms=50)
        out = _check(topic, pa.Table.from_pylist(rows, table.schema), config=config)
        assert {CORRUPT, EXPLAINED} & _types(out)
        assert out["table"] != _outcome(_run(topic, table, vectorised=False, config=config))["table"]


# -- resumed through DivStep -----------------------------------------------------------------------------


def _micro_batches(table: pa.Table, rng: random.Random, overlap: int) -> tuple[list[pa.Table], int]:
    """Cuts at random places; each micro-batch after the first starts up to `overlap` rows before the last one
    ended (a range read again), rows shuffled (a micro-batch's rows come in any order). Also: how many rows are
    read again."""
    cuts = sorted(rng.sample(range(1, table.num_rows), 12))
    out, start, again = [], 0, 0
    for end in [*cuts, table.num_rows]:
        first = max(0, start - overlap)
        again += start - first
        mb = table.slice(first, end - first)
        order = list(range(mb.num_rows))
        rng.shuffle(order)
        out.append(mb.take(pa.array(order, pa.int64())))
        start = end
    return out, again


def _step_cases(traffic_tables, faulty_partition):
    table = traffic_tables[cks.ADHASH]
    return {
        "traffic-vt": ("store_v1", table, _configs(table)["compaction"], VALIDATORS),
        "traffic-rt": ("store_rt", traffic_tables[cks.NONE], ValidatorConfig(max_age_ms=5), None),
        "traffic-md5": ("store_v1", traffic_tables[cks.MD5], None, None),
        "faulty-vt": (D.VT, faulty_partition[D.VT], FAULTY_CONFIG, D.RECORD_VALIDATORS),
        "faulty-rt": (D.RT, faulty_partition[D.RT], FAULTY_CONFIG, None),
        "newer": ("store_v1", _newer(table, 16, False), None, None),
        # another schema for our own version, announced on the first record only: later micro-batches' records
        # must be read by the codec that learnt it, never from envelopes read with a new codec
        "newer-14": ("store_v1", _newer(traffic(cks.ADHASH, faults=False), 14, False), None, None),
    }


@pytest.mark.parametrize("shared", [False, True], ids=["own", "shared"])
@pytest.mark.parametrize("overlap", [0, 3])
@pytest.mark.parametrize(
    "case", ["traffic-vt", "traffic-rt", "traffic-md5", "faulty-vt", "faulty-rt", "newer", "newer-14"]
)
def test_div_step_resumed_equals_one_reference_run(
    traffic_tables, faulty_partition, case, overlap, shared, monkeypatch
):
    """`shared`: each micro-batch as the watch hands it, sorted by offset with its envelopes read once before the
    step (`read_envelopes`, which Leap Frog's step uses too); the step must then read none itself."""
    topic, table, config, validators = _step_cases(traffic_tables, faulty_partition)[case]
    reads = Counter()
    original = EnvelopeReader.read

    def counted(self, *args):
        reads["step"] += 1
        return original(self, *args)

    whole = _run(topic, table, vectorised=False, config=config, validators=validators)
    step = DivStep(config, record_validators=validators)
    state, found, counts = None, [], Counter()
    findings: Counter = Counter()
    skipped = 0
    micro_batches, again = _micro_batches(table, random.Random(len(case) + overlap), overlap)
    for mb in micro_batches:
        envelopes = None
        if shared:
            mb = mb.take(pc.sort_indices(mb, [("offset", "ascending")]))
            envelopes = read_envelopes(mb)
        with monkeypatch.context() as m:
            m.setattr(EnvelopeReader, "read", counted)
            result = step(0, topic, 0, mb, state, envelopes=envelopes)
        state = DivPartitionState.from_bytes(result.state.to_bytes())
        found.extend(result.findings.drop_columns(["finding_id"]).to_pylist())
        c = result.counts
        counts.update(records=c.records, undecodable=c.undecodable, explained=c.explained, fatal=c.fatal)
        findings.update(c.findings)
        skipped += c.skipped
    want = whole.table().to_pylist()
    assert found == want
    s = whole.summary
    assert counts == Counter(
        records=s.records, undecodable=s.undecodable, explained=s.explained, fatal=s.fatal_findings
    )
    assert dict(findings) == dict(s.findings)
    assert c.producers == s.producers_tracked
    assert skipped == again
    assert state.producer_states == whole.validator.producer_states()
    assert state.end_of_push == whole.validator.end_of_push
    assert state.validator == whole.validator.run_state()
    assert state.learned == whole.codec.learned()
    if (
        case != "newer-14"
    ):  # (clean traffic: producers' segments stay open, so the fast lane may take records)
        assert len({r["type"] for r in want}) >= 3
    if case == "newer-14":
        pass  # (its records after the push are undecodable: no segment stays open, so there is no lane)
    elif shared:
        assert reads["step"] == 0
    elif not validators:  # (with record validators every record goes through the codec)
        assert reads["step"] > 0


# -- the comparison can fail -------------------------------------------------------------------------------


def test_a_changed_sequence_number_changes_the_rows(traffic_tables):
    """Equality is not vacuous: one data record's sequence number moved on by 3 changes the error rows on both
    paths (a gap there, a duplicate later), and each path still agrees with the other on the changed input."""
    table = traffic_tables[cks.ADHASH]
    rows = table.to_pylist()
    recs = [[r["key"], r["value"], r["headers"], None] for r in rows]
    i = _find(recs, len(recs) // 3, _is_put)
    rows[i]["value"] = _reencode(
        recs[i],
        lambda env: env["producerMetadata"].update(
            messageSequenceNumber=env["producerMetadata"]["messageSequenceNumber"] + 3
        ),
    )[1]
    changed = pa.Table.from_pylist(rows, table.schema)
    for vectorised in (False, True):
        before = _outcome(_run("store_v1", table, vectorised=vectorised))
        after = _outcome(_run("store_v1", changed, vectorised=vectorised))
        assert before["table"] != after["table"]
        new = [r for r in after["table"] if r not in before["table"]]
        assert any(r["offset"] == rows[i]["offset"] and r["type"] == MISSING for r in new), new
    with pytest.raises(AssertionError, match="error rows differ"):
        _assert_same(
            _outcome(_run("store_v1", table, vectorised=False)),
            _outcome(_run("store_v1", changed, vectorised=True)),
            "original vs changed",
        )
    _check("store_v1", changed, sizes=(None, 7))


def test_the_fast_lane_is_taken(traffic_tables, monkeypatch):
    """The vectorised path decodes far fewer records through the codec: the comparisons above are between two
    different paths, not one path twice."""
    calls = Counter()
    decode = E.EnvelopeCodec.decode

    def counting(self, value, headers=None):
        calls[counting.flag] += 1
        return decode(self, value, headers)

    monkeypatch.setattr(E.EnvelopeCodec, "decode", counting)
    table = traffic_tables[cks.ADHASH]
    for flag in (False, True):
        counting.flag = flag
        _run("store_v1", table, vectorised=flag)
    assert calls[False] >= table.num_rows * 0.9
    assert calls[True] < calls[False] / 2, calls


def test_no_lane_for_producers_whose_segments_began_before_the_run(traffic_tables, monkeypatch):
    """An RT read from where retention left it: no StartOfSegment is in the records, so DIV tracks every producer
    unregistered and the common case never applies. After the first batch (no producer tracked yet) no batch is
    read for the fast lane, which could take none of its records; the results are still the reference's."""
    table = traffic_tables[cks.ADHASH]
    data = table.filter(
        pa.array(
            [
                k is not None and k[:1] == bytes([K.HEADER_PUT_OR_DELETE])
                for k in table.column("key").to_pylist()
            ]
        )
    )
    reads = Counter()
    original = EnvelopeReader.read

    def counted(self, *args):
        reads["batches"] += 1
        return original(self, *args)

    monkeypatch.setattr(EnvelopeReader, "read", counted)
    run = PartitionRun(0, "store_rt", 0, vectorised=True)
    batches = data.to_batches(max_chunksize=333)
    for b in batches:
        run.feed(b)
    assert len(batches) > 3 and reads["batches"] == 1
    assert not any(seg.registered for seg in run.validator.segments.values())
    reference = PartitionRun(0, "store_rt", 0, vectorised=False)
    reference.feed(data)
    assert run.table().to_pylist() == reference.table().to_pylist()
    assert run.finish().to_json() == reference.finish().to_json()


@pytest.mark.parametrize("learnt", [False, True], ids=["new-codec", "v14-learnt"])
def test_div_step_hands_envelopes_on_only_while_its_codec_reads_as_a_new_one(
    traffic_tables, monkeypatch, learnt
):
    """Envelopes read by another reader (the watch's, with a new codec) stand for what this partition's codec reads
    only while it has learnt no other schema for version 14; after that the run must read the records itself."""
    table = traffic_tables[cks.ADHASH]
    first = DivStep()(0, "store_v1", 0, table.slice(0, 100)).state
    if learnt:
        first.learned = {E.CURRENT_VERSION: newer_schema()}
    given = []
    feed = PartitionRun.feed

    def recorded(self, batch, envelopes=None):
        given.append(envelopes)
        return feed(self, batch, envelopes)

    monkeypatch.setattr(PartitionRun, "feed", recorded)
    rest = table.slice(100)
    DivStep()(0, "store_v1", 0, rest, first, envelopes=read_envelopes(rest))
    assert len(given) == 1 and (given[0] is None) == learnt
