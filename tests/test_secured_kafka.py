"""Secured Kafka, proven on a real broker (issue 41, item 3): SASL_SSL with SCRAM-SHA-512 and mutual TLS, under
ACLs, read through `--conf` as production clusters are.

One secured Apache Kafka node for the test run (`secured_kafka`: PLAINTEXT for the super user, SASL_SSL and SSL
with a required client certificate, KRaft's StandardAuthorizer; sim/kafka_security.py). A small three-region
simulation with a dropped and a poisoned write gives the records: region 0's VT and RT are copied into the broker,
regions 1 and 2 stay archives (Leap Frog reads one topic name per region, and one cluster holds one topic of a
name). The job's principals, SCRAM user `reader` and the client certificate's CN, may Read, Describe and
DescribeConfigs those two topics and nothing else; `nosy` may only Describe them.

- `leapfrog`, `div validate`, `changes` and the watch give, through SASL_SSL and through mutual TLS, exactly what
  they give over PLAINTEXT: the same listener-independent records, so any difference is the security path's;
- a wrong password, an expired certificate, a certificate of a CA the broker does not trust, a broker certificate
  the client does not trust and a principal without Read end in exit 2 within seconds, with one line naming the source and the cause, no traceback;
- the SCRAM password and the client key's password appear nowhere tidegauge writes or prints: stdout, stderr (its
  logs and Spark's), every output file (summary.json, findings, the report), the watch's metrics, Spark's event log
  and the Spark UI's SQL, jobs, stages and environment pages and REST answers, fetched while the driver runs.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from kafka_copy import produce_archive
from small_sim import SmallSim, small_sim

from pipelines.cli import main
from sim.kafka_security import MTLS_CN

pytestmark = [pytest.mark.kafka_real, pytest.mark.spark, pytest.mark.slow]

SUPPORT = Path(__file__).resolve().parent / "support"
FAIL_WITHIN_S = 20  # a refused login or handshake is known at once; librdkafka's metadata timeout is 10 s


@dataclass
class World:
    sim: SmallSim
    root: Path
    uris: dict[str, str]  # listener -> kafka:// URI of the secured broker
    kafka: dict[str, dict]  # case -> librdkafka settings (`kafka:` of a --conf file)
    secrets: tuple[str, ...]  # what must never be shown

    def conf(self, case: str, spark: dict | None = None) -> Path:
        """A --conf file with the case's Kafka settings (and Spark settings)."""
        path = self.root / f"{case}.yaml"
        body = {"kafka": self.kafka[case]}
        if spark:
            body["spark"] = {"conf": spark}
        path.write_text(yaml.safe_dump(body))
        return path

    def listener(self, case: str) -> str:
        return self.kafka[case].get("security.protocol", "PLAINTEXT")

    def sources(self, case: str) -> list[str]:
        """--source flags: region 0 on the broker through the case's listener, 1 and 2 the archives."""
        out = ["--source", f"0={self.uris[self.listener(case)]}"]
        for region in (1, 2):
            out += ["--source", f"{region}={self.sim.archives[region]}"]
        return out


@pytest.fixture(scope="module")
def world(secured_kafka, tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("secured")
    sim = small_sim(root / "sim", faults={"dropped": 1, "poisoned": 1})
    vt, rt = sim.topic, f"{sim.store}_rt"
    secured_kafka.create_topics({vt: 2, rt: 2})
    for topic in (vt, rt):
        produce_archive(secured_kafka.bootstrap_servers, sim.archives[0], topic, topic, range(2))
    password, nosy_password = secrets.token_urlsafe(18), secrets.token_urlsafe(18)
    secured_kafka.add_scram_user("reader", password)
    secured_kafka.add_scram_user("nosy", nosy_password)
    for principal in ("User:reader", f"User:{MTLS_CN}"):
        secured_kafka.allow(principal, [vt, rt], ("READ", "DESCRIBE", "DESCRIBE_CONFIGS"))
    secured_kafka.allow("User:nosy", [vt, rt], ("DESCRIBE",))
    certs = secured_kafka.certs
    uris = {"PLAINTEXT": secured_kafka.uri}
    uris |= {name: "kafka://" + secured_kafka.listener_servers(name) for name in ("SASL_SSL", "SSL")}
    kafka = {
        "plaintext": {},
        "sasl": certs.scram_conf("reader", password),
        "mtls": certs.mtls_conf(),
        "wrong-password": certs.scram_conf("reader", "not-" + password),
        "expired-cert": certs.mtls_conf(certs.expired_cert),
        "untrusted-cert": certs.mtls_conf(certs.untrusted_cert),
        "untrusted-broker": {**certs.mtls_conf(), "ssl.ca.location": str(certs.untrusted_ca)},
        "no-read": certs.scram_conf("nosy", nosy_password),
    }
    return World(sim, root, uris, kafka, (password, nosy_password, certs.key_password))


def _run(argv: list, capfd=None) -> tuple[int, str, float]:
    """`tidegauge ARGV` in this process (the shared SparkSession): exit code, stdout + stderr (when `capfd` is
    given), seconds."""
    if capfd is not None:
        capfd.readouterr()
    t0 = time.monotonic()
    code = main([str(a) for a in argv])
    took = time.monotonic() - t0
    if capfd is None:
        return code, "", took
    out, err = capfd.readouterr()
    return code, out + err, took


def _files_text(root: Path) -> str:
    """Every file under `root`, as text (binary files decoded leniently: a secret would still show)."""
    return "\n".join(
        p.read_bytes().decode("utf-8", "replace") for p in sorted(root.rglob("*")) if p.is_file()
    )


def _assert_hidden(world: World, **texts: str) -> None:
    for name, text in texts.items():
        for secret in world.secrets:
            assert secret not in text, f"a secret shows in {name}"


def _sorted_rows(path: Path) -> list[str]:
    return sorted(repr(r) for r in pq.read_table(path).to_pylist())


def _jobs(world: World, case: str, out: Path, capfd) -> dict[str, tuple]:
    """leapfrog, div validate and changes over region 0 through the case's settings: per job, (exit code, rows)."""
    sim, conf = world.sim, world.conf(case)
    got = {}
    code, text, _ = _run(
        ["leapfrog", "--store", sim.store, "--version", sim.version, *world.sources(case)]
        + ["--out", out / "leapfrog", "--conf", conf],
        capfd,
    )
    got["leapfrog"] = (code, _sorted_rows(out / "leapfrog" / "inconsistencies"))
    summary = json.loads((out / "leapfrog" / "summary.json").read_text())
    got["leapfrog verdict"] = (summary["verdict"], summary.get("latest_records_kept"))
    uri = world.uris[world.listener(case)]
    code, more, _ = _run(
        [
            "div",
            "validate",
            "--source",
            f"0={uri}",
            "--topic",
            sim.topic,
            "--out",
            out / "div",
            "--conf",
            conf,
        ],
        capfd,
    )
    text += more
    got["div validate"] = (code, _sorted_rows(out / "div" / "errors"))
    code, more, _ = _run(
        ["changes", "--store", sim.store, "--version", sim.version, "--source", uri, "--regions", 3]
        + ["--out", out / "changes", "--conf", conf],
        capfd,
    )
    text += more
    got["changes"] = (code, _sorted_rows(out / "changes" / "changes"))
    _assert_hidden(world, output=text, files=_files_text(out))
    return got


@pytest.fixture(scope="module")
def over_plaintext(world, tmp_path_factory) -> dict[str, tuple]:
    """What the jobs give over the PLAINTEXT listener (the super user): the answers the secured reads must give."""
    got = _jobs(world, "plaintext", tmp_path_factory.mktemp("plaintext"), None)
    assert got["leapfrog"][0] == 1 and got["leapfrog"][1], "the faults must give findings to compare"
    assert got["changes"][0] == 0 and got["changes"][1]
    return got


@pytest.mark.parametrize("case", ["sasl", "mtls"])
def test_jobs_read_through_sasl_ssl_and_mutual_tls_exactly_as_over_plaintext(
    world, over_plaintext, case, tmp_path, capfd
):
    assert _jobs(world, case, tmp_path, capfd) == over_plaintext


@pytest.mark.parametrize(
    "case,cause",
    [
        ("wrong-password", "authentication failed"),
        ("expired-cert", "TLS handshake failed: the broker refused the client's certificate"),
        ("untrusted-cert", "TLS handshake failed: the broker refused the client's certificate"),
        ("untrusted-broker", "TLS handshake failed: the client refused the broker's certificate"),
        ("no-read", "not authorized to read"),
    ],
)
def test_a_refused_credential_ends_in_exit_2_at_once_naming_the_source_and_the_cause(
    world, case, cause, tmp_path, capfd
):
    sim = world.sim
    code, text, took = _run(
        ["leapfrog", "--store", sim.store, "--version", sim.version, *world.sources(case)]
        + ["--out", tmp_path / "out", "--conf", world.conf(case)],
        capfd,
    )
    assert code == 2, text
    assert took < FAIL_WITHIN_S, f"{case}: {took:.1f} s"
    [line] = [ln for ln in text.splitlines() if ln.startswith("tidegauge leapfrog: error:")]
    print(f"{case}: exit 2 after {took:.1f} s: {line}")
    assert f"source 0={world.uris[world.listener(case)]}" in line
    assert cause in line
    assert f"security.protocol={world.listener(case)}" in line
    assert "Traceback" not in text
    assert not (tmp_path / "out").exists()
    _assert_hidden(world, output=text)


def test_the_watch_reads_through_sasl_ssl_what_the_nightly_job_finds(world, over_plaintext, spark, tmp_path):
    from prometheus_client import generate_latest

    from pipelines.core.sources import SourceSpec
    from pipelines.watch.job import WatchOptions, read_findings, start
    from pipelines.watch.metrics import WatchMetrics

    sim = world.sim
    opts = WatchOptions(
        store=sim.store,
        version=sim.version,
        sources=[SourceSpec(0, world.uris["SASL_SSL"])] + [SourceSpec(r, sim.archives[r]) for r in (1, 2)],
        checkpoint=str(tmp_path / "checkpoint"),
        out=str(tmp_path / "watch"),
        kafka_conf={0: world.kafka["sasl"]},
    )
    metrics = WatchMetrics()
    for q in start(spark, opts, metrics, available_now=True):
        q.awaitTermination()
    found = read_findings(opts.out).to_pylist()
    nightly = [eval(r) for r in over_plaintext["leapfrog"][1]]  # noqa: S307 - our own repr of plain rows
    named = sorted((r["partition"], r["region_a"], r["region_b"], r["key"], r["type"]) for r in found)
    assert named == sorted(
        (r["partition"], r["region_a"], r["region_b"], r["key"], r["type"]) for r in nightly
    )
    _assert_hidden(world, metrics=generate_latest(metrics.registry).decode(), files=_files_text(tmp_path))


def test_no_secret_shows_in_outputs_logs_the_report_metrics_event_log_or_spark_ui(world, tmp_path, capfd):
    """One driver process (tests/support/spark_ui_run.py) runs leapfrog through SASL_SSL and div validate on Spark
    through mutual TLS, with Spark's UI and event log on and tidegauge's debug logging, then saves the UI's pages;
    the report is made from the outputs. Every byte is searched for both secrets. (The outputs and output of
    `changes` and the watch's metrics are searched by the tests above.)"""
    sim = world.sim
    events = tmp_path / "events"
    events.mkdir()
    canary = "canary-" + secrets.token_hex(
        8
    )  # not a secret: proves the texts searched hold the configuration
    spark = {
        "spark.tidegauge.test.canary": canary,
        "spark.ui.enabled": "true",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false",  # Spark 4 compresses it (zstd) by default: searched as text here
        "spark.sql.shuffle.partitions": "4",
    }
    out = tmp_path / "out"
    uri_mtls = world.uris["SSL"]
    spec = {
        "commands": [
            ["-v", "leapfrog", "--store", sim.store, "--version", str(sim.version), *world.sources("sasl")]
            + ["--out", str(out / "leapfrog"), "--conf", str(world.conf("sasl", spark))],
            ["-v", "div", "validate", "--engine", "spark", "--source", f"0={uri_mtls}", "--topic", sim.topic]
            + ["--out", str(out / "div"), "--conf", str(world.conf("mtls", spark))],
        ],
        "pages": str(tmp_path / "pages.json"),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT.parent.parent), str(SUPPORT)])}
    done = subprocess.run(
        [sys.executable, str(SUPPORT / "spark_ui_run.py"), str(tmp_path / "spec.json")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [1, 0], done.stderr[-3000:]
    report = ["report", "--leapfrog", out / "leapfrog", "--div", out / "div", "--out", out / "report"]
    code, report_output, _ = _run(report, capfd)
    assert code in (0, 1), report_output
    pages = json.loads((tmp_path / "pages.json").read_text())
    sql_pages = [u for u in pages if "/SQL/execution/" in u]
    # the plans of the scans that carried the settings are there to be searched, in the UI and in the event log
    assert len(sql_pages) >= 2 and all("MapInArrow" in pages[u] for u in sql_pages), sorted(pages)
    event_log = _files_text(events)
    # (the UI's environment page fills its tables from the REST answer, which is searched too)
    assert canary in event_log and canary in pages[next(u for u in pages if u.endswith("/environment"))]
    assert event_log.count('"Event":"org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart"') >= 2
    assert (out / "report").exists() and (out / "leapfrog" / "summary.json").exists()
    _assert_hidden(
        world,
        stdout=done.stdout,
        stderr=done.stderr,
        report_output=report_output,
        pages=json.dumps(pages),
        files=_files_text(out),
        event_log=event_log,
    )
