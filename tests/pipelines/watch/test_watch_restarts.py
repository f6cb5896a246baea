"""A query that fails is started again from its checkpoint, a few times in a row at most."""

from __future__ import annotations

import threading

import pytest

from pipelines.core.errors import UsageError
from pipelines.watch.cli import _Restarts


class FailedQuery:
    name = "tidegauge_watch_watch"

    def __init__(self, batch_id=None, error="Python worker failed to connect back.\nstack..."):
        self.lastProgress = None if batch_id is None else {"batchId": batch_id}
        self._error = error

    def exception(self):
        return None if self._error is None else RuntimeError(self._error)


def test_a_failed_query_is_started_again_then_given_up_after_failures_in_a_row(caplog):
    r, stop, started = _Restarts(base_delay_s=0.0), threading.Event(), []
    again = lambda: started.append(1) or f"query {len(started)}"  # noqa: E731
    assert r.restart("watch", FailedQuery(3), stop, again) == "query 1"
    assert "failed (Python worker failed to connect back.)" in caplog.text
    assert "stack" not in caplog.text  # one line in the log, not Spark's whole message
    for _ in range(4):
        r.restart("watch", FailedQuery(3), stop, again)
    with pytest.raises(UsageError, match="failed 5 times in a row"):
        r.restart("watch", FailedQuery(3), stop, again)
    assert len(started) == 5


def test_a_committed_micro_batch_resets_the_count_and_a_stop_ends_the_wait():
    r, stop = _Restarts(base_delay_s=0.0), threading.Event()
    for _ in range(5):
        r.restart("watch", FailedQuery(3), stop, lambda: "again")
        r.progressed("watch", 3)  # the same batch as at the failure: no progress
    r.progressed("watch", 4)
    assert r.restart("watch", FailedQuery(4), stop, lambda: "again") == "again"
    stop.set()
    failed = FailedQuery(4)
    assert _Restarts(base_delay_s=3600).restart("watch", failed, stop, lambda: "again") is failed


def test_a_query_that_ends_without_an_error_is_not_restarted():
    with pytest.raises(UsageError, match="stopped by itself"):
        _Restarts(0.0).restart("watch", FailedQuery(1, error=None), threading.Event(), lambda: "again")


def test_records_lost_to_retention_are_not_retried_and_the_message_says_what_to_do():
    from pipelines.core.stream_source import RecordsLostError

    spark_text = (
        "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source perform "
        f"latestOffset: Traceback ...\npipelines.core.stream_source.RecordsLostError: {RecordsLostError.MARKER} "
        "(the cluster's retention, or an archive's files removed): 1/s_v1/0 offsets 0 to 99. Start the watch "
        "with a new --checkpoint\n  at org.apache..."
    )
    with pytest.raises(
        UsageError, match=r"stopped: records were deleted .* 1/s_v1/0 offsets 0 to 99\. Start"
    ):
        _Restarts(0.0).restart("watch", FailedQuery(3, spark_text), threading.Event(), lambda: "again")
