"""`tidegauge repair verify`: did the planned keys converge? Reads a repair plan and a `leapfrog` output made after
the repair was applied and had time to replicate (docs/outputs.md, `tidegauge repair verify`).

Leap Frog reports every divergence it saw in the range it read, so a `leapfrog` over a range that includes the
time before the repair still lists a key the repair fixed. With `--source ID=LOC` (every region's VT, read after
the repair replicated) the regions' *current* records of the planned keys decide instead: a key whose regions
all hold the same record now has **converged**, whatever the leapfrog run saw earlier in its range. Without
`--source`, a planned key absent from the leapfrog's findings has converged (for a leapfrog run over the records
after the repair only).

A key still divergent is, with the output of `repair apply --out` (`--applied`: where each write landed, region
X's RT offset o):

- **pending** when some region of its findings has a final high-water mark for X below o (or none): its VT does not
  yet show it has processed the repair write — replication lag, look again later;
- **ignored_by_dcr** when every mark covers the write and the plan warned that a region's DCR would keep its own
  value (same timestamp, higher stored hash): the write alone cannot fix it. Only a plan made before the repair
  rule stamped such writes one above the winner (`leapfrog.repair`, "The stamp") carries that warning
  (`writes_dcr_would_ignore` in its summary); with a plan made since, such a key is **diverging_again**;
- **diverging_again** when every mark covers the write: the regions processed it and still disagree (a newer
  write diverged, or the fault repeated).

Without `--applied` a key still found divergent is **still_divergent**: leapfrog's output holds the regions' marks
but not where the repair write is in the RT, so pending and diverging again cannot be told apart. A planned key
with no write (op NONE: undecidable) still found divergent is **no_write**.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from div import keys
from pipelines.core.errors import EXIT_CLEAN, EXIT_FINDINGS, UsageError
from pipelines.core.output import OutputDir, guard
from pipelines.core.progress import Progress
from pipelines.core.publish import current as published
from pipelines.core.sources import SourceSpec
from pipelines.core.storage import locate
from pipelines.repair.apply import COMMAND as APPLY_COMMAND
from pipelines.repair.apply import load_plan

log = logging.getLogger("tidegauge.repair")

COMMAND = "repair verify"
STATUSES = ("converged", "pending", "ignored_by_dcr", "diverging_again", "still_divergent", "no_write")
MAX_LISTED = 100

KEYS_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("op", pa.string()),
        ("cause", pa.string()),
        ("status", pa.string()),
        ("regions", pa.list_(pa.int32())),
        ("types", pa.list_(pa.string())),
    ]
)
"""`repair verify --out`'s keys/: one row per planned key, its status and the leapfrog findings still naming it."""


@dataclass
class VerifyOptions:
    plan: str
    leapfrog: str
    applied: str | None = None
    out: str | None = None
    sources: list[SourceSpec] = field(default_factory=list)
    kafka_conf: dict[int, dict[str, Any]] = field(default_factory=dict)
    store: str | None = (
        None  # when given: must be the plan's (a copied command line of another store fails early)
    )
    version: int | None = None


def _current_disagreement(
    opts: VerifyOptions, store: str, version: int, planned: dict[int, set[bytes]], n_regions: int
) -> dict[tuple[int, bytes], list[int]]:
    """Read each region's current record of the planned keys (`--source`); per key, the regions whose record
    differs from another region's (empty: every region holds the same record now). A tombstone and no record
    agree, as Leap Frog counts them."""
    from pipelines.repair.job import PlanOptions, read_current

    popts = PlanOptions(store, version, opts.sources, opts.leapfrog, "", kafka_conf=opts.kafka_conf)
    current: dict[int, dict[tuple[int, bytes], Any]] = {}
    with Progress(COMMAND) as progress:
        for spec in opts.sources:
            current[spec.region], _ = read_current(spec, popts, planned, n_regions, progress)
    out: dict[tuple[int, bytes], list[int]] = {}
    for p, wanted in planned.items():
        for k in wanted:
            seen = {
                x: ("DELETE", None) if (rec := current[x].get((p, k))) is None else rec.content
                for x in current
            }
            out[(p, k)] = [] if len(set(seen.values())) <= 1 else sorted(seen)
    return out


def _load_applied(path: str, store: str) -> tuple[dict[str, Any], dict[tuple[int, bytes], int]]:
    flag = f"--applied {path}"
    try:
        where = published(locate(path))
        summary = json.loads((where / "summary.json").read_text())
        d = where / "writes"
        rows = [r for f in d.files(".parquet") for r in pq.read_table(f.path, filesystem=f.fs).to_pylist()]
    except (OSError, json.JSONDecodeError, pa.ArrowException) as exc:
        raise UsageError(
            f"{flag}: cannot read it ({exc}); give the --out of `tidegauge repair apply`"
        ) from None
    if not isinstance(summary, dict) or summary.get("job") != APPLY_COMMAND:
        raise UsageError(f"{flag}: not the output of `tidegauge repair apply`")
    if summary.get("store") != store:
        raise UsageError(f"{flag}: applied a plan of store {summary.get('store')!r}, not {store!r}")
    if summary.get("dry_run"):
        raise UsageError(f"{flag}: a --dry-run: nothing was written")
    offsets = {
        (int(r["partition"]), bytes(r["key"])): int(r["rt_offset"])
        for r in rows
        if r["rt_offset"] is not None
    }
    return summary, offsets


def run(opts: VerifyOptions) -> int:
    """Returns 0 when every planned key converged, else 1."""
    inputs = {"--plan": opts.plan, "--leapfrog": opts.leapfrog, "--applied": opts.applied}
    if opts.out is not None:
        guard(COMMAND, {"--out": opts.out}, inputs)
    plan = load_plan(opts.plan)
    for flag, given, planned in (
        ("--store", opts.store, plan.store),
        ("--version", opts.version, plan.version),
    ):
        if given is not None and given != planned:
            raise UsageError(
                f"{flag} {given}: the plan {opts.plan} is of store {plan.store} version {plan.version}"
            )
    from pipelines.repair.job import PlanOptions, load_leapfrog

    lf = load_leapfrog(opts.leapfrog, PlanOptions(plan.store, plan.version, [], opts.leapfrog, ""))
    applied, offsets = (None, {}) if opts.applied is None else _load_applied(opts.applied, plan.store)
    apply_region = None if applied is None else int(applied["region"])
    marks: dict[tuple[int, int], list[int]] = {
        (int(b["region"]), int(b["partition"])): list(b.get("final_high_watermark") or [])
        for b in lf.summary.get("by_region") or []
    }
    ignored = {
        (int(e["partition"]), str(e["key"])) for e in plan.summary.get("writes_dcr_would_ignore") or []
    }
    disagree: dict[tuple[int, bytes], list[int]] | None = None
    if opts.sources:
        wanted: dict[int, set[bytes]] = {}
        for r in plan.rows:
            wanted.setdefault(int(r["partition"]), set()).add(bytes(r["key"]))
        n_regions = int(lf.summary.get("store_regions") or max(s.region for s in opts.sources) + 1)
        disagree = _current_disagreement(opts, plan.store, plan.version, wanted, n_regions)
    rows = []
    counts = dict.fromkeys(STATUSES, 0)
    planned = set()
    for r in plan.rows:
        p, k = int(r["partition"]), bytes(r["key"])
        planned.add((p, k))
        d = lf.keys.get((p, k))
        regions = sorted({x for a, b, _ in d.pairs for x in (a, b)}) if d else []
        types = sorted({t for _, _, t in d.pairs}) if d else []
        if disagree is not None:
            regions = disagree[(p, k)]
        if (d is None and disagree is None) or (disagree is not None and not regions):
            status = "converged"
        elif r["op"] == "NONE":
            status = "no_write"
        elif apply_region is None or (p, k) not in offsets:
            status = "still_divergent"
        else:
            o = offsets[(p, k)]

            def covers(x: int, p: int = p, o: int = o) -> bool:
                m = marks.get((x, p), [])
                return len(m) > apply_region and m[apply_region] >= o

            if not all(covers(x) for x in regions):
                status = "pending"
            elif (p, k.hex()) in ignored:
                status = "ignored_by_dcr"
            else:
                status = "diverging_again"
        counts[status] += 1
        rows.append(
            {
                "partition": p,
                "key": k,
                "op": r["op"],
                "cause": r["cause"],
                "status": status,
                "regions": regions,
                "types": types,
            }
        )
    outside = sorted(set(lf.keys) - planned)
    too_early = _leapfrog_before_apply(lf.summary, applied)
    code = EXIT_CLEAN if counts["converged"] == len(rows) else EXIT_FINDINGS
    page = _page(plan, opts, lf, rows, counts, outside, applied)
    if too_early:
        page += (
            "\nwarning: the leapfrog run started before the apply finished: it cannot show the repair "
            "(run leapfrog again once the writes have replicated)"
        )
    print(page, file=sys.stdout)
    doc = {
        "verdict": "converged" if code == EXIT_CLEAN else "not_converged",
        "store": plan.store,
        "version": plan.version,
        "plan": opts.plan,
        "leapfrog": opts.leapfrog,
        "applied": opts.applied,
        "apply_region": apply_region,
        "planned_keys": len(rows),
        "by_status": counts,
        "outside_plan_keys": len(outside),
        "can_tell_pending": applied is not None,
        "current_records_read": bool(opts.sources),
        "leapfrog_before_apply": too_early,
        "not_converged": [
            {
                "partition": r["partition"],
                "key": r["key"].hex(),
                "status": r["status"],
                "regions": r["regions"],
            }
            for r in rows
            if r["status"] != "converged"
        ][:MAX_LISTED],
    }
    if opts.out is not None:
        with OutputDir(opts.out, COMMAND) as out:
            out.write_table("keys", pa.Table.from_pylist(rows, schema=KEYS_SCHEMA))
            out.file("verify.txt").write_text(page + "\n")
            out.write_json("summary.json", {**out.common_fields(COMMAND, code), **doc})
    return code


def _leapfrog_before_apply(lf_summary: dict[str, Any], applied: dict[str, Any] | None) -> bool | None:
    """Whether the leapfrog run started before the apply finished (None: not known)."""
    if applied is None or not applied.get("finished_at_ms") or not lf_summary.get("started_at"):
        return None
    try:
        started = dt.datetime.fromisoformat(str(lf_summary["started_at"]))
    except ValueError:
        return None
    if started.tzinfo is None:
        started = started.replace(tzinfo=dt.UTC)
    return started.timestamp() * 1000 < int(applied["finished_at_ms"])


def _page(plan, opts, lf, rows, counts, outside, applied) -> str:
    lines = [
        f"tidegauge repair verify: store {plan.store} version {plan.version}: plan {opts.plan}, leapfrog {opts.leapfrog}",
        f"{len(rows)} planned keys: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s]),
    ]
    if applied is None and counts["still_divergent"]:
        lines.append(
            "still_divergent: without --applied (the --out of `repair apply`) this cannot tell a key whose regions "
            "have not yet processed the repair write (pending) from one that diverged again"
        )
    if outside:
        lines.append(f"{len(outside)} divergent keys outside the plan (new divergences: plan them again)")
    listed = [r for r in rows if r["status"] != "converged"]
    for r in listed[:MAX_LISTED]:
        lines.append(
            f"  {r['status']}: partition {r['partition']} key {keys.shown(r['key'])} ({r['op']}, cause {r['cause']}); "
            f"regions {', '.join(map(str, r['regions']))}: {', '.join(r['types'])}"
        )
    if len(listed) > MAX_LISTED:
        lines.append(f"  ... and {len(listed) - MAX_LISTED} more (keys/ with --out)")
    return "\n".join(lines)
