"""The Leap Frog job on chunked versions: values stored as chunks are compared through their manifests.

Three regions replicate the same writes into a chunked version (venice-protocol-notes §1.7): large values become chunks plus a
manifest, replaced chunked values are followed by DELETEs of their old chunk keys, every data key carries a
ChunkedKeySuffix. Chunk keys embed each region's own producer GUID, so they differ between regions: if the job
treated them (or their cleanup DELETEs) as keys, every one of them would be reported MISSING.

The oracle is twofold: the findings expected by construction (a chunk changed in one region, a small value
changed in one region, a chunked value one region dropped), and the same writes stored unchunked in an
unchunked version, which must give the same findings and the same coverage counters.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from chunked_scenario import (
    BIG_DIFF,
    BIG_DIFF_POISONED,
    CHUNK,
    EXPECTED,
    STORE,
    TOPIC,
    USER_KEYS,
    Store,
    big,
    scenario,
)
from leapfrog_run import run_leapfrog
from vt_builder import NON_CHUNK_SUFFIX, value_hash

from div.keys import fnv1a_64
from pipelines.leapfrog.source import chunked_version, plan

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _run(spark, dirs, out, mode="heartbeat") -> tuple[int, dict, list[dict]]:
    code = run_leapfrog(spark, STORE, dirs, out, mode=mode)
    summary = json.loads((out / "summary.json").read_text())
    return code, summary, pq.read_table(out / "inconsistencies").to_pylist()


def _comparable(findings: list[dict]) -> set[tuple]:
    """What must not depend on how values were stored (VT offsets do: chunks take offsets)."""
    return {
        (
            r["partition"],
            r["region_a"],
            r["region_b"],
            r["type"],
            r["key"],
            r["key_hash"],
            r["a_value_hash"],
            r["b_value_hash"],
            r["a_deleted"],
            r["b_deleted"],
            tuple(r["a_vector"] or ()),
            tuple(r["b_vector"] or ()),
            tuple(r["a_high_watermark"] or ()),
            tuple(r["b_high_watermark"] or ()),
        )
        for r in findings
    }


def _counters(summary: dict) -> list[tuple]:
    return [
        (
            e["partition"],
            e["region_a"],
            e["region_b"],
            e["keys"],
            e["comparable_pairs"],
            e["skipped_pairs"],
            e["pending_keys"],
            tuple(sorted(e["findings"].items())),
        )
        for e in summary["by_pair"]
    ]


def _expected_rows() -> set[tuple]:
    return {
        (k, t, a, b, None if va is None else value_hash(va), None if vb is None else value_hash(vb))
        for k, t, a, b, va, vb in EXPECTED
    }


def _rows(findings: list[dict]) -> set[tuple]:
    return {
        (r["key"], r["type"], r["region_a"], r["region_b"], r["a_value_hash"], r["b_value_hash"])
        for r in findings
    }


@pytest.fixture(scope="module")
def stores():
    chunked, plain = Store(chunked=True), Store(chunked=False)
    for s in (chunked, plain):
        scenario(s)
        s.heartbeats()
    return chunked, plain


def test_the_chunked_fixture_really_is_chunked(stores):
    chunked, plain = stores
    for x, vt in chunked.vts.items():
        assert vt.chunk_keys(), "no chunk records: the test would not exercise manifests"
        assert len(vt.records) > len(plain.vts[x].records) + 10
    # one chunk of BIG_DIFF differs, the others are equal
    assert [
        BIG_DIFF[i : i + CHUNK] == BIG_DIFF_POISONED[i : i + CHUNK] for i in range(0, len(BIG_DIFF), CHUNK)
    ] == [True, False, True]


@pytest.mark.parametrize("mode", ["heartbeat", "footer"])
def test_chunked_version_gives_the_unchunked_findings(spark, tmp_path, stores, mode):
    chunked, plain = stores
    code_c, sum_c, found_c = _run(spark, chunked.write(tmp_path / "chunked"), tmp_path / "out-chunked", mode)
    code_p, sum_p, found_p = _run(spark, plain.write(tmp_path / "plain"), tmp_path / "out-plain", mode)
    assert _comparable(found_c) == _comparable(found_p)
    assert _counters(sum_c) == _counters(sum_p)
    assert code_c == code_p
    assert sum_c["timings"]["fused"] is False  # a chunked StartOfPush sends the job down the two-phase path
    if mode == "heartbeat":
        assert _rows(found_c) == _expected_rows()
        assert code_c == 1
    # keys are user keys: no suffix, no chunk key, no cleanup DELETE; key_hash is over the user key
    assert {r["key"] for r in found_c} <= USER_KEYS
    assert all(r["key_hash"] == fnv1a_64(r["key"]) for r in found_c)
    assert {e["keys"] for e in sum_c["by_pair"]} == {len(USER_KEYS)}
    assert sum_c["totals"]["undecodable"] == 0 and sum_c["totals"]["out_of_range"] == 0


def test_mid_stream_chunked_archive(spark, tmp_path):
    """No StartOfPush in view: the fused scan meets chunk rows, and the job reruns the two-phase path. Chunked
    values written before the scan start are replaced after it (their cleanup DELETEs point at chunks that are
    not in view). A scan that starts mid-stream cannot know that region 1 never held `missing-big` before its
    start, so that key stays pending instead of MISSING (the reference's rule); the mismatches are found."""
    s = Store(chunked=True)
    s.put(b"replaced", big("before-1"), 0, 1)
    s.put(b"replaced-small", big("before-2"), 1, 1)
    s.put(b"pre-big", big("before-3"), 2, 1)
    starts = s.heartbeats()
    scenario(s)
    s.heartbeats()
    dirs = s.write(tmp_path / "mid", first=starts)
    code, summary, found = _run(spark, dirs, tmp_path / "out")
    assert {r["scan_start"] for r in summary["by_region"]} == {"heartbeat"}
    assert {r["region"]: r["first_offset"] for r in summary["by_region"]} == {
        x: o + 1 for x, o in starts.items()
    }
    assert summary["timings"]["fused"] is False
    assert _rows(found) == {r for r in _expected_rows() if r[1] == "VALUE_MISMATCH"}
    pending = {(e["region_a"], e["region_b"]): e["pending_keys"] for e in summary["by_pair"]}
    assert pending[(0, 1)] >= 1 and pending[(1, 2)] >= 1
    assert code == 1
    assert {r["key"] for r in found} <= USER_KEYS


def test_the_probe_knows_a_chunked_version_without_its_start_of_push(tmp_path, stores):
    """The job picks its path (and where it caches the scan) from `chunked_version`: the chunks a range starts
    with say it as well as a StartOfPush does."""
    s = Store(chunked=True)
    s.put(b"early", big("before-1"), 0, 1)
    starts = s.heartbeats()
    scenario(s)
    s.heartbeats()
    mid = s.write(tmp_path / "mid", first=starts)
    assert chunked_version(plan(mid, TOPIC), TOPIC)
    assert chunked_version(plan(stores[0].write(tmp_path / "chunked"), TOPIC), TOPIC)
    assert not chunked_version(plan(stores[1].write(tmp_path / "plain"), TOPIC), TOPIC)


def test_chunk_key_suffix_is_not_mistaken_for_part_of_the_key(stores):
    """Guard for the fixture itself: whole values and manifests end in 02 00, chunk keys do not."""
    chunked, _ = stores
    vt = chunked.vts[0]
    data_keys = {r.key[1:] for r in vt.records if r.key[0] == 0}
    assert {k[:-2] for k in data_keys if k.endswith(NON_CHUNK_SUFFIX)} == USER_KEYS
    assert all(not k.endswith(NON_CHUNK_SUFFIX) for k in vt.chunk_keys())


def test_chunked_version_region_without_chunks_in_view(spark, tmp_path):
    s = Store(chunked=True)
    s.put(b"big", big("big"), 0, 1)
    starts = s.heartbeats()
    s.put(b"small", b"small", 1, 5)
    s.heartbeats()
    dirs = s.write(tmp_path / "a", first={0: 0, 1: starts[1], 2: 0})  # region 1 sees only the small value
    code, summary, found = _run(spark, dirs, tmp_path / "out")
    assert found == []
    assert code == 0
