"""Damaged archives with known truth, for the bad-input property suite (tests/test_bad_input.py).

Real archives get damaged: a disk flips a bit, a copy is cut short, a script writes nulls or the wrong schema,
two regions' files land in one directory. `damage_archive` copies an archive and applies a list of `Damage`s to
it, and returns what was done (`DamageTruth`): which records were touched, at which offsets, and which class of
damage each is, so the property tests know what every job must say about it:

- UNDECODABLE damage (random bytes or truncation of a value, a null key or value) leaves a record no reader can
  decode: every job must count it with its offset and no finding may come of it.
- ALTERED damage (a bit flip in a value, a changed key) may leave a record that decodes to something else; no
  reader can tell that from the truth without a checksum, so a finding may come of it, but only about that
  record (its offset, or its key before or after the damage).
- HARMLESS damage (rows reordered, repeated identical file content is not among them, foreign-topic rows, an
  empty Parquet file) must change nothing.
- UNUSABLE damage (a file in another schema, a zero-byte file, two regions' records at the same offsets) makes
  the source unreadable: exit 2, naming the source, nothing written as a finding.

Header damage is limited to truncation and random replacement, which break the `0x48 0x01` / `0x44 0x01`
prefixes or the Avro body detectably. A bit flip inside a well-formed `hbw` vector decodes to another vector, and
no reader can tell it from a true one (Kafka's record-batch CRC is what catches those in a real cluster), so the
suite does not claim that case.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from div import archive

UNDECODABLE, ALTERED, HARMLESS, UNUSABLE = "undecodable", "altered", "harmless", "unusable"

RECORD_KINDS = {
    "value_random": UNDECODABLE,
    "value_truncate": UNDECODABLE,
    "value_null": UNDECODABLE,
    "key_null": UNDECODABLE,
    "value_bitflip": ALTERED,
    "key_random": ALTERED,
    "key_truncate": ALTERED,
    "header_truncate": HARMLESS,  # a heartbeat whose vector cannot be read only raises no mark
    "header_random": HARMLESS,
}
FILE_KINDS = {
    "reorder": HARMLESS,
    "foreign_topic": HARMLESS,
    "empty_file": HARMLESS,
    "wrong_schema": UNUSABLE,
    "zero_byte_file": UNUSABLE,
    "duplicate_offsets": UNUSABLE,  # the same offsets again with other content: two archives in one directory
}
KINDS = {**RECORD_KINDS, **FILE_KINDS}
VENICE_MAGIC = 23  # first byte of every Venice value; random bytes never start with it here, so never decode


@dataclass(frozen=True)
class Damage:
    kind: str
    row: int = 0  # which record, as an index into the archive's records sorted by (topic, partition, offset)
    seed: int = 0


@dataclass
class DamagedRecord:
    kind: str
    cls: str
    topic: str
    partition: int
    offset: int
    key_before: bytes | None
    key_after: bytes | None


@dataclass
class DamageTruth:
    records: list[DamagedRecord] = field(default_factory=list)
    file_classes: list[str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return {r.cls for r in self.records} | set(self.file_classes)

    @property
    def unusable(self) -> bool:
        return UNUSABLE in self.classes

    def offsets(self, cls: str | None = None) -> set[tuple[str, int, int]]:
        return {(r.topic, r.partition, r.offset) for r in self.records if cls is None or r.cls == cls}

    def keys(self) -> set[bytes]:
        return {k for r in self.records for k in (r.key_before, r.key_after) if k is not None}


def read_archive(directory: str | os.PathLike) -> pa.Table:
    """Every record of an archive, sorted by (topic, partition, offset)."""
    tables = [
        pq.read_table(os.path.join(directory, f))
        for f in sorted(os.listdir(directory))
        if f.endswith(".parquet") and not f.startswith((".", "_"))
    ]
    table = archive.conform(pa.concat_tables(tables)) if tables else archive.KAFKA_ARROW_SCHEMA.empty_table()
    return table.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])


def damage_archive(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    damages: list[Damage],
    other: str | os.PathLike | None = None,
) -> DamageTruth:
    """Copy archive `src` to `dst` (which must not exist) with `damages` applied. `other`: another region's
    archive, whose records `duplicate_offsets` copies in."""
    table = read_archive(src)
    rows = table.to_pylist()
    truth = DamageTruth()
    extra_files: list[tuple[str, pa.Table | bytes]] = []
    reorder = False
    for d in damages:
        rng = random.Random(d.seed)
        cls = KINDS[d.kind]
        if d.kind in RECORD_KINDS:
            if not rows:
                continue
            i = d.row % len(rows)
            r = rows[i]
            if d.kind.startswith("header") and not r["headers"]:
                continue  # nothing to damage: pick a heartbeat or a record with headers next time
            before = r["key"]
            _damage_record(d.kind, r, rng)
            truth.records.append(
                DamagedRecord(d.kind, cls, r["topic"], r["partition"], r["offset"], before, r["key"])
            )
        elif d.kind == "reorder":
            reorder = True
            truth.file_classes.append(cls)
        elif d.kind == "foreign_topic":
            picked = [dict(rows[(d.row + k) % len(rows)]) for k in range(min(5, len(rows)))] if rows else []
            for r in picked:
                r["topic"] = "foreign_topic_v1"
            extra_files.append(
                ("foreign+00000.parquet", pa.Table.from_pylist(picked, archive.KAFKA_ARROW_SCHEMA))
            )
            truth.file_classes.append(cls)
        elif d.kind == "empty_file":
            extra_files.append(("empty.parquet", archive.KAFKA_ARROW_SCHEMA.empty_table()))
            truth.file_classes.append(cls)
        elif d.kind == "wrong_schema":
            extra_files.append(("wrong.parquet", pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]})))
            truth.file_classes.append(cls)
        elif d.kind == "zero_byte_file":
            extra_files.append(("zero.parquet", b""))
            truth.file_classes.append(cls)
        elif d.kind == "duplicate_offsets":
            if other is None:
                raise ValueError("duplicate_offsets needs the other archive")
            extra_files.append(("other.parquet", read_archive(other)))
            truth.file_classes.append(cls)
    os.makedirs(dst)
    out = pa.Table.from_pylist(rows, archive.KAFKA_ARROW_SCHEMA)
    if reorder and out.num_rows > 1:
        order = list(range(out.num_rows))
        random.Random(len(order)).shuffle(order)
        out = out.take(pa.array(order))
    # written as a foreign tool would (no tidegauge marker), so readers trust nothing about order or uniqueness
    pq.write_table(out, os.path.join(dst, "records.parquet"), row_group_size=max(1, out.num_rows // 3))
    for name, content in extra_files:
        path = os.path.join(dst, name)
        if isinstance(content, bytes):
            with open(path, "wb") as f:
                f.write(content)
        else:
            pq.write_table(content, path)
    return truth


def damage_at_random(
    dirs: dict[int, str], out: str | os.PathLike, rng: random.Random, count: int = 40
) -> dict[int, str]:
    """Each region's archive with `count` records among its first 10,000 damaged, each by a kind drawn from
    RECORD_KINDS, written under `out` (dc-<region>); returns the new directories by region."""
    damaged = {}
    for region, d in dirs.items():
        damages = [
            Damage(rng.choice(sorted(RECORD_KINDS)), row=rng.randrange(10_000), seed=rng.randrange(1 << 30))
            for _ in range(count)
        ]
        damaged[region] = os.path.join(out, f"dc-{region}")
        damage_archive(d, damaged[region], damages)
    return damaged


def _damage_record(kind: str, r: dict, rng: random.Random) -> None:
    if kind == "value_random":
        n = rng.randint(1, 64)
        r["value"] = bytes([rng.choice([b for b in range(256) if b != VENICE_MAGIC])]) + rng.randbytes(n - 1)
    elif kind == "value_truncate":
        v = r["value"] or b""
        r["value"] = v[: rng.randint(0, max(0, len(v) - 1))]
    elif kind == "value_null":
        r["value"] = None
    elif kind == "key_null":
        r["key"] = None
    elif kind == "value_bitflip":
        v = bytearray(r["value"] or b"\x00")
        pos = rng.randrange(len(v) * 8)
        v[pos // 8] ^= 1 << (pos % 8)
        r["value"] = bytes(v)
    elif kind == "key_random":
        r["key"] = rng.randbytes(rng.randint(1, 24))
    elif kind == "key_truncate":
        k = r["key"] or b""
        r["key"] = k[: rng.randint(0, max(0, len(k) - 1))]
    elif kind in ("header_truncate", "header_random"):
        headers = [dict(h) for h in r["headers"]]
        h = headers[rng.randrange(len(headers))]
        v = h["value"] or b""
        if kind == "header_truncate":
            h["value"] = v[: rng.randint(0, max(0, len(v) - 1))]
        else:
            h["value"] = bytes(
                [rng.choice([b for b in range(256) if b not in (0x48, 0x44)])]
            ) + rng.randbytes(rng.randint(0, 16))
        r["headers"] = headers
    else:  # pragma: no cover - KINDS and this function are kept in step by test_damage_kinds_are_all_applied
        raise ValueError(kind)
