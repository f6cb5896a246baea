"""A repair plan written as `tidegauge repair plan` publishes it, for the tests of `repair apply` and `repair
verify` (which need a plan, not the simulation behind one)."""

from __future__ import annotations

import pyarrow as pa

from pipelines.core.output import OutputDir
from pipelines.repair.job import PLAN_SCHEMA


def write_plan(path, store: str, rows: list[dict], ignore: list[dict] | None = None) -> None:
    """A plan directory as `tidegauge repair plan` publishes it. `ignore`: the `writes_dcr_would_ignore` list of
    a plan made before writes were stamped above the winner (a plan made since has none)."""
    old = {} if ignore is None else {"writes_dcr_would_ignore": ignore}
    with OutputDir(str(path), "repair plan") as out:
        out.write_table("plan", pa.Table.from_pylist(rows, schema=PLAN_SCHEMA))
        out.write_json(
            "summary.json",
            {
                **out.common_fields("repair plan", 0),
                "store": store,
                "version": 1,
                "stamped_above_winner": 0,
                "writes_stamped_above_winner": [],
                **old,
            },
        )
