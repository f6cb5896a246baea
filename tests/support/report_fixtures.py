"""Build `leapfrog`, `div validate` and `lag` output directories (docs/outputs.md) with planted problems.

The report tests need outputs whose truth is known: a clean set, and sets that each hold exactly one kind of
problem, so a test can show that an expectation fails when, and only when, its problem is present.
"""

from __future__ import annotations

import json
import pathlib
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.report.inputs import DIV_ERROR_COLUMNS, HEARTBEAT_COLUMNS, INCONSISTENCY_COLUMNS, LAG_COLUMNS

REGIONS = [0, 1, 2]
PARTITIONS = [0, 1]
STORE = "s"
VERSION = 1
NOW_MS = 1_790_000_000_000  # 2026-09-21, the time "lag" measured against

# Each problem breaks exactly one suite of conf/expectations.yaml (except "div_warning", which breaks none:
# a DIV warning after End of Push is not fatal).
PROBLEMS = {
    "divergence": "consistency",
    "fatal_div": "integrity",
    "div_unreadable": "integrity",
    "undecodable_leapfrog": "decoding",
    "undecodable_div": "decoding",
    "missing_heartbeats": "heartbeats",
    "lag": "lag",
    "pending": "coverage",
    "div_warning": None,
}

HOSTILE = "<script>alert('x')</script>\"'&<img src=x onerror=alert(1)>"


@dataclass
class Outputs:
    leapfrog: pathlib.Path
    div: pathlib.Path
    lag: pathlib.Path


def _write_dataset(path: pathlib.Path, rows: list[dict], columns: dict[str, pa.DataType]) -> None:
    """As Spark writes it: a directory with one part file (with the schema even when empty) and _SUCCESS."""
    path.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=pa.schema(list(columns.items())))
    pq.write_table(table, path / "part-00000-c000.snappy.parquet")
    (path / "_SUCCESS").write_bytes(b"")


def _write_json(path: pathlib.Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def _common(job: str, exit_code: int) -> dict:
    return {
        "job": job,
        "tidegauge_version": "0.1.0",
        "started_at": "2026-09-21T06:00:00Z",
        "elapsed_s": 1.5,
        "exit_code": exit_code,
        "verdict": {0: "clean", 1: "findings", 3: "partial"}[exit_code],
        "sources": {str(r): f"/archive/region{r}" for r in REGIONS},
    }


def _divergence(pair: tuple[int, int], partition: int, kind: str, key: bytes, store: str) -> dict:
    a, b = pair
    row = {
        "store": store,
        "version": VERSION,
        "partition": partition,
        "region_a": a,
        "region_b": b,
        "type": kind,
        "key": key,
        "key_hash": zlib.crc32(key),
        "a_value_hash": 1111,
        "b_value_hash": 2222,
        "a_deleted": False,
        "b_deleted": False,
        "a_vt_offset": 120,
        "b_vt_offset": 131,
        "a_vector": [40, 17, -1],
        "b_vector": [40, 18, -1],
        "a_high_watermark": [99, 40, 12],
        "b_high_watermark": [98, 41, 12],
    }
    side = {"MISSING_IN_A": "a", "MISSING_IN_B": "b"}.get(kind)
    if side:
        for col in ("value_hash", "deleted", "vt_offset", "vector", "high_watermark"):
            row[f"{side}_{col}"] = None
    return row


def write_leapfrog(
    out: pathlib.Path, problems: set[str], divergent_keys: Iterable[bytes] | None, hostile: bool
) -> pathlib.Path:
    store = STORE + (HOSTILE if hostile else "")
    rows = []
    if "divergence" in problems:
        rows.append(_divergence((0, 1), 1, "VALUE_MISMATCH", b"key-17", store))
        rows.append(_divergence((1, 2), 0, "MISSING_IN_B", b"\x00\xffbin", store))
    for key in divergent_keys or []:
        rows.append(_divergence((0, 1), 0, "VALUE_MISMATCH", key, store))
    if hostile:
        rows.append(_divergence((0, 2), 1, "MISSING_IN_A", HOSTILE.encode(), store))
    _write_dataset(out / "inconsistencies", rows, INCONSISTENCY_COLUMNS)

    by_pair = []
    for i, a in enumerate(REGIONS):
        for b in REGIONS[i + 1 :]:
            for p in PARTITIONS:
                findings = {"VALUE_MISMATCH": 0, "MISSING_IN_A": 0, "MISSING_IN_B": 0}
                for r in rows:
                    if (r["region_a"], r["region_b"], r["partition"]) == (a, b, p):
                        findings[r["type"]] += 1
                pending = 30 if ("pending" in problems and (a, b, p) == (0, 2, 0)) else 1
                by_pair.append(
                    {
                        "region_a": a,
                        "region_b": b,
                        "partition": p,
                        "keys": 100,
                        "comparable_pairs": 180,
                        "skipped_pairs": 4,
                        "pending_keys": pending,
                        "findings": findings,
                    }
                )
    by_region = []
    for r in REGIONS:
        for p in PARTITIONS:
            by_origin = {str(o): 12 for o in REGIONS}
            if "missing_heartbeats" in problems and (r, p) == (2, 1):
                by_origin["1"] = 0
            undecodable = [7, 9] if ("undecodable_leapfrog" in problems and (r, p) == (1, 0)) else []
            by_region.append(
                {
                    "region": r,
                    "partition": p,
                    "records": 500,
                    "heartbeats": sum(by_origin.values()),
                    "heartbeats_by_origin": by_origin,
                    "eop_offset": 5,
                    "first_offset": 0,
                    "last_offset": 540,
                    "final_high_watermark": [99, 40, 12],
                    "compacted_ranges": [],
                    "undecodable": len(undecodable),
                    "undecodable_offsets": undecodable,
                    "out_of_range": 0,
                    "out_of_range_offsets": [],
                }
            )
    totals_findings = {"VALUE_MISMATCH": 0, "MISSING_IN_A": 0, "MISSING_IN_B": 0}
    for r in rows:
        totals_findings[r["type"]] += 1
    summary = _common("leapfrog", 1 if rows else 0) | {
        "store": store,
        "version": VERSION,
        "mode": "heartbeat",
        "regions": REGIONS,
        "pairs": [[0, 1], [0, 2], [1, 2]],
        "incremental": False,
        "totals": {
            "records": 3000,
            "heartbeats": 216,
            "keys": 600,
            "comparable_pairs": 1080,
            "skipped_pairs": 24,
            "pending_keys": sum(e["pending_keys"] for e in by_pair),
            "findings": totals_findings,
            "undecodable": sum(e["undecodable"] for e in by_region),
            "out_of_range": 0,
        },
        "by_pair": by_pair,
        "by_region": by_region,
        "failed_partitions": [],
        "timings": {"plan_s": 0.1, "run_s": 2.0},
        "versions": {"tidegauge": "0.1.0", "pyspark": "4.3.0", "python": "3.11"},
    }
    _write_json(out / "summary.json", summary)
    return out


def _div_error(
    region: int, topic: str, partition: int, offset: int, kind: str, fatal: bool, detail: str
) -> dict:
    return {
        "region": region,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "producer_guid": "0123456789abcdef0123456789abcdef",
        "segment": 3,
        "sequence": 41,
        "type": kind,
        "fatal": fatal,
        "detail": detail,
    }


def write_div(
    out: pathlib.Path, problems: set[str], fatal_offsets: Iterable[int] | None, hostile: bool
) -> pathlib.Path:
    topic = f"{STORE}_v{VERSION}"
    rows = []
    if "fatal_div" in problems:
        rows.append(_div_error(1, topic, 0, 42, "MISSING", True, "expected sequence 41, got 43"))
    for offset in fatal_offsets or []:
        rows.append(_div_error(0, topic, 1, offset, "CORRUPT", True, "checksum mismatch"))
    if "div_warning" in problems:
        rows.append(
            _div_error(2, topic, 1, 300, "DUPLICATE", False, "sequence 12 seen twice (after End of Push)")
        )
    if "undecodable_div" in problems:
        row = _div_error(0, topic, 0, 77, "UNDECODABLE", False, "bad magic byte 0x00")
        row.update(producer_guid="", segment=-1, sequence=-1)
        rows.append(row)
    if hostile:
        rows.append(_div_error(2, HOSTILE, 0, 5, "VALIDATOR:" + HOSTILE, False, HOSTILE))
    _write_dataset(out / "errors", rows, DIV_ERROR_COLUMNS)
    topics = [topic] + ([HOSTILE] if hostile else [])
    partitions = []
    for t in topics:
        for r in REGIONS:
            for p in PARTITIONS:
                mine = [e for e in rows if (e["region"], e["topic"], e["partition"]) == (r, t, p)]
                by_type: dict[str, int] = {}
                for e in mine:
                    by_type[e["type"]] = by_type.get(e["type"], 0) + 1
                partitions.append(
                    {
                        "region": r,
                        "topic": t,
                        "partition": p,
                        "records": 540,
                        "first_offset": 0,
                        "last_offset": 539,
                        "eop_offset": 5,
                        "producers_tracked": 3,
                        "findings": by_type,
                        "fatal_findings": sum(1 for e in mine if e["fatal"]),
                        "start": {"offset": 0, "restored_from_heartbeat": None},
                    }
                )
    failed = []
    if "div_unreadable" in problems:
        failed.append({"region": 2, "topic": topic, "partition": 1, "error": "broker timed out after 30 s"})
        partitions = [e for e in partitions if (e["region"], e["topic"], e["partition"]) != (2, topic, 1)]
    by_type_total: dict[str, int] = {}
    for e in rows:
        by_type_total[e["type"]] = by_type_total.get(e["type"], 0) + 1
    summary = _common("div validate", 3 if failed else (1 if any(e["fatal"] for e in rows) else 0)) | {
        "engine": "local",
        "records_read": sum(e["records"] for e in partitions),
        "findings": len(rows),
        "fatal_findings": sum(1 for e in rows if e["fatal"]),
        "findings_by_type": by_type_total,
        "producers_tracked": 18,
        "partitions": partitions,
        "failed_partitions": failed,
    }
    _write_json(out / "summary.json", summary)
    return out


def write_lag(out: pathlib.Path, problems: set[str], now_ms: int) -> pathlib.Path:
    lag_rows, hb_rows = [], []
    for r in REGIONS:
        for p in PARTITIONS:
            for s in REGIONS:
                late = "lag" in problems and (r, p, s) == (2, 1, 0)
                time_lag = 20 * 60_000 if late else 1_500 + 100 * r + 10 * s
                lag_rows.append(
                    {
                        "vt_region": r,
                        "partition": p,
                        "source_region": s,
                        "heartbeats": 12,
                        "last_heartbeat_vt_offset": 530,
                        "last_heartbeat_origin_ms": now_ms - time_lag,
                        "time_lag_ms": time_lag,
                        "watermark": 400,
                        "rt_end_offset": 410,
                        "offset_lag": 900 if late else 10,
                    }
                )
            for i in range(12):
                origin_ms = now_ms - 3_600_000 + i * 300_000
                for s in REGIONS:
                    delay = 300 + 50 * r + (i % 3) * 40
                    if "lag" in problems and (r, p, s) == (2, 1, 0) and i >= 8:
                        delay = (i - 7) * 300_000
                    hb_rows.append(
                        {
                            "vt_region": r,
                            "partition": p,
                            "vt_offset": 40 * i + s,
                            "origin_region": s,
                            "origin_ms": origin_ms,
                            "vt_timestamp_ms": origin_ms + delay,
                            "delay_ms": delay,
                            "watermarks": [400, 41, 12],
                        }
                    )
    (out).mkdir(parents=True, exist_ok=True)
    _write_dataset(out / "lag", lag_rows, LAG_COLUMNS)
    _write_dataset(out / "heartbeats", hb_rows, HEARTBEAT_COLUMNS)
    _write_json(out / "lag.json", _common("lag", 0) | {"now_ms": now_ms, "lag": lag_rows})
    return out


def build_outputs(
    root: pathlib.Path,
    problems: Iterable[str] = (),
    *,
    divergent_keys: Iterable[bytes] | None = None,
    fatal_offsets: Iterable[int] | None = None,
    hostile: bool = False,
    now_ms: int = NOW_MS,
) -> Outputs:
    """Write the three job outputs under `root` (leapfrog/, div/, lag/) with the given planted problems.

    `divergent_keys` adds VALUE_MISMATCH findings (regions 0-1, partition 0) and `fatal_offsets` fatal CORRUPT
    DIV findings (region 0, partition 1), for tests that vary findings from run to run. `hostile` puts strings
    that break naive HTML (script tags, quotes) into the store name, keys, topics, types and details.
    """
    problems = set(problems)
    unknown = problems - set(PROBLEMS)
    if unknown:
        raise ValueError(f"unknown planted problem(s): {sorted(unknown)}; known: {sorted(PROBLEMS)}")
    root = pathlib.Path(root)
    for sub in ("leapfrog", "div", "lag"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return Outputs(
        leapfrog=write_leapfrog(root / "leapfrog", problems, divergent_keys, hostile),
        div=write_div(root / "div", problems, fatal_offsets, hostile),
        lag=write_lag(root / "lag", problems, now_ms),
    )
