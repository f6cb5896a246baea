"""Spark modules pyspark does not ship (its Kafka source, its Avro functions), for the benchmarks that compare them
with tidegauge's own code: `connector_jars` resolves one from Maven Central by a descriptor under bench/jvm/ through
`sim.maven` (once per machine and Spark version), and `session_conf` puts the jars on the class path of a session
tidegauge starts, as `pipelines.watch.checkpoint` does for S3A.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from pipelines.core.errors import UsageError

JVM = Path(__file__).resolve().parent / "jvm"  # bench/jvm/<name>/pom.xml


def spark_version() -> str:
    import pyspark

    return pyspark.__version__


def connector_jars(
    name: str, descriptor: str, artifact: str, label: str, progress: Callable[[str], None] | None = None
) -> list[Path]:
    """`artifact` (e.g. spark-avro) at pyspark's Spark version, with what it needs that pyspark lacks, as
    bench/jvm/`descriptor`/pom.xml names them; cached as `name`-<version>. UsageError says what to do when they
    cannot be resolved."""
    from sim import maven

    version = spark_version()
    jar_set = maven.JarSet(
        name=name,
        version=version,
        pom=JVM / descriptor / "pom.xml",
        label=f"{label} ({artifact}_2.13 {version})",
        needs=f"{label} needs",
        marker=f"{artifact}_2.13-{version}.jar",
        properties={"spark.version": version},
    )
    try:
        lib = maven.resolve(jar_set, progress=progress)
    except maven.JarsError as exc:
        raise UsageError(str(exc)) from None
    return sorted(lib.glob("*.jar"))


def with_jars(conf: Mapping[str, str], master: str | None, jars: list[Path]) -> dict[str, str]:
    """`conf` plus `jars` on the class path of a session tidegauge starts: the driver's in local mode (its executors
    share it), `spark.jars` on a cluster. Not under spark-submit, whose JVM already runs: give it `--packages` or
    `--jars` there."""
    out = dict(conf)
    master = master or os.environ.get("SPARK_MASTER") or "local[*]"
    key, sep = (
        ("spark.driver.extraClassPath", os.pathsep) if master.startswith("local") else ("spark.jars", ",")
    )
    out[key] = sep.join([*([conf[key]] if conf.get(key) else []), *map(str, jars)])
    return out
