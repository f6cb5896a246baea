"""`tidegauge leapfrog` as the tests run it: version 1 of a store, over sources given as region → archive or URI."""

from __future__ import annotations

from pipelines.core.sources import SourceSpec
from pipelines.leapfrog.job import LeapfrogOptions, run


def run_leapfrog(spark, store: str, sources: dict[int, str], out, **options) -> int:
    """The job's exit code; `options`: any other `LeapfrogOptions` field (mode, state_dir, plan, ...)."""
    return run(
        LeapfrogOptions(
            store=store,
            version=1,
            out=str(out),
            sources=[SourceSpec(x, str(u)) for x, u in sources.items()],
            **options,
        ),
        spark=spark,
    )
