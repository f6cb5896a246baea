"""The state a nightly Leap Frog run leaves for the next one (`--state DIR`), and its atomic commit.

What is carried follows `leapfrog.reference.state` (heartbeat mode): per region partition the offset reached, the
final mark, how the first run started, the mark before its first gap and the envelope schemas its decoder learnt
from `vtp` headers (a newer Venice writer announces its schema on a producer's first message only: the next run's
records decode by it); per key and region the records that can still take part in a comparison; and every finding
so far. Layout:

    DIR/state.json   meta (store, version, mode, pairs, regions) and the per region partition facts
    DIR/carried/     Parquet: partition, key, region, offset, value_hash, carry (flags, vector, mark), bucket
                     and sortkey (where the fused job's shuffle puts the record, and in which order) — the
                     records of keys still in play, which every run takes into its comparison, and of *settled*
                     keys (flag 4): each region holds only its current record and every pair's current records
                     are already comparable, so only a new record can make the key matter again; a run compares
                     only the settled keys its new records touch and passes the others on unchanged. One file
                     per reduce task, written by the task itself.
    DIR/findings/    Parquet: the findings so far, in the output's columns

DIR is any path or URI the filesystem layer serves. A run builds the next state in a staging directory and publishes
it whole (`pipelines.core.publish`: renames on local disk and HDFS, a pointer object on object stores), so a run
killed at any moment leaves the previous state, and running again gives the same result.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipelines.core.publish import MARKER, RUNS, Publication, current, recover
from pipelines.core.storage import Location, locate

log = logging.getLogger("tidegauge.leapfrog")
VERSION = 2  # 2: carried records in one directory, written by the reduce tasks


class StateError(Exception):
    """A state directory that does not fit this run (other store, mode or pairs) or cannot be read."""


def pack_carry_array(
    absent: np.ndarray,
    last_open: np.ndarray,
    vectors: np.ndarray,
    marks: np.ndarray,
    settled: np.ndarray | None = None,
):
    """Carried records as an Arrow binary array: a flags byte (absent, last_open, settled) then the per-key
    vector and the mark as little-endian longs."""
    import pyarrow as pa

    m, n = vectors.shape
    flags = absent.astype(np.uint8) | (last_open.astype(np.uint8) << 1)
    if settled is not None:
        flags |= settled.astype(np.uint8) << 2
    raw = np.empty((m, 1 + 16 * n), np.uint8)
    raw[:, 0] = flags
    raw[:, 1:] = np.concatenate([vectors, marks], axis=1).astype("<i8").view(np.uint8).reshape(m, 16 * n)
    width = 1 + 16 * n
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), m, [None, pa.py_buffer(raw.tobytes())]
    ).cast(pa.binary())


def unpack_carry_array(col, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(absent, last_open, settled, vectors, marks) of an Arrow binary array written by `pack_carry_array`."""
    import pyarrow as pa

    width = 1 + 16 * n
    m = len(col)
    if m == 0:
        z = np.zeros(0, bool)
        return z, z, z, np.zeros((0, n), np.int64), np.zeros((0, n), np.int64)
    fixed = col.cast(pa.binary(width))
    raw = np.frombuffer(fixed.buffers()[1], np.uint8, count=m * width, offset=fixed.offset * width).reshape(
        m, width
    )
    body = np.ascontiguousarray(raw[:, 1:]).view("<i8").reshape(m, 2 * n)
    flags = raw[:, 0]
    return (
        (flags & 1).astype(bool),
        (flags & 2).astype(bool),
        (flags & 4).astype(bool),
        body[:, :n].astype(np.int64),
        body[:, n:].astype(np.int64),
    )


def carry_flags(col) -> np.ndarray:
    """The flags byte of each packed carried record in an Arrow binary array (0 where a row carries nothing)."""
    import pyarrow as pa

    m = len(col)
    out = np.zeros(m, np.uint8)
    if m == 0 or col.null_count == m:
        return out
    width = np.int64 if pa.types.is_large_binary(col.type) else np.int32
    starts = np.frombuffer(
        col.buffers()[1], width, count=m + 1, offset=col.offset * np.dtype(width).itemsize
    )[:-1]
    valid = ~col.is_null().to_numpy(zero_copy_only=False)
    out[valid] = np.frombuffer(col.buffers()[2], np.uint8)[starts[valid]]
    return out


@dataclass
class State:
    path: Location  # where the published state's files are
    meta: dict[str, Any]
    regions: dict[
        tuple[int, int], dict[str, Any]
    ]  # (region, partition) → last_offset, final_hw, baseline, ...

    @property
    def carried_dir(self) -> Location:
        return self.path / "carried"

    @property
    def findings_dir(self) -> Location:
        return self.path / "findings"

    def settled_keys(self) -> dict[tuple[int, int, int], int]:
        """Settled keys per (partition, region_a, region_b), for the `keys` counter of runs that skip them."""
        return {
            (r["partition"], r["region_a"], r["region_b"]): r["keys"]
            for r in self.meta.get("settled_keys", [])
        }


def load(
    path: str | os.PathLike,
    *,
    store: str,
    version: int,
    mode: str,
    pairs: list[tuple[int, int]],
    regions: list[int],
) -> State | None:
    """The state in `path`, or None when there is none yet. Raises StateError when it belongs to another run or
    cannot be read."""
    try:
        target = locate(path)
        if recover(target):
            log.warning("--state %s: restored the previous state (a run was killed while committing)", target)
        where = current(target)
        meta_file = where / "state.json"
        if not meta_file.is_file():
            strangers = [c for c in target.children() if c.name not in (MARKER, RUNS)]  # RUNS: unpublished
            if strangers:
                raise StateError(
                    f"--state {target}: not empty but has no state.json (not a tidegauge state directory)"
                )
            return None
        doc = json.loads(meta_file.read_bytes())
    except (OSError, json.JSONDecodeError) as exc:
        raise StateError(f"--state {path}: state.json is unreadable: {exc}") from None
    meta = doc.get("meta", {})
    expected = {
        "store": store,
        "version": version,
        "mode": mode,
        "pairs": [list(p) for p in pairs],
        "regions": sorted(regions),
    }
    for k, v in expected.items():
        if meta.get(k) != v:  # (settled_keys is extra meta, not part of the identity)
            raise StateError(
                f"--state {path}: it was built with {k} = {meta.get(k)!r}, this run has {v!r} "
                "(use another --state directory, or remove this one for a full rescan)"
            )
    if doc.get("format") != VERSION:
        raise StateError(f"--state {path}: state format {doc.get('format')!r} is not {VERSION}")
    regions_state = {(r["region"], r["partition"]): r for r in doc.get("regions", [])}
    return State(where, meta, regions_state)


def check_width(state: State, n: int) -> None:
    """Raise StateError when `state`'s marks are not `n` wide: a state built for another region count of the
    store (by a run that was told another `--regions`, or one that counted only its sources' regions) cannot be
    resumed."""
    widths = sorted({len(r["final_hw"]) for r in state.regions.values()})
    if widths and widths != [n]:
        raise StateError(
            f"--state {state.path}: it was built for a store of {widths[0]} regions, and this run's store has {n} "
            "(use another --state directory, or remove this one for a full rescan)"
        )


def stage(path: str | os.PathLike) -> Publication:
    """The next state's publication: `.stage()` gives the directory to build it in, `.publish()` commits it."""
    return Publication(locate(path), "leapfrog state")


def region_rows(facts: dict, ends: dict[tuple[int, int], int], carried: dict) -> list[dict[str, Any]]:
    """What the next run (or micro-batch) needs of each region partition, from this one's plan (`facts`, the
    `leapfrog.plan.RegionPartition`s), its end offsets and the facts it resumed from (`carried`)."""
    rows = []
    for (region, partition), rp in sorted(facts.items()):
        end = ends.get((region, partition))
        last = (
            end - 1
            if end is not None
            else carried.get((region, partition), {}).get("last_offset", rp.start_after)
        )
        rows.append(
            {
                "region": region,
                "partition": partition,
                "last_offset": last,
                "final_hw": list(rp.final_hw),
                "baseline": list(rp.baseline) if rp.baseline is not None and not rp.prefix_known else None,
                "prefix_known": rp.prefix_known,
                "gap_hw": list(rp.next_freeze()) if rp.next_freeze() else None,
                "eop_offset": rp.eop_offset,
                "chunked": rp.chunked,
                "latest_kept": rp.latest_kept,
                # kept across runs: a later run must not compare a value that an unreadable record replaced
                "unverified": rp.unverified,
                "unverified_overflow": rp.unverified_overflow,
                "learned": rp.learned,
            }
        )
    return rows


def write_meta(stage: Location, meta: dict[str, Any], regions: list[dict[str, Any]]) -> None:
    (stage / "state.json").write_text(
        json.dumps({"format": VERSION, "meta": meta, "regions": regions}, indent=1) + "\n"
    )
