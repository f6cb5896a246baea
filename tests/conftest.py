"""Shared fixtures: one SparkSession per test run, the embedded Kafka cluster, and paths to reference data.

The tests mirror the source tree (tests/leapfrog/, tests/div/, tests/heartbeat/, tests/sim/,
tests/pipelines/<command>/); whole-product contracts sit here at the top and shared helpers in tests/support/.
"venice-protocol-notes §N" in a test cites ../shared/reference/venice-protocol-notes.md, the reference the tests
may read (the product never does).
"""

from __future__ import annotations

import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    """`../shared`: reference schemas and notes. Tests may read it; the product never does."""
    if not SHARED.exists():
        pytest.skip("../shared (reference schemas) is not present next to this checkout")
    return SHARED


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of this test run (a session costs ~7 s to start)."""
    from pipelines.core.spark_session import get_session

    session = get_session("local[2]", app_name="tidegauge-tests", conf={"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def embedded_kafka():
    """One librdkafka mock cluster (1 broker) for the test run; tests create their own uniquely named topics.

    Tests that take brokers down or inject errors must start their own `sim.embedded_kafka.EmbeddedKafka`.
    """
    from sim.embedded_kafka import EmbeddedKafka

    cluster = EmbeddedKafka(brokers=1)
    yield cluster
    cluster.close()
