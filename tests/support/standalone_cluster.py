"""A real Spark standalone cluster on loopback, started from pyspark's own `bin/spark-class`.

A master and N workers (one core each), every worker with its own working directory, so an executor resolves a
relative path somewhere the driver never looked: the setting in which `leapfrog` once read 0 records and said
"0 findings". Jobs run against it as separate driver processes (`tidegauge ... --master spark://...`), because one
Python process holds one SparkContext and the test run's is local.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyspark


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    master_url: str
    ui_url: str
    root: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """Environment for a driver process of this cluster: loopback, this venv's Python on executors, and the
        environment the cluster was started with (`standalone_cluster(env=...)`)."""
        return {
            **os.environ,
            **self.extra_env,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }


def _spark_env(root: Path, extra: dict[str, str]) -> dict[str, str]:
    home = os.path.dirname(pyspark.__file__)
    return {
        **os.environ,
        **extra,
        "SPARK_HOME": home,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(root / "logs"),
        "SPARK_NO_DAEMONIZE": "1",
        "PYSPARK_PYTHON": sys.executable,
    }


def _alive_workers(ui_url: str) -> int:
    try:
        with urllib.request.urlopen(f"{ui_url}/json/", timeout=2) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except OSError:
        return 0


@contextlib.contextmanager
def standalone_cluster(
    root: Path,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1536m",
    timeout_s: float = 90,
    env: dict[str, str] | None = None,
) -> Iterator[Cluster]:
    """Start a master and `workers` workers; yields the Cluster once every worker has registered; stops all.

    `env`: more environment for the master and workers (and so their executors) and for the drivers started with
    `Cluster.env()`, e.g. an S3 endpoint's AWS variables."""
    root.mkdir(parents=True, exist_ok=True)
    spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    extra = dict(env or {})
    env = _spark_env(root, extra)
    port, ui = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    logs = []

    def start(args: list[str], name: str) -> None:
        log = open(root / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [spark_class, *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=root,
                start_new_session=True,
            )
        )

    try:
        start(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui),
            ],
            "master",
        )
        url = f"spark://127.0.0.1:{port}"
        for i in range(workers):
            work = root / f"worker-{i}"
            work.mkdir(exist_ok=True)
            start(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(cores),
                    "--memory",
                    memory,
                    "--work-dir",
                    str(work),
                    "--webui-port",
                    str(free_port()),
                ],
                f"worker-{i}",
            )
        ui_url = f"http://127.0.0.1:{ui}"
        deadline = time.monotonic() + timeout_s
        while _alive_workers(ui_url) < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                tails = {f.name: Path(f.name).read_bytes()[-2000:].decode(errors="replace") for f in logs}
                raise RuntimeError(f"the standalone cluster did not come up: {tails}")
            time.sleep(0.5)
        yield Cluster(url, ui_url, root, extra)
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for f in logs:
            f.close()
