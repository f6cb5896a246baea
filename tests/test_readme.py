"""The README keeps its promises: the two setup commands (and that CI runs the second verbatim), a CLI reference
equal to what the parsers say, a heartbeat example and a change-capture consumer that run (the consumer against a
real broker), and a benchmark table drawn from measured output."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DEMO_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/tidegauge demo"
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _example(name: str) -> str:
    """The code block right after `<!-- example: NAME -->`."""
    m = re.search(
        rf"<!-- example: {re.escape(name)} -->\s*```python\n(.*?)```", README.read_text(), flags=re.S
    )
    assert m, f"README.md has no example block {name!r}"
    return m.group(1)


def test_the_readme_opens_with_the_demo_and_the_test_command():
    text = README.read_text()
    first, second = (b.strip() for b in _blocks(text, "sh")[:2])
    assert (first, second) == (DEMO_COMMAND, TEST_COMMAND)
    assert text.index(DEMO_COMMAND) < text.index("## ")  # before any section


def test_ci_runs_exactly_the_readme_test_command():
    script = (REPO / ".ci" / "run").read_text()
    commands = [ln.strip() for ln in script.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert TEST_COMMAND in commands
    assert (REPO / ".ci" / "run").stat().st_mode & 0o111, ".ci/run must be executable"
    assert "java" in script and "17" in script  # Java is checked first, with a message


def test_cli_reference_equals_what_the_parsers_say():
    gen = _load(REPO / "docs" / "gen_cli_reference.py")
    section = gen.generate()
    assert section in README.read_text(), (
        "README's CLI reference is out of date: run python docs/gen_cli_reference.py"
    )
    # and it really covers every flag of every subcommand
    from pipelines.cli import build_parser

    def flags(parser) -> set[str]:
        out = set()
        for action in parser._actions:
            out.update(a for a in action.option_strings if a.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    out |= flags(sub)
        return out

    missing = {f for f in flags(build_parser()) if f"`{f}" not in section and f"`{f}," not in section}
    assert not missing - {"--help"}
    assert {"### `tidegauge demo`", "### `tidegauge div validate`", "### `tidegauge leapfrog`"} <= set(
        section.splitlines()
    )


@pytest.mark.kafka
def test_the_heartbeat_leader_example_runs_and_prints_what_the_readme_says():
    namespace: dict = {"__name__": "readme_example"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_example("leader-loop"), "README.md:leader-loop", "exec"), namespace)
        exec(compile(_example("leader-loop-run"), "README.md:leader-loop-run", "exec"), namespace)
    lines = out.getvalue().splitlines()
    assert lines[0] == "leader of region 0 processed RT offsets [52, 52]"
    heartbeats = [
        re.fullmatch(r"VT offset (\d+): heartbeat from region (\d), watermarks \[(\d+), (\d+)\]", ln)
        for ln in lines[1:]
    ]
    assert len(heartbeats) == 2 and all(heartbeats), lines
    assert sorted(int(m.group(2)) for m in heartbeats) == [0, 1]
    for m in heartbeats:  # a heartbeat covers at least its own RT heartbeat (offset 52 of its origin region)
        marks = [int(m.group(3)), int(m.group(4))]
        assert marks[int(m.group(2))] == 52
        assert int(m.group(1)) >= 101  # after the StartOfSegment and the 100 PUTs it covers


def test_the_benchmark_table_is_what_the_benchmarks_printed():
    bench = _load(REPO / "bench" / "readme_table.py")
    results = json.loads((REPO / "bench" / "results.json").read_text())
    table = bench.table(results)
    assert table in README.read_text(), (
        "README's benchmark table is out of date: python bench/readme_table.py --render"
    )
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "python bench/" in ln]
    assert len(rows) == len(results["benches"]) >= 5
    for name, entry in results["benches"].items():
        script = entry["command"].split()[1]
        assert (REPO / script).exists(), script
        assert entry["command"] == "python " + " ".join(bench.BENCHES[name])  # measured with today's sizes


def _change_capture_vt(partition: int, steps: int = 90):
    """A VT partition of a three-region store: a bulk load, End of Push, changes from every region with heartbeats,
    and a new leader that re-produces the changes after its predecessor's last heartbeat (duplicates)."""
    import random

    from vt_builder import RegionVt

    rng = random.Random(partition)
    vt = RegionVt(0, partition)
    vt.start_of_push()
    for i in range(8):
        vt.put(b"key-%d" % i, b"bulk %d" % i, 0, 0)
    vt.end_of_push()
    writes = [(i % 3, i // 3, b"key-%d" % rng.randrange(12), i % 7 == 6) for i in range(steps)]
    marks = [-1, -1, -1]

    def write(r, q, key, delete):
        if delete:
            vt.delete(key, r, q)
        else:
            vt.put(key, b"r%d-%d" % (r, q), r, q)

    for i, w in enumerate(writes):
        write(*w)
        marks[w[0]] = w[1]
        if i % 10 == 9:
            vt.heartbeat(w[0], 1000 + i, list(marks))
        if i == 2 * steps // 3 + 5:  # failover: the new leader starts again from the last heartbeat's vector
            for again in writes[i - i % 10 : i + 1]:
                write(*again)
    return vt


@pytest.mark.slow
def test_the_change_capture_example_applies_each_change_once_and_resumes(real_kafka, tmp_path):
    """The README's consumer, run as written against a real broker: over a VT produced in two parts (a run after
    each) and then once more with nothing new, it applies every change once and its dict is what applying the
    rule's events in order gives."""
    import uuid

    import pyarrow as pa
    from confluent_kafka import Producer
    from vt_builder import write_archive

    from div import archive
    from heartbeat.change_events import PartitionChanges
    from heartbeat.changes import PartitionState

    store = f"readme{uuid.uuid4().hex[:8]}"
    topic = f"{store}_v1"
    vts = [_change_capture_vt(p) for p in range(2)]
    real_kafka.create_topics({topic: 2})
    bootstrap = real_kafka.bootstrap_servers
    expected_events, expected_table = [], {}
    write_archive(vts, tmp_path / "archive", topic)
    for p in range(2):
        table = pa.Table.from_batches(list(archive.iter_partition(str(tmp_path / "archive"), topic, p)))
        expected_events += PartitionChanges(p, PartitionState.fresh(3)).feed(table)
    for e in sorted(expected_events, key=lambda e: (e.partition, e.vt_offset)):
        if e.logical_ts >= expected_table.get(e.key, (None, -1))[1]:
            expected_table[e.key] = (e.value, e.logical_ts)

    run = _example("change-capture-run")
    for old, new in [
        ('"localhost:9092"', repr(bootstrap)),
        ('"store", 1', f"{store!r}, 1"),
        ('path="store_v1.json"', f"path={str(tmp_path / 'mirror.json')!r}"),
    ]:
        assert run.count(old) == 1, old
        run = run.replace(old, new)
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(_example("change-capture"), "README.md:change-capture", "exec"), namespace)

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "log_level": 0})
    delivered, lines = 0, []
    for part in (slice(0, 70), slice(70, None), slice(0, 0)):
        for vt in vts:
            for r in vt.records[part]:
                producer.produce(topic, key=r.key, value=r.value, headers=r.headers, partition=vt.partition)
        assert producer.flush(30) == 0
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(run, "README.md:change-capture-run", "exec"), namespace)
        lines.append(out.getvalue().strip())
        delivered += namespace["counts"]["delivered"]
        assert namespace["counts"]["undecodable"] == 0
    assert delivered == len(expected_events)
    assert namespace["table"] == expected_table
    assert lines[-1] == "0 changes applied, 0 duplicates dropped"
    assert re.fullmatch(r"\d+ changes applied, [1-9]\d* duplicates dropped", lines[1]), lines
    assert namespace["load"](str(tmp_path / "mirror.json"))[0] == expected_table
