"""`WatchMetrics` (issue 19, item 5): updates as the streaming job makes them, scraped over HTTP on loopback and read
back with prometheus_client's own parser.

The clock is injected (no sleeps): the heartbeat age must grow between two scrapes with no update at all, and a
heartbeat that arrives late with an older arrival time must never move it back. Spark's progress reports are
the real shape: one captured from a streaming query with a stateful operator, and, in the Spark test, the
reports of a query run here.
"""

from __future__ import annotations

import copy
import json
import logging
import socket
import urllib.request

import numpy as np
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipelines.watch.metrics import WatchMetrics


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of the endpoint: (sample name, its labels) -> value."""
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode("utf-8")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def labels(**kw) -> frozenset:
    return frozenset((k, str(v)) for k, v in kw.items())


def samples(scraped: dict, name: str) -> dict[frozenset, float]:
    return {lab: v for (n, lab), v in scraped.items() if n == name}


@pytest.fixture
def clock() -> Clock:
    return Clock(1_800_000_000.0)


@pytest.fixture
def watch(clock):
    """A WatchMetrics served on a free loopback port: (metrics, scrape url)."""
    metrics = WatchMetrics(heartbeat_interval_ms=30_000, clock=clock)
    with metrics.serve(0) as server:
        assert server.addr == "127.0.0.1" and server.port > 0
        yield metrics, server.url


def hb(region, partition, source, origin_ms, arrival_ms, mark=None) -> dict:
    row = {"region": region, "partition": partition, "source_region": source}
    row.update(origin_ms=origin_ms, arrival_ms=arrival_ms)
    if mark is not None:
        row["mark"] = mark
    return row


# -- heartbeats ------------------------------------------------------------------------------------------
def test_heartbeat_age_grows_between_scrapes_with_no_update(watch, clock):
    metrics, url = watch
    t_ms = int(clock.now * 1000)
    metrics.observe_heartbeats(
        [
            hb(0, 3, 1, origin_ms=t_ms - 7_250, arrival_ms=t_ms - 5_000, mark=120),
            hb(0, 3, 2, origin_ms=t_ms - 1_000, arrival_ms=t_ms - 900),
        ]
    )
    first = scrape(url)
    assert samples(first, "tidegauge_heartbeat_age_seconds") == {
        labels(region=0, partition=3, source_region=1): 5.0,
        labels(region=0, partition=3, source_region=2): 0.9,
    }
    assert samples(first, "tidegauge_heartbeat_delay_seconds") == {
        labels(region=0, partition=3, source_region=1): 2.25,
        labels(region=0, partition=3, source_region=2): 0.1,
    }
    assert samples(first, "tidegauge_high_water_mark") == {
        labels(region=0, partition=3, source_region=1): 120
    }
    assert samples(first, "tidegauge_heartbeat_interval_seconds") == {labels(): 30.0}

    clock.now += 95.5  # no micro-batch, nobody writes: only time passes
    second = scrape(url)
    assert samples(second, "tidegauge_heartbeat_age_seconds") == {
        labels(region=0, partition=3, source_region=1): 100.5,
        labels(region=0, partition=3, source_region=2): 96.4,
    }
    # the delay is a property of the last heartbeat, not of time
    assert samples(second, "tidegauge_heartbeat_delay_seconds") == samples(
        first, "tidegauge_heartbeat_delay_seconds"
    )


def test_a_late_older_heartbeat_never_moves_the_age_back(watch, clock):
    metrics, url = watch
    t_ms = int(clock.now * 1000)
    key = labels(region=1, partition=0, source_region=0)
    metrics.observe_heartbeats([hb(1, 0, 0, origin_ms=t_ms - 10_000, arrival_ms=t_ms - 8_000, mark=50)])
    before = scrape(url)
    assert samples(before, "tidegauge_heartbeat_age_seconds")[key] == 8.0

    # an older heartbeat delivered late (and, in the same batch, ahead of a newer one), with a lower mark
    metrics.observe_heartbeats(
        [
            hb(1, 0, 0, origin_ms=t_ms - 60_000, arrival_ms=t_ms - 59_000, mark=10),
            hb(1, 0, 0, origin_ms=t_ms - 9_500, arrival_ms=t_ms - 9_000, mark=45),
        ]
    )
    after = scrape(url)
    assert samples(after, "tidegauge_heartbeat_age_seconds")[key] == 8.0
    assert samples(after, "tidegauge_heartbeat_delay_seconds")[key] == 2.0
    assert samples(after, "tidegauge_high_water_mark")[key] == 50

    # a newer one moves it forward, in a batch whose rows come newest first
    metrics.observe_heartbeats(
        [
            hb(1, 0, 0, origin_ms=t_ms - 1_500, arrival_ms=t_ms - 1_000, mark=70),
            hb(1, 0, 0, origin_ms=t_ms - 4_000, arrival_ms=t_ms - 3_000, mark=60),
        ]
    )
    newest = scrape(url)
    assert samples(newest, "tidegauge_heartbeat_age_seconds")[key] == 1.0
    assert samples(newest, "tidegauge_heartbeat_delay_seconds")[key] == 0.5
    assert samples(newest, "tidegauge_high_water_mark")[key] == 70


def test_no_broker_time_falls_back_to_the_origin_and_a_fast_broker_clock_gives_age_zero(watch, clock):
    metrics, url = watch
    t_ms = int(clock.now * 1000)
    metrics.observe_heartbeats(
        [
            hb(0, 0, 1, origin_ms=t_ms - 4_000, arrival_ms=-1),  # CreateTime missing: -1
            hb(0, 1, 1, origin_ms=t_ms - 4_000, arrival_ms=None),
            hb(0, 2, 1, origin_ms=t_ms - 1_000, arrival_ms=t_ms + 2_000),  # the broker's clock is ahead
        ]
    )
    got = scrape(url)
    assert samples(got, "tidegauge_heartbeat_age_seconds") == {
        labels(region=0, partition=0, source_region=1): 4.0,
        labels(region=0, partition=1, source_region=1): 4.0,
        labels(region=0, partition=2, source_region=1): 0.0,
    }
    assert (
        samples(got, "tidegauge_heartbeat_delay_seconds")[labels(region=0, partition=0, source_region=1)] == 0
    )


def test_an_expected_partition_that_never_heartbeats_ages_from_when_the_watch_began_waiting(watch, clock):
    metrics, url = watch
    start = clock.now
    metrics.expect_heartbeats(2, partitions=[0, 1], source_regions=[0, 1, 2])
    clock.now = start + 40
    t_ms = int(clock.now * 1000)
    metrics.observe_heartbeats([hb(2, 1, 0, origin_ms=t_ms - 3_000, arrival_ms=t_ms - 2_000)])
    metrics.expect_heartbeats(2, partitions=[0, 1], source_regions=[0, 1, 2])  # again: changes nothing
    clock.now = start + 100
    ages = samples(scrape(url), "tidegauge_heartbeat_age_seconds")
    assert len(ages) == 6
    assert ages.pop(labels(region=2, partition=1, source_region=0)) == 62.0
    assert set(ages.values()) == {100.0}
    # waiting for a heartbeat has no delay and no mark to show yet
    assert list(samples(scrape(url), "tidegauge_heartbeat_delay_seconds")) == [
        labels(region=2, partition=1, source_region=0)
    ]


def test_high_water_marks_set_apart_from_heartbeats_keep_the_highest(watch):
    metrics, url = watch
    metrics.set_high_water_marks(0, 2, [10, 20, 30])
    metrics.set_high_water_marks("0", "2", {1: 25, 2: 5})  # 1 rises, 2 stays at 30
    assert samples(scrape(url), "tidegauge_high_water_mark") == {
        labels(region=0, partition=2, source_region=0): 10,
        labels(region=0, partition=2, source_region=1): 25,
        labels(region=0, partition=2, source_region=2): 30,
    }


# -- the rest of the updates -----------------------------------------------------------------------------
class SparkRow(tuple):
    """What a collected pyspark Row offers the metrics: asDict()."""

    def __new__(cls, **kw):
        row = super().__new__(cls, kw.values())
        row._fields = list(kw)
        return row

    def asDict(self) -> dict:  # noqa: N802 (pyspark's name)
        return dict(zip(self._fields, self, strict=True))


def test_lag_sources_records_findings_and_key_counts(watch):
    metrics, url = watch
    metrics.set_lag(0, "s_v1", 3, latest_offset=1_500, next_offset=1_200, query="watch")
    metrics.set_lag(0, "s_rt", 3, latest_offset=1_500, next_offset=1_450, query="watch")  # the RT, with --rt
    # end read before the position moved
    metrics.set_lag(1, "s_v1", 3, latest_offset=90, next_offset=100, query="watch")
    metrics.set_source_up(0, True)
    metrics.set_source_up(2, False)
    metrics.add_records(0, "s_v1", 400)
    metrics.add_records(0, "s_v1", np.int64(100))
    metrics.add_records(1, "s_rt", 7)
    finding = {"store": "s", "version": 1, "partition": 0, "key": b"k", "a_vt_offset": 5}  # other columns
    metrics.observe_divergences(
        [
            {**finding, "type": "VALUE_MISMATCH", "region_a": 0, "region_b": 1},
            SparkRow(type="VALUE_MISMATCH", region_a=0, region_b=1, key=b"j"),
            {**finding, "type": "MISSING_IN_B", "region_a": np.int32(0), "region_b": np.int64(2)},
        ]
    )
    metrics.observe_div_findings(
        [
            {"type": "MISSING", "fatal": True, "region": 1, "topic": "s_v1", "offset": 17},
            {"type": "MISSING", "fatal": np.bool_(True), "region": 1, "topic": "s_v1", "offset": 30},
            {"type": "DUPLICATE", "fatal": "false", "region": 1, "topic": "s_rt"},
        ]
    )
    metrics.set_pending_keys(0, 1, 12)
    metrics.set_pending_keys(0, 1, 4)
    metrics.set_unverified_keys(2, 3)
    got = scrape(url)
    assert samples(got, "tidegauge_offset_lag_records") == {
        labels(query="watch", region=0, topic="s_v1", partition=3): 300,
        labels(query="watch", region=0, topic="s_rt", partition=3): 50,
        labels(query="watch", region=1, topic="s_v1", partition=3): 0,
    }
    assert samples(got, "tidegauge_source_up") == {labels(region=0): 1, labels(region=2): 0}
    assert samples(got, "tidegauge_records_total") == {
        labels(region=0, topic="s_v1"): 500,
        labels(region=1, topic="s_rt"): 7,
    }
    assert samples(got, "tidegauge_divergences_total") == {
        labels(type="VALUE_MISMATCH", region_a=0, region_b=1): 2,
        labels(type="MISSING_IN_B", region_a=0, region_b=2): 1,
    }
    assert samples(got, "tidegauge_div_findings_total") == {
        labels(type="MISSING", fatal="true", region=1, topic="s_v1"): 2,
        labels(type="DUPLICATE", fatal="false", region=1, topic="s_rt"): 1,
    }
    assert samples(got, "tidegauge_pending_keys") == {labels(region_a=0, region_b=1): 4}
    assert samples(got, "tidegauge_unverified_keys") == {labels(region=2): 3}
    assert samples(got, "tidegauge_metric_rows_rejected_total") == {}

    metrics.observe_divergences([{"type": "VALUE_MISMATCH", "region_a": 0, "region_b": 1}])
    assert (
        samples(scrape(url), "tidegauge_divergences_total")[
            labels(type="VALUE_MISMATCH", region_a=0, region_b=1)
        ]
        == 3
    )


def test_the_open_count_falls_when_findings_heal_and_rises_when_one_opens_again(watch):
    """What pages is the open count (issue 41): a healed finding stops counting, the pair goes back to 0."""
    metrics, url = watch
    rows = [
        {"type": "VALUE_MISMATCH", "region_a": 0, "region_b": 1, "status": "open"},
        {"type": "VALUE_MISMATCH", "region_a": 0, "region_b": 1, "status": "open"},
        {"type": "MISSING_IN_B", "region_a": 0, "region_b": 2, "status": "healed"},
    ]
    metrics.set_open_divergences(rows)
    open_now = samples(scrape(url), "tidegauge_open_divergences")
    assert open_now == {labels(type="VALUE_MISMATCH", region_a=0, region_b=1): 2}
    rows[0]["status"] = rows[1]["status"] = "healed"  # the repair converged both keys
    metrics.set_open_divergences(rows)
    assert samples(scrape(url), "tidegauge_open_divergences") == {
        labels(type="VALUE_MISMATCH", region_a=0, region_b=1): 0
    }
    rows[2]["status"] = "open"  # a newer write diverged the other key again
    metrics.set_open_divergences(rows)
    assert samples(scrape(url), "tidegauge_open_divergences") == {
        labels(type="VALUE_MISMATCH", region_a=0, region_b=1): 0,
        labels(type="MISSING_IN_B", region_a=0, region_b=2): 1,
    }


def test_a_bad_row_is_skipped_counted_and_named_and_the_rest_applied(watch, clock, caplog):
    metrics, url = watch
    t_ms = int(clock.now * 1000)
    caplog.set_level(logging.WARNING, logger="tidegauge.watch.metrics")
    metrics.observe_heartbeats(
        [
            {"region": 0, "partition": 0, "origin_ms": 1},  # no source_region
            hb(0, 0, 1, origin_ms="yesterday", arrival_ms=t_ms),
            hb(0, 1, 1, origin_ms=t_ms - 2_000, arrival_ms=t_ms - 1_000),
            "not a row",
        ]
    )
    metrics.observe_div_findings([{"type": "MISSING", "fatal": "maybe", "region": 0, "topic": "t"}])
    metrics.set_lag(0, "s_v1", 0, latest_offset=None, next_offset=3, query="watch")
    metrics.set_lag(0, "s_v1", 0, latest_offset=4, next_offset=3, query="nightly")  # not a query of the watch
    metrics.add_records(0, "s_v1", -5)
    metrics.observe_progress({"batchId": 1}, query="watch")  # no timestamp
    metrics.observe_progress("{not json", query="watch")
    metrics.observe_progress(REAL_PROGRESS, query="Watch")
    got = scrape(url)
    assert samples(got, "tidegauge_heartbeat_age_seconds") == {
        labels(region=0, partition=1, source_region=1): 1.0
    }
    assert samples(got, "tidegauge_metric_rows_rejected_total") == {
        labels(method="observe_heartbeats"): 3,
        labels(method="observe_div_findings"): 1,
        labels(method="set_lag"): 2,
        labels(method="add_records"): 1,
        labels(method="observe_progress"): 3,
    }
    assert samples(got, "tidegauge_div_findings_total") == {}
    assert samples(got, "tidegauge_offset_lag_records") == {}
    text = caplog.text
    assert "observe_heartbeats: skipped 3 row(s)" in text and "no field 'source_region'" in text
    assert "fatal 'maybe' is not a boolean" in text
    assert "latest_offset None is not an integer" in text
    assert "count -5 is negative" in text
    assert "timestamp None is not an ISO-8601 string" in text
    assert "query 'Watch' is not one of the watch's queries ('watch', 'changes')" in text
    assert samples(got, "tidegauge_last_progress_timestamp_seconds") == {}


# -- Spark's progress ------------------------------------------------------------------------------------
# A StreamingQueryProgress as Spark 4.3 wrote it (`query.lastProgress.json`) for a rate source feeding a
# groupBy().count() in complete mode: the shape the watch's listener hands over, state operator included.
REAL_PROGRESS = {
    "id": "c6fd5f0d-c049-4cce-bf5a-fc4cb0b0cbec",
    "runId": "8d268251-5089-44c2-9c8e-47d7de4ed3e8",
    "name": "q",
    "timestamp": "2026-11-26T07:08:34.000Z",
    "batchId": 9,
    "batchDuration": 881,
    "numInputRows": 50,
    "inputRowsPerSecond": 50.0,
    "processedRowsPerSecond": 56.8,
    "durationMs": {
        "addBatch": 717,
        "commitOffsets": 62,
        "getBatch": 0,
        "latestOffset": 0,
        "queryPlanning": 15,
        "triggerExecution": 880,
        "walCommit": 83,
    },
    "stateOperators": [
        {
            "operatorName": "stateStoreSave",
            "numRowsTotal": 3,
            "numRowsUpdated": 3,
            "allUpdatesTimeMs": 452,
            "numRowsRemoved": 0,
            "allRemovalsTimeMs": 0,
            "commitTimeMs": 157,
            "memoryUsedBytes": 1944,
            "numRowsDroppedByWatermark": 0,
            "numShufflePartitions": 2,
            "numStateStoreInstances": 2,
            "customMetrics": {"loadedMapCacheHitCount": 36, "stateOnCurrentVersionSizeBytes": 888},
        }
    ],
    "sources": [
        {
            "description": "RateStreamV2[rowsPerSecond=50, rampUpTimeSeconds=0, numPartitions=default",
            "startOffset": 14,
            "endOffset": 15,
            "latestOffset": 15,
            "numInputRows": 50,
            "inputRowsPerSecond": 50.0,
            "processedRowsPerSecond": 56.8,
        }
    ],
    "sink": {"description": "MemorySink", "numOutputRows": 3},
}
REAL_TIMESTAMP = 1795676914.0  # 2026-11-26T07:08:34Z


def _idle_after(progress: dict) -> dict:
    """The report Spark makes for a trigger that found no data, 10 s later: two phases, no rows, and rates
    Spark leaves out (the Python object holds them as None)."""
    idle = copy.deepcopy(progress)
    idle.update(
        timestamp="2026-11-26T07:08:44.000Z",
        numInputRows=0,
        durationMs={"latestOffset": 1, "triggerExecution": 1},
    )
    idle.update(inputRowsPerSecond=None, processedRowsPerSecond=float("nan"))
    return idle


def test_a_real_progress_report_becomes_timings_rows_and_state(watch):
    metrics, url = watch
    metrics.observe_progress(REAL_PROGRESS, query="watch")
    got = scrape(url)
    lf = {"query": "watch"}
    assert samples(got, "tidegauge_microbatch_duration_seconds") == {
        labels(**lf, phase=phase): ms / 1000 for phase, ms in REAL_PROGRESS["durationMs"].items()
    }
    assert samples(got, "tidegauge_last_progress_timestamp_seconds") == {labels(**lf): REAL_TIMESTAMP}
    assert samples(got, "tidegauge_last_batch_id") == {labels(**lf): 9}
    assert samples(got, "tidegauge_microbatch_input_rows") == {labels(**lf): 50}
    assert samples(got, "tidegauge_input_rows_total") == {labels(**lf): 50}
    assert samples(got, "tidegauge_input_rows_per_second") == {labels(**lf): 50.0}
    assert samples(got, "tidegauge_processed_rows_per_second") == {labels(**lf): 56.8}
    assert samples(got, "tidegauge_state_rows") == {labels(**lf, operator="stateStoreSave"): 3}
    assert samples(got, "tidegauge_state_memory_bytes") == {labels(**lf, operator="stateStoreSave"): 1944}

    # the same report again (say from a listener and from lastProgress), or an older one: nothing changes
    metrics.observe_progress(json.dumps(REAL_PROGRESS), query="watch")
    older = {**REAL_PROGRESS, "timestamp": "2026-11-26T07:08:30.000Z", "batchId": 8, "numInputRows": 7}
    metrics.observe_progress(older, query="watch")
    assert scrape(url) == got

    # an idle trigger: its phases replace the last batch's, rates Spark left out are not shown
    metrics.observe_progress(_idle_after(REAL_PROGRESS), query="watch")
    idle = scrape(url)
    assert samples(idle, "tidegauge_microbatch_duration_seconds") == {
        labels(**lf, phase="latestOffset"): 0.001,
        labels(**lf, phase="triggerExecution"): 0.001,
    }
    assert samples(idle, "tidegauge_last_progress_timestamp_seconds") == {labels(**lf): REAL_TIMESTAMP + 10}
    assert samples(idle, "tidegauge_microbatch_input_rows") == {labels(**lf): 0}
    assert samples(idle, "tidegauge_input_rows_total") == {labels(**lf): 50}
    assert samples(idle, "tidegauge_input_rows_per_second") == {}
    assert samples(idle, "tidegauge_processed_rows_per_second") == {}
    assert samples(idle, "tidegauge_metric_rows_rejected_total") == {}


def test_the_series_are_the_one_query_s_and_the_old_two_queries_names_are_refused(watch):
    """The watch runs Leap Frog and DIV as one query, `watch`: its reports give one set of series, labelled
    query="watch". The names of the two queries an older watch ran (`leapfrog`, `div`) are no query of this one:
    a report or a lag under them is skipped and counted, never shown as a series that alert rules would read."""
    metrics, url = watch
    for _ in range(2):  # the same report again changes nothing
        metrics.observe_progress(REAL_PROGRESS, query="watch", heartbeats_read=True)
    metrics.observe_progress({**REAL_PROGRESS, "batchId": 31}, query="div")
    metrics.observe_progress({**REAL_PROGRESS, "batchId": 32}, query="leapfrog")
    metrics.set_lag(0, "s_v1", 3, latest_offset=10, next_offset=5, query="leapfrog")
    got = scrape(url)
    assert samples(got, "tidegauge_last_progress_timestamp_seconds") == {
        labels(query="watch"): REAL_TIMESTAMP
    }
    assert samples(got, "tidegauge_last_batch_id") == {labels(query="watch"): 9}
    assert samples(got, "tidegauge_input_rows_total") == {labels(query="watch"): 50}
    assert samples(got, "tidegauge_offset_lag_records") == {}
    assert samples(got, "tidegauge_metric_rows_rejected_total") == {
        labels(method="observe_progress"): 2,
        labels(method="set_lag"): 1,
    }


@pytest.mark.spark
@pytest.mark.slow
def test_the_progress_of_a_streaming_query_run_here(spark, tmp_path, clock):
    """Spark's own StreamingQueryProgress objects (a dict subclass in PySpark 4), from a query that reads two
    files once (availableNow: it stops by itself) through a stateful count."""
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.json").write_text("".join(json.dumps({"k": i % 3}) + "\n" for i in range(7)))
    (src / "b.json").write_text("".join(json.dumps({"k": i % 2}) + "\n" for i in range(4)))
    stream = spark.readStream.schema("k long").option("maxFilesPerTrigger", 1).json(str(src))
    query = (
        stream.groupBy("k")
        .count()
        .writeStream.outputMode("complete")
        .format("memory")
        .queryName("watch_metrics_progress")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(300)
        reports = query.recentProgress
        last = query.lastProgress
    finally:
        query.stop()
    assert len(reports) >= 2 and last is not None

    metrics = WatchMetrics(clock=clock)
    for report in reports:
        metrics.observe_progress(report, query="watch")
    metrics.observe_progress(last, query="watch")  # the last report again, as lastProgress: counted once
    with metrics.serve(0) as server:
        got = scrape(server.url)
    assert samples(got, "tidegauge_metric_rows_rejected_total") == {}
    lf = {"query": "watch"}
    assert samples(got, "tidegauge_input_rows_total") == {labels(**lf): 11}  # every row of both files, once
    assert samples(got, "tidegauge_last_batch_id") == {labels(**lf): last["batchId"]}
    assert samples(got, "tidegauge_microbatch_input_rows") == {labels(**lf): last["numInputRows"]}
    durations = samples(got, "tidegauge_microbatch_duration_seconds")
    assert durations == {labels(**lf, phase=p): ms / 1000 for p, ms in last["durationMs"].items()}
    assert labels(**lf, phase="triggerExecution") in durations
    state_rows = samples(got, "tidegauge_state_rows")
    assert sum(state_rows.values()) == 3  # keys 0, 1, 2 in the state store


# -- the registry and the endpoint -----------------------------------------------------------------------
def test_each_watch_has_its_own_registry_never_the_global_one(clock):
    a = WatchMetrics(clock=clock)
    b = WatchMetrics(clock=clock)
    a.add_records(0, "t", 1)
    assert a.registry is not b.registry
    assert b.registry.get_sample_value("tidegauge_records_total", {"region": "0", "topic": "t"}) is None
    global_names = {f.name for f in prometheus_client.REGISTRY.collect()}
    assert not any(name.startswith("tidegauge_") for name in global_names)


def test_serve_refuses_a_port_in_use_by_name_and_close_frees_it(clock):
    metrics = WatchMetrics(clock=clock)
    server = metrics.serve(0)
    port = server.port
    with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
        metrics.serve(port)
    server.close()
    with socket.create_server(("127.0.0.1", port)):  # the port is free again
        pass
    with metrics.serve(port) as again:
        assert scrape(again.url)[("tidegauge_heartbeat_interval_seconds", labels())] == 60.0


def test_bad_construction_is_named():
    with pytest.raises(ValueError, match="heartbeat_interval_ms must be positive, got 0"):
        WatchMetrics(heartbeat_interval_ms=0)


def test_the_change_stream_has_series_of_its_own_beside_the_watch_query(watch):
    """With --changes the CLI feeds the change stream's progress and lag too (query="changes"): its own series, so
    a stalled or lagging change stream is seen; none of it is rejected."""
    metrics, url = watch
    metrics.observe_progress(REAL_PROGRESS, query="watch")
    later = {**REAL_PROGRESS, "timestamp": "2026-11-26T07:09:00.000Z", "batchId": 3}
    metrics.observe_progress(later, query="changes")
    metrics.set_lag(0, "s_v1", 3, latest_offset=1_500, next_offset=1_200, query="watch")
    metrics.set_lag(0, "s_v1", 3, latest_offset=1_500, next_offset=1_000, query="changes")
    got = scrape(url)
    assert samples(got, "tidegauge_last_batch_id") == {labels(query="watch"): 9, labels(query="changes"): 3}
    assert samples(got, "tidegauge_last_progress_timestamp_seconds") == {
        labels(query="watch"): REAL_TIMESTAMP,
        labels(query="changes"): REAL_TIMESTAMP + 26,
    }
    assert samples(got, "tidegauge_offset_lag_records") == {
        labels(query="watch", region=0, topic="s_v1", partition=3): 300,
        labels(query="changes", region=0, topic="s_v1", partition=3): 500,
    }
    assert samples(got, "tidegauge_metric_rows_rejected_total") == {}
