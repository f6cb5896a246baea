"""The filesystem layer and the publication protocol, on local disk and on an S3 server on loopback.

Property (Safe): whatever step a run dies at, a reader sees the previous complete content or the new complete
content, never a mix and never nothing (once something was published); re-running publishes the new content and
leaves nothing of the dead run behind. Checked by killing a publication at every storage operation in turn.
"""

from __future__ import annotations

import json

import pytest
from kill_points import Killed, kill_at
from s3_server import s3_server

from pipelines.core import publish
from pipelines.core.output import OutputDir, OutputRefused, check_disjoint, check_output
from pipelines.core.storage import Location, StorageError, absolute, locate


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        yield server


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> Location:
    """An empty directory on each kind of filesystem."""
    if request.param == "local":
        return locate(tmp_path / "root")
    server = request.getfixturevalue("s3")
    return locate(f"s3://{server.bucket()}/root")


def test_plain_paths_are_made_absolute_on_the_driver(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loc = locate("out/x")
    assert loc.kind == "local" and loc.path == str(tmp_path / "out" / "x") and loc.uri == loc.path
    assert locate("file://rel").path == str(tmp_path / "rel")
    assert absolute("s3a://b/k") == "s3a://b/k"


def test_hadoop_spellings_of_s3_are_s3(s3):
    bucket = s3.bucket()
    loc = locate(f"s3a://{bucket}/dir/")
    assert loc.kind == "s3" and loc.path == f"{bucket}/dir" and loc.uri == f"s3a://{bucket}/dir"
    (loc / "f").write_bytes(b"x")
    assert locate(f"s3://{bucket}/dir/f").read_bytes() == b"x"


def test_an_unknown_scheme_is_an_error_naming_the_path():
    with pytest.raises(StorageError, match=r"nosuch://x/y: cannot open"):
        locate("nosuch://x/y")


def test_location_operations(root):
    (root / "a" / "b.parquet").write_bytes(b"1")
    (root / "a" / "_SUCCESS").write_bytes(b"")
    (root / ".hidden" / "c.parquet").write_bytes(b"2")
    (root / "d.parquet").write_text("3")
    assert root.is_dir() and (root / "d.parquet").is_file() and not (root / "nope").exists()
    assert [f.name for f in root.files(".parquet")] == ["b.parquet", "d.parquet"]
    assert sorted(c.name for c in root.children()) == [".hidden", "a", "d.parquet"]
    assert (root / "d.parquet").read_text() == "3"
    (root / "a").remove()
    assert not (root / "a").exists() and (root / "d.parquet").exists()
    (root / "nope").remove()  # absent: nothing to do


def _content(target: Location) -> dict[str, str] | None:
    """What a reader sees at `target`: file name → text, or None when nothing is published."""
    where = publish.current(target)
    if not where.exists():
        return None
    files = {f.name: f.read_text() for f in where.files()}
    return files or None


def _publish(target: Location, generation: int) -> None:
    p = publish.Publication(target, "test")
    stage = p.stage()
    for name in ("one", "two", "three"):
        (stage / name).write_text(f"{name}-{generation}")
    p.publish()


def test_a_publication_killed_at_any_step_leaves_the_old_or_the_new_content(root, monkeypatch):
    old = {n: f"{n}-1" for n in ("one", "two", "three")}
    new = {n: f"{n}-2" for n in ("one", "two", "three")}
    with monkeypatch.context() as m:
        counter = kill_at(m, step=-1)
        target = root / "pub"
        _publish(target, 1)
        first = counter[0]
        _publish(target, 2)
        steps = counter[0] - first
    assert steps >= 5
    for step in range(1, steps + 1):
        target = root / f"t{step}"
        _publish(target, 1)
        with monkeypatch.context() as m:
            kill_at(m, step)
            with pytest.raises(Killed):
                _publish(target, 2)
        assert _content(target) in (old, new), f"killed at step {step}: a reader sees {_content(target)}"
        _publish(target, 2)  # the re-run
        assert _content(target) == new
        leftovers = [c.name for c in root.children() if c.name.startswith(f".t{step}.")]
        assert leftovers == [], f"killed at step {step}: {leftovers} left beside the target"
        if target.is_object_store:
            runs = (target / publish.RUNS).children()
            assert [r.path for r in runs] == [publish.current(target).path]


def test_readers_see_the_previous_run_until_the_new_one_is_published(root):
    target = root / "out"
    _publish(target, 1)
    p = publish.Publication(target, "test")
    stage = p.stage()
    (stage / "one").write_text("one-2")
    assert _content(target) == {"one": "one-1", "two": "two-1", "three": "three-1"}
    p.publish()
    assert _content(target) == {"one": "one-2"}


def test_output_dir_refuses_what_it_did_not_write_on_any_filesystem(root):
    (root / "theirs" / "data.csv").write_text("a,b\n")
    with pytest.raises(OutputRefused, match="not empty and is not an earlier output"):
        check_output(root / "theirs", "leapfrog")
    with OutputDir(str(root / "ours"), "leapfrog") as out:
        out.write_json("summary.json", {"n": 1})
    check_output(str(root / "ours"), "leapfrog")  # its own earlier output: fine
    with pytest.raises(OutputRefused, match="holds the output of `tidegauge leapfrog`"):
        check_output(str(root / "ours"), "lag")
    assert json.loads((publish.current(root / "ours") / "summary.json").read_text()) == {"n": 1}


def test_outputs_may_not_nest_in_inputs_across_spellings(s3):
    bucket = s3.bucket()
    with pytest.raises(OutputRefused, match="is inside --source 0"):
        check_disjoint({"--out": f"s3a://{bucket}/arch/out"}, {"--source 0": f"s3://{bucket}/arch"})
    check_disjoint({"--out": f"s3://{bucket}/archive-out"}, {"--source 0": f"s3://{bucket}/arch"})


def test_a_failed_run_leaves_the_previous_output(root):
    with OutputDir(str(root / "out"), "lag") as out:
        out.write_json("lag.json", {"run": 1})
    with pytest.raises(RuntimeError), OutputDir(str(root / "out"), "lag") as out:
        out.write_json("lag.json", {"run": 2})
        raise RuntimeError("the job failed")
    assert json.loads((publish.current(root / "out") / "lag.json").read_text()) == {"run": 1}


def test_a_store_error_names_the_path_and_never_the_secret(s3, tmp_path):
    from pipelines.core.sources import SourceError, SourceSpec, open_source

    with pytest.raises(SourceError) as info:
        open_source(SourceSpec(0, "s3://no-such-bucket-tg/archive"))
    text = str(info.value)
    assert "s3://no-such-bucket-tg/archive" in text
    assert s3.env["AWS_SECRET_ACCESS_KEY"] not in text and s3.env["AWS_ACCESS_KEY_ID"] not in text


def test_a_first_run_killed_at_any_step_leaves_a_place_the_next_run_accepts(root, monkeypatch):
    """Found by the job-level kill test on S3: a first run killed before publishing left `_runs/` under the
    target, and the re-run refused the directory as "not ours"."""

    def run(target: Location) -> None:
        with OutputDir(str(target), "leapfrog") as out:
            out.write_json("summary.json", {"n": 1})
            out.write_json("more.json", {"n": 2})

    with monkeypatch.context() as m:
        counter = kill_at(m, step=-1)
        run(root / "count")
        steps = counter[0]
    for step in range(1, steps + 1):
        target = root / f"first{step}"
        with monkeypatch.context() as m:
            kill_at(m, step)
            with pytest.raises(Killed):
                run(target)
        check_output(str(target), "leapfrog")
        run(target)
        assert json.loads((publish.current(target) / "more.json").read_text()) == {"n": 2}


def test_runs_a_killed_first_run_left_without_a_target_marker_are_recognised(s3):
    target = locate(f"s3://{s3.bucket()}/out")
    run = target / publish.RUNS / "20261126T000000Z-deadbeef"
    (run / publish.MARKER).write_text(json.dumps({"command": "leapfrog"}))
    (run / "summary.json").write_text("{}")
    check_output(str(target), "leapfrog")
    with pytest.raises(OutputRefused, match="not empty"):
        check_output(str(target), "lag")
