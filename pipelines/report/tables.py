"""Turn the job outputs into the small tables the expectation suites check and the page shows.

Each table has one row per thing a check can blame (a region pair and partition, a log partition, ...), so a
failed expectation points at the rows to look at. Counts of findings come from the finding rows themselves
(the Parquet datasets), not from the summaries, because the rows are the proof the page links to; the
summaries supply what has no rows (keys compared, records read).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from div.validator import NOT_FINDINGS
from leapfrog.compare import HEALED
from leapfrog.results import divergent_keys
from pipelines.report.inputs import DivOutput, Inputs, LagOutput, LeapfrogOutput

DIVERGENCE_TYPES = ("VALUE_MISMATCH", "MISSING_IN_A", "MISSING_IN_B")


def open_findings(rows: pd.DataFrame) -> pd.DataFrame:
    """The leapfrog findings still open: healed ones (their regions agree again) are history."""
    return rows[rows["status"] != HEALED] if len(rows) else rows


# The columns that identify a row of each table: GX reports offending rows by them and the page links by them.
ID_COLUMNS: dict[str, list[str]] = {
    "pairs": ["region_a", "region_b", "partition"],
    "div_partitions": ["region", "topic", "partition"],
    "heartbeat_grid": ["region", "partition"],
    "lag": ["vt_region", "partition", "source_region"],
    "decoding": ["job", "region", "topic", "partition"],
}
TABLES = tuple(ID_COLUMNS)


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def pairs_table(lf: LeapfrogOutput) -> pd.DataFrame:
    """One row per (region_a, region_b, partition): what was compared and how many divergences were found."""
    rows: dict[tuple[int, int, int], dict[str, Any]] = {}

    def row(a: int, b: int, p: int) -> dict[str, Any]:
        return rows.setdefault(
            (a, b, p),
            {
                "region_a": a,
                "region_b": b,
                "partition": p,
                "keys": 0,
                "comparable_pairs": 0,
                "skipped_pairs": 0,
                "pending_keys": 0,
                "summary_divergences": 0,
                "divergences": 0,
                "healed": 0,
                **{t.lower(): 0 for t in DIVERGENCE_TYPES},
            },
        )

    for entry in lf.summary.get("by_pair") or []:
        r = row(_int(entry.get("region_a")), _int(entry.get("region_b")), _int(entry.get("partition")))
        for name in ("keys", "comparable_pairs", "skipped_pairs", "pending_keys"):
            r[name] += _int(entry.get(name))
        r["summary_divergences"] += sum(_int(v) for v in (entry.get("findings") or {}).values())
    found = lf.inconsistencies
    if len(found):
        # every open row counts as a divergence, whatever its type says, so an unexpected type cannot hide one;
        # a healed row (its regions agree again) is history, counted apart
        healed = found["status"] == HEALED
        for (a, b, p), n in found[healed].groupby(["region_a", "region_b", "partition"]).size().items():
            row(int(a), int(b), int(p))["healed"] += int(n)
        counts = found[~healed].groupby(["region_a", "region_b", "partition", "type"]).size()
        for (a, b, p, kind), n in counts.items():
            r = row(int(a), int(b), int(p))
            r["divergences"] += int(n)
            if str(kind) in DIVERGENCE_TYPES:
                r[str(kind).lower()] += int(n)
    table = pd.DataFrame(
        list(rows.values()),
        columns=[
            "region_a",
            "region_b",
            "partition",
            "keys",
            "comparable_pairs",
            "skipped_pairs",
            "pending_keys",
            "summary_divergences",
            "divergences",
            "healed",
            *[t.lower() for t in DIVERGENCE_TYPES],
        ],
    )
    for col in table.columns:
        table[col] = table[col].astype("int64")
    keys = table["keys"].where(table["keys"] > 0)
    table["pending_percent"] = (100.0 * table["pending_keys"] / keys).fillna(0.0).astype("float64")
    return table.sort_values(["region_a", "region_b", "partition"], ignore_index=True)


def div_partitions_table(div: DivOutput) -> pd.DataFrame:
    """One row per (region, topic, partition) DIV read or failed to read, with its finding counts."""
    rows: dict[tuple[int, str, int], dict[str, Any]] = {}

    def row(region: int, topic: str, partition: int) -> dict[str, Any]:
        return rows.setdefault(
            (region, topic, partition),
            {
                "region": region,
                "topic": topic,
                "partition": partition,
                "records": 0,
                "findings": 0,
                "fatal_findings": 0,
                "warnings": 0,
                "read_ok": True,
                "error": "",
            },
        )

    for entry in div.summary.get("partitions") or []:
        r = row(_int(entry.get("region")), str(entry.get("topic", "")), _int(entry.get("partition")))
        r["records"] += _int(entry.get("records"))
    for entry in div.summary.get("failed_partitions") or []:
        r = row(_int(entry.get("region")), str(entry.get("topic", "")), _int(entry.get("partition")))
        r["read_ok"] = False
        r["error"] = str(entry.get("error", ""))
    errors = div.errors
    if len(errors):
        fatal = errors["fatal"].fillna(False).astype(bool)
        for (region, topic, partition), group in errors.groupby(["region", "topic", "partition"]):
            r = row(int(region), str(topic), int(partition))
            n_fatal = int(fatal.loc[group.index].sum())
            r["findings"] += len(group)
            r["fatal_findings"] += n_fatal
            r["warnings"] += len(group) - n_fatal
    table = pd.DataFrame(
        list(rows.values()),
        columns=[
            "region",
            "topic",
            "partition",
            "records",
            "findings",
            "fatal_findings",
            "warnings",
            "read_ok",
            "error",
        ],
    )
    for col in ("region", "partition", "records", "findings", "fatal_findings", "warnings"):
        table[col] = table[col].astype("int64")
    table["read_ok"] = table["read_ok"].astype(bool)
    return table.sort_values(["region", "topic", "partition"], ignore_index=True)


def _partitions(lf: LeapfrogOutput) -> list[int]:
    parts = {_int(e.get("partition")) for e in lf.summary.get("by_region") or []}
    parts |= {_int(e.get("partition")) for e in lf.summary.get("by_pair") or []}
    parts |= {_int(e.get("partition")) for e in lf.summary.get("failed_partitions") or []}
    if len(lf.inconsistencies):
        parts |= {int(p) for p in lf.inconsistencies["partition"]}
    return sorted(parts)


def heartbeat_grid(lf: LeapfrogOutput) -> pd.DataFrame:
    """Every region x every partition of the store: how many heartbeats it holds from each region.

    A (region, partition) that leapfrog did not report at all counts as holding no heartbeats, so a partition
    that vanished from the output fails the check instead of passing unseen.
    """
    by_key = {(_int(e.get("region")), _int(e.get("partition"))): e for e in lf.summary.get("by_region") or []}
    failed: dict[tuple[int, int], str] = {}
    for e in lf.summary.get("failed_partitions") or []:
        # docs/outputs.md names one `region`; the leapfrog job also writes `regions` (every region it lacked)
        regions = e.get("regions") if isinstance(e.get("regions"), list) else [e.get("region")]
        for region in regions:
            failed[(_int(region), _int(e.get("partition")))] = str(e.get("error", ""))
    rows = []
    for region in lf.regions:
        for partition in _partitions(lf):
            entry = by_key.get((region, partition))
            by_origin = {
                _int(k): _int(v) for k, v in ((entry or {}).get("heartbeats_by_origin") or {}).items()
            }
            counts = [by_origin.get(origin, 0) for origin in lf.regions]
            rows.append(
                {
                    "region": region,
                    "partition": partition,
                    "reported": entry is not None,
                    "heartbeats": _int((entry or {}).get("heartbeats")),
                    "min_heartbeats_from_a_region": min(counts) if counts else 0,
                    "regions_without_heartbeats": ", ".join(
                        str(o) for o, n in zip(lf.regions, counts, strict=True) if n == 0
                    ),
                    "heartbeats_by_origin": ", ".join(
                        f"{o}: {n}" for o, n in zip(lf.regions, counts, strict=True)
                    ),
                    "error": failed.get((region, partition), ""),
                }
            )
    table = pd.DataFrame(
        rows,
        columns=[
            "region",
            "partition",
            "reported",
            "heartbeats",
            "min_heartbeats_from_a_region",
            "regions_without_heartbeats",
            "heartbeats_by_origin",
            "error",
        ],
    )
    for col in ("region", "partition", "heartbeats", "min_heartbeats_from_a_region"):
        table[col] = table[col].astype("int64")
    return table


def lag_table(lag: LagOutput) -> pd.DataFrame:
    """The lag rows, with nullable numbers as floats (NaN = unknown), which GX treats as missing values."""
    table = lag.lag.copy()
    for col in ("vt_region", "partition", "source_region"):
        table[col] = table[col].astype("int64")
    for col in (
        "heartbeats",
        "last_heartbeat_vt_offset",
        "last_heartbeat_origin_ms",
        "time_lag_ms",
        "watermark",
        "rt_end_offset",
        "offset_lag",
    ):
        table[col] = pd.to_numeric(table[col], errors="coerce").astype("float64")
    return table.sort_values(["vt_region", "partition", "source_region"], ignore_index=True)


def decoding_table(lf: LeapfrogOutput, div: DivOutput, div_parts: pd.DataFrame) -> pd.DataFrame:
    """Undecodable records per log partition, as each job counted them."""
    vt_topic = f"{lf.store}_v{lf.version}"
    rows = []
    for e in lf.summary.get("by_region") or []:
        offsets = list(e.get("undecodable_offsets") or [])
        rows.append(
            {
                "job": "leapfrog",
                "region": _int(e.get("region")),
                "topic": vt_topic,
                "partition": _int(e.get("partition")),
                "undecodable": _int(e.get("undecodable")),
                "out_of_range": _int(e.get("out_of_range")),
                "offsets": ", ".join(str(o) for o in offsets[:20]) + (" ..." if len(offsets) > 20 else ""),
            }
        )
    bad = div.errors[div.errors["type"] == "UNDECODABLE"] if len(div.errors) else div.errors
    undecodable: dict[tuple[int, str, int], list[int]] = {}
    for r in bad.itertuples(index=False):
        undecodable.setdefault((int(r.region), str(r.topic), int(r.partition)), []).append(int(r.offset))
    keys = {(int(r.region), str(r.topic), int(r.partition)) for r in div_parts.itertuples(index=False)}
    for key in sorted(keys | set(undecodable)):
        offsets = sorted(undecodable.get(key, []))
        rows.append(
            {
                "job": "div validate",
                "region": key[0],
                "topic": key[1],
                "partition": key[2],
                "undecodable": len(offsets),
                "out_of_range": 0,
                "offsets": ", ".join(str(o) for o in offsets[:20]) + (" ..." if len(offsets) > 20 else ""),
            }
        )
    table = pd.DataFrame(
        rows, columns=["job", "region", "topic", "partition", "undecodable", "out_of_range", "offsets"]
    )
    for col in ("region", "partition", "undecodable", "out_of_range"):
        table[col] = table[col].astype("int64")
    return table


def build_tables(inputs: Inputs) -> dict[str, pd.DataFrame]:
    """Every table the suites may read; `lag` only when a lag output was given, `div_partitions` only when a
    `div validate` output was (the integrity suite is not run without it)."""
    div_parts = div_partitions_table(inputs.div)
    tables = {
        "pairs": pairs_table(inputs.leapfrog),
        "div_partitions": div_parts,
        "heartbeat_grid": heartbeat_grid(inputs.leapfrog),
        "decoding": decoding_table(inputs.leapfrog, inputs.div, div_parts),
    }
    if not inputs.div.given:
        del tables["div_partitions"]
    if inputs.lag is not None:
        tables["lag"] = lag_table(inputs.lag)
    return tables


def lag_by_region(lag: pd.DataFrame) -> list[dict[str, Any]]:
    """Per VT region, its worst time lag and offset lag over partitions and source regions."""
    out = []
    for region, group in lag.groupby("vt_region"):
        known = group.dropna(subset=["time_lag_ms"])
        worst = known.loc[known["time_lag_ms"].idxmax()] if len(known) else None
        offset_lag = group["offset_lag"].dropna()
        out.append(
            {
                "region": int(region),
                "max_time_lag_ms": int(worst["time_lag_ms"]) if worst is not None else None,
                "worst_partition": int(worst["partition"]) if worst is not None else None,
                "worst_source_region": int(worst["source_region"]) if worst is not None else None,
                "max_offset_lag": int(offset_lag.max()) if len(offset_lag) else None,
                "unknown": int(group["time_lag_ms"].isna().sum()),
            }
        )
    return out


def summary_numbers(inputs: Inputs, tables: dict[str, pd.DataFrame]) -> dict[str, Any]:
    """The counts the verdict, report.json and history are made of."""
    lf, div = inputs.leapfrog, inputs.div
    pairs = tables["pairs"]
    div_parts = tables.get("div_partitions", div_partitions_table(div))
    grid = tables["heartbeat_grid"]
    decoding = tables["decoding"]
    # UNDECODABLE and EXPLAINED_BY_UNDECODABLE rows are missing evidence, not findings (div.validator)
    errors = div.errors[~div.errors["type"].isin(list(NOT_FINDINGS))] if len(div.errors) else div.errors
    divergent = pairs[pairs["divergences"] > 0]
    keys = int(pairs["keys"].sum())
    pending = int(pairs["pending_keys"].sum())
    numbers: dict[str, Any] = {
        "store": lf.store,
        "version": lf.version,
        "regions": lf.regions,
        "partitions": _partitions(lf),
        "divergences": {
            # open findings (one per region pair and key); `divergent_keys` counts each (partition, key) once
            "total": int(pairs["divergences"].sum()),
            "divergent_keys": len(
                divergent_keys(
                    zip(
                        lf.inconsistencies["partition"],
                        lf.inconsistencies["key"],
                        lf.inconsistencies["status"],
                        strict=True,
                    )
                )
            ),
            "healed": int(pairs["healed"].sum()),
            "by_type": {t: int(pairs[t.lower()].sum()) for t in DIVERGENCE_TYPES},
            "region_pairs_with_divergences": int(
                divergent[["region_a", "region_b"]].drop_duplicates().shape[0]
            ),
            "region_pairs": int(pairs[["region_a", "region_b"]].drop_duplicates().shape[0]),
            "summary_total": int(pairs["summary_divergences"].sum()),
        },
        "div": {
            "checked": div.given,  # a `div validate` output was given
            "records_read": _int(div.summary.get("records_read"), int(div_parts["records"].sum())),
            "findings": len(errors),
            "fatal_findings": int(errors["fatal"].fillna(False).astype(bool).sum()) if len(errors) else 0,
            "warnings": int((~errors["fatal"].fillna(False).astype(bool)).sum()) if len(errors) else 0,
            "by_type": {str(k): int(v) for k, v in errors["type"].value_counts().sort_index().items()},
            "partitions": len(div_parts),
            "partitions_with_fatal_findings": int((div_parts["fatal_findings"] > 0).sum()),
            "failed_partitions": int((~div_parts["read_ok"]).sum()),
        },
        "heartbeats": {
            "region_partitions": len(grid),
            "region_partitions_missing_heartbeats": int((grid["min_heartbeats_from_a_region"] <= 0).sum()),
        },
        "coverage": {
            "keys": keys,
            "comparable_pairs": int(pairs["comparable_pairs"].sum()),
            "skipped_pairs": int(pairs["skipped_pairs"].sum()),
            "pending_keys": pending,
            "pending_percent": (100.0 * pending / keys) if keys else 0.0,
            "worst_pending_percent": float(pairs["pending_percent"].max()) if len(pairs) else 0.0,
        },
        "decoding": {
            "undecodable_leapfrog": int(decoding.loc[decoding["job"] == "leapfrog", "undecodable"].sum()),
            "undecodable_div": int(decoding.loc[decoding["job"] == "div validate", "undecodable"].sum()),
            # both jobs read the same VT partitions: a record neither could decode is one record, counted once
            "undecodable_records": int(
                decoding.groupby(["region", "topic", "partition"])["undecodable"].max().sum()
            )
            if len(decoding)
            else 0,
        },
        "leapfrog_failed_partitions": len(lf.summary.get("failed_partitions") or []),
        "evidence": {
            "leapfrog_verdict": lf.summary.get("verdict"),
            "div_verdict": div.summary.get("verdict"),
            "leapfrog_records": _int((lf.summary.get("totals") or {}).get("records")),
            "unverified_keys": _int((lf.summary.get("totals") or {}).get("unverified_keys")),
            "div_records": _int(div.summary.get("records_read")),
        },
    }
    if "lag" in tables:
        by_region = lag_by_region(tables["lag"])
        known = [r["max_time_lag_ms"] for r in by_region if r["max_time_lag_ms"] is not None]
        numbers["lag"] = {
            "now_ms": inputs.lag.now_ms if inputs.lag else None,
            "by_region": by_region,
            "max_time_lag_ms": max(known) if known else None,
            "heartbeats_seen": len(inputs.lag.heartbeats) if inputs.lag else 0,
        }
    return numbers
