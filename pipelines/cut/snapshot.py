"""`tidegauge cut --snapshot X`: one partition's snapshot table from region X's change events before ceil.

The rules are elsewhere, once: which records lie above the cut is `heartbeat.cuts.above_many`, the state per key
and whether it is exact is `leapfrog.snapshot.states_at_cut`, and the resolution of the keys that are not exact
from the RT writes is `leapfrog.snapshot.dcr_fold` (Venice's DCR, as `repair plan` applies it). This module only
moves columns between Arrow and numpy, so that a partition of millions of keys costs a few vector passes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from heartbeat.change_events import DELETE, PUT
from heartbeat.cuts import above_many
from leapfrog.repair import Record
from leapfrog.snapshot import dcr_fold, states_at_cut

NONE = "NONE"

SNAPSHOT_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("op", pa.string()),
        ("value", pa.binary()),
        ("logical_ts", pa.int64()),
        ("upstream_region", pa.int32()),
        ("upstream_offset", pa.int64()),
        ("exact", pa.bool_()),
    ]
)
"""One row per key written at or below the cut (docs/outputs.md): op PUT | DELETE | NONE (not exact and nothing
of the key at or below the cut known); upstream_* null for a bulk-load record and for NONE."""


def _ints(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(column, -1).to_numpy(zero_copy_only=False), dtype=np.int64)


def key_codes(keys: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Each key's integer code and the distinct keys they index."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    enc = pc.dictionary_encode(keys)
    return np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64), enc.dictionary


def undecided_keys(events: pa.Table, cut: Sequence[int], last_gap: int = -1) -> list[bytes]:
    """The keys whose state at the cut the VT alone leaves unknown (a record above the cut before ceil, or records
    missing after the key's last one: `last_gap`, see `snapshot_table`): those `--rt` must resolve, so only their
    RT writes are decoded."""
    if not events.num_rows:
        return []
    codes, dictionary = key_codes(events.column("key"))
    above = _above(events, cut)
    states = states_at_cut(codes, above, _missing_after(events, last_gap))
    return [dictionary[int(k)].as_py() for k in states.key[~states.exact]]


def _above(events: pa.Table, cut: Sequence[int]) -> np.ndarray:
    region = events.column("upstream_region")
    has_coordinate = np.asarray(pc.is_valid(region).to_numpy(zero_copy_only=False), dtype=bool)
    return above_many(_ints(region), _ints(events.column("upstream_offset")), cut) & has_coordinate


def _missing_after(events: pa.Table, last_gap: int) -> np.ndarray | None:
    if last_gap < 0:
        return None
    return _ints(events.column("vt_offset")) <= last_gap


def snapshot_table(
    partition: int,
    events: pa.Table,
    cut: Sequence[int],
    rt_writes: Mapping[bytes, list[Record]] | None = None,
    last_gap: int = -1,
) -> pa.Table:
    """The snapshot rows of one partition (SNAPSHOT_SCHEMA, ordered by key code: first appearance in the VT).

    `events`: the change events (`heartbeat.change_events.CHANGES_SCHEMA`) of region X's VT partition from its
    first offset to ceil, bulk load included, in VT order; `cut`: C as a vector by region. `rt_writes` (with
    `--rt`): for each key that is not exact (`undecided_keys`), the RT writes of the key at or below the cut, from
    every region; those keys are then folded with DCR from their bulk record and are exact. `last_gap`: the highest
    VT offset after which offsets are missing before ceil (a compacted range; -1: none), so that a key whose last
    record lies at or before it is not exact (`leapfrog.snapshot`)."""
    if not events.num_rows:
        return SNAPSHOT_SCHEMA.empty_table()
    codes, dictionary = key_codes(events.column("key"))
    above = _above(events, cut)
    states = states_at_cut(codes, above, _missing_after(events, last_gap))
    rows, exact = states.row.copy(), states.exact.copy()
    keys_out = dictionary.take(pa.array(states.key))
    taken = events.take(pa.array(np.where(rows >= 0, rows, 0)))
    known = pa.array(rows >= 0)
    op = pc.if_else(known, taken.column("op"), pa.scalar(NONE))
    value = pc.if_else(known, taken.column("value"), pa.scalar(None, pa.binary()))
    ts = pc.if_else(known, taken.column("logical_ts"), pa.scalar(None, pa.int64()))
    region = pc.if_else(known, taken.column("upstream_region"), pa.scalar(None, pa.int32()))
    offset = pc.if_else(known, taken.column("upstream_offset"), pa.scalar(None, pa.int64()))
    table = pa.table(
        {
            "partition": pa.array(np.full(len(rows), partition, dtype=np.int32)),
            "key": keys_out,
            "op": op,
            "value": value,
            "logical_ts": ts,
            "upstream_region": region,
            "upstream_offset": offset,
            "exact": pa.array(exact),
        },
        schema=SNAPSHOT_SCHEMA,
    )
    if rt_writes is None or bool(exact.all()):
        return table
    return _resolve(table, events, codes, states.key, exact, rt_writes)


def _resolve(
    table: pa.Table,
    events: pa.Table,
    codes: np.ndarray,
    state_keys: np.ndarray,
    exact: np.ndarray,
    rt_writes: Mapping[bytes, list[Record]],
) -> pa.Table:
    """The rows that are not exact replaced by the DCR fold of the key's bulk record and its RT writes at or below
    the cut (after the exact rows); a key with neither was not written at or below the cut: no row."""
    bulk = np.flatnonzero(
        ~np.asarray(pc.is_valid(events.column("upstream_region")).to_numpy(False), dtype=bool)
    )
    last_bulk = np.full(int(codes.max()) + 1, -1, dtype=np.int64)
    np.maximum.at(last_bulk, codes[bulk], bulk)
    undecided = np.flatnonzero(~exact)
    resolved = []
    partition = table.column("partition")[0].as_py()
    for i, key in zip(undecided, table.column("key").take(pa.array(undecided)).to_pylist(), strict=True):
        b = int(last_bulk[state_keys[i]])
        stored = None
        if b >= 0:
            e = events.slice(b, 1).to_pylist()[0]
            stored = Record(e["op"], e["value"], e["logical_ts"])
        won = dcr_fold(stored, rt_writes.get(key, []))
        if won is None:
            continue
        resolved.append(
            {
                "partition": partition,
                "key": key,
                "op": won.op,
                "value": won.value if won.op == PUT else None,
                "logical_ts": won.logical_ts,
                "upstream_region": won.region,
                "upstream_offset": won.offset,
                "exact": True,
            }
        )
    assert all(r["op"] in (PUT, DELETE) for r in resolved)
    return pa.concat_tables(
        [table.filter(pa.array(exact)), pa.Table.from_pylist(resolved, schema=SNAPSHOT_SCHEMA)]
    )
