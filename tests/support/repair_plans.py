"""A repair plan written as `tidegauge repair plan` publishes it, for the tests of `repair apply` and `repair
verify` (which need a plan, not the simulation behind one)."""

from __future__ import annotations

import pyarrow as pa

from pipelines.core.output import OutputDir
from pipelines.repair.job import PLAN_SCHEMA


def write_plan(path, store: str, rows: list[dict], ignore: list[dict] | None = None) -> None:
    """A plan directory as `tidegauge repair plan` publishes it."""
    with OutputDir(str(path), "repair plan") as out:
        out.write_table("plan", pa.Table.from_pylist(rows, schema=PLAN_SCHEMA))
        out.write_json(
            "summary.json",
            {
                **out.common_fields("repair plan", 0),
                "store": store,
                "version": 1,
                "writes_dcr_would_ignore": ignore or [],
            },
        )
