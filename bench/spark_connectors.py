"""Spark modules pyspark does not ship (its Kafka source, its Avro functions), for the benchmarks that compare them
with tidegauge's own code: `connector_jars` resolves one from Maven Central by a descriptor under bench/jvm/
(`sim.maven`: once per machine and Spark version), and `pipelines.core.spark_jars.with_jars` puts them on a session's
class path, as it does the watch's S3A connector.
"""

from __future__ import annotations

from collections.abc import Callable
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
        return maven.jars(jar_set, progress=progress)
    except maven.JarsError as exc:
        raise UsageError(str(exc)) from None
