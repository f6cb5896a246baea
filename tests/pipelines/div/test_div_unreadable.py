"""Unreadable records never create DIV findings (issue 16, finding 2).

With record values replaced by random bytes or cut short, `div validate` used to report a MISSING after each
one (fatal before End of Push), because it could not read that record's sequence number. Now an unreadable record
is an UNDECODABLE row that makes the run partial (exit 3), and a gap or checksum mismatch that the unreadable
records between the producer's two records can explain is an EXPLAINED_BY_UNDECODABLE row — neither a finding.
A gap larger than they can explain stays a MISSING.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import venice_reference as ref

from div.validator import EXPLAINED, UNDECODABLE
from pipelines.cli import main

T0 = 1_700_000_000_000


def _log(lost: int, unreadable: list[int], mangle) -> list[tuple[int, ref.Rec]]:
    """A push (before End of Push: every finding is fatal) with one producer writing 8 PUTs; `lost` of them (the
    3rd onwards) never reach the topic, and the records at `unreadable` indexes of the topic are mangled."""
    p = ref.RefProducer(ref.type3_uuid("u-push"), start_ms=T0)
    a = ref.RefProducer(ref.type3_uuid("u-a"), start_ms=T0 + 10)
    puts = [a.put(b"k%d" % i, b"v%d" % i) for i in range(8)]
    kept = puts[:2] + puts[2 + lost :]
    recs = ref.flatten(p.start_of_push(), *kept, a.end_segment(), p.end_of_push(), p.end_segment(final=True))
    for i in unreadable:
        recs[i] = recs[i].replace(value=mangle(recs[i].value))
    return list(enumerate(recs))


def _validate(tmp_path, log, *extra):
    ref.write_archive(tmp_path / "arc", "s_v1", 0, log)
    out = tmp_path / "out"
    code = main(["div", "validate", "--source", f"0={tmp_path / 'arc'}", "--out", str(out), *extra])
    return code, pq.read_table(out / "errors").to_pylist(), json.loads((out / "summary.json").read_text())


def _types(rows):
    return [(r["offset"], r["type"], r["fatal"]) for r in rows]


def test_a_truncated_record_is_undecodable_and_explains_the_gap_and_checksum_it_causes(tmp_path):
    # offsets: 0-1 the push's SOS and SOP, 2 the producer's SOS, 3-10 its PUTs, 11 its EOS, 12 EOP, 13 push EOS;
    # offset 4, the producer's 2nd PUT, is cut short
    code, rows, summary = _validate(tmp_path, _log(0, [4], lambda v: v[:12]))
    assert _types(rows) == [(4, UNDECODABLE, False), (5, EXPLAINED, False), (11, EXPLAINED, False)]
    assert code == 3 and summary["verdict"] == "partial"
    assert summary["findings"] == 0 and summary["fatal_findings"] == 0
    assert summary["undecodable_records"] == 1 and summary["explained_by_undecodable"] == 2
    assert summary["evidence"]["by_partition"][0]["undecodable_offsets"] == [4]


def test_random_bytes_are_undecodable_too(tmp_path):
    code, rows, summary = _validate(tmp_path, _log(0, [3, 5], lambda v: b"\x07" + bytes(range(40))))
    assert [t for _, t, _ in _types(rows)].count(UNDECODABLE) == 2
    assert not [r for r in rows if r["type"] not in (UNDECODABLE, EXPLAINED)]
    assert code == 3


def test_a_gap_larger_than_the_unreadable_records_between_stays_missing(tmp_path):
    # two PUTs lost and one of the records around the gap unreadable: one record cannot hold two
    code, rows, summary = _validate(tmp_path, _log(2, [4], lambda v: v[:12]))
    types = _types(rows)
    assert (4, UNDECODABLE, False) in types
    assert (5, "MISSING", True) in types
    assert code == 1 and summary["verdict"] == "findings"


def test_unreadable_records_elsewhere_do_not_explain_a_gap(tmp_path):
    # the unreadable record is the push job's End of Push (offset 11, after the gap at 5): it cannot explain the
    # gap nor the producer's checksum, only the push job's own checksum at its EndOfSegment
    code, rows, _ = _validate(tmp_path, _log(1, [11], lambda v: v[:5]))
    assert _types(rows) == [
        (5, "MISSING", True),
        (10, "CORRUPT", True),
        (11, UNDECODABLE, False),
        (12, EXPLAINED, False),
    ]
    assert code == 1


def test_fail_fast_does_not_stop_at_an_unreadable_record(tmp_path):
    code, rows, summary = _validate(tmp_path, _log(0, [4], lambda v: v[:12]), "--fail-fast")
    assert code == 3
    assert summary["records_read"] == len(_log(0, [], None))
