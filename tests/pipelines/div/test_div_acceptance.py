"""Acceptance scenarios for `tidegauge div validate`, built independently of our writer and codec.

Every record comes from tests/support/venice_reference.py (Venice's schema files and fastavro, nothing from `div`), the
archive is written with pyarrow alone, and the command runs end to end. Each scenario lives in its own
partition with its own push job and End of Push, and is classified exactly: the expected rows (record, type,
fatal) are written out by hand from Venice's rules (venice-protocol-notes §3.3–3.4) and the decisions in div/validator.py.
"""

from __future__ import annotations

import io
import json

import fastavro
import pyarrow.parquet as pq
import pytest
import venice_reference as ref

from div.validator import EXPLAINED, UNDECODABLE
from pipelines.cli import main

TOPIC = "accept_v1"
COMPACTED = "compacted_v1"
T0 = 1_700_000_000_000
RECENT = T0 + 100 * 86_400_000


def guid(name: str) -> bytes:
    return ref.type3_uuid("acceptance-" + name)


class Log:
    """One partition's log: (offset, record) pairs with labels unique in the partition."""

    def __init__(self) -> None:
        self.records: list[tuple[int, ref.Rec]] = []
        self.next_offset = 0

    def add(self, who: str, *groups) -> None:
        for group in groups:
            for r in group if isinstance(group, list) else [group]:
                label = r.label if r.label.startswith(f"{who}:") else f"{who}:{r.label}"
                self.records.append((self.next_offset, r.replace(label=label)))
                self.next_offset += 1

    def label(self, offset: int) -> str:
        return next(r.label for o, r in self.records if o == offset)

    def record(self, label: str) -> ref.Rec:
        return next(r for _, r in self.records if r.label == label)


def push_start(log: Log, name: str = "push") -> ref.RefProducer:
    p = ref.RefProducer(guid(name), start_ms=T0, host="vpj")
    log.add("P", p.start_of_push())
    return p


def push_end(log: Log, p: ref.RefProducer) -> None:
    log.add("P", p.end_of_push(), p.end_segment(final=True))


def producer(name: str, ctype: int = ref.ADHASH) -> ref.RefProducer:
    return ref.RefProducer(guid(name), checksum_type=ctype, start_ms=T0 + 1000, host=name)


def _with_value(rec: ref.Rec, edit) -> ref.Rec:
    env = ref.decode_envelope(rec.value)
    edit(env)
    return rec.replace(value=ref.encode_envelope(env))


# -- the scenarios, one partition each ---------------------------------------------------------------------------
SCENARIOS: dict[int, tuple[str, Log, list[tuple[str, str, bool]]]] = {}


def scenario(partition: int, name: str):
    def register(build):
        log = Log()
        SCENARIOS[partition] = (name, log, build(log))
        return build

    return register


@scenario(0, "clean log with heartbeats and DoL stamps")
def _clean(log):
    p = push_start(log)
    log.add("P", p.put(b"a", b"1"), p.put(b"b", b"2"))
    log.add("HB", ref.heartbeat(T0 + 5))
    log.add("P", p.delete(b"a"))
    log.add("DOL", ref.dol_stamp(T0 + 6))
    push_end(log, p)
    a, b = producer("a"), producer("b", ref.MD5)
    log.add("A", a.put(b"c", b"3"), a.update(b"c", b"u"))
    log.add("HB", ref.heartbeat(T0 + 7), ref.heartbeat(T0 + 8))
    log.add("B", b.put(b"d", b"4" * 100), b.delete(b"d"))
    log.add("A", a.end_segment(), a.put(b"e", b"5"))
    log.add("B", b.end_segment(final=True))
    return []


@scenario(1, "producers restarting with new GUIDs")
def _restarts(log):
    p = push_start(log)
    w1, w2 = producer("w1"), producer("w2")
    log.add("W1", w1.put(b"a", b"1"), w1.put(b"b", b"2"))  # crashes without an EndOfSegment
    log.add("W2", w2.put(b"a", b"1"), w2.put(b"b", b"2"), w2.end_segment())
    push_end(log, p)
    w3, w4 = producer("w3"), producer("w4")
    log.add("W3", w3.put(b"c", b"3"))  # crashes too
    log.add("W4", w4.put(b"c", b"3"), w4.end_segment(), w4.put(b"d", b"4"), w4.end_segment(final=True))
    return []


@scenario(2, "retries resend identical records")
def _retries(log):
    p = push_start(log)
    first = p.put(b"a", b"1")
    log.add("P", first, p.put(b"b", b"2"))
    log.add("P", log.record("P:PUT0.2"))  # retried after a timeout that hid a success
    push_end(log, p)
    a = producer("a")
    recs = a.put(b"c", b"3")
    log.add("A", recs, recs[1])
    eos = a.end_segment()
    log.add("A", eos, eos)
    return [
        ("P:PUT0.2", "DUPLICATE", False),
        ("A:PUT0.1", "DUPLICATE", False),
        ("A:EOS0", "DUPLICATE", False),
    ]


@scenario(3, "gaps inside segments")
def _gaps_inside(log):
    p = push_start(log)
    a = producer("a")
    log.add("A", a.put(b"k", b"1"))
    a.put(b"k", b"lost")
    log.add("A", a.put(b"k", b"3"), a.end_segment())
    push_end(log, p)
    b = producer("b")
    log.add("B", b.put(b"k", b"1"))
    b.put(b"k", b"lost"), b.put(b"k", b"lost too")
    log.add("B", b.delete(b"k"), b.end_segment())
    return [
        ("A:PUT0.3", "MISSING", True),
        ("A:EOS0", "CORRUPT", True),
        ("B:DEL0.4", "MISSING", False),
        ("B:EOS0", "CORRUPT", False),
    ]


@scenario(4, "gaps across segments")
def _gaps_across(log):
    p = push_start(log)
    a = producer("a")
    log.add("A", a.put(b"k", b"1"), a.end_segment())
    a.put(b"k", b"seg 1 lost"), a.end_segment()
    log.add("A", a.put(b"k", b"2"), a.end_segment())
    log.add("A", a.put(b"k", b"3"))
    a.end_segment()  # EOS3 lost
    log.add("A", a.put(b"k", b"4"), a.end_segment())
    push_end(log, p)
    b = producer("b")
    log.add("B", b.put(b"k", b"1"), b.end_segment())
    b.put(b"k", b"lost"), b.end_segment(), b.put(b"k", b"lost"), b.end_segment()
    log.add("B", b.put(b"k", b"2"))
    b.end_segment()
    log.add("B", b.put(b"k", b"3"), b.end_segment())
    return [
        ("A:SOS2", "MISSING", True),
        ("A:SOS4", "MISSING", True),
        ("B:SOS3", "MISSING", False),
        ("B:SOS4", "MISSING", False),
    ]


@scenario(5, "corrupted values")
def _corrupted(log):
    p = push_start(log)
    a = producer("a")
    recs = a.put(b"k", b"value")
    recs[1] = _with_value(
        recs[1], lambda e: e["payloadUnion"][1].update(putValue=b"valuf")
    )  # one bit flipped
    log.add("A", recs, a.put(b"j", b"x"), a.end_segment())
    push_end(log, p)
    b = producer("b", ref.MD5)
    recs = b.put(b"k", b"v") + b.delete(b"key")
    recs[2] = recs[2].replace(key=b"\x00kez")  # the key is covered by the checksum too
    log.add("B", recs, b.end_segment())
    return [("A:EOS0", "CORRUPT", True), ("B:EOS0", "CORRUPT", False)]


@scenario(6, "unknown producers before and after End of Push")
def _unknown(log):
    p = push_start(log)
    u1 = producer("u1")
    u1.put(b"k", b"1"), u1.put(b"k", b"2")  # SOS and sequence 1, 2 never reached this log
    log.add("U1", u1.put(b"k", b"3"), u1.put(b"k", b"4"), u1.end_segment(checksum=b"\x00" * 8))
    u2 = producer("u2")
    u2.put(b"k", b"1"), u2.end_segment(), u2.put(b"k", b"2"), u2.end_segment()
    log.add("U2", u2.put(b"k", b"3"), u2.end_segment())
    push_end(log, p)
    u3 = producer("u3")
    u3.put(b"k", b"1")
    log.add("U3", u3.put(b"k", b"2"), u3.end_segment(checksum=b"\x01" * 8))  # unverifiable: no SOS seen
    u4 = producer("u4")
    for _ in range(5):
        u4.put(b"k", b"0"), u4.end_segment()
    u4.put(b"k", b"1")
    log.add("U4", u4.put(b"k", b"2"), u4.put(b"k", b"3"))
    return [("U1:PUT0.3", "UNREGISTERED_PRODUCER", True), ("U2:SOS2", "UNREGISTERED_PRODUCER", True)]


def _v99_schema() -> dict:
    s = ref.schema_json("KafkaMessageEnvelope.v14.avsc")
    pm = s["fields"][1]["type"]
    pm["fields"].append({"name": "futureField", "type": "string", "default": ""})
    return s


def _as_v99(rec: ref.Rec, with_vtp: bool) -> ref.Rec:
    env = ref.decode_envelope(rec.value)
    env["producerMetadata"]["futureField"] = "from the future"
    value = ref.encode_envelope(env, 99, fastavro.parse_schema(_v99_schema()))
    return rec.replace(value=value, headers=[("vtp", json.dumps(_v99_schema()).encode())] if with_vtp else [])


def _junk(log: Log, who: str, donor: ref.Rec) -> list[str]:
    """Records that cannot be decoded, each in its own way; returns their labels."""
    env = ref.decode_envelope(donor.value)
    env["messageType"] = 1  # a Put body declared as a DELETE (§1.3 pitfall)
    junk = [
        ("bad-magic", donor.replace(value=b"\x16" + donor.value[1:])),
        ("truncated", donor.replace(value=donor.value[:-9])),
        ("unknown-version", donor.replace(value=b"\x17\x63" + donor.value[2:], headers=[])),
        ("garbage-vtp", donor.replace(value=b"\x17\x62" + donor.value[2:], headers=[("vtp", b"{oops")])),
        ("bad-key-header", donor.replace(key=b"\x05" + donor.key[1:])),
        ("empty-key", donor.replace(key=b"")),
        ("type-mismatch", donor.replace(value=ref.encode_envelope(env))),
        ("null-value", donor.replace(value=None)),
    ]
    labels = []
    for name, rec in junk:
        log.add(who, rec.replace(label=name))
        labels.append(f"{who}:{name}")
    return labels


@scenario(7, "undecodable records")
def _undecodable(log):
    p = push_start(log)
    a = producer("a")
    donor = producer("donor").put(b"k", b"v")[1]
    before = _junk(log, "J1", donor)
    log.add("A", a.put(b"k", b"1"))
    truncated = a.put(b"k", b"2")[0]
    log.add("A", truncated.replace(value=truncated.value[:12]))
    log.add("A", a.put(b"k", b"3"), a.end_segment())
    push_end(log, p)
    after = _junk(log, "J2", donor)
    # A producer whose writer speaks protocol version 99: its first SOS carries the schema in `vtp`.
    f = producer("future")
    recs = f.put(b"k", b"1") + f.put(b"k", b"2") + f.end_segment()
    log.add("F", [_as_v99(r, with_vtp=i == 0) for i, r in enumerate(recs)])
    # An unreadable record is missing evidence, never a finding (not fatal, before End of Push either); the
    # sequence gap and the checksum mismatch it causes in its producer's segment are explained by it.
    return (
        [(label, "UNDECODABLE", False) for label in before]
        + [("A:PUT0.2", "UNDECODABLE", False), ("A:PUT0.3", EXPLAINED, False), ("A:EOS0", EXPLAINED, False)]
        + [(label, "UNDECODABLE", False) for label in after]
    )


# A compacted version topic (one partition): superseded PUTs removed, offsets keep their gaps. ------------------


def _compacted_log() -> Log:
    log = Log()
    p = ref.RefProducer(guid("cpush"), start_ms=T0, host="vpj")
    log.add(
        "P",
        p.start_of_push(),
        p.put(b"k1", b"1"),
        p.put(b"k2", b"2"),
        p.put(b"k1", b"3"),
        p.put(b"k3", b"4"),
        p.end_of_push(),
        p.end_segment(final=True),
    )
    a = ref.RefProducer(guid("conline"), start_ms=RECENT, host="online")
    log.add("A", a.put(b"k2", b"5"), a.put(b"k2", b"6"), a.put(b"k4", b"7"), a.end_segment())
    last_of_key = {r.key: o for o, r in log.records if r.key[0] == 0}
    log.records = [(o, r) for o, r in log.records if r.key[0] != 0 or last_of_key[r.key] == o]
    assert [o for o, _ in log.records] == [0, 1, 4, 5, 6, 7, 8, 10, 11, 12]
    return log


COMPACTED_STRICT = [
    ("P:PUT0.4", "MISSING", True),
    ("P:EOS0", "CORRUPT", False),
    ("A:PUT0.2", "MISSING", False),
    ("A:EOS0", "CORRUPT", False),
]


# -- running the command -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    root = tmp_path_factory.mktemp("acceptance") / "archive"
    for partition, (_, log, _) in SCENARIOS.items():
        ref.write_archive(root, TOPIC, partition, log.records)
    ref.write_archive(root, COMPACTED, 0, _compacted_log().records)
    return root


def _run(archive, out, *extra) -> tuple[int, list[dict], dict]:
    code = main(["div", "validate", "--source", f"0={archive}", "--out", str(out), *extra])
    rows = pq.read_table(out / "errors").to_pylist()
    summary = json.loads((out / "summary.json").read_text())
    return code, rows, summary


@pytest.fixture(scope="module")
def strict_run(archive, tmp_path_factory):
    return _run(archive, tmp_path_factory.mktemp("strict") / "out")


def _classified(rows: list[dict], topic: str, partition: int, log: Log) -> list[tuple[str, str, bool]]:
    got = []
    for row in rows:
        if row["topic"] != topic or row["partition"] != partition:
            continue
        label = log.label(row["offset"])
        rec = log.record(label)
        if row["type"] == "UNDECODABLE":
            assert (row["producer_guid"], row["segment"], row["sequence"]) == ("", -1, -1)
        else:
            assert (row["producer_guid"], row["segment"], row["sequence"]) == (
                rec.guid.hex(),
                rec.segment,
                rec.sequence,
            )
        assert row["region"] == 0 and row["detail"]
        got.append((label, row["type"], row["fatal"]))
    return got


@pytest.mark.parametrize("partition", sorted(SCENARIOS), ids=[SCENARIOS[p][0] for p in sorted(SCENARIOS)])
def test_scenario_is_classified_exactly(strict_run, partition):
    _, rows, _ = strict_run
    _, log, expected = SCENARIOS[partition]
    assert _classified(rows, TOPIC, partition, log) == expected


def test_the_run_goes_on_and_counts_everything(strict_run):
    code, rows, summary = strict_run
    assert code == 1  # fatal findings exist
    expected_total = sum(len(e) for _, _, e in SCENARIOS.values()) + len(COMPACTED_STRICT)
    assert len(rows) == expected_total
    not_findings = [r for r in rows if r["type"] in (UNDECODABLE, EXPLAINED)]
    assert summary["findings"] == expected_total - len(not_findings)
    assert summary["undecodable_records"] == sum(r["type"] == UNDECODABLE for r in rows) > 0
    assert summary["explained_by_undecodable"] == sum(r["type"] == EXPLAINED for r in rows) == 2
    assert summary["evidence"]["undecodable_records"] == summary["undecodable_records"]
    assert summary["verdict"] == "findings"  # findings outrank the partial evidence
    assert summary["fatal_findings"] == sum(r["fatal"] for r in rows)
    assert summary["records_read"] == sum(len(log.records) for _, log, _ in SCENARIOS.values()) + 10
    by_partition = {(p["topic"], p["partition"]): p for p in summary["partitions"]}
    for partition, (_, log, expected) in SCENARIOS.items():
        part = by_partition[(TOPIC, partition)]
        assert part["records"] == len(log.records)
        assert part["eop_offset"] == next(o for o, r in log.records if r.label.startswith("P:EndOfPush"))
        assert part["fatal_findings"] == sum(1 for *_, fatal in expected if fatal)
    assert by_partition[(TOPIC, 1)]["producers_tracked"] == 5  # push job + four writers; heartbeats are not
    assert by_partition[(TOPIC, 0)]["producers_tracked"] == 3


def test_compacted_topic_is_strict_without_a_compaction_lag(strict_run):
    _, rows, _ = strict_run
    assert _classified(rows, COMPACTED, 0, _compacted_log()) == COMPACTED_STRICT


def test_compacted_topic_with_min_compaction_lag(archive, tmp_path):
    # The push job's records are 100 days old; the online producer's are 1 s old at --now-ms: the push job's
    # gaps may be compaction, the online producer's may not (yet).
    lag = 86_400_000
    code, rows, summary = _run(
        archive,
        tmp_path / "lag",
        "--topic",
        COMPACTED,
        "--min-compaction-lag-ms",
        str(lag),
        "--now-ms",
        str(RECENT + 1000),
    )
    assert _classified(rows, COMPACTED, 0, _compacted_log()) == [
        ("A:PUT0.2", "MISSING", False),
        ("A:EOS0", "CORRUPT", False),
    ]
    assert code == 0 and summary["fatal_findings"] == 0
    code, rows, _ = _run(
        archive,
        tmp_path / "later",
        "--topic",
        COMPACTED,
        "--min-compaction-lag-ms",
        str(lag),
        "--now-ms",
        str(RECENT + lag + 10),
    )
    assert rows == [] and code == 0


def test_archive_written_by_the_reference_is_readable_as_venice_would_write_it(archive):
    # Sanity of the test data itself: every non-junk value starts with magic 23 and decodes with Venice's schema.
    for _, log, _ in SCENARIOS.values():
        for _, r in log.records:
            if r.label.startswith(("J1:", "J2:", "F:")) or r.label == "A:PUT0.2":
                continue
            env = fastavro.schemaless_reader(io.BytesIO(r.value[2:]), ref.kme_schema(), None)
            assert env["producerMetadata"]["producerGUID"] == r.guid
