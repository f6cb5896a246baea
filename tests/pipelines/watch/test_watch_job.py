"""The watch as a streaming query: archives that grow between runs, read from one checkpoint, give the findings
a nightly run over the whole archives gives — each once — and a restart re-runs nothing twice."""

from __future__ import annotations

import contextlib
import random
from collections import Counter

import pyarrow.parquet as pq
import pytest
from change_oracle import one_pass
from leapfrog_histories import generated
from nightly_oracle import named, nightly
from vt_fixtures import STORE, write_archives

from pipelines.core.sources import SourceSpec
from pipelines.watch.changes import read_changes
from pipelines.watch.job import WatchOptions, read_findings, start
from pipelines.watch.metrics import WatchMetrics

pytestmark = [pytest.mark.spark, pytest.mark.slow]
NOW_S = 4_000_000_000.0  # the metrics' clock: heartbeat ages are read against it


def newest_heartbeats_by_lag(dirs: dict) -> dict[tuple[int, int, int], tuple[int, int]]:
    """(region, partition, source region) → (arrival, origin) ms of the newest VT heartbeat, read by the `lag`
    job's own reader."""
    from pipelines.core.sources import open_source
    from pipelines.lag.job import monitor_partition

    out = {}
    for region, d in dirs.items():
        src = open_source(SourceSpec(region, d), {})
        for p in src.partitions(f"{STORE}_v1"):
            for hb in monitor_partition(src, f"{STORE}_v1", p, len(dirs)).series:
                at = (hb.vt_timestamp_ms, hb.origin_ms)
                key = (region, p, hb.origin_region)
                out[key] = max(out.get(key, at), at)
    return out


def test_growing_archives_watched_from_one_checkpoint_equal_a_nightly_run(spark, tmp_path):
    histories = [h for h in generated(20) if h.n_regions == 3][:30]
    rng = random.Random(4)
    cuts = {}
    for p, h in enumerate(histories):
        for x in range(3):
            offsets = [e.vt_offset for e in h.vt[x]]
            cuts[(p, x)] = rng.randint(min(offsets), max(offsets)) if offsets else 0
    full = write_archives(histories, tmp_path / "full")
    expected = nightly(spark, full, tmp_path / "batch")
    assert expected

    live = tmp_path / "live"
    dirs = write_archives(histories, live, keep=lambda p, x, off: off <= cuts[(p, x)])
    opts = WatchOptions(
        store=STORE,
        version=1,
        sources=[SourceSpec(x, d) for x, d in dirs.items()],
        checkpoint=str(tmp_path / "checkpoint"),
        out=str(tmp_path / "watch"),
        max_records_per_trigger=400,
    )
    metrics = WatchMetrics(clock=lambda: NOW_S)
    queries = start(spark, opts, metrics, available_now=True)
    # one query reads each record once for Leap Frog and DIV, with one checkpoint
    assert [q.name for q in queries] == ["tidegauge_watch_watch"]
    for q in queries:
        q.awaitTermination()
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir() if p.is_dir()) == ["watch"]
    first = read_findings(opts.out).num_rows
    # the rest of every log arrives; the same checkpoint goes on from where it stopped
    write_archives(histories, live, keep=lambda p, x, off: off > cuts[(p, x)])
    for q in start(spark, opts, metrics, available_now=True):
        q.awaitTermination()
    # the heartbeat metrics show, per region partition and source region, the newest heartbeat the `lag` job
    # reads in the whole archives
    newest = newest_heartbeats_by_lag(full)
    assert len(newest) > 20
    for (region, partition, source), (arrival, origin) in newest.items():
        labels = {"region": str(region), "partition": str(partition), "source_region": str(source)}
        assert metrics.registry.get_sample_value(
            "tidegauge_heartbeat_delay_seconds", labels
        ) == pytest.approx((arrival - origin) / 1000), labels
        assert metrics.registry.get_sample_value("tidegauge_heartbeat_age_seconds", labels) == pytest.approx(
            NOW_S - arrival / 1000
        ), labels
    found = read_findings(opts.out).to_pylist()
    assert named(found) == expected
    assert len({r["finding_id"] for r in found}) == len(found)
    # each finding ends with the nightly run's status (its changes under OUT/leapfrog-status/), and the open count
    # is what the metric says
    batch = pq.read_table(tmp_path / "batch" / "inconsistencies").to_pylist()
    key = lambda r: (r["partition"], r["region_a"], r["region_b"], r["key"])  # noqa: E731
    assert {key(r): r["status"] for r in found} == {key(r): r["status"] for r in batch}
    opened = Counter(
        (r["type"], str(r["region_a"]), str(r["region_b"])) for r in found if r["status"] == "open"
    )
    for (t, a, b), n in opened.items():
        labels = {"type": t, "region_a": a, "region_b": b}
        assert metrics.registry.get_sample_value("tidegauge_open_divergences", labels) == n, labels
    assert 0 < first < len(found) or first == len(found)
    # DIV over the same records: what div validate writes, row for row
    from pipelines.div.validate import ValidateOptions, run_local

    run_local(ValidateOptions(sources=[SourceSpec(x, d) for x, d in full.items()], out=str(tmp_path / "div")))
    div_rows = sorted(
        (r["region"], r["topic"], r["partition"], r["offset"], r["type"], r["fatal"])
        for r in pq.read_table(tmp_path / "div" / "errors").to_pylist()
    )
    assert div_rows, "no DIV finding: the comparison would prove nothing"
    watched = read_findings(opts.out, "div").to_pylist()
    assert (
        sorted((r["region"], r["topic"], r["partition"], r["offset"], r["type"], r["fatal"]) for r in watched)
        == div_rows
    )
    # nothing new: a third run appends nothing
    for q in start(spark, opts, available_now=True):
        q.awaitTermination()
    assert read_findings(opts.out).num_rows == len(found)


def test_kill_9_at_random_moments_then_restart_loses_and_repeats_nothing(spark, tmp_path):
    """`tidegauge watch` as users run it (a process of its own), stopped at random moments and started again from
    the same checkpoint: killed with SIGKILL (its whole process group: driver, JVM, Python workers), then, restarted
    from what the kill left, stopped with SIGTERM (the CLI alone, as `kill PID` does: it exits 0 once no
    micro-batch runs); each stop after the run committed a micro-batch of its own. In the end (a restart after the
    SIGTERM) the findings equal a nightly run's, each once. The console of every run shows none of Spark's Python
    workers' own prints. (It killed twice until the suite moved to two workers; a second kill repeated the first's
    evidence at the price of a JVM start, about 100 s of CI.)

    Small on purpose (two JVM starts are the price of the property): ten partitions of every mix's histories
    (the step runs once per VT partition with records, so partitions cost time in every micro-batch), a cap of 30
    offsets a micro-batch (9 micro-batches: some left for each run, given a trigger every 3 s), two state
    partitions."""
    import os
    import signal
    import subprocess
    import sys
    import time

    histories = [h for h in generated(20) if h.n_regions == 3][:30][::3]
    dirs = write_archives(histories, tmp_path / "archives")
    expected = nightly(spark, dirs, tmp_path / "batch")
    assert expected, "no finding: losing or repeating one could not be seen"
    conf = tmp_path / "watch.yaml"
    conf.write_text("spark:\n  conf:\n    spark.sql.shuffle.partitions: 2\n")
    argv = [sys.executable, "-m", "pipelines.cli", "watch", "--store", STORE, "--version", "1"]
    argv += [f"--source={x}={d}" for x, d in dirs.items()]
    argv += ["--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "watch"), "--conf", str(conf)]
    argv += ["--trigger-interval", "3 seconds", "--max-records-per-trigger", "30", "--changes", "0"]
    rng = random.Random(7)
    commits = tmp_path / "ck" / "watch" / "commits"

    def committed() -> int:
        return len([f for f in commits.iterdir() if f.name.isdigit()]) if commits.exists() else 0

    for i, stop in enumerate((signal.SIGKILL, signal.SIGTERM)):
        before = committed()
        out, err = tmp_path / f"run-{i}.out", tmp_path / f"run-{i}.err"
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(argv, stdout=o, stderr=e, start_new_session=True)
        deadline = time.monotonic() + 300
        while committed() == before and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # until this run has finished a micro-batch of its own
        assert committed() > before, f"run {i} committed no micro-batch of its own: {err.read_text()[-3000:]}"
        # then a random moment within a trigger interval: inside the next micro-batch, between two, ... (the killed
        # run takes one or two micro-batches of the 9; the SIGTERM, last, may let several more finish: the CLI
        # waits for a moment when no micro-batch runs, which a backlog of micro-batches back to back defers)
        time.sleep(rng.uniform(0, 3))
        assert proc.poll() is None, f"the watch stopped by itself: {err.read_text()[-3000:]}"
        if stop == signal.SIGKILL:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        else:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=300) == 0, err.read_text()[-3000:]
            assert "SIGTERM received, stopping after the current micro-batch" in err.read_text()
            with contextlib.suppress(ProcessLookupError):  # what the JVM left running (it ends with the CLI)
                os.killpg(proc.pid, signal.SIGKILL)
        console = out.read_text() + err.read_text()
        for noise in ("Python worker", "Using Spark's default log4j profile", " WARN "):
            assert noise not in console, console[-3000:]
        assert "tidegauge watch: watching" in out.read_text()
    # then a run that reads what is left, from the same checkpoint
    opts = WatchOptions(
        store=STORE,
        version=1,
        sources=[SourceSpec(x, d) for x, d in dirs.items()],
        checkpoint=str(tmp_path / "ck"),
        out=str(tmp_path / "watch"),
        changes_region=0,
    )
    for q in start(spark, opts, available_now=True):
        q.awaitTermination()
    found = read_findings(opts.out).to_pylist()
    assert named(found) == expected
    assert len({r["finding_id"] for r in found}) == len(found)
    # each finding ends with the nightly run's status, across the kills (OUT/leapfrog-status/ holds its changes)
    batch = pq.read_table(tmp_path / "batch" / "inconsistencies").to_pylist()
    key = lambda r: (r["partition"], r["region_a"], r["region_b"], r["key"])  # noqa: E731
    assert {key(r): r["status"] for r in found} == {key(r): r["status"] for r in batch}
    # region 0's change stream (--changes 0): each change once, none lost, as the rule gives it in one pass
    changes = read_changes(opts.out).sort_by([("partition", "ascending"), ("vt_offset", "ascending")])
    assert changes.num_rows > 20 and changes.equals(one_pass(dirs[0], f"{STORE}_v1", 3))
