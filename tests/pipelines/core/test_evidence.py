"""The verdict rule, written once in pipelines.core.evidence: findings outrank partial, partial outranks clean."""

from pipelines.core.evidence import PartitionEvidence, describe_short, summary_fields, verdict


def _whole(**kw) -> PartitionEvidence:
    e = PartitionEvidence(region=0, topic="s_v1", partition=0, start=0, end=10, planned_records=10, **kw)
    e.read_records = kw.get("read_records", 10)
    e.reached_end = True
    return e


def test_clean_only_when_every_planned_record_was_read_and_decoded():
    assert verdict(0, [_whole()]) == ("clean", 0)


def test_a_short_read_is_partial_never_clean():
    e = _whole()
    e.read_records = 7
    assert e.short and verdict(0, [e]) == ("partial", 3)
    kafka = PartitionEvidence(region=1, topic="s_v1", partition=2, start=5, end=9, read_records=4)
    assert kafka.short and verdict(0, [kafka]) == ("partial", 3)  # never reached the planned end
    kafka.reached_end = True
    assert verdict(0, [kafka]) == ("clean", 0)  # compaction may leave holes: reaching the end is what counts


def test_undecodable_records_are_partial_and_listed():
    e = _whole()
    e.note_undecodable([3, 4])
    assert verdict(0, [e]) == ("partial", 3)
    assert "2 record(s) could not be decoded (offsets 3, 4)" in describe_short([e])[0]


def test_findings_outrank_partial():
    e = _whole(error="broker unreachable")
    assert verdict(2, [e]) == ("findings", 1)
    assert verdict(0, [e]) == ("partial", 3)
    assert verdict(0, [_whole()], failed_partitions=1) == ("partial", 3)


def test_nothing_planned_is_not_short():
    e = PartitionEvidence(region=0, topic="t", partition=0, start=3, end=3)
    assert not e.short


def test_summary_counts():
    a, b = _whole(), _whole()
    b.note_undecodable([1])
    s = summary_fields(0, [a, b])
    assert s["verdict"] == "partial" and s["exit_code"] == 3
    assert s["evidence"]["planned_records"] == 20 and s["evidence"]["undecodable_records"] == 1
    assert s["evidence"]["by_partition"][1]["undecodable_offsets"] == [1]
