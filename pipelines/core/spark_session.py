"""One place that builds SparkSessions, so jobs, tests and benchmarks configure Spark the same way.

A session costs seconds to start; callers share one. Java 17 is checked first because PySpark's own
error for a missing JVM is a long, unhelpful stack trace.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql import SparkSession

from pipelines.core import interrupts


class JavaMissingError(RuntimeError):
    """Spark needs a Java 17 runtime and none was found."""


def check_java() -> str:
    """Return the Java version string, or raise JavaMissingError with a message that says what to install."""
    java = shutil.which(
        "java", path=os.path.join(os.environ["JAVA_HOME"], "bin") if "JAVA_HOME" in os.environ else None
    )
    java = java or shutil.which("java")
    if not java:
        raise JavaMissingError(
            "Spark needs Java 17 and no `java` was found on PATH or in $JAVA_HOME. "
            "Install it (Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`) and retry."
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    m = re.search(r'version "(\d+)', out)
    major = int(m.group(1)) if m else 0
    if major < 17:
        raise JavaMissingError(f"Spark 4 needs Java 17 or newer; `{java} -version` says: {out.strip()!r}")
    return out.splitlines()[0] if out else "java"


# Lines the JVM prints on its stderr below any log4j level, meaning nothing to the user. Spark's JVM copies its
# Python workers' output to its stderr as it is: the driver-side worker of transformWithStateInPandas (`tidegauge
# watch`) says, at each query start, that it started, which UDF it got and that it ran it, each line followed by
# an empty one. The AWS SDK bundle (Hadoop's S3 connector, `watch --checkpoint s3a://`) shades an SLF4J 1.7 of its
# own, which finds no binding beside Spark's SLF4J 2 and says so in three lines at its first use: the SDK's own
# logging is off, which is all they mean.
_WORKER_NOISE = re.compile(
    rb"(Starting )?Streaming TransformWithStateInPandas Python worker\b"
    rb'|SLF4J: (Failed to load class "org\.slf4j\.impl\.StaticLoggerBinder"|Defaulting to no-operation \(NOP\) '
    rb"logger implementation|See http://www\.slf4j\.org/codes\.html#StaticLoggerBinder)"
)


def _forward(pipe: int, console: int) -> None:
    """Copy the JVM's stderr (`pipe`) to the console line by line, less `_WORKER_NOISE` and the empty line after
    each of those; until the JVM and whatever it started have closed their end. Nothing once the run is
    interrupted: what the JVM and its Python workers say while their jobs are cancelled under them (broken pipes,
    killed tasks) is not the user's business, who asked for the run to stop."""
    after_noise = False
    with open(pipe, "rb") as lines:
        for line in lines:
            if interrupts.arrived():
                continue  # read on: a JVM writing into a full pipe would block
            noise = _WORKER_NOISE.match(line) is not None
            if noise or (after_noise and not line.strip()):
                after_noise = noise
                continue
            after_noise = False
            with contextlib.suppress(OSError):  # a console gone: nothing to tell it
                while line:
                    line = line[os.write(console, line) :]
    os.close(console)


@contextlib.contextmanager
def _jvm_stderr_filtered() -> Iterator[None]:
    """A JVM that starts inside the block writes its stderr through `_forward`; this process's own stderr (fd 2)
    is the console again after the block. Where no JVM starts (one already runs), the filter ends at once."""
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    console = os.dup(2)
    threading.Thread(target=_forward, args=(read_end, console), name="spark-stderr", daemon=True).start()
    os.dup2(write_end, 2)  # what the JVM inherits
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(console, 2)


def under_spark_submit() -> bool:
    """This driver was started by `spark-submit`, whose JVM already runs (with the class path, master and
    settings it was given): detected by the gateway spark-submit hands to the Python driver."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_session(
    master: str | None = None, app_name: str = "tidegauge", conf: dict[str, str] | None = None
) -> SparkSession:
    """Get or create the process-wide SparkSession.

    `master` defaults to `local[*]`, or to whatever `spark-submit` already configured. Extra `conf` entries are
    applied verbatim (e.g. from the `spark:` section of a tidegauge YAML file).
    """
    check_java()
    # Executors run our Python code; they must use the same interpreter (and so the same packages) as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    active = SparkSession.getActiveSession()
    # Under spark-submit the JVM starts first and hands its settings (master, --conf) to this driver.
    submitted = under_spark_submit()
    given: set[str] = set()
    if submitted:
        from pyspark import SparkConf, SparkContext

        # Connect to spark-submit's JVM first: only then does SparkConf() read the settings it was given.
        SparkContext._ensure_initialized()
        given = {k for k, _ in SparkConf().getAll()}
    if master:
        builder = builder.master(master)
    elif active is None and not submitted and not os.environ.get("SPARK_MASTER"):
        builder = builder.master("local[*]")
    defaults = {
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Small local runs: the default 200 shuffle partitions mostly cost task overhead.
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "true",
        "spark.driver.memory": "2g",
    }
    if not submitted and active is None and "spark.driver.extraJavaOptions" not in (conf or {}):
        # the driver JVM starts here: give it our log4j2 file, so Spark's start-up notices (default profile,
        # NativeCodeLoader, ...) stay below the default level. Under spark-submit the JVM already runs with the
        # cluster's own logging, which is left alone.
        props = Path(__file__).resolve().parent / "log4j2.properties"
        builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{props}")
    for k, v in defaults.items():
        if k not in given:  # spark-submit's own --conf wins over our defaults
            builder = builder.config(k, v)
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    if not submitted and active is None:
        # the JVM (if not running yet) starts here: its stderr goes through a filter of Python workers' own
        # prints (`_WORKER_NOISE`). Under spark-submit the JVM already runs with the cluster's own console.
        # It stays in the terminal's process group (pyspark starts it ignoring SIGINT; its Python workers do get
        # a Ctrl-C, and what they then say is not copied, `_forward`): a kill of the whole group, by a service
        # manager, `timeout` or a test, stops Spark with the driver, and nothing of it lingers on the outputs.
        with _jvm_stderr_filtered():
            spark = builder.getOrCreate()
    else:
        spark = builder.getOrCreate()
    # a new SparkContext puts pyspark's SIGINT handler in place of ours; ours goes back, and cancels Spark's jobs
    # from a thread of its own (pipelines.core.interrupts says why not from the handler, as pyspark's does)
    interrupts.install()
    interrupts.on_interrupt(_cancel_jobs)
    # `tidegauge -v` shows Spark's warnings too
    spark.sparkContext.setLogLevel("WARN" if logging.getLogger().isEnabledFor(logging.DEBUG) else "ERROR")
    return spark


def _cancel_jobs() -> None:
    """Ctrl-C: stop Spark's running jobs at once (the driver's wait for them ends with an error, not their end)."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is not None:
        sc.cancelAllJobs()


def warn_local_paths(spark: SparkSession, paths: dict[str, str | None]) -> None:
    """On a cluster, say which inputs and outputs are local paths: executors read and write them on their own
    disks, so they must be a mount every node shares (an object store or HDFS URI needs nothing shared)."""
    from pipelines.core.storage import is_local

    master = spark.sparkContext.master
    if master.startswith("local"):
        return
    local = [f"{flag} {path}" for flag, path in paths.items() if path is not None and is_local(path)]
    if local:
        logging.getLogger("tidegauge").warning(
            "on %s, executors open %s on their own disks: every node must see them at the same place (a shared "
            "mount), or give URIs such as s3://bucket/path (docs/spark.md, Storage)",
            master,
            ", ".join(local),
        )
