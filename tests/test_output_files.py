"""Every job's output files, as a user finds them (issue 28): one file mode for all of them (0666 less the umask,
0644 under the usual 022, as Parquet written by Spark's tasks). One small simulation, then every job on it through
the command line, in this process."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pipelines.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def outputs(spark, tmp_path_factory) -> dict[str, Path]:
    """command -> its output directory (`--state` and `--history` too), every command exiting 0, 1 or 3."""
    root = tmp_path_factory.mktemp("outputs")
    out = {
        name: root / name for name in ("simulate", "lag", "leapfrog", "state", "div validate", "div restore")
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
        if argv[0] in ("lag", "leapfrog") or argv[:2] == ["div", "validate"]:
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
    assert {"truth.json", "partition_state.bin"} <= names and any(n.endswith(".parquet") for n in names)
    assert {p: oct(m) for p, m in modes.items() if m != 0o666 & ~umask} == {}
