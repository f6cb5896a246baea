"""`tidegauge changes` as a user runs it, on a small simulation with a leader failover (its VT holds duplicates).

Truth is the one rule run directly: `PartitionChanges` over `div.archive.iter_partition`, one pass per partition
(tests/support/change_oracle.py).
The command (either engine, any number of incremental steps, killed anywhere and run again, following a version
swap) must give exactly those rows.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from change_oracle import one_pass
from damage import Damage, damage_archive, read_archive

from div import archive
from heartbeat.change_events import CHANGES_SCHEMA
from heartbeat.changes import ChangeState
from pipelines.cli import main

N_REGIONS = 3


def vt_tables(directory, topic: str) -> dict[int, pa.Table]:
    parts = sorted(i.partition for i in archive.describe(directory) if i.topic == topic)
    return {p: pa.Table.from_batches(list(archive.iter_partition(directory, topic, p))) for p in parts}


def changes(*argv) -> int:
    return main(["changes", *map(str, argv)])


def rows(out: Path) -> pa.Table:
    files = sorted((out / "changes").glob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else CHANGES_SCHEMA.empty_table()


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def by_partition(table: pa.Table) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in table.to_pylist():
        out.setdefault(r["partition"], []).append(r)
    return out


def write_vt(tables: dict[int, pa.Table], directory: Path, topic: str | None = None) -> Path:
    """An archive of these VT partitions (renamed to `topic` when given)."""
    directory.mkdir(parents=True)
    for p, t in tables.items():
        if topic is not None:
            t = t.set_column(t.schema.get_field_index("topic"), "topic", pa.array([topic] * t.num_rows))
        pq.write_table(t, directory / f"part-{p}.parquet")
    return directory


def eop_offsets(sim) -> dict[int, int]:
    """Each partition's End of Push offset in the archive (a cut after it keeps swaps exact)."""
    from div.envelope import EnvelopeCodec
    from div.records import Kind, iter_records

    out = {}
    for p, t in vt_tables(sim.archive, sim.topic).items():
        out[p] = next(r.offset for r in iter_records(t, EnvelopeCodec()) if r.kind is Kind.END_OF_PUSH)
    return out


# -- one run ------------------------------------------------------------------------------------------------------


def test_one_run_delivers_the_rule_s_rows_in_vt_order_and_each_coordinate_once(sim, tmp_path):
    out = tmp_path / "out"
    assert changes("--store", sim.store, "--version", 1, "--source", sim.archive, "--out", out) == 0
    got = rows(out)
    assert got.schema == CHANGES_SCHEMA
    expected = one_pass(sim.archive, sim.topic, N_REGIONS)
    assert got.equals(expected)
    for p, rs in by_partition(got).items():
        offsets = [r["vt_offset"] for r in rs]
        assert offsets == sorted(offsets), p
        coords = [
            (r["upstream_region"], r["upstream_offset"]) for r in rs if r["upstream_region"] is not None
        ]
        assert len(coords) == len(set(coords)), f"partition {p} delivers a coordinate twice"
    s = summary(out)
    assert s["job"] == "changes" and s["verdict"] == "clean" and s["exit_code"] == 0
    assert s["delivered"] == got.num_rows
    assert s["bulk_load"] == sum(1 for r in got.to_pylist() if r["upstream_region"] is None) > 0
    dups = s["duplicates_dropped"]
    assert (
        dups["total"] == dups["below_record"] + dups["below_heartbeat"] > 0
    )  # the failover's re-produced tail
    assert s["undecodable"] == 0 and s["problems"] == []
    assert s["state"] == {
        "dir": None,
        "used": "fresh",
        "version": None,
        "from": "fresh",
        "to": s["state"]["to"],
        "recovered": None,
        "region": None,
        "log_identity": {"checked": [], "unchecked": []},
    }
    assert s["store_regions"] == {"count": N_REGIONS, "learned_from": "heartbeats"}
    assert [p["partition"] for p in s["partitions"]] == [0, 1]
    assert sum(p["delivered"] for p in s["partitions"]) == s["delivered"]
    assert all(p["read"]["from"] == 0 and p["read"]["records"] > 0 for p in s["partitions"])


@pytest.mark.spark
@pytest.mark.slow
def test_the_spark_engine_gives_the_local_engine_s_rows(sim, tmp_path, spark):
    local, remote = tmp_path / "local", tmp_path / "spark"
    state_l, state_s = tmp_path / "state-l", tmp_path / "state-s"
    base = ["--store", sim.store, "--version", 1, "--source", sim.archive]
    assert changes(*base, "--out", local, "--state", state_l) == 0
    assert changes(*base, "--out", remote, "--state", state_s, "--engine", "spark") == 0
    assert rows(remote).equals(rows(local))
    assert sorted(p.name for p in (remote / "changes").iterdir()) == [
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    a, b = summary(local), summary(remote)
    assert (a["engine"], b["engine"]) == ("local", "spark")
    for s in (a, b):
        for k in ("started_at", "elapsed_s", "engine", "run"):
            s.pop(k)
        s["state"].pop("dir")
    assert a == b
    assert (state_l / "state.tgcc").read_bytes() == (state_s / "state.tgcc").read_bytes()


# -- incremental runs ---------------------------------------------------------------------------------------------


def test_runs_over_a_growing_source_deliver_together_exactly_the_one_pass_rows(sim, tmp_path):
    """The source grows between runs (prefixes of the archive cut at random offsets per partition, some between a
    record and its failover duplicate); each run reads on from --state into its own --out."""
    full = vt_tables(sim.archive, sim.topic)
    rng = random.Random(3)
    cuts = {p: sorted(rng.sample(range(1, t.num_rows), 3)) + [t.num_rows] for p, t in full.items()}
    state, delivered, previous = tmp_path / "state", [], "fresh"
    for step in range(4):
        grown = write_vt({p: t.slice(0, cuts[p][step]) for p, t in full.items()}, tmp_path / f"src-{step}")
        out = tmp_path / f"out-{step}"
        argv = ["--store", sim.store, "--version", 1, "--source", grown, "--out", out, "--state", state]
        # (a first cut may hold no heartbeat yet: nothing says how many regions the store has)
        assert changes(*argv, "--regions", N_REGIONS) == 0
        s = summary(out)
        assert s["state"]["used"] == ("fresh" if step == 0 else "resume")
        assert s["state"]["from"] == previous  # each output names the state it started from: a chain
        previous = s["state"]["to"]
        assert [p["read"]["from"] for p in s["partitions"]] == [
            0 if step == 0 else cuts[p][step - 1] for p in sorted(full)
        ]
        delivered.append(rows(out))
    got = by_partition(pa.concat_tables(delivered))
    expected = by_partition(one_pass(sim.archive, sim.topic, N_REGIONS))
    assert got == expected
    assert (
        ChangeState.from_bytes((state / "state.tgcc").read_bytes()).partition(0).position == full[0].num_rows
    )
    # nothing new: nothing delivered, the state unchanged
    out = tmp_path / "out-again"
    assert (
        changes("--store", sim.store, "--version", 1, "--source", sim.archive, "--out", out, "--state", state)
        == 0
    )
    assert (
        rows(out).num_rows == 0 and summary(out)["state"]["to"] == summary(out)["state"]["from"] == previous
    )


def test_a_version_swap_keeps_the_marks_skips_the_bulk_load_and_drops_the_replay(sim, tmp_path):
    """Version 2 replays version 1 (here: the same records, renamed `<store>_v2`): a reader that read version 1 up to
    a cut after End of Push and follows version 2 delivers exactly version 1's changes after the cut."""
    full = vt_tables(sim.archive, sim.topic)
    eop = eop_offsets(sim)
    cut = {p: eop[p] + 1 + (t.num_rows - eop[p]) // 2 for p, t in full.items()}
    v1 = write_vt({p: t.slice(0, cut[p]) for p, t in full.items()}, tmp_path / "v1")
    v2 = write_vt(full, tmp_path / "v2", topic=f"{sim.store}_v2")
    state = tmp_path / "state"
    assert (
        changes(
            "--store", sim.store, "--version", 1, "--source", v1, "--out", tmp_path / "o1", "--state", state
        )
        == 0
    )
    # version 1 was cut before its end (no VersionSwap read): following is refused, nothing written...
    assert summary(tmp_path / "o1")["version_ended"] is False
    assert (
        changes(
            "--store", sim.store, "--version", 2, "--source", v2, "--out", tmp_path / "o2", "--state", state
        )
        == 2
    )
    assert not (tmp_path / "o2").exists()
    # ...unless the operator says the store's versions end without one
    assert (
        changes(
            "--store",
            sim.store,
            "--version",
            2,
            "--source",
            v2,
            "--out",
            tmp_path / "o2",
            "--state",
            state,
            "--follow-unended",
        )
        == 0
    )
    s = summary(tmp_path / "o2")
    assert (s["state"]["used"], s["state"]["version"], s["version"]) == ("swap", 1, 2)
    assert s["bulk_load"] == 0 and s["bulk_skipped"] > 0 and s["duplicates_dropped"]["total"] > 0
    got = by_partition(pa.concat_tables([rows(tmp_path / "o1"), rows(tmp_path / "o2")]))
    assert got == by_partition(one_pass(sim.archive, sim.topic, N_REGIONS))
    assert ChangeState.from_bytes((state / "state.tgcc").read_bytes()).version == 2
    # and version 2 resumes from there: nothing new
    assert (
        changes(
            "--store", sim.store, "--version", 2, "--source", v2, "--out", tmp_path / "o3", "--state", state
        )
        == 0
    )
    assert summary(tmp_path / "o3")["state"]["used"] == "resume" and rows(tmp_path / "o3").num_rows == 0


# -- refusals: exit 2, a message, nothing written -----------------------------------------------------------------


@pytest.fixture
def v1_state(sim, tmp_path) -> Path:
    state = tmp_path / "state"
    assert (
        changes(
            "--store",
            sim.store,
            "--version",
            1,
            "--source",
            sim.archive,
            "--out",
            tmp_path / "o",
            "--state",
            state,
        )
        == 0
    )
    return state


def _refused(capsys, argv, out: Path, *needles: str, state: Path | None = None) -> str:
    before = {f.name: f.read_bytes() for f in state.iterdir()} if state is not None else None
    assert changes(*argv, "--out", out) == 2
    err = capsys.readouterr().err
    assert err.startswith("tidegauge changes: error:"), err
    for n in needles:
        assert n in err, (n, err)
    if state is not None:
        assert {f.name: f.read_bytes() for f in state.iterdir()} == before
    return err


def test_a_state_of_another_store_is_refused_naming_both(sim, tmp_path, capsys, v1_state):
    argv = ["--store", "other_store", "--version", 1, "--source", sim.archive, "--state", v1_state]
    _refused(capsys, argv, tmp_path / "x", "'sim_store'", "'other_store'", str(v1_state), state=v1_state)
    assert not (tmp_path / "x").exists()


def test_a_state_two_versions_back_is_refused_naming_both(sim, tmp_path, capsys, v1_state):
    argv = ["--store", sim.store, "--version", 3, "--source", sim.archive, "--state", v1_state]
    _refused(capsys, argv, tmp_path / "x", "version 1", "version 3", state=v1_state)
    assert not (tmp_path / "x").exists()


def test_a_damaged_state_is_refused_naming_the_file_and_why(sim, tmp_path, capsys, v1_state):
    f = v1_state / "state.tgcc"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x10
    f.write_bytes(bytes(data))
    argv = ["--store", sim.store, "--version", 1, "--source", sim.archive, "--state", v1_state]
    _refused(capsys, argv, tmp_path / "x", f"{f}:", "CRC32", state=v1_state)
    f.write_bytes(b"TGCC")
    _refused(capsys, argv, tmp_path / "x", f"{f}:", "truncated", state=v1_state)
    assert not (tmp_path / "x").exists()


def test_a_state_directory_of_other_files_is_refused(sim, tmp_path, capsys):
    state = tmp_path / "mine"
    state.mkdir()
    (state / "notes.txt").write_text("mine")
    argv = ["--store", sim.store, "--version", 1, "--source", sim.archive, "--state", state]
    _refused(capsys, argv, tmp_path / "x", "notes.txt", state=state)


@pytest.mark.parametrize("what", ["empty archive", "no such topic", "no such directory"])
def test_an_empty_source_is_refused_with_a_clear_message(sim, tmp_path, capsys, what):
    empty = tmp_path / "empty"
    empty.mkdir()
    source, store, needle = {
        "empty archive": (empty, sim.store, "holds no record"),
        "no such topic": (sim.archive, "nosuch", "no topic 'nosuch_v1'"),
        "no such directory": (tmp_path / "absent", sim.store, "no such archive directory"),
    }[what]
    _refused(capsys, ["--store", store, "--version", 1, "--source", source], tmp_path / "x", needle)
    assert not (tmp_path / "x").exists()


def test_out_on_user_files_or_on_the_source_is_refused_and_nothing_is_touched(sim, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    base = ["--store", sim.store, "--version", 1, "--source", sim.archive]
    _refused(capsys, base, mine, "not empty")
    assert sorted(os.listdir(mine)) == ["thesis.tex"] and (mine / "thesis.tex").read_text() == "years of work"
    _refused(capsys, base, Path(sim.archive) / "out", "inside --source")
    _refused(capsys, [*base, "--state", tmp_path / "o" / "state"], tmp_path / "o", "overlap")
    other = tmp_path / "div-out"
    assert main(["div", "validate", "--source", f"0={sim.archive}", "--out", str(other)]) in (0, 1, 3)
    _refused(capsys, base, other, "div validate")


# -- undecodable records ------------------------------------------------------------------------------------------


def test_an_undecodable_record_is_counted_with_its_offset_never_delivered_and_the_rest_is(sim, tmp_path):
    table = read_archive(sim.archive)
    expected = one_pass(sim.archive, sim.topic, N_REGIONS)
    # a change delivered in partition 1 (no failover there: no later copy of it would take its place)
    victim = [r for r in expected.to_pylist() if r["partition"] == 1 and r["upstream_region"] is not None][10]
    recs = table.to_pylist()
    row = next(
        i
        for i, r in enumerate(recs)
        if (r["topic"], r["partition"], r["offset"]) == (sim.topic, 1, victim["vt_offset"])
    )
    damaged = tmp_path / "damaged"
    damage_archive(sim.archive, damaged, [Damage("value_random", row=row)])
    out = tmp_path / "out"
    assert changes("--store", sim.store, "--version", 1, "--source", damaged, "--out", out) == 3
    s = summary(out)
    assert (s["verdict"], s["exit_code"], s["undecodable"]) == ("partial", 3, 1)
    (problem,) = s["problems"]
    assert (problem["topic"], problem["partition"], problem["offset"]) == (sim.topic, 1, victim["vt_offset"])
    assert problem["reason"]
    assert s["evidence"]["by_partition"][1]["undecodable_offsets"] == [victim["vt_offset"]]
    got = rows(out).to_pylist()
    assert got == [r for r in expected.to_pylist() if r != victim]


# -- a live cluster -----------------------------------------------------------------------------------------------


@pytest.mark.kafka
def test_a_kafka_source_gives_the_archive_s_rows_and_resumes_as_it_grows(
    sim, embedded_kafka, tmp_path, capsys
):
    """The archive's VT produced into a topic of the embedded cluster in two halves, `changes --state` run after
    each: the two outputs together are the one-pass rows (the topic's offsets are the archive's)."""
    import uuid

    from confluent_kafka import Producer

    store = f"k{uuid.uuid4().hex[:8]}"
    full = vt_tables(sim.archive, sim.topic)
    embedded_kafka.create_topic(f"{store}_v1", len(full))
    producer = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers, "enable.idempotence": False})

    def produce(lo: float, hi: float) -> None:
        for p, t in full.items():
            for r in t.slice(int(t.num_rows * lo), int(t.num_rows * hi) - int(t.num_rows * lo)).to_pylist():
                headers = [(h["key"], h["value"]) for h in r["headers"] or []]
                producer.produce(
                    f"{store}_v1", key=r["key"], value=r["value"], partition=p, headers=headers or None
                )
        assert producer.flush(30) == 0

    state, argv = tmp_path / "state", ["--store", store, "--version", 1, "--source", embedded_kafka.uri]
    produce(0, 0.5)
    assert changes(*argv, "--out", tmp_path / "k1", "--state", state, "--regions", 3) == 0
    produce(0.5, 1)
    assert changes(*argv, "--out", tmp_path / "k2", "--state", state) == 0
    got = by_partition(pa.concat_tables([rows(tmp_path / "k1"), rows(tmp_path / "k2")]))
    assert got == by_partition(one_pass(sim.archive, sim.topic, N_REGIONS))
    assert summary(tmp_path / "k2")["source"] == embedded_kafka.uri
    _refused(
        capsys,
        ["--store", "absent", "--version", 1, "--source", embedded_kafka.uri],
        tmp_path / "x",
        "no topic 'absent_v1'",
    )


def test_kafka_client_settings_from_conf_pass_through_untouched(tmp_path, monkeypatch):
    import pipelines.changes.job as job

    conf = tmp_path / "tidegauge.yaml"
    conf.write_text(
        "store: s\nversion: 4\nsources: {1: 'kafka://b:9092'}\n"
        "kafka: {security.protocol: SASL_SSL, sasl.mechanism: PLAIN, sasl.password: secret}\n"
        "kafka_by_region: {1: {sasl.username: reader}}\n"
    )
    seen = []
    monkeypatch.setattr(job, "run_local", lambda opts: seen.append(opts) or 0)
    assert changes("--conf", conf, "--out", tmp_path / "o") == 0
    (opts,) = seen
    assert (opts.store, opts.version, opts.topic, opts.source.uri, opts.source.region) == (
        "s",
        4,
        "s_v4",
        "kafka://b:9092",
        1,
    )
    assert opts.kafka_conf == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.password": "secret",
        "sasl.username": "reader",
    }


def test_a_partition_that_cannot_be_read_delivers_nothing_keeps_its_state_and_is_read_next_time(
    sim, tmp_path, monkeypatch
):
    from pipelines.core.sources import ArchiveSource, SourceError

    original = ArchiveSource.iter_partition

    def failing(self, topic, partition, *args, **kwargs):
        for i, batch in enumerate(original(self, topic, partition, *args, batch_size=100, **kwargs)):
            if partition == 1 and i == 2:
                raise SourceError("the disk went away")
            yield batch

    state, argv = tmp_path / "state", ["--store", sim.store, "--version", 1, "--source", sim.archive]
    with monkeypatch.context() as m:
        m.setattr(ArchiveSource, "iter_partition", failing)
        assert changes(*argv, "--out", tmp_path / "o1", "--state", state) == 3
    s = summary(tmp_path / "o1")
    assert s["verdict"] == "partial" and s["failed_partitions"] == [
        {"partition": 1, "error": "the disk went away"}
    ]
    assert sorted(p.name for p in (tmp_path / "o1" / "changes").iterdir()) == ["part-00000.parquet"]
    assert ChangeState.from_bytes((state / "state.tgcc").read_bytes()).partition(1).position == 0
    assert changes(*argv, "--out", tmp_path / "o2", "--state", state) == 0
    assert summary(tmp_path / "o2")["partitions"][0]["read"]["records"] == 0
    got = by_partition(pa.concat_tables([rows(tmp_path / "o1"), rows(tmp_path / "o2")]))
    assert got == by_partition(one_pass(sim.archive, sim.topic, N_REGIONS))


def test_one_out_for_every_run_is_replaced_once_read_and_other_commands_state_is_refused(
    sim, tmp_path, capsys
):
    out, state = tmp_path / "out", tmp_path / "state"
    argv = ["--store", sim.store, "--version", 1, "--source", sim.archive, "--state", state, "--out", out]
    assert changes(*argv) == 0
    first = summary(out)["state"]
    (out / "read.json").write_text(json.dumps({"run": summary(out)["run"]}))  # the consumer read it
    assert changes(*argv) == 0  # the same --out again: the earlier output of `changes`, read, is replaced
    assert summary(out)["state"]["from"] == first["to"] and rows(out).num_rows == 0
    lf = tmp_path / "lf-state"
    lf.mkdir()
    (lf / "state.json").write_text("{}")
    _refused(capsys, [*argv[:-4], "--state", lf], tmp_path / "x", "state.json", state=lf)
