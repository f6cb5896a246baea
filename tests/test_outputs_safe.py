"""Outputs never destroy anything (issue 16, finding 1): each reproduction as it was reported, through the CLI.

`--out` may be absent, an empty directory or an earlier output of the same command (marked `.tidegauge`);
anything else — user files, an input, a file, another command's output — is exit 2 with one line naming the path,
and nothing is touched. Write failures are exit 2 with one line, no traceback, the previous output intact.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess

import pytest

from pipelines.cli import main
from pipelines.core.output import MARKER, OutputRefused, check_disjoint, check_output
from sim import SimConfig
from sim import run as simulate


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs-safe")
    cfg = SimConfig(
        out=str(root / "sim"),
        seed=3,
        regions=2,
        partitions=1,
        records=300,
        keys=100,
        batch_records=20,
        heartbeat_every_records=50,
        step_records=300,
        progress=False,
        workers="inline",
    )
    result = simulate(cfg)
    return result


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


def _tree(path) -> dict[str, bytes]:
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = fh.read()
    return out


def _lag(sim, out) -> tuple[int, str]:
    t = sim.truth["run"]
    argv = ["lag", "--store", t["store"], "--version", str(t["version"]), "--out", str(out)]
    for r, a in sorted(sim.archives.items()):
        argv += ["--source", f"{r}={a}"]
    return _cli(argv)


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1, err
    return lines[0]


def test_lag_out_on_a_directory_of_user_files_is_refused_and_the_files_survive(sim, tmp_path):
    user = tmp_path / "home"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    (user / "data").mkdir()
    (user / "data" / "x.csv").write_text("1,2")
    before = _tree(user)
    code, err = _lag(sim, user)
    assert code == 2
    assert str(user) in _one_error_line(err)
    assert _tree(user) == before


def test_div_validate_out_equal_to_its_source_is_refused_and_the_archive_survives(sim):
    archive = sim.archives[0]
    before = _tree(archive)
    code, err = _cli(["div", "validate", "--source", f"0={archive}", "--out", archive])
    assert code == 2
    assert "reads" in _one_error_line(err)
    assert _tree(archive) == before


def test_lag_out_on_the_simulation_directory_is_refused(sim):
    before = _tree(sim.out)
    code, err = _lag(sim, sim.out)
    assert code == 2
    _one_error_line(err)
    assert _tree(sim.out) == before


def test_out_on_a_file_is_refused_and_the_file_stays_a_file(sim, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    code, err = _lag(sim, f)
    assert code == 2
    assert "not a directory" in _one_error_line(err)
    assert f.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no hidden .notes.txt.old-PID


def test_an_earlier_output_of_the_same_command_is_replaced_and_marked(sim, tmp_path):
    out = tmp_path / "lag"
    assert _lag(sim, out)[0] in (0, 3)
    mark = json.loads((out / MARKER).read_text())
    assert mark["command"] == "lag"
    code, err = _lag(sim, out)  # the second run replaces the first
    assert code in (0, 3), err
    code, err = _cli(["div", "validate", "--source", f"0={sim.archives[0]}", "--out", str(out)])
    assert code == 2 and "tidegauge lag" in _one_error_line(err)  # another command's output is not replaced
    assert json.loads((out / MARKER).read_text())["command"] == "lag"


def test_an_unmarked_output_of_an_older_version_is_still_accepted(tmp_path):
    old = tmp_path / "old-leapfrog"
    (old / "inconsistencies").mkdir(parents=True)
    (old / "summary.json").write_text("{}")
    check_output(old, "leapfrog")
    (old / "mine.txt").write_text("x")
    with pytest.raises(OutputRefused):
        check_output(old, "leapfrog")


def test_inputs_inside_outputs_and_outputs_inside_inputs_are_refused(tmp_path):
    src = tmp_path / "archives" / "dc-0"
    src.mkdir(parents=True)
    for out in (tmp_path / "archives", src, src / "out", tmp_path):
        with pytest.raises(OutputRefused, match="--source 0"):
            check_disjoint({"--out": str(out)}, {"--source 0": str(src)})
    check_disjoint({"--out": str(tmp_path / "elsewhere")}, {"--source 0": str(src)})
    with pytest.raises(OutputRefused, match="overlap"):
        check_disjoint({"--out": str(tmp_path / "o"), "--state": str(tmp_path / "o" / "state")}, {})
    # file:// URIs and relative paths name the same places
    with pytest.raises(OutputRefused):
        check_disjoint({"--out": f"file://{src}"}, {"--source 0": str(src)})


def test_report_history_holding_other_files_is_refused(tmp_path):
    from pipelines.core.output import check_history

    h = tmp_path / "history"
    h.mkdir()
    (h / "run-20260101T000000000000Z-abcd1234.parquet").write_bytes(b"")
    check_history(h)
    (h / "budget.xlsx").write_bytes(b"")
    with pytest.raises(OutputRefused, match="budget.xlsx"):
        check_history(h)


@contextlib.contextmanager
def _mounted(path, options: str):
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_out_on_read_only_storage_is_one_line_and_exit_2(sim, tmp_path):
    with _mounted(tmp_path / "ro", "ro,size=1m") as ro:
        code, err = _lag(sim, ro / "lag")
        assert code == 2
        line = _one_error_line(err)
        assert "Read-only file system" in line and str(ro / "lag") in line


def _cli_out(argv: list[str]) -> tuple[int, str, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(argv)
    return code, err.getvalue(), out.getvalue()


def test_every_output_on_read_only_storage_is_refused_before_any_work(sim, tmp_path, caplog):
    # Found trying it: lag printed its table and leapfrog started Spark before failing on a read-only --out, and
    # leapfrog --state ended in "cannot write .state.next-PID". Now the check comes first, naming the flag.
    t = sim.truth["run"]
    sources = [a for r, p in sorted(sim.archives.items()) for a in ("--source", f"{r}={p}")]
    job = ["--store", t["store"], "--version", str(t["version"]), *sources]
    with _mounted(tmp_path / "ro", "ro,size=1m") as ro:
        for flag, argv in [
            ("--out", ["lag", *job, "--out", str(ro / "lag")]),
            ("--out", ["leapfrog", *job, "--out", str(ro / "lf")]),
            ("--state", ["leapfrog", *job, "--out", str(tmp_path / "lf"), "--state", str(ro / "state")]),
            ("--out", ["simulate", "--records", "100", "--out", str(ro / "sim")]),
        ]:
            caplog.clear()
            code, err, out = _cli_out(argv)
            assert code == 2, (argv, err)
            line = _one_error_line(err)
            assert f"{flag} {ro}" in line and "Read-only file system" in line, line
            assert out == "" and not caplog.records, (argv, out, caplog.text)  # refused before any work
        assert not (tmp_path / "lf").exists()


def test_a_full_disk_keeps_the_previous_output_intact(sim, tmp_path):
    with _mounted(tmp_path / "small", "size=200k") as small:
        out = small / "lag"
        code, err = _lag(sim, out)
        assert code in (0, 3), err
        before = _tree(out)
        with contextlib.suppress(OSError):  # fill the disk up
            with open(small / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        code, err = _lag(sim, out)
        assert code == 2
        assert "No space left on device" in _one_error_line(err)
        assert _tree(out) == before
