"""JVM jars a session tidegauge starts needs beyond pyspark's own (Hadoop's S3A connector for a watch checkpoint on
`s3a://`; the benchmarks' Spark modules), once resolved (`sim.maven.jars`), on the session's class path. Under
spark-submit the JVM already runs: its user gives the jars there (`--packages`, `--jars`), and the callers leave
the configuration alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def with_jars(conf: Mapping[str, str], master: str | None, jars: list[Path]) -> dict[str, str]:
    """`conf` plus `jars` on the class path of a session started with `master`: the driver's in local mode (its
    executors share the JVM), `spark.jars` on a cluster (shipped to the executors)."""
    out = dict(conf)
    master = master or os.environ.get("SPARK_MASTER") or "local[*]"
    key, sep = (
        ("spark.driver.extraClassPath", os.pathsep) if master.startswith("local") else ("spark.jars", ",")
    )
    out[key] = sep.join([*([conf[key]] if conf.get(key) else []), *map(str, jars)])
    return out
