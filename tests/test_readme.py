"""The README keeps its promises: the two setup commands (and that CI runs the second verbatim), a CLI reference
equal to what the parsers say, a heartbeat example that runs, and a benchmark table drawn from measured output."""

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
