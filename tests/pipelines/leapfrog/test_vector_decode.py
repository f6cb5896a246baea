"""The vectorised decode (`VtDecoder`, `pipelines.leapfrog.vector_decode`) gives the reference loop's rows
(`VtDecoder(vectorised=False)`), row for row.

On the archives the tests generate (Leap Frog's histories, chunked histories, a small simulation), on the bad-input
suite's damaged archives, on fuzzed envelopes, on corrupt lengths and on a producer newer than us (a version learnt
from `vtp`, and our own version whose `vtp` announces another schema): the same batches, cut at several sizes, go
through both, and every column of every row must be equal. Also: the record kind of every payload under every key
header against `div.records.kind`, and the vectorised path reads the common records itself (few go to the loop).
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from chunked_histories import write_chunked_archives
from damage import damage_at_random, read_archive
from leapfrog_histories import generated
from newer_protocol import newer_vtp, reencode_rows
from vt_fixtures import put_envelope, write_archives

from div import envelope as E
from div import keys as K
from div.records import kind as record_kind
from pipelines.leapfrog import decode as V

_SOURCE_SCHEMA = pa.schema(
    [
        ("region", pa.int32()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)


def _table(archives: dict[int, str]) -> pa.Table:
    """Every region's archive as `tidegauge_vt` rows (region, partition, offset, key, value, headers), in
    (region, partition, offset) order."""
    parts = []
    for region, d in sorted(archives.items()):
        t = read_archive(d)
        parts.append(
            pa.table(
                {
                    "region": pa.array([region] * t.num_rows, pa.int32()),
                    "partition": t.column("partition").cast(pa.int32()),
                    "offset": t.column("offset").cast(pa.int64()),
                    "key": t.column("key"),
                    "value": t.column("value"),
                    "headers": t.column("headers"),
                }
            )
        )
    t = pa.concat_tables(parts)
    return t.sort_by([("region", "ascending"), ("partition", "ascending"), ("offset", "ascending")])


def _both(table: pa.Table, batch_rows: tuple[int, ...] = (4096, 333)) -> tuple[pa.Table, pa.Table, int]:
    """(the reference loop's rows, the vectorised decode's rows, rows it gave to the loop) of the same batches,
    one decoder per (region, partition) as a Spark task has, cut at each of `batch_rows`."""
    want, got, routed = [], [], 0
    for size in batch_rows:
        for part in _partitions(table):
            old, new = V.VtDecoder(vectorised=False), V.VtDecoder()
            for b in part.to_batches(max_chunksize=size):
                want.append(old.decode(b, None))
                got.append(new.decode(b, None))
            routed += new.loop_rows
    return pa.Table.from_batches(want, V.DECODED_SCHEMA), pa.Table.from_batches(got, V.DECODED_SCHEMA), routed


def _partitions(table: pa.Table):
    """Each (region, partition)'s rows of `table`, in order."""
    import pyarrow.compute as pc

    regions, partitions = table.column("region"), table.column("partition")
    for region, partition in sorted(set(zip(regions.to_pylist(), partitions.to_pylist(), strict=True))):
        mask = pc.and_(pc.equal(regions, region), pc.equal(partitions, partition))
        yield table.filter(mask).cast(_SOURCE_SCHEMA)


def _assert_equal(want: pa.Table, got: pa.Table) -> None:
    assert got.schema.names == want.schema.names
    assert got.num_rows == want.num_rows
    w, g = want.to_pylist(), got.to_pylist()
    diffs = [(a, b) for a, b in zip(w, g, strict=True) if a != b]
    assert not diffs, f"{len(diffs)} rows differ, first: today {diffs[0][0]} / vectorised {diffs[0][1]}"


@pytest.fixture(scope="module")
def generated_archives(tmp_path_factory):
    root = tmp_path_factory.mktemp("vector-decode")
    return write_archives(generated(2), root / "generated")


def test_generated_histories(generated_archives):
    want, got, routed = _both(_table(generated_archives))
    _assert_equal(want, got)
    kinds = pa.compute.value_counts(got.column("kind")).to_pylist()
    assert any(k["values"] == V.PUT for k in kinds)
    assert routed < want.num_rows


def test_chunked_histories(tmp_path):
    dirs, _ = write_chunked_archives(generated(2), tmp_path / "chunked")
    want, got, _ = _both(_table(dirs))
    assert V.CHUNK in set(want.column("kind").to_pylist())
    _assert_equal(want, got)


def test_small_sim(tmp_path):
    from small_sim import small_sim

    sim = small_sim(tmp_path / "sim", records=600, keys=100)
    want, got, routed = _both(_table(sim.archives))
    _assert_equal(want, got)


@pytest.mark.parametrize("seed", range(3))
def test_damaged_archives(generated_archives, tmp_path, seed):
    rng = random.Random(seed)
    damaged = damage_at_random(generated_archives, tmp_path, rng)
    want, got, _ = _both(_table(damaged))
    _assert_equal(want, got)


def _fuzz(value: bytes | None, rng: random.Random) -> bytes | None:
    if not value:
        return value
    v = bytearray(value)
    op = rng.randrange(6)
    if op == 0:  # a few bytes replaced, anywhere after the framing
        for _ in range(rng.randint(1, 3)):
            v[rng.randrange(2, len(v)) if len(v) > 2 else 0] = rng.randrange(256)
    elif op == 1:  # a bit flipped
        pos = rng.randrange(len(v) * 8)
        v[pos // 8] ^= 1 << (pos % 8)
    elif op == 2:  # cut short
        del v[rng.randrange(len(v)) :]
    elif op == 3:  # bytes inserted
        pos = rng.randrange(len(v))
        v[pos:pos] = rng.randbytes(rng.randint(1, 4))
    elif op == 4:  # the protocol version byte changed
        if len(v) > 1:
            v[1] = rng.choice([1, 5, 9, 13, 15, 16, 99, 200])
    else:  # the tail (footer, RMD) replaced
        pos = max(2, len(v) - rng.randint(1, 24))
        v[pos:] = rng.randbytes(len(v) - pos)
    return bytes(v)


@pytest.mark.parametrize("seed", range(4))
def test_fuzzed_envelopes(generated_archives, seed):
    rng = random.Random(100 + seed)
    table = _table(generated_archives)
    values = table.column("value").to_pylist()
    fuzzed = [_fuzz(v, rng) if rng.random() < 0.3 else v for v in values]
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(fuzzed, pa.binary()))
    want, got, _ = _both(table)
    _assert_equal(want, got)


def _newer(table: pa.Table, version: int, every_vtp: bool) -> pa.Table:
    """`table` as a newer producer writes it under protocol `version`: the newer schema in a `vtp` header on every
    record (`every_vtp`) or on the first of each partition only (later ones decode by what the first taught)."""
    rows = table.to_pylist()
    seen = set()

    def headers_of(r: dict) -> list:
        first = (r["region"], r["partition"]) not in seen
        seen.add((r["region"], r["partition"]))
        if not (every_vtp or first):
            return r["headers"]
        return [h for h in (r["headers"] or []) if h["key"] != "vtp"] + [{"key": "vtp", "value": newer_vtp()}]

    reencode_rows(rows, version, headers_of)
    return pa.Table.from_pylist(rows, table.schema)


@pytest.mark.parametrize(("version", "every_vtp"), [(16, True), (16, False), (14, False)])
def test_newer_producer(generated_archives, version, every_vtp):
    """A version learnt from `vtp` (16), and our own v14 whose `vtp` announced the newer schema: the rows that
    follow the header are decoded by what it taught, in Python, as today."""
    table = _newer(_table(generated_archives), version, every_vtp)
    want, got, _ = _both(table)
    assert V.PUT in set(want.column("kind").to_pylist())
    _assert_equal(want, got)


def test_vtp_on_a_control_message_teaches_version_14(generated_archives):
    """A `vtp` header on a control message (Start of Segment carries it) that announces another schema for our
    own version 14 teaches the codec: the data records after it, which carry no header, are decoded by what it
    taught, so they are the loop's, never read with our layout."""
    table = _table(generated_archives)
    rows = table.to_pylist()
    taught = set()
    for r in rows:
        where = (r["region"], r["partition"])
        if r["key"][0] == K.HEADER_CONTROL_MESSAGE and where not in taught:
            r["headers"] = [h for h in (r["headers"] or []) if h["key"] != "vtp"] + [
                {"key": "vtp", "value": newer_vtp()}
            ]
            taught.add(where)
    assert taught
    want, got, routed = _both(pa.Table.from_pylist(rows, table.schema))
    _assert_equal(want, got)
    assert routed > want.num_rows // 2  # after the header, every v14 record is the loop's


def test_kind_against_the_rule():
    """Every payload and schema id under every key header: where the vectorised path decides a row's kind (data
    keys and unknown headers) it is `div.records.kind`'s; Update and Global-RT-DIV keys are OTHER, as Leap Frog's
    decoder leaves them undecoded; control keys go to the loop, which applies the rule itself."""
    codec = E.EnvelopeCodec()
    pm = E.producer_metadata(bytes(16), 0, 1, 5)
    footer = E.leader_footer("h", 7, 1)
    rmd = {"replicationMetadataVersionId": -1, "replicationMetadataPayload": b""}
    payloads = [(0, (E.PUT, {"putValue": b"v", "schemaId": s, **rmd})) for s in (1, -1, -10, -20, 0)]
    payloads += [
        (1, (E.DELETE, {"schemaId": -1, **rmd})),
        (3, (E.UPDATE, {"schemaId": 1, "updateSchemaId": 1, "updateValue": b"u"})),
        (
            2,
            E.control_message(
                E.END_OF_SEGMENT, {"checksumValue": b"", "computedAggregates": [], "finalSegment": False}
            ),
        ),
    ]
    rows, expected = [], []
    for mtype, payload in payloads:
        env = {
            "messageType": mtype,
            "producerMetadata": pm,
            "payloadUnion": payload,
            "leaderMetadataFooter": footer,
        }
        value = codec.encode(env)
        for header in [*sorted(K.KNOWN_HEADERS), 9]:
            key = bytes([header]) + b"k"
            rows.append((len(rows), key, value))
            rule = record_kind(key, codec.decode(value))
            expected.append(int(rule) if header in (K.HEADER_PUT_OR_DELETE, 9) else None)
    table = pa.table(
        {
            "region": pa.array([0] * len(rows), pa.int32()),
            "partition": pa.array([0] * len(rows), pa.int32()),
            "offset": pa.array([r[0] for r in rows], pa.int64()),
            "key": pa.array([r[1] for r in rows], pa.binary()),
            "value": pa.array([r[2] for r in rows], pa.binary()),
            "headers": pa.nulls(len(rows), _SOURCE_SCHEMA.field("headers").type),
        }
    )
    want, got, routed = _both(table, batch_rows=(len(rows),))
    _assert_equal(want, got)
    checked = 0
    for k, e, key in zip(got.column("kind").to_pylist(), expected, [r[1] for r in rows], strict=True):
        if e is not None and e != V.MANIFEST:  # a manifest is the loop's: it reads the chunk keys in its body
            assert k == e, (key, k, e)
            checked += 1
    assert checked == 15
    # the loop reads control keys, and data keys holding a manifest, an Update or a control message; nothing else
    assert routed == sum(1 for r in rows if r[1][0] == K.HEADER_CONTROL_MESSAGE) + 3


def test_corrupt_lengths_are_undecodable_rows():
    """A Put whose value length is corrupt (up to 2^62 bytes) is an undecodable row with its offset: the
    vectorised read leaves it to the loop, whose Avro decoder refuses it."""
    from div.avro_bits import write_long

    codec = E.EnvelopeCodec()
    env = put_envelope(E.leader_footer("h", 7, 1))
    good = codec.encode(env)
    at = good.index(write_long(1) + b"v")  # the putValue's length
    values = [good] + [
        good[:at] + write_long(n) + good[at + 1 :] for n in (1 << 20, (1 << 31) - 1, 1 << 40, 1 << 62)
    ]
    table = pa.table(
        {
            "region": pa.array([0] * len(values), pa.int32()),
            "partition": pa.array([0] * len(values), pa.int32()),
            "offset": pa.array(range(len(values)), pa.int64()),
            "key": pa.array([b"\x00k"] * len(values), pa.binary()),
            "value": pa.array(values, pa.binary()),
            "headers": pa.nulls(len(values), _SOURCE_SCHEMA.field("headers").type),
        }
    )
    want, got, _ = _both(table, batch_rows=(len(values),))
    _assert_equal(want, got)
    assert got.column("kind").to_pylist() == [V.PUT] + [V.UNDECODABLE] * 4
