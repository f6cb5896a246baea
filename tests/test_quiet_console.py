"""A quiet console (issue 16, finding 7): an unreachable broker is one line and exit 2, not ~190 librdkafka lines.

Spark's own noise: start-up notices below the default level (log4j2.properties), and its Python workers' own
prints (which the JVM copies to its stderr below any log level) filtered out of the JVM's stderr; what a whole
`tidegauge watch` run shows is checked on the runs of tests/pipelines/watch/test_watch_job.py (kill and restart).
"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from div.kafka_log import _OncePerKind, client_logger, consumer_config


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("tidegauge.kafka.client", logging.ERROR, __file__, 1, msg, (), None)


def test_one_line_per_kind_of_client_error():
    f = _OncePerKind(every_s=60)
    refused = (
        "FAIL [rdkafka#consumer-1] 127.0.0.1:1/bootstrap: Connect failed: Connection refused (after {}ms)"
    )
    assert f.filter(_record(refused.format(0)))
    assert not f.filter(_record(refused.format(51)))  # the same refusal again, other numbers
    assert f.filter(_record("FAIL [rdkafka#consumer-1] SASL authentication error"))  # another kind passes


def test_clients_log_through_python_logging_and_user_settings_win():
    conf = consumer_config("kafka://h:9092", {"security.protocol": "SSL"})
    assert conf["logger"] is client_logger() and conf["security.protocol"] == "SSL"


@pytest.mark.parametrize(
    "argv",
    [
        ["lag", "--store", "s", "--version", "1", "--source", "0=kafka://127.0.0.1:1"],
        ["div", "validate", "--source", "0=kafka://127.0.0.1:1"],
    ],
)
def test_an_unreachable_broker_is_one_line_and_exit_2(tmp_path, argv):
    run = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *argv, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "kafka://127.0.0.1:1" in lines[0]


def test_python_workers_own_prints_are_filtered_out_of_the_jvms_stderr():
    """The driver-side worker of transformWithStateInPandas (`tidegauge watch`) prints four lines, each followed
    by an empty one, at every query start; everything else the JVM writes passes, in order."""
    import os
    import threading

    from pipelines.core.spark_session import _forward

    worker = "Streaming TransformWithStateInPandas Python worker"
    noise = [
        f"Starting {worker}.",
        f"{worker} finish init stage of Python runner. Received UDF from JVM: <bound method ...>",
        f"{worker} received parameters for UDF. State server port/path: 40889, key schema: StructType([])",
        f"{worker} Starting execution of UDF: <bound method ...>.",
    ]
    kept = [
        "WARNING: Using incubator modules: jdk.incubator.vector",
        "26/11/26 10:00:00 ERROR TaskSetManager: Task 0 in stage 1.0 failed 1 times; aborting job",
        "",  # an empty line of the JVM's own
        "Traceback (most recent call last):",
        '  File "worker.py", line 1, in <module>',
    ]
    jvm = "".join(line + "\n\n" for line in noise[:2]) + "\n".join(kept[:3]) + "\n"
    jvm += "".join(line + "\n\n" for line in noise[2:]) + "\n".join(kept[3:]) + "\nno newline at the end"
    pipe_r, pipe_w = os.pipe()
    console_r, console_w = os.pipe()
    forward = threading.Thread(target=_forward, args=(pipe_r, console_w))
    forward.start()
    for i in range(0, len(jvm), 7):  # the JVM writes in pieces that cut lines anywhere
        os.write(pipe_w, jvm[i : i + 7].encode())
    os.close(pipe_w)
    forward.join(10)
    with open(console_r, "rb") as console:
        assert console.read().decode() == "\n".join(kept) + "\nno newline at the end"


def test_the_aws_sdk_bundles_slf4j_notice_is_filtered_out_too():
    """The AWS SDK bundle (Hadoop's S3 connector, on the class path for an s3a:// watch checkpoint) shades an SLF4J
    1.7 that says in three lines, at its first use, that it found no binding; any other SLF4J line passes."""
    import os
    import threading

    from pipelines.core.spark_session import _forward

    jvm = (
        'SLF4J: Failed to load class "org.slf4j.impl.StaticLoggerBinder".\n'
        "SLF4J: Defaulting to no-operation (NOP) logger implementation\n"
        "SLF4J: See http://www.slf4j.org/codes.html#StaticLoggerBinder for further details.\n"
        "SLF4J: Class path contains multiple SLF4J providers.\n"
        "26/11/26 10:00:00 ERROR MicroBatchExecution: Query failed\n"
    )
    pipe_r, pipe_w = os.pipe()
    console_r, console_w = os.pipe()
    forward = threading.Thread(target=_forward, args=(pipe_r, console_w))
    forward.start()
    os.write(pipe_w, jvm.encode())
    os.close(pipe_w)
    forward.join(10)
    with open(console_r, "rb") as console:
        assert console.read().decode() == "\n".join(jvm.splitlines()[3:]) + "\n"


@pytest.mark.spark
@pytest.mark.slow
def test_spark_start_up_notices_stay_below_the_default_level(tmp_path):
    from pathlib import Path

    from sim import SimConfig
    from sim import run as simulate

    sim = simulate(
        SimConfig(
            out=str(tmp_path / "sim"),
            seed=2,
            regions=2,
            partitions=1,
            records=200,
            keys=50,
            batch_records=10,
            step_records=200,
            progress=False,
            workers="inline",
        )
    )
    tidegauge = Path(sys.executable).parent / "tidegauge"
    run = subprocess.run(
        [
            str(tidegauge),
            "leapfrog",
            "--store",
            "sim_store",
            "--version",
            "1",
            "--source",
            f"0={sim.archives[0]}",
            "--source",
            f"1={sim.archives[1]}",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode in (0, 1), run.stderr
    for noise in ("Using Spark's default log4j profile", "NativeCodeLoader", "setLogLevel", " WARN "):
        assert noise not in run.stderr, run.stderr
    assert "tidegauge.leapfrog" in run.stderr  # our own summary line still arrives
