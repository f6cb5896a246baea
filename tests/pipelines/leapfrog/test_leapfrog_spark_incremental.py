"""Incremental runs of the Spark job (`--state`) give exactly the findings of a full rescan of the whole range.

Generated histories are cut at a random offset per region into a day-1 and a day-2 archive. Day 1 runs with a
state directory, then day 2 with the same one; the findings must equal one run over the full archives — also
when a day-2 run is killed midway (SIGKILL) and run again.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from leapfrog_histories import day_cuts, generated
from vt_fixtures import STORE, write_archives

from leapfrog.reference import FromState, RegionLog, carry_state, check_partition
from pipelines.core.sources import SourceSpec
from pipelines.leapfrog.job import LeapfrogOptions, run
from pipelines.leapfrog.state import carry_flags

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _findings(out):
    return sorted(
        (
            r["partition"],
            r["region_a"],
            r["region_b"],
            r["type"],
            r["key"],
            r["a_vt_offset"],
            r["b_vt_offset"],
            r["a_value_hash"],
            r["b_value_hash"],
            r["status"],  # an earlier day's finding takes the status of the day that compared its key last
        )
        for r in pq.read_table(out / "inconsistencies").to_pylist()
    )


def _run(spark, dirs, out, state=None, plan=LeapfrogOptions.plan):
    return run(
        LeapfrogOptions(
            store=STORE,
            version=1,
            out=str(out),
            state_dir=str(state) if state else None,
            sources=[SourceSpec(x, d) for x, d in dirs.items()],
            plan=plan,
        ),
        spark=spark,
    )


_FULL_RESCANS: dict[tuple, list] = {}


def _two_days(spark, histories, seed: int, tmp_path):
    """Cut each region's log at a random offset into day 1 and day 2 archives; also run the full rescan.
    Returns (cuts, day 1, day 2, the full rescan's findings)."""
    cuts = day_cuts(histories, random.Random(seed))
    day1 = write_archives(histories, tmp_path / "day1", keep=lambda p, x, off: off <= cuts[(p, x)])
    day2 = write_archives(histories, tmp_path / "day2", keep=lambda p, x, off: off > cuts[(p, x)])
    # the full rescan depends on the histories only: tests that cut the same histories share one run
    which = tuple((h.seed, h.mix.name, h.n_regions) for h in histories)
    if which not in _FULL_RESCANS:
        full = write_archives(histories, tmp_path / "full")
        _run(spark, full, tmp_path / "out-full")
        _FULL_RESCANS[which] = _findings(tmp_path / "out-full")
    expected = _FULL_RESCANS[which]
    assert expected, "no divergence in these histories: the comparison would prove nothing"
    return cuts, day1, day2, expected


def test_two_days_equal_one_rescan(spark, tmp_path):
    histories = [h for h in generated(60) if h.n_regions == 3][:80:2]
    cuts, day1, day2, expected = _two_days(spark, histories, 5, tmp_path)
    state = tmp_path / "state"
    _run(spark, day1, tmp_path / "out-day1", state)
    code = _run(spark, day2, tmp_path / "out-day2", state)
    assert _findings(tmp_path / "out-day2") == expected
    assert code == 1
    summary = json.loads((tmp_path / "out-day2" / "summary.json").read_text())
    assert summary["incremental"] is True
    assert sum(summary["totals"]["findings"].values()) == len(expected)
    carried = pq.read_table(state / "carried")
    assert 0 < carried.num_rows < sum(len(h.vt[x]) for h in histories for x in range(h.n_regions))
    settled = (carry_flags(carried.column("carry").combine_chunks()) & 4) != 0
    assert settled.any(), "no key ever settled: the skip path went untested"
    # day 2's counters equal the reference's resumed run over what each day's archive shows
    expected_counts = {}
    for p, h in enumerate(histories):
        first = {
            x: RegionLog([e for e in log.entries if e.vt_offset <= cuts[(p, x)]], log.start, None)
            for x, log in h.logs.items()
        }
        state_ref = carry_state(check_partition(first, mode="heartbeat", n_regions=h.n_regions))
        second = {
            x: RegionLog([e for e in log.entries if e.vt_offset > cuts[(p, x)]], FromState(state_ref), None)
            for x, log in h.logs.items()
        }
        for (a, b), c in check_partition(
            second, mode="heartbeat", n_regions=h.n_regions
        ).pair_counters.items():
            expected_counts[(p, a, b)] = (c.keys, c.comparable_pairs, c.skipped_pairs, c.pending_keys)
    got_counts = {
        (e["partition"], e["region_a"], e["region_b"]): (
            e["keys"],
            e["comparable_pairs"],
            e["skipped_pairs"],
            e["pending_keys"],
        )
        for e in summary["by_pair"]
    }
    assert got_counts == expected_counts
    # a state of another run is refused with a clear error
    from pipelines.core.sources import SourceError

    with pytest.raises(SourceError, match="built with"):
        run(
            LeapfrogOptions(
                store=STORE,
                version=1,
                out=str(tmp_path / "o"),
                state_dir=str(state),
                sources=[SourceSpec(x, d) for x, d in list(day2.items())[:2]],
            ),
            spark=spark,
        )


def test_what_a_vtp_header_taught_on_day_1_decodes_day_2(spark, tmp_path):
    """Writers newer than us (protocol 16 in region 1, a fork of version 14 in region 2) announce their schema in a
    `vtp` header on each partition's first record only, on day 1: day 2's records decode by what it taught, which
    the state keeps ("learned"), so the two days name what one rescan names."""
    from newer_protocol import announced_first, reencode_archive

    histories = [h for h in generated(60) if h.n_regions == 3][:80:2]
    _, day1, day2, expected = _two_days(spark, histories, 7, tmp_path)
    newer = {"day1": dict(day1), "day2": dict(day2)}
    for region, version in ((1, 16), (2, 14)):
        for day, dirs in newer.items():
            dst = tmp_path / f"newer-{day}-{region}"
            headers_of = announced_first() if day == "day1" else (lambda r: r["headers"])
            assert reencode_archive(dirs[region], dst, version, headers_of) > 0
            dirs[region] = str(dst)
    state = tmp_path / "state"
    _run(spark, newer["day1"], tmp_path / "out-day1", state)
    learned = json.loads((state / "state.json").read_text())["regions"]
    assert {r["region"] for r in learned if r["learned"]} == {1, 2}
    _run(spark, newer["day2"], tmp_path / "out-day2", state)
    summary = json.loads((tmp_path / "out-day2" / "summary.json").read_text())
    assert summary["totals"]["undecodable"] == 0, summary["totals"]
    assert _findings(tmp_path / "out-day2") == expected


@pytest.mark.parametrize(
    "change",
    [0, -1, "older-state"],
    ids=["tasks-read-their-own-state", "bucket-count-changed", "state-before-bucket-labels"],
)
def test_carried_records_are_read_by_each_task_or_shuffled_in(spark, tmp_path, monkeypatch, change):
    """With day 1's bucket count, day 2's reduce tasks read their carried records from their own files
    (pipelines.leapfrog.carried); with another, or from a state whose files were tagged before the buckets got
    their labels (rows.bucket_labels), the state goes through the shuffle. Same findings either way. (The shuffle
    job's own mechanics: the one-pass job reads each partition's carried records, tests/.../test_leapfrog_one_pass.py.)"""
    from pipelines.leapfrog import job as leapfrog_job
    from pipelines.leapfrog.rows import bucket_labels

    histories = [h for h in generated(30) if h.n_regions == 3][:60:2]
    _, day1, day2, expected = _two_days(spark, histories, 7, tmp_path)
    state = tmp_path / "state"
    buckets = int(spark.conf.get("spark.sql.shuffle.partitions"))
    day2_buckets = buckets + (change if change != "older-state" else 0)
    _run(spark, day1, tmp_path / "out-day1", state, plan="shuffle")
    doc = json.loads((state / "state.json").read_text())
    assert doc["meta"]["reduce_buckets"] == buckets
    if change == "older-state":
        doc["meta"]["buckets"] = doc["meta"].pop("reduce_buckets")
        (state / "state.json").write_text(json.dumps(doc))
    own = []
    original = leapfrog_job._Job._own_carried_files
    monkeypatch.setattr(
        leapfrog_job._Job, "_own_carried_files", lambda self: own.append(original(self)) or own[-1]
    )
    spark.conf.set("spark.sql.shuffle.partitions", str(day2_buckets))
    try:
        _run(spark, day2, tmp_path / "out-day2", state, plan="shuffle")
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", str(buckets))
    assert _findings(tmp_path / "out-day2") == expected
    if change == 0:
        directory, files = own[0]
        held = sorted(b for bs in files.values() for b in bs)
        # each task holds one bucket: Spark placed bucket i in shuffle partition i
        assert files and all(len(bs) == 1 for bs in files.values()) and len(held) == len(set(held))
        assert set(held) <= set(bucket_labels(buckets))
    else:
        assert own == [None]
    assert json.loads((state / "state.json").read_text())["meta"]["reduce_buckets"] == day2_buckets


def test_many_findings_take_the_spark_path_with_the_same_result(spark, tmp_path, monkeypatch):
    """Findings are merged on the driver when few (the usual case) and by Spark when very many: same findings."""
    import pipelines.leapfrog.job as J

    histories = [h for h in generated(61) if h.n_regions == 2][:80:2]
    _, day1, day2, expected = _two_days(spark, histories, 8, tmp_path)
    monkeypatch.setattr(J, "FINDINGS_ON_DRIVER", 0)
    written = []  # the directories Spark's tasks wrote (not the driver)

    def spark_write(df, directory):
        written.append(directory.name)
        return write_parquet(df, directory)

    write_parquet = J.write_parquet
    monkeypatch.setattr(J, "write_parquet", spark_write)
    state = tmp_path / "state"
    _run(spark, day1, tmp_path / "out-day1", state)
    assert _findings(tmp_path / "out-day1"), (
        "day 1 found nothing: the merge of old and new findings went untested"
    )
    _run(spark, day2, tmp_path / "out-day2", state)
    assert _findings(tmp_path / "out-day2") == expected
    assert written.count("findings") == 2, "the state's findings were not Spark's"
    assert written.count("inconsistencies") == 2


def test_a_killed_run_then_a_rerun_gives_the_same_findings(spark, tmp_path):
    histories = [h for h in generated(60) if h.n_regions == 2][:80:2]
    _, day1, day2, expected = _two_days(spark, histories, 9, tmp_path)
    state = tmp_path / "state"
    _run(spark, day1, tmp_path / "out-day1", state)
    before = sorted(os.listdir(state))
    # a day-2 run in another process, killed while it works
    args = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "leapfrog",
        "--store",
        STORE,
        "--version",
        "1",
        "--out",
        str(tmp_path / "out-killed"),
        "--state",
        str(state),
        "--master",
        "local[1]",
    ]
    for x, d in day2.items():
        args += ["--source", f"{x}={d}"]
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    time.sleep(12)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert sorted(os.listdir(state)) == before or (state / "state.json").exists()
    _run(spark, day2, tmp_path / "out-day2", state)
    assert _findings(tmp_path / "out-day2") == expected


def test_three_days_equal_one_rescan_and_untouched_settled_keys_carry_over(spark, tmp_path):
    """Settled keys that day 2 does not touch pass through day 2's run into its state unchanged, and day 3
    still finds what a full rescan finds."""
    histories = [h for h in generated(60) if h.n_regions == 2][:80:2]
    rng = random.Random(13)
    first, second = day_cuts(histories, rng), {}
    for (p, x), c in first.items():
        offsets = [e.vt_offset for e in histories[p].vt[x]]
        second[(p, x)] = rng.randint(c, max(offsets)) if offsets and max(offsets) > c else c
    full = write_archives(histories, tmp_path / "full")
    days = [
        write_archives(histories, tmp_path / "day1", keep=lambda p, x, off: off <= first[(p, x)]),
        write_archives(
            histories, tmp_path / "day2", keep=lambda p, x, off: first[(p, x)] < off <= second[(p, x)]
        ),
        write_archives(histories, tmp_path / "day3", keep=lambda p, x, off: off > second[(p, x)]),
    ]
    _run(spark, full, tmp_path / "out-full")
    state = tmp_path / "state"

    def settled():
        t = pq.read_table(state / "carried")
        flags = carry_flags(t.column("carry").combine_chunks())
        return {
            (r["partition"], r["key"], r["region"], r["offset"], r["carry"])
            for r, f in zip(t.to_pylist(), flags, strict=True)
            if f & 4
        }

    _run(spark, days[0], tmp_path / "out-day1", state)
    after_day1 = settled()
    day2_keys = {
        (r["partition"], r["key"][1:])
        for x, d in days[1].items()
        for r in pq.read_table(d, columns=["partition", "key"]).to_pylist()
    }
    untouched = {row for row in after_day1 if (row[0], row[1]) not in day2_keys}
    assert untouched, "every settled key was touched on day 2: the pass-through went untested"
    _run(spark, days[1], tmp_path / "out-day2", state)
    assert untouched <= settled()  # carried over exactly as they were
    _run(spark, days[2], tmp_path / "out-day3", state)
    assert _findings(tmp_path / "out-day3") == _findings(tmp_path / "out-full")


def test_first_finding_per_key_wins_as_in_a_full_rescan():
    import pyarrow as pa

    from pipelines.leapfrog.job import _first_per_key

    def t(rows):
        cols = ["partition", "region_a", "region_b", "key", "type", "a_vt_offset", "b_vt_offset"]
        return pa.table(
            {c: [r[i] for r in rows] for i, c in enumerate(cols)},
            schema=pa.schema(
                [
                    ("partition", pa.int32()),
                    ("region_a", pa.int32()),
                    ("region_b", pa.int32()),
                    ("key", pa.binary()),
                    ("type", pa.string()),
                    ("a_vt_offset", pa.int64()),
                    ("b_vt_offset", pa.int64()),
                ]
            ),
        )

    new = t(
        [
            (0, 0, 1, b"k", "VALUE_MISMATCH", 50, 60),
            (0, 0, 1, b"j", "MISSING_IN_B", 7, None),
            (1, 0, 1, b"k", "VALUE_MISMATCH", 5, 6),
        ]
    )
    old = t([(0, 0, 1, b"k", "MISSING_IN_A", None, 40), (0, 0, 2, b"k", "VALUE_MISMATCH", 1, 2)])
    got = sorted(tuple(r.values()) for r in _first_per_key(new, old).to_pylist())
    assert got == sorted(
        [
            (0, 0, 1, b"j", "MISSING_IN_B", 7, None),
            (0, 0, 1, b"k", "MISSING_IN_A", None, 40),
            (0, 0, 2, b"k", "VALUE_MISMATCH", 1, 2),
            (1, 0, 1, b"k", "VALUE_MISMATCH", 5, 6),
        ]
    )
    assert _first_per_key(new.slice(0, 0), old.slice(0, 0)).num_rows == 0
