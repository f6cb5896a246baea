"""The watch's checkpoint on S3 (issue 29): `--checkpoint s3a://` puts Hadoop's S3 connector, resolved by Maven from
the repository's own descriptor, on Spark's class path, and takes the store from the AWS environment.

- a watch on a checkpoint in an S3 server on loopback (moto), killed with SIGKILL mid-run and started again, names
  what a nightly run names, each finding once, and its checkpoint is in the bucket, not on local disk; no secret
  reaches the JVM's command line;
- without Maven or Java, or with Maven Central out of reach, it exits 2 saying what to install or do;
- checkpoints Spark could not write (s3://, gs://, abfs://) are refused, naming what would be needed;
- the settings it adds: the jars (on the driver's class path in local mode, `spark.jars` for a cluster), the
  endpoint and region where the user set none, never credentials; nothing under spark-submit.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from leapfrog_histories import generated
from nightly_oracle import named, nightly
from vt_fixtures import STORE, write_archives

from pipelines.core.errors import UsageError
from pipelines.core.stream_source import read_status
from pipelines.watch import checkpoint
from pipelines.watch.job import WatchOptions, read_findings, status_file


def _watch_args(tmp_path: Path, ck: str) -> list[str]:
    return ["watch", "--store", STORE, "--version", "1", "--source", f"0={tmp_path / 'a'}"] + [
        "--source",
        f"1={tmp_path / 'b'}",
        "--checkpoint",
        ck,
        "--out",
        str(tmp_path / "out"),
    ]


def _main(argv: list[str]) -> int:
    from pipelines.cli import main

    return main(argv)


# -- what a watch on s3a:// asks of Spark ----------------------------------------------------------------------
def test_the_descriptor_names_the_hadoop_pyspark_ships():
    # the watch passes pyspark's version to Maven anyway; the descriptor's default (what its comment and the docs
    # quote) must not drift from it unnoticed
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    pom = ET.parse(checkpoint.S3A_POM).getroot()
    assert pom.find("m:properties/m:hadoop.version", ns).text == checkpoint.spark_hadoop_version()


def test_an_s3a_checkpoint_adds_the_jars_and_the_stores_endpoint_never_credentials(monkeypatch):
    jars = [Path("/cache/hadoop-aws.jar"), Path("/cache/bundle.jar")]
    monkeypatch.setattr(checkpoint, "s3a_jars", lambda progress=None: jars)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret")
    mine = {"spark.sql.shuffle.partitions": "2", "spark.driver.extraClassPath": "/opt/mine.jar"}
    conf = checkpoint.session_conf("s3a://b/ck", mine, None)
    assert conf == {
        **mine,
        # local mode: the driver's class path (no copy of ~690 MB per start), after what the user gave
        "spark.driver.extraClassPath": os.pathsep.join(
            ["/opt/mine.jar", "/cache/hadoop-aws.jar", "/cache/bundle.jar"]
        ),
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-3",
    }
    # S3A reads the credentials from the JVM's environment: they stay off the JVM's command line
    assert not any(s in v for v in conf.values() for s in ("AKIDEXAMPLE", "very-secret"))
    # a cluster: Spark ships the jars to executors; the user's own store settings win
    theirs = {"spark.hadoop.fs.s3a.endpoint": "https://s3.example", "spark.jars": "/opt/a.jar"}
    conf = checkpoint.session_conf("s3a://b/ck", theirs, "spark://h:7077")
    assert conf["spark.jars"] == "/opt/a.jar,/cache/hadoop-aws.jar,/cache/bundle.jar"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "https://s3.example"
    assert "spark.driver.extraClassPath" not in conf
    # nothing for another checkpoint, nothing under spark-submit (its JVM runs with the class path it was given)
    assert checkpoint.session_conf("/var/ck", mine, None) == mine
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    assert checkpoint.session_conf("s3a://b/ck", mine, None) == mine


@pytest.mark.parametrize(
    "ck,said",
    [
        ("s3://b/ck", "answers to s3a:// only; give --checkpoint s3a://b/ck"),
        ("gs://b/ck", "would need the GCS connector (com.google.cloud.bigdataoss:gcs-connector"),
        ("abfss://c@a.dfs.core.windows.net/ck", "would need hadoop-azure (org.apache.hadoop:hadoop-azure"),
    ],
)
def test_checkpoints_spark_cannot_write_are_refused_naming_what_they_would_need(tmp_path, capsys, ck, said):
    assert _main(_watch_args(tmp_path, ck)) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _fake_mvn(tmp_path: Path, monkeypatch, body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mvn").write_text("#!/bin/sh\n" + body)
    (bin_dir / "mvn").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_without_maven_java_or_maven_central_an_s3a_watch_exits_2_saying_what_to_do(
    monkeypatch, tmp_path, capsys
):

    monkeypatch.setenv("TIDEGAUGE_CACHE_DIR", str(tmp_path / "cache"))  # nothing resolved yet
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    real_which = shutil.which
    args = _watch_args(tmp_path, "s3a://b/ck")

    def err() -> str:
        return capsys.readouterr().err

    monkeypatch.setattr(shutil, "which", lambda n, *a, **k: None if n == "mvn" else real_which(n, *a, **k))
    assert _main(args) == 2
    said = err()
    assert "an s3a:// checkpoint needs the jars of Spark's S3A connector (hadoop-aws" in said
    assert "no 'mvn' is on PATH; on Debian/Ubuntu: apt-get install -y maven" in said

    _fake_mvn(
        tmp_path,
        monkeypatch,
        'echo "[ERROR] Failed to execute goal: Could not transfer artifact org.apache.hadoop:hadoop-aws:pom:3.5.0 '
        'from/to central: Network is unreachable"\nexit 1\n',
    )
    monkeypatch.setattr(shutil, "which", lambda n, *a, **k: None if n == "java" else real_which(n, *a, **k))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert _main(args) == 2
    assert (
        "an s3a:// checkpoint needs Java 17 or newer and no 'java' is on PATH; on Debian/Ubuntu: apt-get"
        in err()
    )

    monkeypatch.setattr(shutil, "which", real_which)
    assert _main(args) == 2
    said = err()
    assert "mvn could not resolve Spark's S3A connector" in said and "Could not transfer artifact" in said
    assert (
        "Maven Central could not be reached: check the network, or the proxy or mirror in ~/.m2/settings.xml"
        in said
    )
    assert "mvn.log" in said
    assert not (tmp_path / "cache" / "jvm" / f"hadoop-aws-{checkpoint.spark_hadoop_version()}").exists()
    assert not (tmp_path / "out").exists()  # refused before anything was made


# -- the real thing, on moto's S3 server -----------------------------------------------------------------------
def _cmdlines(pgid: int) -> list[str]:
    """The command lines of the processes in process group `pgid` (the watch, its JVM, Python workers)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, ValueError):
                if os.getpgid(int(d.name)) == pgid:
                    out.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return out


@pytest.mark.slow
@pytest.mark.spark
def test_a_watch_on_an_s3a_checkpoint_killed_and_restarted_loses_and_repeats_nothing(
    spark, s3a_jars, tmp_path
):
    """`tidegauge watch --checkpoint s3a://bucket/ck` as a process of its own against moto's S3 server on loopback:
    killed with SIGKILL (its whole process group) at a random moment after its first committed micro-batch, then
    started again from the same checkpoint until it has read everything, then stopped with SIGTERM (exit 0). Its
    findings equal a nightly run's, Leap Frog's and DIV's, each once; the checkpoint's objects (offsets, commits,
    state) are in the bucket and nothing of it on local disk.

    Smaller still than its local-disk twin in test_watch_job.py (two JVM starts are the price of the property):
    five partitions of every mix's histories, a cap of 30 offsets a micro-batch in the first run (so it is killed
    with batches left), none in the second (what is left is one micro-batch), a trigger every second, two state
    partitions."""
    from s3_server import s3_server

    histories = [h for h in generated(20) if h.n_regions == 3][:30][::6]
    dirs = write_archives(histories, tmp_path / "archives")
    expected = nightly(spark, dirs, tmp_path / "batch")
    assert expected, "no finding: losing or repeating one could not be seen"
    from pipelines.core.sources import SourceSpec
    from pipelines.div.validate import ValidateOptions, run_local

    run_local(ValidateOptions(sources=[SourceSpec(x, d) for x, d in dirs.items()], out=str(tmp_path / "div")))

    def div_named(rows) -> list[tuple]:
        return sorted(
            (r["region"], r["topic"], r["partition"], r["offset"], r["type"], r["fatal"]) for r in rows
        )

    expected_div = div_named(pq.read_table(tmp_path / "div" / "errors").to_pylist())
    assert expected_div, "no DIV finding: the comparison would prove nothing"

    # a session started without the connector (this process's) is refused before a query fails on it
    with pytest.raises(
        UsageError, match="cannot load Hadoop's S3 connector.*--packages org.apache.hadoop:hadoop-aws"
    ):
        checkpoint.check_session(spark, "s3a://bucket/ck")

    conf = tmp_path / "watch.yaml"
    # moto's server (werkzeug) answers `Expect: 100-continue` in a way the AWS SDK's asynchronous client, which
    # S3A's copyFromLocalFile uses (RocksDB's state files), reads as a final status 100: S3A retries for minutes.
    # The synchronous path it takes with this setting off handles it (real S3, MinIO: either path works).
    conf.write_text(
        "spark:\n  conf:\n    spark.sql.shuffle.partitions: 2\n"
        "    spark.hadoop.fs.s3a.optimized.copy.from.local.enabled: 'false'\n"
    )
    out = tmp_path / "watch"
    with s3_server() as server:  # its AWS_* environment is the watch's
        bucket = server.bucket()
        argv = [sys.executable, "-m", "pipelines.cli", "watch", "--store", STORE, "--version", "1"]
        argv += [f"--source={x}={d}" for x, d in dirs.items()]
        argv += ["--checkpoint", f"s3a://{bucket}/ck", "--out", str(out), "--conf", str(conf)]
        argv += ["--trigger-interval", "1 second"]

        def committed() -> int:
            return len([k for k in server.keys(bucket, "ck/watch/commits/") if k.rsplit("/", 1)[1].isdigit()])

        def done() -> bool:
            lf, div = read_findings(str(out)).to_pylist(), read_findings(str(out), "div").to_pylist()
            return named(lf) == expected and div_named(div) == expected_div

        runs = [(signal.SIGKILL, ["--max-records-per-trigger", "30"]), (signal.SIGTERM, [])]
        for i, (stop, extra) in enumerate(runs):
            before = committed()
            console = tmp_path / f"run-{i}.log"
            with open(console, "wb") as log:
                proc = subprocess.Popen(argv + extra, stdout=log, stderr=log, start_new_session=True)
            deadline = time.monotonic() + 240
            wanted = (lambda n=before: committed() > n) if stop == signal.SIGKILL else done
            while not wanted() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            assert proc.poll() is None and wanted(), (
                f"run {i} did not get there: {console.read_text()[-3000:]}"
            )
            cmdlines = _cmdlines(proc.pid)
            assert any("bundle-" in c and "spark.driver.extraClassPath" in c for c in cmdlines), cmdlines
            assert not any(server.env["AWS_SECRET_ACCESS_KEY"] in c for c in cmdlines)
            if stop == signal.SIGKILL:
                time.sleep(random.Random(29).uniform(0, 1))  # inside the next micro-batch, between two, ...
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            else:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=120) == 0, console.read_text()[-3000:]
                with contextlib.suppress(
                    ProcessLookupError
                ):  # what the JVM left running (it ends with the CLI)
                    os.killpg(proc.pid, signal.SIGKILL)
            said = console.read_text()
            assert server.env["AWS_SECRET_ACCESS_KEY"] not in said
            assert "tidegauge watch: watching" in said and "SLF4J" not in said, said[-3000:]
        keys = server.keys(bucket, "ck/")
    found = read_findings(str(out)).to_pylist()
    assert named(found) == expected
    assert len({r["finding_id"] for r in found}) == len(found)
    assert div_named(read_findings(str(out), "div").to_pylist()) == expected_div
    # the checkpoint is in the bucket: the query's offsets, commits and state, and the region count
    for part in ("metadata", "offsets/", "commits/", "state/"):
        assert any(k.startswith(f"ck/watch/{part}") for k in keys), (part, keys[:20])
    assert not [k for k in keys if k.startswith(("ck/leapfrog/", "ck/div/"))]  # no query of the old layout
    assert "ck/store-regions.json" in keys
    # which sources answered (tidegauge_source_up) is said in a local file, the checkpoint being remote
    opts = WatchOptions(store=STORE, version=1, sources=[], checkpoint=f"s3a://{bucket}/ck", out=str(out))
    status = read_status(status_file(opts))
    shutil.rmtree(
        Path(status_file(opts)).parent
    )  # its directory is named after this test's bucket: never reused
    assert {r: s["up"] for r, s in status["sources"].items()} == {str(x): True for x in dirs}
    assert not [p for p in tmp_path.rglob("*") if p.name in ("commits", "offsets")]  # and nothing of it here
