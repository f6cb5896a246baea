"""Where the watch's checkpoint may be, and what Spark then needs: the one path tidegauge hands to Spark itself.

Every other path goes through `pipelines.core.storage` (pyarrow's filesystems, no jars). A streaming checkpoint
cannot: Spark writes it through Hadoop's FileSystem API, and the Hadoop client pyspark ships opens local paths,
`file://` and `hdfs://`, not object stores. For `s3a://`, Hadoop's own S3 connector (`hadoop-aws` and the AWS SDK
bundle it depends on) is resolved from Maven Central by `jvm/s3a/pom.xml` beside this package, once per machine,
into the jar cache outside the repository (`sim.maven`, the resolver the Kafka brokers' jars use), at the Hadoop
version of pyspark's own `hadoop-client-api` jar; then, when tidegauge starts Spark itself:

- `local[*]` (the default): the jars go on the driver JVM's class path (`spark.driver.extraClassPath`), which in
  local mode is the executors' too. Not `spark.jars`: Spark copies every `spark.jars` entry into the executor's
  temporary directory at each start, ~690 MB for this bundle, and a watch killed with SIGKILL leaves the copy
  behind. Not `spark.jars.packages`: Spark's Ivy would resolve the same artifacts a second time into a cache of
  its own, reaching for Maven Central at every session start, with its own errors instead of ours.
- another master (`--master spark://...`): `spark.jars`, which Spark ships to executors that lack the cache.

Under `spark-submit` the JVM already runs with the class path the user gave it (`--packages
org.apache.hadoop:hadoop-aws:<Spark's Hadoop version>`, docs/spark.md): nothing is resolved or added, and a session
without the connector is refused before a query starts (`check_session`) rather than failing on
`ClassNotFoundException` inside one.

The store's settings come from the standard AWS environment, as for every other path tidegauge opens:
`AWS_ENDPOINT_URL` becomes `fs.s3a.endpoint` (with path-style access, what S3-compatible servers expect) and
`AWS_REGION` (or `AWS_DEFAULT_REGION`) `fs.s3a.endpoint.region`, each only where the Spark configuration does not
set it already. Credentials are not copied into Spark's configuration: pyspark starts the JVM with every setting
on its command line, where any user of the machine can read it (`ps`); S3A's default credential chain reads
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` from the environment the JVM inherits (then
instance roles), so they need not be. Nothing here logs a setting's value.

`gs://`, `abfs://` and `wasb://` checkpoints are refused, naming the Hadoop connector each would need (tidegauge
resolves none of them); `s3://` and `s3n://` are refused with the spelling Hadoop's S3 connector answers to.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from pipelines.core.errors import UsageError
from pipelines.core.spark_jars import with_jars

S3A_POM = Path(__file__).resolve().parent / "jvm" / "s3a" / "pom.xml"
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
# object stores whose Hadoop connector tidegauge does not resolve: what a user would have to add
_OTHER_CONNECTORS = {
    "gs": "the GCS connector (com.google.cloud.bigdataoss:gcs-connector, its hadoop3 shaded jar)",
    "abfs": "hadoop-azure (org.apache.hadoop:hadoop-azure at Spark's Hadoop version)",
    "abfss": "hadoop-azure (org.apache.hadoop:hadoop-azure at Spark's Hadoop version)",
    "wasb": "hadoop-azure (org.apache.hadoop:hadoop-azure at Spark's Hadoop version)",
    "wasbs": "hadoop-azure (org.apache.hadoop:hadoop-azure at Spark's Hadoop version)",
}


def _scheme(uri: str) -> str:
    """The scheme as written ('' for a plain path): Hadoop tells s3a:// from s3://, pyarrow's spelling does not."""
    return uri.split("://", 1)[0].lower() if "://" in uri else ""


def needs_s3a(uri: str | None) -> bool:
    return uri is not None and _scheme(uri) == "s3a"


def check_checkpoint(uri: str) -> None:
    """Refuse a checkpoint Spark could not write: an object store other than S3, or S3 spelled as Hadoop does not
    know it. Local paths, `file://`, `hdfs://` and `s3a://` pass."""
    scheme = _scheme(uri)
    if scheme in ("s3", "s3n"):
        fixed = "s3a://" + uri.split("://", 1)[1]
        raise UsageError(
            f"--checkpoint {uri}: Spark writes its checkpoint through Hadoop, whose S3 connector answers to "
            f"s3a:// only; give --checkpoint {fixed}"
        )
    if scheme in _OTHER_CONNECTORS:
        raise UsageError(
            f"--checkpoint {uri}: Spark writes its checkpoint through Hadoop, which would need "
            f"{_OTHER_CONNECTORS[scheme]} on Spark's class path, and tidegauge resolves only S3's (s3a://); "
            "give an s3a://, local, file:// or hdfs:// path"
        )


def spark_hadoop_version() -> str:
    """The Hadoop version of the client pyspark ships (its `hadoop-client-api-<version>.jar`): hadoop-aws must be
    the same version as the Hadoop classes it extends."""
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    if not jars.is_dir() and os.environ.get("SPARK_HOME"):
        jars = Path(os.environ["SPARK_HOME"]) / "jars"
    found = sorted(jars.glob("hadoop-client-api-*.jar"))
    if not found:
        raise UsageError(
            f"cannot tell which Hadoop Spark ships: no hadoop-client-api-*.jar in {jars}, so no matching S3A "
            "connector can be resolved"
        )
    return found[-1].name[len("hadoop-client-api-") : -len(".jar")]


def s3a_jars(progress: Callable[[str], None] | None = None) -> list[Path]:
    """The S3A connector's jars at Spark's Hadoop version, resolved on first use (see the module's doc); raises
    UsageError saying what to install or do when they cannot be had."""
    from sim import maven

    version = spark_hadoop_version()
    jar_set = maven.JarSet(
        name="hadoop-aws",
        version=version,
        pom=S3A_POM,
        label=f"Spark's S3A connector (hadoop-aws {version} and the AWS SDK bundle it depends on)",
        needs="an s3a:// checkpoint needs",
        marker=f"hadoop-aws-{version}.jar",
        properties={"hadoop.version": version},
    )
    try:
        return maven.jars(jar_set, progress=progress)
    except maven.JarsError as exc:
        raise UsageError(str(exc)) from None


def _store_settings(conf: Mapping[str, str]) -> dict[str, str]:
    """The AWS environment's endpoint and region as S3A settings, where `conf` does not set them (never
    credentials: see the module's doc)."""
    out: dict[str, str] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if endpoint:
        out["spark.hadoop.fs.s3a.endpoint"] = endpoint
        # an S3-compatible server (MinIO, Ceph, moto) answers at http://host/bucket, not http://bucket.host
        out["spark.hadoop.fs.s3a.path.style.access"] = "true"
    if region:
        out["spark.hadoop.fs.s3a.endpoint.region"] = region
    return {k: v for k, v in out.items() if k not in conf}


def session_conf(
    checkpoint: str,
    conf: Mapping[str, str],
    master: str | None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """`conf` (the Spark settings the session will be built with) plus what a checkpoint on `s3a://` needs when
    tidegauge starts Spark itself: the connector's jars (resolved now, if not yet) and the store's endpoint and
    region. Unchanged for any other checkpoint and under spark-submit."""
    from pipelines.core.spark_session import under_spark_submit

    if not needs_s3a(checkpoint) or under_spark_submit():
        return dict(conf)
    out = with_jars(conf, master, s3a_jars(progress))
    out.update(_store_settings(conf))
    return out


def check_session(spark, checkpoint: str) -> None:
    """Refuse an `s3a://` checkpoint in a session whose Hadoop cannot load S3A (one started without the jars:
    spark-submit without --packages, or a session started before, in this process), before a query fails on it."""
    if not needs_s3a(checkpoint):
        return
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    if hadoop.getClassByNameOrNull(S3A_FILESYSTEM) is None:
        version = spark.sparkContext._jvm.org.apache.hadoop.util.VersionInfo.getVersion()  # this JVM's Hadoop
        raise UsageError(
            f"--checkpoint {checkpoint}: this Spark session cannot load Hadoop's S3 connector ({S3A_FILESYSTEM}); "
            f"under spark-submit add --packages org.apache.hadoop:hadoop-aws:{version} "
            "(docs/spark.md); `tidegauge watch` adds it by itself when it starts Spark"
        )


def progress_line(line: str) -> None:
    """How the watch says it is resolving jars (once per machine: it may take a while)."""
    print(f"tidegauge watch: {line}", file=sys.stderr, flush=True)
