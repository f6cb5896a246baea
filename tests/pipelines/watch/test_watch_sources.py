"""The watch's offset lag and source-up metrics, from a query's progress and its source's status file."""

from __future__ import annotations

import json

from pipelines.watch.job import observe_sources
from pipelines.watch.metrics import WatchMetrics


def test_lag_per_partition_from_progress_and_sources_up_from_status():
    m = WatchMetrics()
    progress = {
        "batchId": 7,
        "sources": [
            {
                "description": "tidegauge_stream",
                "startOffset": json.dumps({"0/s_v1/0": 10, "1/s_v1/0": 10}),
                "endOffset": json.dumps({"0/s_v1/0": 40, "1/s_v1/0": 25}),
                "latestOffset": json.dumps({"0/s_v1/0": 100, "1/s_v1/0": 25}),
            }
        ],
    }
    status = {"checked_ms": 1, "sources": {"0": {"up": True}, "1": {"up": False, "error": "down"}}}
    observe_sources(m, progress, status, query="watch")
    # with --rt the one query reads the RTs too, with the same offsets log: their lag is in the same series
    rt = {
        "sources": [{"latestOffset": json.dumps({"0/s_rt/0": 9}), "endOffset": json.dumps({"0/s_rt/0": 4})}]
    }
    observe_sources(m, rt, None, query="watch")

    def value(name, **labels):
        return m.registry.get_sample_value(name, labels)

    def lag(query, region, topic="s_v1"):
        return value("tidegauge_offset_lag_records", query=query, region=region, topic=topic, partition="0")

    assert (lag("watch", "0"), lag("watch", "1"), lag("watch", "0", "s_rt")) == (60, 0, 5)
    assert value("tidegauge_source_up", region="0") == 1
    assert value("tidegauge_source_up", region="1") == 0
    observe_sources(m, None, None, query="watch")  # no progress yet, no status file yet: nothing changes
    assert value("tidegauge_source_up", region="1") == 0


def test_pending_and_unverified_keys_records_and_marks_from_the_processor_rows():
    import pyarrow as pa

    from pipelines.watch.job import OUTPUT_SCHEMA, observe_rows

    m = WatchMetrics()
    rows = [
        {"row": "C", "partition": 0, "region_a": 0, "region_b": 1, "pending": 2},
        {"row": "C", "partition": 1, "region_a": 0, "region_b": 1, "pending": 3},
        {"row": "M", "partition": 1, "region": 1, "mark": [7, 9], "unverified": 2},
        {"row": "M", "partition": 0, "region": 1, "mark": [3, 4], "unverified": 1},
        {"row": "N", "partition": 0, "region": 1, "records": 40},
        {"row": "N", "partition": 1, "region": 1, "records": 2},
        {"row": "F", "partition": 1, "region_a": 0, "region_b": 1, "type": "VALUE_MISMATCH", "key": b"k"},
    ]
    pending: dict = {}
    unverified: dict = {}
    observe_rows(m, pa.Table.from_pylist(rows, OUTPUT_SCHEMA), pending, "s_v1", unverified)
    assert m.registry.get_sample_value("tidegauge_pending_keys", {"region_a": "0", "region_b": "1"}) == 5
    assert m.registry.get_sample_value("tidegauge_unverified_keys", {"region": "1"}) == 3
    assert m.registry.get_sample_value("tidegauge_records_total", {"region": "1", "topic": "s_v1"}) == 42
    # a later micro-batch brings records of partition 1 only: partition 0's counts still count
    later = [
        {"row": "C", "partition": 1, "region_a": 0, "region_b": 1, "pending": 1},
        {"row": "M", "partition": 1, "region": 1, "mark": [8, 9], "unverified": 0},
        {"row": "N", "partition": 1, "region": 1, "records": 5},
    ]
    observe_rows(m, pa.Table.from_pylist(later, OUTPUT_SCHEMA), pending, "s_v1", unverified)
    assert m.registry.get_sample_value("tidegauge_pending_keys", {"region_a": "0", "region_b": "1"}) == 3
    assert m.registry.get_sample_value("tidegauge_unverified_keys", {"region": "1"}) == 1
    assert m.registry.get_sample_value("tidegauge_records_total", {"region": "1", "topic": "s_v1"}) == 47
    mark = {"region": "1", "partition": "1", "source_region": "0"}
    assert m.registry.get_sample_value("tidegauge_high_water_mark", mark) == 8  # the later row's
    assert m.registry.get_sample_value("tidegauge_heartbeat_age_seconds", mark) is None  # no heartbeat seen


def test_heartbeat_rows_give_age_and_delay_and_every_planned_partition_waits_for_heartbeats():
    import pyarrow as pa

    from pipelines.core.sources import SourceSpec
    from pipelines.watch.job import OUTPUT_SCHEMA, WatchOptions, observe_rows

    now = [1_000.0]
    m = WatchMetrics(heartbeat_interval_ms=2_000, clock=lambda: now[0])
    opts = WatchOptions("s", 1, [SourceSpec(0, "a"), SourceSpec(1, "b")], "ck", "out")
    progress = {"sources": [{"latestOffset": {"0/s_v1/0": 5, "0/s_v1/1": 5, "0/s_rt/0": 9}, "endOffset": {}}]}
    observe_sources(m, progress, None, opts, query="watch")
    # only the watch query reads heartbeats: the change stream's planning (--changes) expects none
    observe_sources(m, {"sources": [{"latestOffset": {"0/s_v1/2": 5}}]}, None, opts, query="changes")
    now[0] = 1_004.0
    age = "tidegauge_heartbeat_age_seconds"
    # planned VT partitions wait for a heartbeat from every region; an RT partition does not
    assert m.registry.get_sample_value(age, {"region": "0", "partition": "1", "source_region": "1"}) == 4
    assert m.registry.get_sample_value(age, {"region": "0", "partition": "0", "source_region": "0"}) == 4
    assert m.registry.get_sample_value(age, {"region": "0", "partition": "9", "source_region": "0"}) is None
    assert m.registry.get_sample_value(age, {"region": "0", "partition": "2", "source_region": "0"}) is None
    rows = [
        {
            "row": "H",
            "region": 0,
            "partition": 1,
            "source_region": 1,
            "origin_ms": 1_001_000,
            "arrival_ms": 1_001_500,
        },
        {
            "row": "H",
            "region": 0,
            "partition": 1,
            "source_region": 0,
            "origin_ms": 1_002_000,
            "arrival_ms": None,
        },
    ]
    observe_rows(m, pa.Table.from_pylist(rows, OUTPUT_SCHEMA))
    hb = {"region": "0", "partition": "1", "source_region": "1"}
    assert m.registry.get_sample_value(age, hb) == 2.5
    assert m.registry.get_sample_value("tidegauge_heartbeat_delay_seconds", hb) == 0.5
    # no broker time: the origin time stands in (delay 0), as in `lag`
    own = {**hb, "source_region": "0"}
    assert m.registry.get_sample_value(age, own) == 2
    assert m.registry.get_sample_value("tidegauge_heartbeat_delay_seconds", own) == 0
    assert m.registry.get_sample_value("tidegauge_heartbeat_interval_seconds", {}) == 2


def test_the_watch_refuses_bad_places_and_sources_before_any_work(tmp_path):
    import pytest
    from leapfrog_histories import generated
    from vt_fixtures import STORE, write_archives

    from pipelines.core.errors import UsageError
    from pipelines.core.sources import SourceError, SourceSpec
    from pipelines.watch.job import WatchOptions, prepare

    dirs = write_archives([h for h in generated(1) if h.n_regions == 3][:2], tmp_path / "a")
    sources = [SourceSpec(x, d) for x, d in dirs.items()]

    def opts(**kw):
        base = dict(
            store=STORE, version=1, sources=sources, checkpoint=str(tmp_path / "ck"), out=str(tmp_path / "w")
        )
        return WatchOptions(**{**base, **kw})

    with pytest.raises(UsageError, match="--checkpoint s3://b/ck"):
        prepare(opts(checkpoint="s3://b/ck"))
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("not ours")
    with pytest.raises(UsageError, match="not an earlier output"):
        prepare(opts(out=str(tmp_path / "theirs")))
    with pytest.raises(SourceError, match="no topic 'typo_v1'"):
        prepare(opts(store="typo"))
    assert not (tmp_path / "w").exists()  # nothing written by a refused start
    prepare(opts())
    prepare(opts())  # a restart: its own --out, marked by the first start
    assert (tmp_path / "theirs" / "notes.txt").read_text() == "not ours"


def test_the_checkpoint_of_a_watch_that_ran_two_queries_is_refused(tmp_path, capsys):
    """A checkpoint of the watch before Leap Frog and DIV ran as one query holds `leapfrog/` and `div/` (each
    query's offsets and state): the one query's state is laid out otherwise, so it is refused, with the path and
    what to do, before anything is written; the command line exits 2 with that message."""
    import pytest
    from leapfrog_histories import generated
    from vt_fixtures import STORE, write_archives

    from pipelines.cli import main
    from pipelines.core.errors import UsageError
    from pipelines.core.sources import SourceSpec
    from pipelines.watch.job import WatchOptions, prepare

    dirs = write_archives([h for h in generated(1) if h.n_regions == 3][:2], tmp_path / "a")
    for old in (["leapfrog", "div"], ["leapfrog"], ["div"]):
        ck = tmp_path / ("ck-" + "-".join(old))
        for name in old:
            (ck / name / "offsets").mkdir(parents=True)
            (ck / name / "offsets" / "0").write_text("v1\n{}\n")
        opts = WatchOptions(
            store=STORE,
            version=1,
            sources=[SourceSpec(x, d) for x, d in dirs.items()],
            checkpoint=str(ck),
            out=str(tmp_path / "w"),
        )
        with pytest.raises(UsageError) as refused:
            prepare(opts)
        text = str(refused.value)
        for name in old:
            assert str(ck / name) in text
        assert "two queries" in text and "start it with a new --checkpoint" in text
        assert not (tmp_path / "w").exists()  # nothing written by a refused start
        assert sorted(p.name for p in ck.iterdir()) == sorted(old)  # and the old checkpoint left as it was
    argv = [
        "watch",
        "--store",
        STORE,
        "--version",
        "1",
        "--checkpoint",
        str(ck),
        "--out",
        str(tmp_path / "w"),
    ]
    assert main(argv + [f"--source={x}={d}" for x, d in dirs.items()]) == 2
    err = capsys.readouterr().err
    assert f"{ck / 'div'}" in err and "new --checkpoint" in err
    assert not (tmp_path / "w").exists()
    # a checkpoint of this watch (watch/, and changes/ with --changes) is taken
    (tmp_path / "ck-new" / "watch" / "offsets").mkdir(parents=True)
    (tmp_path / "ck-new" / "changes").mkdir()
    prepare(
        WatchOptions(
            store=STORE,
            version=1,
            sources=opts.sources,
            checkpoint=str(tmp_path / "ck-new"),
            out=str(tmp_path / "w"),
        )
    )


def test_heartbeat_ages_count_up_to_what_the_watch_has_read_not_up_to_the_scrape():
    """A watch that runs behind must not make healthy partitions look silent: ages count up to the planning time
    of the watch query's last micro-batch, when every heartbeat that had arrived was read."""
    now = [2_000.0]
    m = WatchMetrics(heartbeat_interval_ms=5_000, clock=lambda: now[0])
    labels = {"region": "0", "partition": "0", "source_region": "1"}
    m.observe_heartbeats([{**labels, "origin_ms": 1_989_000, "arrival_ms": 1_990_000}])
    assert (
        m.registry.get_sample_value("tidegauge_heartbeat_age_seconds", labels) == 10
    )  # no progress yet: now

    def progress(batch: int, at_s: float) -> dict:
        from datetime import UTC, datetime

        return {"batchId": batch, "timestamp": datetime.fromtimestamp(at_s, UTC).isoformat()}

    m.observe_progress(progress(4, 1_995.0), query="watch", heartbeats_read=True)
    now[0] = 2_030.0  # the watch is 35 s behind: the age says what it knows, 5 s
    assert m.registry.get_sample_value("tidegauge_heartbeat_age_seconds", labels) == 5
    # no heartbeat since: it grows, batch by batch
    m.observe_progress(progress(5, 2_020.0), query="watch", heartbeats_read=True)
    assert m.registry.get_sample_value("tidegauge_heartbeat_age_seconds", labels) == 30


def test_the_source_status_file_is_local_whatever_the_checkpoint(tmp_path):
    # the stream source's planner writes it with local file calls: beside a local checkpoint, else in a local
    # directory of its own per checkpoint (without it an s3a:// watch exported no tidegauge_source_up)
    from pathlib import Path

    from pipelines.watch.job import WatchOptions, status_file

    def where(ck: str) -> str:
        return status_file(WatchOptions(store="s", version=1, sources=[], checkpoint=ck, out=str(tmp_path)))

    assert where(str(tmp_path / "ck")) == str(tmp_path / "ck" / "watch-sources.json")
    remote = where("s3a://bucket/ck")
    assert Path(remote).is_absolute() and "bucket" not in remote
    assert where("s3a://bucket/ck/") == remote != where("s3a://bucket/other") != where("hdfs://nn/ck")
