"""Record validators: building the chain from configuration, the built-ins, raising validators, the docs example,
and what `div validate` does with them (rows typed VALIDATOR:<name>, exit 2 for a bad entry)."""

from __future__ import annotations

import os
import sys

import pyarrow.parquet as pq
import pytest
import yaml
from validator_examples import write_modules

from div import envelope as E
from div import keys
from div.archive import ArchiveWriter, records_to_batch
from div.batch import PartitionRun
from div.validator import ValidatorConfig
from div.validators.base import (
    MAX_RAISES_PER_PARTITION,
    Chain,
    PartitionContext,
    Record,
    RecordValidator,
    ValidatorSpecError,
    run_chain,
)
from div.validators.builtin import KeyPresent, OffsetsIncreasing, SchemaIds, TimestampDrift
from div.validators.registry import build_chain
from div.writer import SegmentWriter
from pipelines.cli import main
from sim.div_traffic import TrafficSpec, generate

T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def example_modules(tmp_path_factory):
    directory = tmp_path_factory.mktemp("validators")
    write_modules(directory)
    sys.path.insert(0, str(directory))
    yield directory
    sys.path.remove(str(directory))
    for name in ("producer_checks", "flaky_checks"):
        sys.modules.pop(name, None)


def _records(n: int = 300, seed: int = 3) -> list[list]:
    """[offset, key, value, headers, ts] of one partition's traffic (push job, then two producers)."""
    spec = TrafficSpec(
        partitions=1,
        producers=2,
        records=n,
        batch_records=20,
        segment_every=50,
        seed=seed,
        value_size=30,
        keys=20,
        start_ms=T0,
    )
    return [[r.offset, r.key, r.value, list(r.headers) or None, r.timestamp_ms] for r in generate(spec)]


def _batch(recs: list[list], topic: str = "s_v1"):
    return records_to_batch([(topic, 0, off, k, v, ts, 0, h) for off, k, v, h, ts in recs])


def _run(recs, validators, topic="s_v1", batch_size=100_000, **kw) -> PartitionRun:
    run = PartitionRun(0, topic, 0, record_validators=build_chain(validators), **kw)
    for i in range(0, len(recs), batch_size):
        run.feed(_batch(recs[i : i + batch_size], topic))
    run.finish()
    return run


def _vrows(run: PartitionRun) -> list[tuple]:
    return [r for r in run.rows if r[7].startswith("VALIDATOR:")]


def _record(offset=0, key=b"\x00k", env=None, ts=T0, topic="s_v1") -> Record:
    return Record(0, topic, 0, offset, key, b"", None, env, ts)


# -- the chain ---------------------------------------------------------------------------------------


def test_builtin_names_resolve_with_or_without_prefix():
    chain = build_chain(
        [
            "offsets_increasing",
            {"class": "builtin:schema_ids", "allowed": "1,3-4"},
            {"class": "div.validators.builtin:TimestampDrift", "name": "ts", "max_drift_ms": 5},
        ]
    )
    assert [type(v) for v in chain] == [OffsetsIncreasing, SchemaIds, TimestampDrift]
    assert [v.name for v in chain] == ["offsets_increasing", "schema_ids", "ts"]
    assert chain[1].ranges == [(3, 4)] and 1 in chain[1].ids
    assert build_chain(None) == [] and build_chain([]) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuch.module:Check", "cannot import module 'nosuch.module'"),
        ("div.validators.builtin:Nope", "has no 'Nope'"),
        ("json:loads", "is not a validator class"),
        ("builtin:nope", "no built-in validator 'nope'"),
        (":X", "expected module:Class"),
        ({"class": "builtin:schema_ids"}, "allowed"),
        (
            {"class": "builtin:timestamp_drift", "max_drift": 5},
            "unknown parameter 'max_drift' (did you mean 'max_drift_ms'?)",
        ),
        ({"class": "builtin:timestamp_drift", "max_drift_ms": -5}, "non-negative"),
        ({"class": "builtin:key_present", "pattern": "("}, "not a valid regular expression"),
        ({"name": "x"}, "needs `class: module:Class`"),
        (42, "expected `module:Class`"),
    ],
)
def test_bad_entries_name_themselves(spec, message):
    with pytest.raises(ValidatorSpecError, match=None) as err:
        build_chain([spec])
    assert message in str(err.value)
    assert "validator" in str(err.value)


def test_a_raising_validator_is_a_row_and_the_chain_goes_on():
    class Boom(RecordValidator):
        name = "boom"

        def validate(self, record):
            raise KeyError("no such field")

    class Always(RecordValidator):
        def validate(self, record):
            return "always"

    chain = Chain([Boom(), Always()])
    chain.reset(PartitionContext(0, "t", 0))
    findings = chain.run(_record(offset=7))
    assert [(f.type, f.detail, f.fatal, f.offset) for f in findings] == [
        ("VALIDATOR:boom", "validator raised KeyError: 'no such field'", False, 7),
        ("VALIDATOR:Always", "always", False, 7),
    ]
    for i in range(MAX_RAISES_PER_PARTITION + 20):
        chain.run(_record(offset=8 + i))
    # after 100 raises the validator is off for the partition; the last row says so
    assert chain._raises[0] == MAX_RAISES_PER_PARTITION
    last = [f for f in chain.run(_record(offset=10_000))]
    assert [f.type for f in last] == ["VALIDATOR:Always"]
    chain.reset(PartitionContext(0, "t", 1))  # a new partition: it runs again
    assert [f.type for f in chain.run(_record())] == ["VALIDATOR:boom", "VALIDATOR:Always"]
    assert run_chain([Always()], _record())[0].detail == "always"


def test_raise_cap_row_in_a_partition_run(example_modules):
    recs = _records(400)
    run = _run(recs, [{"class": "flaky_checks:Flaky", "every": 2}])
    rows = _vrows(run)
    assert len(rows) == MAX_RAISES_PER_PARTITION
    assert all(
        r[7] == "VALIDATOR:Flaky" and r[9].startswith("validator raised RuntimeError: boom at ") for r in rows
    )
    assert "not run on the rest of s_v1/0" in rows[-1][9]
    assert run.summary.findings["VALIDATOR:Flaky"] == MAX_RAISES_PER_PARTITION
    assert run.summary.fatal_findings == 0


# -- the docs example ---------------------------------------------------------------------------------


def test_docs_example_finds_a_producer_going_back_in_time(example_modules):
    recs = _records()
    codec = E.EnvelopeCodec()
    target = next(i for i, r in enumerate(recs) if i > 200 and r[1][0] == 0)
    env = codec.decode(recs[target][2], recs[target][3])
    env["producerMetadata"]["messageTimestamp"] -= 5_000  # not covered by the checksum: DIV stays quiet
    recs[target][2] = codec.encode(env)
    spec = {"class": "producer_checks:ProducerClockBackwards", "slack_ms": 1000}
    run = _run(recs, [spec])
    assert [(r[3], r[4], r[7], r[8]) for r in run.rows] == [
        (
            recs[target][0],
            env["producerMetadata"]["producerGUID"].hex(),
            "VALIDATOR:producer_clock_backwards",
            False,
        )
    ]
    assert "went back" in run.rows[0][9]
    assert _vrows(_run(recs, [{**spec, "slack_ms": 10_000}])) == []
    with pytest.raises(ValidatorSpecError, match="slack_ms"):
        build_chain([{**spec, "slack_ms": -1}])


# -- built-ins ----------------------------------------------------------------------------------------


def test_offsets_increasing_sees_out_of_order_records():
    recs = _records(100)
    run = PartitionRun(0, "s_v1", 0, record_validators=build_chain(["offsets_increasing"]))
    run.feed(_batch(recs[:50]))
    run.feed(_batch(recs[45:47]))  # a source that hands 45, 46 again after 49
    run.feed(_batch(recs[50:]))
    rows = _vrows(run)
    assert [(r[3], r[9]) for r in rows] == [
        (45, "offset 45 follows offset 49: offsets must increase within a partition")
    ]
    v = OffsetsIncreasing()
    v.reset(PartitionContext(0, "t", 0))
    assert [v.validate(_record(offset=o)) for o in (3, 3, 4)] == [
        None,
        "offset 3 appears twice in a row",
        None,
    ]


def test_validators_see_undecodable_records():
    recs = _records(100)
    recs[60][1] = None  # keyless
    recs[61][2] = b"not a venice value"
    seen = []

    class Spy(RecordValidator):
        def validate(self, record):
            seen.append((record.offset, record.envelope is None, record.undecodable))

    run = PartitionRun(
        0,
        "s_v1",
        0,
        config=ValidatorConfig(min_compaction_lag_ms=0, now_ms=T0),
        record_validators=Chain([Spy(), KeyPresent()]),
    )
    run.feed(_batch(recs))
    assert len(seen) == len(recs)
    assert seen[60][:2] == (60, True) and "empty Kafka key" in seen[60][2]
    assert seen[61][:2] == (61, True) and "bad magic" in seen[61][2]
    types = [(r[3], r[7]) for r in run.rows]
    assert (60, "UNDECODABLE") in types and (60, "VALIDATOR:key_present") in types
    assert (61, "VALIDATOR:key_present") not in types


def test_key_present_applies_to_compacted_topics():
    ctx = PartitionContext(0, "s_v1", 0, compacted=False)
    keyless = _record(key=None)
    v = KeyPresent()
    v.reset(ctx)
    assert v.validate(keyless) is None
    v.reset(PartitionContext(0, "s_v1", 0, compacted=True))
    assert "compacted topic s_v1" in v.validate(keyless)
    by_pattern = KeyPresent(pattern=r".*_v\d+")
    by_pattern.reset(ctx)
    assert by_pattern.validate(keyless) and by_pattern.validate(_record()) is None
    by_name = KeyPresent(topics="other")
    by_name.reset(ctx)
    assert by_name.validate(keyless) is None


def test_timestamp_drift_both_ways():
    v = TimestampDrift(max_drift_ms=100)
    v.reset(PartitionContext(0, "t", 0))
    out = [
        v.validate(_record(offset=i, ts=ts))
        for i, ts in enumerate([T0, T0 + 50, T0 - 60, T0 + 500, None, T0 + 520])
    ]
    assert out[0] is None and out[1] is None and out[4] is None and out[5] is None
    assert out[2] == (
        f"timestamp {T0 - 60} is 110 ms before that of the previous record (offset 1, {T0 + 50}); "
        "allowed drift 100 ms"
    )
    assert "560 ms after" in out[3]
    forward_ok = TimestampDrift(max_drift_ms=100, max_ahead_ms=-1)
    forward_ok.reset(PartitionContext(0, "t", 0))
    assert [forward_ok.validate(_record(ts=ts)) for ts in (T0, T0 + 10**9)] == [None, None]


def test_timestamp_drift_on_producer_timestamps():
    recs = _records(200)
    codec = E.EnvelopeCodec()
    i = 150
    env = codec.decode(recs[i][2], recs[i][3])
    env["producerMetadata"]["messageTimestamp"] += 3_600_000
    recs[i][2] = codec.encode(env)
    run = _run(recs, [{"class": "builtin:timestamp_drift", "max_drift_ms": 1000, "timestamp": "producer"}])
    assert [r[3] for r in _vrows(run)] == [recs[i][0], recs[i + 1][0]]  # the jump, and the way back
    assert _vrows(_run(recs, [{"class": "builtin:timestamp_drift", "max_drift_ms": 1000}])) == []


def test_schema_ids():
    w = SegmentWriter(b"\x01" * 16, clock=lambda: T0)
    recs = (
        w.put(0, b"a", b"v", schema_id=1)
        + w.put(0, b"b", b"v", schema_id=9)
        + w.delete(0, b"c")
        + w.delete(0, b"d", schema_id=8)
        + w.put(0, b"e", b"chunk", schema_id=-10)
        + w.update(0, b"f", b"u", schema_id=4, update_schema_id=99)
        + w.put(0, b"g", b"grd", schema_id=1, header=keys.HEADER_GLOBAL_RT_DIV)
    )
    codec = E.EnvelopeCodec()
    records = [
        Record(0, "t", 0, i, r.key, r.value, None, codec.decode(r.value), T0) for i, r in enumerate(recs)
    ]
    v = SchemaIds(allowed=[1, "3-5"])
    assert [i for i, rec in enumerate(records) if v.validate(rec)] == [2, 4]  # 9 and the delete with 8
    assert v.validate(records[2]) == "value schema id 9 of a PUT is not allowed (allowed: {-10, -20, 1, 3-5})"
    strict = SchemaIds(allowed=1, chunks=False)
    assert [i for i, rec in enumerate(records) if strict.validate(rec)] == [2, 4, 5, 6]
    assert strict.validate(_record(env=None)) is None


# -- the job ------------------------------------------------------------------------------------------


def test_fail_fast_summary_does_not_depend_on_batching():
    recs = _records(300)
    del recs[10]  # a push-job gap: fatal MISSING
    runs = []
    for size in (7, 1000):
        run = PartitionRun(
            0, "s_v1", 0, fail_fast=True, record_validators=build_chain(["offsets_increasing"])
        )
        try:
            for i in range(0, len(recs), size):
                run.feed(_batch(recs[i : i + size]))
        except Exception as exc:
            run.stopped = str(exc)
        runs.append(run)
    assert runs[0].stopped and runs[0].stopped == runs[1].stopped
    assert runs[0].summary == runs[1].summary
    assert runs[0].summary.last_offset == recs[10][0]
    assert runs[0].summary.records == 11
    assert runs[0].rows == runs[1].rows


def test_div_validate_cli(tmp_path, example_modules):
    archive = tmp_path / "dc-0"
    recs = _records(300)
    recs[120][4] -= 7_200_000
    with ArchiveWriter(str(archive)) as w:
        for off, k, v, h, ts in recs:
            w.append_record("s_v1", 0, off, k, v, ts, 0, h)
    conf = tmp_path / "conf.yaml"
    conf.write_text(
        yaml.safe_dump(
            {
                "validators": [
                    {"class": "builtin:timestamp_drift", "max_drift_ms": 60_000, "name": "drift"},
                    "producer_checks:ProducerClockBackwards",
                ]
            }
        )
    )
    out = tmp_path / "out"
    args = ["div", "validate", "--source", f"0={archive}", "--out", str(out), "--conf", str(conf)]
    assert main(args + ["--validator", "builtin:offsets_increasing"]) == 0  # validator rows are not fatal
    rows = pq.read_table(os.path.join(out, "errors")).to_pylist()
    assert [(r["offset"], r["type"], r["fatal"]) for r in rows] == [
        (120, "VALIDATOR:drift", False),
        (121, "VALIDATOR:drift", False),
    ]
    assert main(args + ["--validator", "nosuch_module_xyz:Check"]) == 2
    assert main(args + ["--validator", "builtin:schema_ids"]) == 2  # `allowed` is required
