"""Run tidegauge commands in one driver process with Spark's UI on, then save what the UI shows: the pages a user
(or anyone who reaches the driver's port) would read while the application runs.

    python tests/support/spark_ui_run.py SPEC.json

SPEC: {"commands": [[argv of `tidegauge`], ...], "watch": {WatchOptions fields} or null, "pages": PATH}. The
commands run in order through `pipelines.cli.main`, so they share one SparkSession (the first one's `--conf`
`spark: conf:` starts it: UI and event log settings go there); `watch` then runs the watch's query over what is
available (its Prometheus metrics saved beside the pages). Then the UI's SQL and environment pages, each SQL
execution's page, and the REST API's sql (with plans) and environment answers are fetched on loopback and written
to PAGES as JSON {url: text}. Prints the commands' exit codes as a JSON list on its last line.
"""

from __future__ import annotations

import json
import sys
import urllib.request


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode("utf-8", "replace")


def main(spec_path: str) -> int:
    from pyspark.sql import SparkSession

    from pipelines.cli import main as tidegauge

    spec = json.loads(open(spec_path).read())
    codes = [tidegauge(list(argv)) for argv in spec["commands"]]
    spark = SparkSession.getActiveSession()
    pages: dict[str, str] = {}
    if spec.get("watch"):
        from prometheus_client import generate_latest

        from pipelines.core.sources import SourceSpec
        from pipelines.watch.job import WatchOptions, start
        from pipelines.watch.metrics import WatchMetrics

        w = dict(spec["watch"])
        w["sources"] = [SourceSpec(int(r), uri) for r, uri in w["sources"].items()]
        w["kafka_conf"] = {int(r): c for r, c in w.get("kafka_conf", {}).items()}
        metrics = WatchMetrics()
        for q in start(spark, WatchOptions(**w), metrics, available_now=True):
            q.awaitTermination()
        pages["watch metrics"] = generate_latest(metrics.registry).decode()
    ui = spark.sparkContext.uiWebUrl
    app = spark.sparkContext.applicationId
    for path in ("/SQL/", "/environment/", "/jobs/", "/stages/"):
        pages[ui + path] = _get(ui + path)
    for path in ("sql?details=true&planDescription=true", "environment"):
        url = f"{ui}/api/v1/applications/{app}/{path}"
        pages[url] = _get(url)
    for execution in json.loads(
        pages[f"{ui}/api/v1/applications/{app}/sql?details=true&planDescription=true"]
    ):
        url = f"{ui}/SQL/execution/?id={execution['id']}"
        pages[url] = _get(url)
    with open(spec["pages"], "w") as f:
        json.dump(pages, f)
    print(json.dumps(codes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
