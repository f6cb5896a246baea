"""Every job's output files, as a user finds them (issue 28): one file mode for all of them (0666 less the umask,
0644 under the usual 022, as Parquet written by Spark's tasks), and every figure of every job's summary described in
docs/outputs.md. One small simulation, then every job on it through the command line, in this process."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from pipelines.cli import main
from sim.config import FAULT_KINDS

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
OUTPUTS_MD = REPO / "docs" / "outputs.md"


@pytest.fixture(scope="module")
def outputs(spark, tmp_path_factory) -> dict[str, Path]:
    """command -> its output directory (`--state` and `--history` too), every command exiting 0, 1 or 3."""
    root = tmp_path_factory.mktemp("outputs")
    out = {
        name: root / name
        for name in (
            "simulate",
            "lag",
            "leapfrog",
            "state",
            "div validate",
            "div restore",
            "changes",
            "changes state",
            "cut",
        )
    }
    out |= {"report": root / "report", "history": root / "history"}
    sim = out["simulate"]
    runs = [
        ["simulate", "--out", str(sim), "--regions", "2", "--partitions", "2", "--records", "1500"]
        + ["--heartbeat-ms", "200", "--faults", "dropped=1,gap=1", "--workers", "inline", "--no-progress"],
        ["lag", "--out", str(out["lag"])],
        ["leapfrog", "--store", "sim_store", "--version", "1", "--out", str(out["leapfrog"])]
        + ["--state", str(out["state"])],
        ["div", "validate", "--out", str(out["div validate"])],
        ["div", "restore", "--store", "sim_store", "--version", "1", "--partition", "0", "--at-offset", "600"]
        + ["--rt-source", f"0={sim / 'archive' / 'dc-0'}", "--rt-source", f"1={sim / 'archive' / 'dc-1'}"]
        + ["--source", f"0={sim / 'archive' / 'dc-0'}", "--out", str(out["div restore"])],
        ["changes", "--store", "sim_store", "--version", "1", "--source", str(sim / "archive" / "dc-1")]
        + ["--out", str(out["changes"]), "--state", str(out["changes state"])],
        ["cut", "--at", "1700000000200", "--snapshot", "1", "--out", str(out["cut"])]
        + [f"--rt={r}={sim / 'archive' / f'dc-{r}'}" for r in (0, 1)],
        [
            "report",
            "--leapfrog",
            str(out["leapfrog"]),
            "--div",
            str(out["div validate"]),
            "--lag",
            str(out["lag"]),
        ]
        + ["--history", str(out["history"]), "--out", str(out["report"])],
    ]
    sources = [f"--source={r}={sim / 'archive' / f'dc-{r}'}" for r in (0, 1)]
    for argv in runs:
        if argv[0] in ("lag", "leapfrog", "cut") or argv[:2] == ["div", "validate"]:
            argv = [*argv, *sources]
        assert main(argv) in (0, 1, 3), argv
    return out


def test_every_output_file_has_the_same_mode(outputs):
    """report.html and summary.json were 0600 (written through a `tempfile` and renamed), Parquet 0644."""
    umask = os.umask(0)
    os.umask(umask)
    modes: dict[Path, int] = {}
    for directory in outputs.values():
        for path in directory.rglob("*"):
            if path.is_file():
                modes[path] = stat.S_IMODE(path.stat().st_mode)
    names = {p.name for p in modes}
    assert {"summary.json", "report.html", "report.json", "lag.json", "state.json", ".tidegauge"} <= names
    assert {"truth.json", "partition_state.bin", "state.tgcc"} <= names and any(
        n.endswith(".parquet") for n in names
    )
    assert {p: oct(m) for p, m in modes.items() if m != 0o666 & ~umask} == {}


def _sections() -> dict[str, str]:
    """docs/outputs.md by command (`## \\`tidegauge CMD --out DIR\\``), and "" for what every summary has."""
    text = OUTPUTS_MD.read_text()
    parts = re.split(r"^## ", text, flags=re.M)
    out = {"": parts[0]}
    for part in parts[1:]:
        m = re.match(r"`tidegauge ([a-z ]+?) --out DIR`", part)
        if m:
            out[m.group(1)] = part
    return out


def _documented(text: str) -> set[str]:
    """The names a section gives in code spans (`a.b[]`, tables) and as keys of its JSON examples."""
    spans = re.findall(r"`((?:[^`\n]|\n(?!\n))+)`", text)  # (a span may run over lines, not paragraphs)
    spans += re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"\s*:', text)
    return {name for span in spans for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}


def _figures(doc, out: set[str]) -> set[str]:
    """Every field name in a summary; keys that are data (region ids, topics, finding types, fault kinds, GUIDs)
    are not."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            data = (
                re.fullmatch(r"\d+|[0-9a-f]{32}|[A-Z_]+(:.*)?|rt\d+:.*|.*_(rt|v\d+)", key)
                or key in FAULT_KINDS
            )
            if not data:
                out.add(key)
            _figures(value, out)
    elif isinstance(doc, list):
        for value in doc:
            _figures(value, out)
    return out


@pytest.mark.parametrize(
    "command, file",
    [
        ("simulate", "summary.json"),
        ("leapfrog", "summary.json"),
        ("div validate", "summary.json"),
        ("div restore", "summary.json"),
        ("changes", "summary.json"),
        ("cut", "summary.json"),
        ("cut", "cut.json"),
        ("lag", "lag.json"),
    ],
)
def test_every_summary_figure_is_described_in_docs_outputs_md(outputs, command, file):
    sections = _sections()
    assert command in sections, f"docs/outputs.md has no section `tidegauge {command} --out DIR`"
    figures = _figures(json.loads((outputs[command] / file).read_text()), set())
    assert len(figures) > 10
    undocumented = figures - _documented(sections[""] + sections[command])
    assert not undocumented, f"{command} {file}: not in docs/outputs.md: {sorted(undocumented)}"
