"""The documentation site keeps its promises: it builds with `mkdocs build --strict` (a broken link, a missing page
or a page left out of the navigation fails), its generated parts equal what the code says (the CLI reference, the
benchmark table, the metrics), and the commands and code of the getting-started page and of the guides that run on
one machine run as written.

A page marks what runs: `<!-- run: NAME -->` before a shell block (one `tidegauge` command a line, run in this
process on the test run's Spark session; `touch FILE`), `<!-- file: NAME -->` before a block written to that file
first, `<!-- install: demo -->` before the README's demo command, `<!-- output: demo -->` before lines the demo
prints, `<!-- example: NAME -->` before Python code, `<!-- dag: NAME -->` before an Airflow DAG, `<!-- script:
NAME -->` and `<!-- cron: NAME -->` before a scheduled script and its crontab line (their command lines are
parsed). The commands that read a demo's output run on the test run's one demo (conftest.demo_run), symlinked as
`tidegauge-demo`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
DEMO_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/tidegauge demo"


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def marked(page: Path, kind: str, name: str) -> str:
    """The fenced block right after `<!-- KIND: NAME -->` on `page`."""
    m = re.search(rf"<!-- {kind}: {re.escape(name)} -->\s*```[a-z]*\n(.*?)```", page.read_text(), flags=re.S)
    assert m, f"{page.relative_to(REPO)} has no block <!-- {kind}: {name} -->"
    return m.group(1)


def commands(block: str) -> list[str]:
    """A shell block's commands: continuation lines joined, blank lines and comments left out."""
    out, current = [], ""
    for line in block.splitlines():
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip() and not current.lstrip().startswith("#"):
            out.append(" ".join(current.split()))
        current = ""
    return out


def run_block(page: Path, name: str, replace: dict[str, str] | None = None) -> list[int | None]:
    """Run a `run:` block in the working directory: each `tidegauge ...` line through the CLI's main() (the
    session's SparkSession is reused), each `touch FILE` line; their exit codes (None for touch)."""
    from pipelines.cli import main

    codes: list[int | None] = []
    for command in commands(marked(page, "run", name)):
        for old, new in (replace or {}).items():
            command = command.replace(old, new)
        argv = shlex.split(command)
        if argv[0] == "tidegauge":
            codes.append(main(argv[1:]))
        elif argv[0] == "touch" and len(argv) == 2:
            Path(argv[1]).touch()
            codes.append(None)
        else:
            pytest.fail(
                f"{page.name} <!-- run: {name} -->: only tidegauge and touch lines run here: {command}"
            )
    return codes


def parses(argv: list[str], where: str) -> argparse.Namespace:
    """`tidegauge`'s own parser accepts argv (a renamed or removed flag fails here, not in production)."""
    from pipelines.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `tidegauge {' '.join(argv)}` does not parse: {err.getvalue().strip()}")


def test_the_site_builds_strict_with_every_page_in_the_navigation(tmp_path):
    import yaml

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(REPO / "mkdocs.yml"),
            "-d",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        # (Material's notice about MkDocs 2 is not about this site)
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "WARNING" not in run.stderr, run.stderr
    # every page is in the navigation (mkdocs' omitted_files check says so too; this names the page)
    conf = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)

    def pages(nav) -> set[str]:
        out: set[str] = set()
        for item in nav:
            for value in item.values() if isinstance(item, dict) else [item]:
                out |= pages(value) if isinstance(value, list) else {value}
        return out

    listed = pages(conf["nav"])
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert on_disk == listed, (on_disk - listed, listed - on_disk)
    built = (tmp_path / "concepts" / "index.html").read_text()
    assert "data-flow.svg" in built and (tmp_path / "img" / "data-flow.svg").exists()  # the diagram is drawn
    assert "fonts.googleapis.com" not in built  # the site reads offline


def test_the_data_flow_diagram_is_a_drawing_of_rt_leaders_vt_tidegauge():
    import xml.etree.ElementTree as ET

    svg = ET.parse(DOCS / "img" / "data-flow.svg").getroot()
    texts = " ".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
    for word in ("RT[0]", "leaders of region 0", "VT[0]", "tidegauge", "hbw", "repair apply"):
        assert word in texts, word
    assert len(list(svg.iter("{http://www.w3.org/2000/svg}line"))) >= 12  # arrows, not a picture of text


def test_cli_reference_equals_what_the_parsers_say():
    gen = _load(DOCS / "gen_cli_reference.py")
    section = gen.generate()
    assert section in (DOCS / "reference" / "cli.md").read_text(), (
        "docs/reference/cli.md is out of date: run python docs/gen_cli_reference.py"
    )
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


def test_the_benchmark_table_is_what_the_benchmarks_printed():
    bench = _load(REPO / "bench" / "readme_table.py")
    results = json.loads((REPO / "bench" / "results.json").read_text())
    table = bench.table(results)
    assert bench.PAGE == DOCS / "reference" / "benchmarks.md"
    assert table in bench.PAGE.read_text(), (
        "docs/reference/benchmarks.md's table is out of date: python bench/readme_table.py --render"
    )
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "python bench/" in ln]
    assert len(rows) == len(results["benches"]) >= 5
    for name, entry in results["benches"].items():
        script = entry["command"].split()[1]
        assert (REPO / script).exists(), script
        assert entry["command"] == "python " + " ".join(bench.BENCHES[name])  # measured with today's sizes


def test_the_metrics_page_names_every_series_and_every_alert_rule():
    import yaml
    from prometheus_client import CollectorRegistry

    from heartbeat.metrics import LeaderMetrics
    from pipelines.watch.metrics import WatchMetrics

    page = (DOCS / "reference" / "metrics.md").read_text()
    leader = CollectorRegistry()
    LeaderMetrics(leader)
    registered = set(WatchMetrics().registry._names_to_collectors) | set(leader._names_to_collectors)
    names = {n for n in registered if n.startswith("tidegauge_") and not n.endswith("_created")}
    names = {n for n in names if n + "_total" not in names}  # a counter registers both names
    names |= set(re.findall(r"`(tidegauge_[a-z_]+)`", (DOCS / "watch.md").read_text()))  # those it explains
    assert len(names) > 20
    missing = {n for n in names if f"`{n}`" not in page}
    assert not missing, f"docs/reference/metrics.md does not name {sorted(missing)}"
    rules = yaml.safe_load((REPO / "conf" / "alerts.yaml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert alerts and not {a for a in alerts if f"`{a}`" not in page}


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
def test_the_getting_started_page_and_the_readme_show_what_the_demo_prints(demo_run):
    page = DOCS / "getting-started.md"
    assert marked(page, "install", "demo").strip() == DEMO_COMMAND
    result, lines = demo_run

    def shape(line: str) -> str:  # figures, timings and paths vary from run to run
        line = line.replace(result.out.as_uri(), "URI").replace(str(result.out), "OUT")
        line = re.sub(r"file:///\S*tidegauge-demo", "URI", line)
        line = re.sub(r"/\S*tidegauge-demo", "OUT", line)
        line = re.sub(r"local\[[^]]*\]", "local[N]", line)  # the tests' session is local[2]
        line = re.sub(r"(\d[\d.,]*\s*(ms|s|min|h)\b[\s,]*)+", "T ", line)
        return re.sub(r"\d[\d.,]*", "N", " ".join(line.split()))

    printed = {shape(ln) for ln in lines}
    for shows in (page, REPO / "README.md"):
        shown = [
            ln for ln in marked(shows, "output", "demo").splitlines() if ln.strip() and ln.strip() != "..."
        ]
        assert len(shown) >= 10
        for line in shown:
            assert shape(line) in printed, f"{shows.name} shows a line the demo does not print: {line!r}"


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
def test_the_nightly_guide_and_the_change_capture_commands_run_on_a_demo(demo_run, tmp_path, monkeypatch):
    result, _ = demo_run
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tidegauge-demo").symlink_to(result.out)
    nightly = DOCS / "guides" / "nightly.md"
    (tmp_path / "nightly-local.yaml").write_text(marked(nightly, "file", "nightly-local.yaml"))

    leapfrog, div, lag, report = run_block(nightly, "nightly-local")
    codes = (leapfrog, div, lag, report)
    assert set(codes) <= {0, 1}, codes  # 1: the demo's faults are findings
    day = tmp_path / "nightly" / "2026-11-29"
    for job in ("leapfrog", "div", "lag"):
        assert (day / job / "summary.json").exists() or (day / job / "lag.json").exists(), job
    assert (day / "report" / "report.html").exists() and any((tmp_path / "nightly" / "history").iterdir())
    assert any((tmp_path / "nightly" / "state").iterdir())  # the next night goes on from here

    first, again = run_block(DOCS / "changes.md", "changes-demo")
    assert (first, again) == (0, 0)
    one = json.loads((tmp_path / "changes" / "run-1" / "summary.json").read_text())
    two = json.loads((tmp_path / "changes" / "run-2" / "summary.json").read_text())
    assert one["delivered"] > 0 and two["delivered"] == 0, (one, two)


class _Task:
    """A stand-in for an Airflow operator: keeps its arguments."""

    made: list[_Task] = []

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        _Task.made.append(self)

    def __rshift__(self, other):
        return other

    def __rrshift__(self, other):
        return self


class _Dag:
    def __init__(self, dag_id: str, **kwargs) -> None:
        self.dag_id, self.kwargs = dag_id, kwargs

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def test_the_nightly_dag_and_script_give_tidegauge_command_lines_it_accepts(monkeypatch):
    """Airflow is not installed here: the DAG runs against stand-ins for its classes, and every command line it
    would start is parsed by tidegauge's own parser; so are the script's (what the cron line runs)."""
    stubs = {
        "airflow": types.ModuleType("airflow"),
        "airflow.operators": types.ModuleType("airflow.operators"),
        "airflow.operators.bash": types.ModuleType("airflow.operators.bash"),
        "airflow.providers": types.ModuleType("airflow.providers"),
        "airflow.providers.apache": types.ModuleType("airflow.providers.apache"),
        "airflow.providers.apache.spark": types.ModuleType("airflow.providers.apache.spark"),
        "airflow.providers.apache.spark.operators": types.ModuleType(
            "airflow.providers.apache.spark.operators"
        ),
        "airflow.providers.apache.spark.operators.spark_submit": types.ModuleType("spark_submit"),
    }
    stubs["airflow"].DAG = _Dag
    stubs["airflow.operators.bash"].BashOperator = type("BashOperator", (_Task,), {})
    stubs["airflow.providers.apache.spark.operators.spark_submit"].SparkSubmitOperator = type(
        "SparkSubmitOperator", (_Task,), {}
    )
    for name, module in stubs.items():
        monkeypatch.setitem(sys.modules, name, module)
    _Task.made = []
    page = DOCS / "guides" / "nightly.md"
    exec(compile(marked(page, "dag", "nightly"), "nightly.md:dag", "exec"), {"__name__": "nightly_dag"})
    tasks = {t.kwargs["task_id"]: t for t in _Task.made}
    assert set(tasks) == {"leapfrog", "div_validate", "lag", "report"}
    assert tasks["report"].kwargs["trigger_rule"] == "all_done"  # the report runs whatever the checks found
    for task_id, task in tasks.items():
        if "application_args" in task.kwargs:
            assert task.kwargs["application"].endswith("pipelines/submit.py")
            argv = [a.replace("{{ ds }}", "2026-11-29") for a in task.kwargs["application_args"]]
        else:
            words = shlex.split(task.kwargs["bash_command"].replace("{{ ds }}", "2026-11-29"))
            assert words[1:3] == ["-m", "pipelines.cli"], words
            argv = words[3:]
        args = parses(argv, f"nightly.md DAG task {task_id}")
        assert args.command_name == {"div_validate": "div validate"}.get(task_id, task_id)

    lines = commands(marked(page, "script", "nightly.sh"))
    ran = []
    for line in lines:
        line = line.split(";")[0].replace('"$OUT', '"s3://ops-bucket/tidegauge').replace("$DAY", "2026-11-29")
        words = shlex.split(line)
        if words[0] == "submit":
            ran.append(parses(words[1:], "nightly.sh").command_name)
        elif words[0].endswith("/bin/tidegauge"):
            ran.append(parses(words[1:], "nightly.sh").command_name)
    assert ran == ["leapfrog", "div validate", "lag", "report"]
    fields = marked(page, "cron", "nightly").split()
    # five time fields, a user, the script
    assert len(fields) >= 7 and fields[6] == "/opt/tidegauge/nightly.sh"


def test_every_tidegauge_command_line_on_the_site_parses():
    """The command lines the pages only show (a cluster's, a long-running watch's, a Prometheus setup's) are parsed
    by tidegauge's own parser, so a renamed flag cannot linger in a page; `FLAGS` stands for the simulator's printed
    sources and `...` for flags left out."""
    sample = (
        "--source 0=kafka://127.0.0.1:9092 --source 1=kafka://127.0.0.1:9093 --store sim_store --version 1"
    )
    parsed = 0
    for page in sorted(DOCS.rglob("*.md")):
        for block in re.findall(r"```(?:sh|bash)\n(.*?)```", page.read_text(), flags=re.S):
            for command in commands(block):
                command = command.replace(" FLAGS ", f" {sample} ")
                if "..." in command or '"$@"' in command:
                    continue
                try:
                    words = shlex.split(command, comments=True)
                except ValueError:  # not a command line of ours (a `python -c` spanning lines)
                    continue
                for i, word in enumerate(words):  # `cmd; next` ends at the semicolon
                    if word.endswith(";"):
                        words = [*words[:i], word[:-1]]
                        break
                launcher = [i for i, w in enumerate(words) if w.endswith("submit.py") or w == "$TG_SUBMIT"]
                launcher += [i for i, w in enumerate(words) if "pipelines.submit --path" in w]
                if words and words[0].endswith("tidegauge"):
                    argv = words[1:]
                elif launcher:
                    argv = words[launcher[0] + 1 :]
                else:
                    continue
                parses(argv, str(page.relative_to(REPO)))
                parsed += 1
    assert parsed >= 25


def _wait_for_window(live: Path, sim: threading.Thread, timeout_s: float = 300.0) -> dict:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if live.exists():
            info = json.loads(live.read_text())
            if info.get("state") == "repair-window":
                return info
        assert sim.is_alive(), "the simulation ended without opening its repair window"
        time.sleep(0.2)
    pytest.fail(f"no repair window within {timeout_s:g} s")


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
def test_the_repair_guide_runs_as_written(spark, tmp_path, monkeypatch):
    """The guide's three steps, in its two terminals: the simulation with its repair window in a thread, the
    loop here; the exit codes are the ones the guide states, and every planned key converges."""
    from pipelines.cli import main

    monkeypatch.chdir(tmp_path)
    page = DOCS / "guides" / "repair.md"
    [simulate] = commands(marked(page, "run", "repair-window"))
    argv = shlex.split(simulate)
    assert argv[0] == "tidegauge"
    ended: dict = {}
    sim = threading.Thread(target=lambda: ended.update(code=main(argv[1:])), daemon=True)
    sim.start()
    info = _wait_for_window(tmp_path / "out" / "repair-sim" / "live.json", sim)
    done = Path(info["repair_window_done"])
    assert done == (tmp_path / "out" / "repair-sim" / "repair-window.done").resolve()
    region0 = info["regions"][0]["uri"].removeprefix("kafka://")
    codes = run_block(page, "repair-loop", {"127.0.0.1:41867": region0})
    # divergences found; planned, printed, applied; the window closed
    assert codes == [1, 0, 0, 0, None], codes
    sim.join(300)
    assert not sim.is_alive() and ended["code"] == 0
    *_, verify = run_block(page, "repair-verify")
    assert verify == 0
    summary = json.loads((tmp_path / "out" / "repair" / "verify" / "summary.json").read_text())
    plan = json.loads((tmp_path / "out" / "repair" / "plan" / "summary.json").read_text())
    assert summary["by_status"]["converged"] == summary["planned_keys"] == plan["writes"] > 0


@pytest.mark.kafka
def test_the_heartbeat_leader_example_runs_and_prints_what_the_page_says():
    page = DOCS / "reference" / "heartbeat-library.md"
    namespace: dict = {"__name__": "docs_example"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(
            compile(marked(page, "example", "leader-loop"), "heartbeat-library.md:leader-loop", "exec"),
            namespace,
        )
        exec(
            compile(marked(page, "example", "leader-loop-run"), "heartbeat-library.md:run", "exec"), namespace
        )
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
    """The page's consumer, run as written against a real broker: over a VT produced in two parts (a run after
    each) and then once more with nothing new, it applies every change once and its dict is what applying the
    rule's events in order gives."""
    import uuid

    import pyarrow as pa
    from confluent_kafka import Producer
    from vt_builder import write_archive

    from div import archive
    from heartbeat.change_events import PartitionChanges
    from heartbeat.changes import PartitionState

    page = DOCS / "changes.md"
    store = f"docs{uuid.uuid4().hex[:8]}"
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

    run = marked(page, "example", "change-capture-run")
    for old, new in [
        ('"localhost:9092"', repr(bootstrap)),
        ('"store", 1', f"{store!r}, 1"),
        ('path="store_v1.json"', f"path={str(tmp_path / 'mirror.json')!r}"),
    ]:
        assert run.count(old) == 1, old
        run = run.replace(old, new)
    namespace: dict = {"__name__": "docs_example"}
    exec(compile(marked(page, "example", "change-capture"), "changes.md:change-capture", "exec"), namespace)

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "log_level": 0})
    delivered, lines = 0, []
    for part in (slice(0, 70), slice(70, None), slice(0, 0)):
        for vt in vts:
            for r in vt.records[part]:
                producer.produce(topic, key=r.key, value=r.value, headers=r.headers, partition=vt.partition)
        assert producer.flush(30) == 0
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(run, "changes.md:change-capture-run", "exec"), namespace)
        lines.append(out.getvalue().strip())
        delivered += namespace["counts"]["delivered"]
        assert namespace["counts"]["undecodable"] == 0
    assert delivered == len(expected_events)
    assert namespace["table"] == expected_table
    assert lines[-1] == "0 changes applied, 0 duplicates dropped"
    assert re.fullmatch(r"\d+ changes applied, [1-9]\d* duplicates dropped", lines[1]), lines
    assert namespace["load"](str(tmp_path / "mirror.json"))[0] == expected_table
