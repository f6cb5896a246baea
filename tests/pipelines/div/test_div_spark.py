"""Both `div validate` engines on the same archives: identical errors tables and summaries.

The archives hold sim.div_traffic traffic with every kind of fault DIV and the built-in record validators find:
gaps before and after End of Push, duplicates, corrupt values, unknown producers, undecodable values and keys,
gaps inside and outside the compaction window, a wild timestamp, a keyless record, an unexpected schema id, and
a second (foreign) file repeating records. Each engine run is compared field by field apart from `engine` and
timings.
"""

from __future__ import annotations

import json
import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from validator_examples import write_modules

from div import envelope as E
from div.archive import KAFKA_ARROW_SCHEMA, ArchiveWriter, records_to_batch
from div.writer import SegmentWriter
from pipelines.core.sources import SourceSpec
from pipelines.div.spark import _assign_buckets, _bucket_keys, archive_is_tidy, run_spark, spark_hash_int
from pipelines.div.validate import ValidateOptions, run_local
from sim.div_traffic import TrafficSpec, generate

pytestmark = pytest.mark.spark

START_MS = 1_700_000_000_000
B_START_MS = START_MS - 100_000  # region 1's traffic is older: part of it lies in the compaction window
NOW_MS = START_MS + 20_000
LAG_MS = NOW_MS - (B_START_MS + 500)  # records at or before B_START_MS + 500 may have been compacted away

VALIDATORS = [
    {"class": "builtin:offsets_increasing"},
    {"class": "builtin:timestamp_drift", "max_drift_ms": 60_000, "max_ahead_ms": -1},
    {"class": "builtin:key_present"},
    {"class": "builtin:schema_ids", "allowed": [1]},
    {"class": "producer_checks:ProducerClockBackwards", "slack_ms": 1000},
    {"class": "flaky_checks:Flaky", "every": 97},
]


def _traffic(seed: int, partitions: int, records: int, start_ms: int) -> dict[int, list[list]]:
    spec = TrafficSpec(
        topic="store_v1",
        partitions=partitions,
        producers=3,
        records=records,
        batch_records=60,
        value_size=40,
        keys=50,
        segment_every=120,
        seed=seed,
        start_ms=start_ms,
    )
    out: dict[int, list[list]] = {p: [] for p in range(partitions)}
    for r in generate(spec):
        out[r.partition].append([r.key, r.value, list(r.headers) or None, r.timestamp_ms])
    return out


def _eop_index(recs: list[list]) -> int:
    codec = E.EnvelopeCodec()
    for i, (key, value, headers, _) in enumerate(recs):
        if key and key[0] == 2 and E.control_type(codec.decode(value, headers)) == E.END_OF_PUSH:
            return i
    raise AssertionError("no EndOfPush")


def _data_index(recs: list[list], start: int) -> int:
    """The first plain PUT at or after `start`."""
    codec = E.EnvelopeCodec()
    for i in range(start, len(recs)):
        key, value, headers, _ = recs[i]
        if key[0] == 0 and E.payload_kind(codec.decode(value, headers)) == "PUT":
            return i
    raise AssertionError("no PUT")


def _reencode(rec: list, change) -> list:
    codec = E.EnvelopeCodec()
    env = codec.decode(rec[1], rec[2])
    change(env)
    return [rec[0], codec.encode(env), rec[2], rec[3]]


def _stranger(partition: int, ts: int, segment: int) -> list[list]:
    """Records of a producer nobody saw start: its StartOfSegment is missing."""
    w = SegmentWriter(random.Random(segment).randbytes(16), clock=lambda: ts, send_vtp=False)
    recs = []
    for _ in range(segment + 1):
        recs = w.put(partition, b"key-x", b"v") + w.end_segment(partition, final=False)
    return [[r.key, r.value, list(r.headers) or None, ts] for r in recs[1:]]


def _write(
    path: str, topic: str, parts: dict[int, list[list]], holes: dict[int, set[int]] | None = None
) -> None:
    with ArchiveWriter(path, row_group_size=500) as w:
        for p, recs in parts.items():
            off = 0
            for key, value, headers, ts in recs:
                while off in (holes or {}).get(p, set()):
                    off += 1
                w.append_record(topic, p, off, key, value, ts, 0, headers)
                off += 1


def build_archives(root: str) -> tuple[str, str]:
    """Two regions' archives with known faults; returns their paths."""
    a = _traffic(seed=11, partitions=3, records=1500, start_ms=START_MS)
    # p0, after EOP: a gap (MISSING), a duplicate (DUPLICATE), a corrupt value (CORRUPT at its segment's end)
    eop = _eop_index(a[0])
    i = _data_index(a[0], eop + 40)
    del a[0][i]
    j = _data_index(a[0], eop + 80)
    a[0].insert(j + 1, list(a[0][j]))
    k = _data_index(a[0], eop + 150)
    a[0][k] = _reencode(a[0][k], lambda env: env["payloadUnion"][1].update(putValue=b"tampered"))
    # p1, before EOP: a gap (fatal MISSING) and an undecodable value (fatal); after: a bad key and a bad value
    eop = _eop_index(a[1])
    del a[1][_data_index(a[1], 10)]
    a[1].insert(20, [b"\x00key-u", b"\x17\x0egarbage", None, START_MS + 1])
    eop = _eop_index(a[1])
    a[1].insert(eop + 30, [b"\x63nope", a[1][eop + 30][1], None, START_MS + 400])
    a[1].insert(eop + 60, [b"\x00key-v", b"\x01not venice", None, START_MS + 500])
    # p2: unknown producers before EOP (fatal) and after; a schema id outside the allowed set
    eop = _eop_index(a[2])
    a[2][30:30] = _stranger(2, START_MS + 30, segment=2)
    eop = _eop_index(a[2])
    a[2][eop + 20 : eop + 20] = _stranger(2, START_MS + 900, segment=3)
    m = _data_index(a[2], eop + 100)
    a[2][m] = _reencode(a[2][m], lambda env: env["payloadUnion"][1].update(schemaId=5))
    region0 = os.path.join(root, "dc-0")
    _write(region0, "store_v1", a, holes={0: {5, 6}})

    b = _traffic(seed=12, partitions=2, records=1000, start_ms=B_START_MS)
    # p0: gaps inside the compaction window (tolerated) and after it (MISSING)
    eop = _eop_index(b[0])
    early = _data_index(b[0], eop + 5)
    late = _data_index(b[0], len(b[0]) - 40)
    assert b[0][early][3] <= NOW_MS - LAG_MS < b[0][late][3]
    back = _data_index(b[0], eop + 200)
    b[0][back] = _reencode(
        b[0][back],
        lambda env: env["producerMetadata"].update(
            messageTimestamp=env["producerMetadata"]["messageTimestamp"] - 5_000
        ),
    )
    # late in p0, an incremental push starts: its control message is a checkpoint, where max age expires producers
    soip_at = len(b[0]) - 20
    ts = b[0][soip_at][3]
    w = SegmentWriter(random.Random(99).randbytes(16), clock=lambda: ts, send_vtp=False)
    b[0][soip_at:soip_at] = [
        [r.key, r.value, None, ts] for r in w.control(0, E.START_OF_INCREMENTAL_PUSH, {"version": "inc-1"})
    ]
    del b[0][late]
    del b[0][early : early + 3]
    # p1: a wild timestamp, a keyless record
    eop = _eop_index(b[1])
    b[1][eop + 50][3] -= 3_600_000
    b[1].insert(eop + 70, [None, b[1][eop + 70][1], None, B_START_MS + 600])
    region1 = os.path.join(root, "dc-1")
    _write(region1, "store_v1", b)
    # a foreign file repeating the first 100 records of p1 (foreign archives may hold records twice)
    dup = records_to_batch(
        [
            ("store_v1", 1, off, key, value, ts, 0, headers)
            for off, (key, value, headers, ts) in enumerate(b[1][:100])
        ]
    )
    pq.write_table(
        pa.Table.from_batches([dup], schema=KAFKA_ARROW_SCHEMA), os.path.join(region1, "foreign.parquet")
    )
    return region0, region1


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> tuple[str, str]:
    return build_archives(str(tmp_path_factory.mktemp("div-spark")))


@pytest.fixture(scope="module")
def validator_modules(spark, tmp_path_factory):
    """The example validators, importable here and (shipped as --py-files would) on the executors."""
    directory = tmp_path_factory.mktemp("validator-modules")
    for f in write_modules(directory):
        spark.sparkContext.addPyFile(str(f))
    sys.path.insert(0, str(directory))
    yield
    sys.path.remove(str(directory))


def _opts(archives, out: str, **kw) -> ValidateOptions:
    base = dict(
        sources=[SourceSpec(0, archives[0]), SourceSpec(1, archives[1])],
        out=out,
        min_compaction_lag_ms=LAG_MS,
        now_ms=NOW_MS,
    )
    base.update(kw)
    return ValidateOptions(**base)


def _errors(out: str) -> list[dict]:
    rows = pq.read_table(os.path.join(out, "errors")).to_pylist()
    return sorted(
        rows, key=lambda r: (r["region"], r["topic"], r["partition"], r["offset"], r["type"], r["detail"])
    )


def _summary(out: str) -> dict:
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    for k in ("engine", "elapsed_s", "started_at"):
        s.pop(k)
    return s


def _both(spark, archives, tmp_path, read="shuffle", **kw) -> tuple[int, dict, list[dict]]:
    local_out, spark_out = str(tmp_path / "local"), str(tmp_path / "spark")
    code_local = run_local(_opts(archives, local_out, **kw))
    code_spark = run_spark(_opts(archives, spark_out, **kw), read=read)
    assert code_spark == code_local
    assert _summary(spark_out) == _summary(local_out)
    errors = _errors(local_out)
    assert _errors(spark_out) == errors
    schemas = [
        pq.read_table(os.path.join(o, "errors")).schema.remove_metadata() for o in (local_out, spark_out)
    ]
    assert schemas[0] == schemas[1]
    return code_local, _summary(local_out), errors


@pytest.mark.parametrize("read", ["shuffle", "direct"])
def test_same_findings_and_summary(spark, archives, validator_modules, tmp_path, read):
    code, summary, errors = _both(spark, archives, tmp_path, read, record_validators=VALIDATORS)
    assert code == 1
    by_type = summary["findings_by_type"]
    for kind in (
        "MISSING",
        "DUPLICATE",
        "CORRUPT",
        "UNREGISTERED_PRODUCER",
        "VALIDATOR:timestamp_drift",
        "VALIDATOR:key_present",
        "VALIDATOR:schema_ids",
        "VALIDATOR:producer_clock_backwards",
        "VALIDATOR:Flaky",
    ):
        assert by_type.get(kind), (kind, by_type)
    # unreadable records are counted, never findings (the verdict is "findings" for the others)
    assert "UNDECODABLE" not in by_type and summary["undecodable_records"] > 0
    assert {(e["region"], e["partition"]) for e in errors if e["type"] == "UNDECODABLE"} >= {(0, 1)}
    fatal = {(e["region"], e["partition"], e["type"]) for e in errors if e["fatal"]}
    assert {(0, 1, "MISSING"), (0, 2, "UNREGISTERED_PRODUCER")} <= fatal
    assert not any(e["fatal"] for e in errors if e["type"] == "UNDECODABLE")
    # the compaction window: region 1's early gap is tolerated, the late one is not (nor its segment's checksum)
    assert [
        e["type"]
        for e in errors
        if e["region"] == 1 and e["partition"] == 0 and not e["type"].startswith("V")
    ] == ["MISSING", "CORRUPT"]
    # the repeated records of the foreign file are validated once
    p1 = next(p for p in summary["partitions"] if p["region"] == 1 and p["partition"] == 1)
    assert p1["records"] == p1["last_offset"] - p1["first_offset"] + 1
    assert not any(e["type"] == "VALIDATOR:offsets_increasing" for e in errors)
    assert summary["failed_partitions"] == []


def test_same_without_validators_and_with_max_age(spark, archives, tmp_path):
    code, summary, _ = _both(spark, archives, tmp_path, max_age_ms=200, topics=["store_v1"])
    assert code == 1
    run_local(_opts(archives, str(tmp_path / "no-max-age"), topics=["store_v1"]))
    unlimited = _summary(str(tmp_path / "no-max-age"))
    assert summary["records_read"] == unlimited["records_read"]
    assert summary["producers_tracked"] < unlimited["producers_tracked"]  # max age forgot some producers


@pytest.mark.parametrize("read", ["shuffle", "direct"])
def test_fail_fast_keeps_what_the_local_engine_keeps(spark, archives, tmp_path, read):
    code, summary, errors = _both(spark, archives, tmp_path, read, fail_fast=True)
    assert code == 1
    # the local engine stops in region 0 partition 1 (the first with a fatal finding): nothing after it
    assert [(p["region"], p["partition"]) for p in summary["partitions"]] == [(0, 0), (0, 1)]
    assert errors[-1]["fatal"] and errors[-1]["partition"] == 1


@pytest.mark.parametrize("read", ["shuffle", "direct"])
def test_unreadable_partition_is_reported_and_the_rest_written(spark, archives, tmp_path, read):
    broken = tmp_path / "broken"
    region1 = archives[1]
    os.makedirs(broken)
    for name in os.listdir(region1):
        if not name.startswith("foreign"):
            with open(os.path.join(region1, name), "rb") as f:
                data = bytearray(f.read())
            if name.startswith("store_v1+00001"):
                data[200:4000] = os.urandom(3800)  # the data pages, not the footer: planning still works
            with open(broken / name, "wb") as f:
                f.write(data)
    kw = dict(sources=[SourceSpec(0, archives[0]), SourceSpec(1, str(broken))])
    local_out, spark_out = str(tmp_path / "local"), str(tmp_path / "spark")
    assert run_local(_opts(archives, local_out, **kw)) == 1
    assert run_spark(_opts(archives, spark_out, **kw), read=read) == 1
    s_local, s_spark = _summary(local_out), _summary(spark_out)
    failed = [(f["region"], f["topic"], f["partition"]) for f in s_spark["failed_partitions"]]
    assert failed == [(f["region"], f["topic"], f["partition"]) for f in s_local["failed_partitions"]]
    assert failed == [(1, "store_v1", 1)]
    assert s_spark["partitions"] == s_local["partitions"]
    assert _errors(spark_out) == _errors(local_out)


def test_validator_the_executors_cannot_import_fails_its_partitions(spark, archives, tmp_path, monkeypatch):
    """Importable on the driver only (not shipped with --py-files): every partition fails, saying why."""
    (tmp_path / "driver_only_checks.py").write_text(
        "from div.validators.base import RecordValidator\n\n"
        "class Nothing(RecordValidator):\n    def validate(self, record):\n        return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = str(tmp_path / "out")
    code = run_spark(_opts(archives, out, record_validators=[{"class": "driver_only_checks:Nothing"}]))
    assert code == 3
    summary = _summary(out)
    assert summary["partitions"] == [] and len(summary["failed_partitions"]) == 5
    assert all(
        "cannot import module 'driver_only_checks'" in f["error"] for f in summary["failed_partitions"]
    )
    assert _errors(out) == []


def test_bad_validator_is_a_usage_error(spark, archives, tmp_path):
    from div.validators import ValidatorSpecError
    from pipelines.core.errors import UsageError

    # the CLI entry maps ValidatorSpecError to exit 2 (tests/div/test_record_validators.py runs it)
    with pytest.raises(ValidatorSpecError, match="nosuch.module"):
        run_spark(_opts(archives, str(tmp_path / "o"), record_validators=[{"class": "nosuch.module:X"}]))
    with pytest.raises(UsageError, match="tidegauge.div.read='sideways'"):
        run_spark(_opts(archives, str(tmp_path / "o")), read="sideways")


def test_bucket_keys_follow_sparks_hash(spark):
    from pyspark.sql import functions as F

    rows = (
        spark.range(0, 200)
        .select(F.col("id").cast("int").alias("k"), F.hash(F.col("id").cast("int")).alias("h"))
        .collect()
    )
    assert [spark_hash_int(r["k"]) for r in rows] == [r["h"] for r in rows]
    keys = _bucket_keys(7)
    assert [spark_hash_int(k) % 7 for k in keys] == list(range(7))


def test_auto_plan_reads_directly_only_when_row_groups_hold_one_partition(archives, tmp_path):
    assert archive_is_tidy(archives[0]) and archive_is_tidy(archives[1])
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    batch = records_to_batch([("t", p, 0, b"\x00k", b"v", START_MS, 0, None) for p in (0, 1)])
    pq.write_table(pa.Table.from_batches([batch]), mixed / "part-0.parquet")
    assert not archive_is_tidy(str(mixed))


def test_largest_tasks_are_spread_first():
    assert _assign_buckets([10, 50, 30, 40], 2) == [0, 0, 1, 1]
    assert _assign_buckets([5, 5, 5], 4) == [0, 1, 2]


@pytest.mark.kafka
@pytest.mark.parametrize("read", ["shuffle", "direct"])
def test_same_on_a_live_cluster_with_an_empty_partition(spark, embedded_kafka, tmp_path, read):
    """Kafka sources: the engines read the cluster (end offsets fixed at planning) and agree; partition 3 of the
    topic is empty, so no record of it reaches Spark and the driver reports it as the local engine does."""
    from confluent_kafka import Producer

    a = _traffic(seed=21, partitions=3, records=600, start_ms=START_MS)
    del a[1][_data_index(a[1], 10)]  # a fatal gap before End of Push
    a[2].insert(_eop_index(a[2]) + 10, [b"\x00k", b"garbage!", None, START_MS + 300])
    topic = f"div-spark-{read}-{random.Random().randrange(1 << 30):08x}"
    embedded_kafka.create_topic(topic, 4)
    producer = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers, "linger.ms": 5})
    for p, recs in a.items():
        for key, value, headers, ts in recs:
            producer.produce(topic, key=key, value=value, partition=p, headers=headers, timestamp=ts)
    assert producer.flush(30) == 0
    kw = dict(sources=[SourceSpec(0, embedded_kafka.uri)], topics=[topic], record_validators=VALIDATORS[:4])
    code, summary, errors = _both(spark, (None, None), tmp_path, read, **kw)
    assert code == 1
    assert [(p["partition"], p["records"]) for p in summary["partitions"]] == [
        (0, len(a[0])),
        (1, len(a[1])),
        (2, len(a[2])),
        (3, 0),
    ]
    assert {(e["partition"], e["type"], e["fatal"]) for e in errors if e["fatal"]} == {(1, "MISSING", True)}
    assert any(e["partition"] == 2 and e["type"] == "UNDECODABLE" for e in errors)


@pytest.mark.kafka
@pytest.mark.parametrize("read", ["shuffle", "direct"])
def test_records_written_after_planning_are_not_read(spark, embedded_kafka, tmp_path, read, monkeypatch):
    """Each task reads the offsets the driver planned: records a producer writes once the job is planned (here
    while the session starts; on a cluster, before an executor opens the topic) are not validated, as the local
    engine, run before they were written, is the reference. (Found on a standalone cluster: the direct plan's
    tasks read up to their executor's own high watermark, the shuffle plan's scan up to its own.)"""
    from confluent_kafka import Producer

    import pipelines.core.spark_session as session

    a = _traffic(seed=22, partitions=2, records=300, start_ms=START_MS)
    topic = f"div-planned-{read}-{random.Random().randrange(1 << 30):08x}"
    embedded_kafka.create_topic(topic, 2)
    producer = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers, "linger.ms": 5})
    for p, recs in a.items():
        for key, value, headers, ts in recs:
            producer.produce(topic, key=key, value=value, partition=p, headers=headers, timestamp=ts)
    assert producer.flush(30) == 0
    kw = dict(sources=[SourceSpec(0, embedded_kafka.uri)], topics=[topic])
    local_out, spark_out = str(tmp_path / "local"), str(tmp_path / "spark")
    code = run_local(_opts((None, None), local_out, **kw))
    get_session = session.get_session

    def written_after_planning(*args, **kwargs):
        for p in a:
            producer.produce(topic, key=b"\x00late", value=b"written after planning", partition=p)
        assert producer.flush(30) == 0
        return get_session(*args, **kwargs)

    monkeypatch.setattr(session, "get_session", written_after_planning)
    assert run_spark(_opts((None, None), spark_out, **kw), read=read) == code
    assert _summary(spark_out) == _summary(local_out)
    assert _errors(spark_out) == _errors(local_out)
    assert [p["records"] for p in _summary(spark_out)["partitions"]] == [len(a[0]), len(a[1])]


def test_cli_engine_spark(spark, archives, tmp_path):
    from pipelines.cli import main

    out = tmp_path / "out"
    code = main(
        [
            "div",
            "validate",
            "--engine",
            "spark",
            "--source",
            f"1={archives[1]}",
            "--out",
            str(out),
            "--min-compaction-lag-ms",
            str(LAG_MS),
            "--now-ms",
            str(NOW_MS),
            "--validator",
            "builtin:offsets_increasing",
        ]
    )
    with open(out / "summary.json") as f:
        summary = json.load(f)
    # region 1 has no fatal finding, but one record it cannot decode: partial, not clean
    assert (code, summary["engine"], summary["exit_code"], summary["verdict"]) == (3, "spark", 3, "partial")
    assert summary["undecodable_records"] == 1
    assert summary["findings_by_type"]["MISSING"] == 1
    assert (
        main(
            [
                "div",
                "validate",
                "--engine",
                "spark",
                "--source",
                f"1={archives[1]}",
                "--out",
                str(out),
                "--validator",
                "builtin:nope",
            ]
        )
        == 2
    )
