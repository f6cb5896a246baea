"""The watch's DIV over the real-time topics too (`--rt`): a simulation's archives, holding RT faults whose truth is
known, watched as they grow (--rt added on a restart of a watch that read only the VTs) give `div validate`'s rows
over VT and RT; a source without the RT is refused at start."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from small_sim import small_sim

from div.archive import file_name
from pipelines.core.sources import SourceError, SourceSpec
from pipelines.watch.job import WatchOptions, prepare, read_findings, start
from pipelines.watch.metrics import WatchMetrics


def _row(r: dict) -> tuple:
    return (r["region"], r["topic"], r["partition"], r["offset"], r["type"], r["fatal"])


def _grow(full: dict[int, str], live, part: int, parts: int) -> dict[int, str]:
    """The `part`-th of `parts` slices of every archive file's offsets, added to a copy under `live` as the
    archiver adds files (whole, by rename, a partition's files in offset order). Returns {region: copy}."""
    dirs = {}
    for region, src in full.items():
        dst = live / f"dc-{region}"
        dst.mkdir(parents=True, exist_ok=True)
        dirs[region] = str(dst)
        for f in sorted(p for p in Path(src).iterdir() if p.suffix == ".parquet"):
            table = pq.read_table(f)
            offsets = table.column("offset")
            first, last = pc.min(offsets).as_py(), pc.max(offsets).as_py()
            step = (last - first + parts) // parts
            lo, hi = first + part * step, first + (part + 1) * step
            piece = table.filter(pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, hi)))
            if piece.num_rows:
                topic, partition = f.name.split("+")[:2]
                name = file_name(topic, int(partition), pc.min(piece.column("offset")).as_py())
                pq.write_table(piece, dst / f".{name}.tmp")
                (dst / f".{name}.tmp").rename(dst / name)
    return dirs


@pytest.mark.spark
@pytest.mark.slow
def test_growing_simulated_archives_watched_with_rt_equal_div_validate_over_vt_and_rt(spark, tmp_path):
    from pipelines.div.validate import ValidateOptions, run_local

    sim = small_sim(
        tmp_path / "sim",
        records=600,
        keys=100,
        partitions=2,
        faults={"gap": 1, "corrupt": 1, "duplicate": 1},
    )
    truth = {
        tuple(e[k] for k in ("region", "topic", "partition", "offset", "type", "fatal"))
        for f in sim.result.truth["faults"]
        for e in f["expect"]["div"]
    }
    rt = f"{sim.store}_rt"
    assert truth and all(t[1] == rt for t in truth), "the run's DIV faults are RT faults"
    # the oracle: the batch command over the whole archives (every topic a source holds: VT and RT)
    run_local(
        ValidateOptions(
            sources=[SourceSpec(x, d) for x, d in sim.archives.items()], out=str(tmp_path / "div")
        )
    )
    expected = sorted(_row(r) for r in pq.read_table(tmp_path / "div" / "errors").to_pylist())
    assert truth <= set(expected), "div validate finds what the simulation put in"

    live = tmp_path / "live"
    dirs = _grow(sim.archives, live, 0, 3)
    opts = WatchOptions(
        store=sim.store,
        version=sim.version,
        sources=[SourceSpec(x, d) for x, d in dirs.items()],
        checkpoint=str(tmp_path / "checkpoint"),
        out=str(tmp_path / "watch"),
        rt_topic=rt,
    )
    counts = []
    metrics = WatchMetrics()
    for part in range(3):
        if part:
            _grow(sim.archives, live, part, 3)  # more of every log arrives; the same checkpoint goes on
        # the first run watches the VTs only, as a watch started before --rt existed: --rt added on a restart
        # reads each RT from its first offset, then goes on across runs as the VTs do
        run_opts = opts if part else dataclasses.replace(opts, rt_topic=None)
        for q in start(spark, run_opts, metrics, available_now=True):
            q.awaitTermination()
        counts.append(read_findings(opts.out, "div").num_rows)
    watched = read_findings(opts.out, "div").to_pylist()
    assert sorted(_row(r) for r in watched) == expected
    assert len({r["finding_id"] for r in watched}) == len(watched)
    assert counts[0] < counts[-1], f"findings after each run: {counts}"
    # the one query read the RTs (from the run that asked for them on) beside the VTs...
    offsets = tmp_path / "checkpoint" / "watch" / "offsets"
    planned = [json.loads(f.read_text().splitlines()[-1]) for f in offsets.iterdir() if f.name.isdigit()]
    assert {k.split("/")[1] for o in planned for k in o} == {sim.topic, rt}
    # ...and Leap Frog stayed on the VTs: the records it read are the VTs', every one of them once
    read = {
        (s.labels["region"], s.labels["topic"]): s.value
        for fam in metrics.registry.collect()
        if fam.name == "tidegauge_records"
        for s in fam.samples
        if s.name == "tidegauge_records_total"
    }
    vt_records = {
        (str(x), sim.topic): sum(
            pq.read_table(f, columns=["topic"]).column("topic").to_pylist().count(sim.topic)
            for f in Path(d).iterdir()
            if f.suffix == ".parquet"
        )
        for x, d in sim.archives.items()
    }
    assert read == vt_records


def test_rt_asked_for_but_a_source_lacks_it_is_refused_at_start(tmp_path):
    from leapfrog_histories import generated
    from vt_fixtures import STORE, write_archives

    dirs = write_archives([h for h in generated(1) if h.n_regions == 3][:2], tmp_path / "a")
    opts = WatchOptions(
        store=STORE,
        version=1,
        sources=[SourceSpec(x, d) for x, d in dirs.items()],
        checkpoint=str(tmp_path / "ck"),
        out=str(tmp_path / "w"),
        rt_topic=f"{STORE}_rt",
    )
    with pytest.raises(SourceError, match=rf"source 0={dirs[0]}: no topic '{STORE}_rt'.*--rt"):
        prepare(opts)
    assert not (tmp_path / "w").exists()  # nothing written by a refused start
    # a region that has it passes; the others are still named
    vt = pq.read_table(next(p for p in (tmp_path / "a" / "dc-0").iterdir() if p.suffix == ".parquet"))
    topic = pa.array([f"{STORE}_rt"] * vt.num_rows, vt.schema.field("topic").type)
    rt = vt.set_column(vt.schema.get_field_index("topic"), vt.schema.field("topic"), topic)
    pq.write_table(rt, tmp_path / "a" / "dc-0" / file_name(f"{STORE}_rt", 0, 0))
    with pytest.raises(SourceError, match=rf"source 1=.*no topic '{STORE}_rt'"):
        prepare(opts)


def test_the_command_line_asks_for_rts_as_documented(tmp_path, capsys):
    from leapfrog_histories import generated
    from vt_fixtures import STORE, write_archives

    from pipelines.cli import main

    dirs = write_archives([h for h in generated(1) if h.n_regions == 3][:2], tmp_path / "a")
    argv = ["watch", "--store", STORE, "--version", "1", "--checkpoint", str(tmp_path / "ck")]
    argv += ["--out", str(tmp_path / "w")] + [f"--source={x}={d}" for x, d in dirs.items()]
    assert main([*argv, "--rt"]) == 2
    assert f"source 0={dirs[0]}: no topic '{STORE}_rt'" in capsys.readouterr().err
    assert main([*argv, "--rt-topic", f"{STORE}_rt_v3"]) == 2
    assert f"no topic '{STORE}_rt_v3'" in capsys.readouterr().err
    assert main([*argv, "--rt-topic", f"{STORE}_v1"]) == 2
    assert "not a real-time topic name" in capsys.readouterr().err
    conf = tmp_path / "c.yaml"
    conf.write_text("rt: true\n")
    assert main([*argv, "--conf", str(conf)]) == 2
    assert f"no topic '{STORE}_rt'" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
