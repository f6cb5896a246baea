"""Forward compatibility: records from a newer Venice writer decode on every path, as Venice's own readers do.

The writer schema comes from the `vtp` header and is resolved against our v14 reader (fields matched by name,
unknown fields skipped, union branches matched by name). Two cases, both with fields inserted mid-record and new
union branches (tests/support/newer_protocol.py):

- protocol version 16, which we do not ship: learnt from the header;
- protocol version 15, which we do ship, announced with a different schema than our copy: the header is the
  writer's own word and wins (before, our copy was used and every record failed to decode).

Per record: the resolved envelope equals what the v14 writer's record decodes to. Per job: every job gives on the
re-encoded archives exactly what it gives on the originals (findings, verdict, nothing undecodable). A record of a
kind we cannot know (the new payload branch, the new control message) is undecodable: counted, never a crash.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from damage import read_archive
from newer_protocol import (
    NEW_CONTROL,
    encode_newer,
    new_payload_value,
    newer_schema,
    newer_vtp,
    reencode_archive,
    to_newer,
)
from small_sim import small_sim

from div import envelope as E
from div import partition_state as ps
from div.writer import vtp_header_value
from pipelines.cli import main

BACKENDS = ["fastavro", "cavro"]
VERSIONS = [15, 16]


def _some_envelopes() -> list[tuple[bytes, list]]:
    """(v14 value, headers): the SOS that opens segment 0 (with vtp), a Put with a leader footer, a Delete and a
    final EndOfSegment."""
    from div.writer import SegmentWriter

    w = SegmentWriter(b"\x07" * 16, clock=lambda: 1_700_000_000_000)
    records = [
        *w.put(0, b"k1", b"v1", footer=E.leader_footer("leader-1", 41, 2, term_id=3, upstream_timestamp=9)),
        *w.delete(0, b"k2"),
        *w.end_segment(0),
    ]
    return [(r.value, list(r.headers or ())) for r in records]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("version", VERSIONS)
def test_newer_records_resolve_to_what_the_older_writer_wrote(backend, version):
    reference = E.EnvelopeCodec("fastavro")
    codec = E.EnvelopeCodec(backend)
    records = _some_envelopes()
    assert records[0][1], "the first message of segment 0 carries vtp"
    for i, (value, headers) in enumerate(records):
        older = reference.decode(value, headers)
        newer = encode_newer(to_newer(older), version)
        announced = [("vtp", newer_vtp())] if i == 0 else []
        assert codec.decode(newer, announced) == older, f"record {i}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("version", VERSIONS)
def test_records_of_a_kind_we_cannot_know_are_undecodable_and_the_codec_goes_on(backend, version):
    reference = E.EnvelopeCodec("fastavro")
    codec = E.EnvelopeCodec(backend)
    (sos, headers), (put, _) = _some_envelopes()[:2]
    template = reference.decode(put)
    with pytest.raises(E.UndecodableError, match=f"version {version}"):
        codec.decode(new_payload_value(template, version), [("vtp", newer_vtp())])
    control = to_newer(reference.decode(sos, headers))
    control["payloadUnion"][1]["controlMessageType"] = 9
    control["payloadUnion"][1]["controlMessageUnion"] = (NEW_CONTROL, {"tier": "cold"})
    with pytest.raises(E.UndecodableError):
        codec.decode(encode_newer(control, version), None)
    assert codec.decode(encode_newer(to_newer(template), version), None) == template


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_header_announcing_the_schema_in_use_changes_nothing(backend, monkeypatch):
    # Every heartbeat carries vtp (~17 KB): taking it into account must not rebuild a decoder each time.
    codec = E.EnvelopeCodec(backend)
    learnt = []
    monkeypatch.setattr(codec, "learn", lambda *a: learnt.append(a))
    value, headers = _some_envelopes()[1]
    for _ in range(3):
        codec.decode(value, [("vtp", vtp_header_value())])
    assert learnt == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_garbage_vtp_on_a_version_we_ship_is_ignored(backend):
    codec = E.EnvelopeCodec(backend)
    value, _ = _some_envelopes()[1]
    expected = codec.decode(value)
    for junk in (b"{oops", b'"string"', json.dumps({"type": "record", "name": "X", "fields": []}).encode()):
        assert codec.decode(value, [("vtp", junk)]) == expected


def test_the_newer_schema_really_differs_from_ours():
    from fastavro.schema import to_parsing_canonical_form

    from div import envelope_versions as ev

    assert to_parsing_canonical_form(newer_schema()) != to_parsing_canonical_form(ev.writer_schema(15))


# ---- every job, on a simulation re-encoded by the newer writer -------------------------------------------------

REGIONS = 3


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    root = tmp_path_factory.mktemp("newer-protocol")
    sim = small_sim(
        root / "sim", seed=11, regions=REGIONS, records=900, keys=200, faults={"dropped": 1, "poisoned": 1}
    )
    original = sim.archives
    newer = {}
    for region, src in original.items():
        version = 15 if region == 0 else 16  # a shipped version with another schema, and an unknown one
        dst = root / f"newer-{region}"
        assert reencode_archive(src, dst, version) == read_archive(src).num_rows
        newer[region] = str(dst)
    return {
        "root": root,
        "store": sim.store,
        "version": sim.version,
        "topic": sim.topic,
        "original": original,
        "newer": newer,
    }


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, err.getvalue()


def _sources(archives: dict[int, str], flag: str = "--source") -> list[str]:
    return [a for r, path in sorted(archives.items()) for a in (flag, f"{r}={path}")]


def _both(worlds, name: str, argv_of) -> tuple[tuple[int, str, Path], tuple[int, str, Path]]:
    runs = []
    for which in ("original", "newer"):
        out = worlds["root"] / f"{name}-{which}"
        code, err = _cli(argv_of(worlds[which], out))
        runs.append((code, err, out))
    return runs[0], runs[1]


def _table(path: Path, sort: list[str]) -> list[dict]:
    if not path.exists():
        return []
    return sorted(pq.read_table(path).to_pylist(), key=lambda r: [str(r.get(c)) for c in sort])


@pytest.mark.slow
@pytest.mark.spark
def test_leapfrog_finds_the_same_on_newer_records(worlds, spark):
    (c0, e0, o0), (c1, e1, o1) = _both(
        worlds,
        "leapfrog",
        lambda archives, out: [
            "leapfrog",
            "--store",
            worlds["store"],
            "--version",
            worlds["version"],
            "--out",
            out,
            *_sources(archives),
        ],
    )
    assert c0 == 1, e0  # the simulation's dropped and poisoned writes
    assert c1 == c0, e1
    cols = ["type", "region_a", "region_b", "partition", "key"]
    assert [{c: f[c] for c in cols} for f in _table(o1 / "inconsistencies", cols)] == [
        {c: f[c] for c in cols} for f in _table(o0 / "inconsistencies", cols)
    ]
    s0, s1 = (json.loads((o / "summary.json").read_text()) for o in (o0, o1))
    assert s1["verdict"] == s0["verdict"] == "findings"
    assert s1["totals"]["unverified_keys"] == 0
    assert s1["evidence"]["undecodable_records"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["local", pytest.param("spark", marks=pytest.mark.spark)])
def test_div_validate_finds_the_same_on_newer_records(worlds, engine, request):
    if engine == "spark":
        request.getfixturevalue("spark")
    for region in range(REGIONS):
        (c0, e0, o0), (c1, e1, o1) = _both(
            worlds,
            f"div-{engine}-{region}",
            lambda archives, out, region=region: [
                "div",
                "validate",
                "--source",
                f"0={archives[region]}",
                "--topic",
                worlds["topic"],
                "--out",
                out,
                "--now-ms",
                "1800000000000",
                "--engine",
                engine,
            ],
        )
        assert c1 == c0, e1
        cols = ["topic", "partition", "offset", "type"]
        assert [{c: f[c] for c in cols} for f in _table(o1 / "errors", cols)] == [
            {c: f[c] for c in cols} for f in _table(o0 / "errors", cols)
        ]
        summary = json.loads((o1 / "summary.json").read_text())
        assert summary["undecodable_records"] == 0


@pytest.mark.slow
def test_lag_reads_the_same_on_newer_records(worlds):
    (c0, e0, o0), (c1, e1, o1) = _both(
        worlds,
        "lag",
        lambda archives, out: [
            "lag",
            "--store",
            worlds["store"],
            "--version",
            worlds["version"],
            "--out",
            out,
            "--now-ms",
            "1800000000000",
            *_sources(archives),
        ],
    )
    assert c1 == c0 == 0, (e0, e1)
    keys = ["vt_region", "partition", "source_region"]
    assert _table(o1 / "lag", keys) == _table(o0 / "lag", keys)


@pytest.mark.slow
def test_div_restore_restores_the_same_state_from_newer_records(worlds):
    def argv(archives, out):
        return [
            "div",
            "restore",
            "--store",
            worlds["store"],
            "--version",
            worlds["version"],
            "--partition",
            1,
            "--at-offset",
            300,
            "--out",
            out,
            "--source",
            f"1={archives[1]}",
            *_sources(archives, "--rt-source"),
        ]

    (c0, e0, o0), (c1, e1, o1) = _both(worlds, "restore", argv)
    assert c1 == c0 == 0, (e0, e1)
    states = [ps.decode((o / "partition_state.bin").read_bytes()) for o in (o0, o1)]
    for s in states:
        s.pop("lastUpdate")  # the wall-clock time of the run
    assert states[1] == states[0]
    s0, s1 = (json.loads((o / "state.json").read_text()) for o in (o0, o1))
    assert s1 == s0
    summary = json.loads((o1 / "summary.json").read_text())
    assert summary["verdict"] == "clean" and summary["evidence"]["undecodable_records"] == 0
    assert summary["vt_records_replayed"] > 0  # the replay after the heartbeat read newer records
