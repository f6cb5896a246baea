"""`tidegauge leapfrog` under `spark-submit`, as docs/spark.md describes it, with the package shipped as a zip.

The driver and the Python workers run an interpreter that has the third-party dependencies but not tidegauge
(a throwaway venv that borrows this venv's site-packages without its editable install), so everything of
ours they import comes from the `--py-files` zip. spark-submit must hand back the job's exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from vt_builder import RegionVt, write_archive

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("div", "heartbeat", "leapfrog", "pipelines", "sim")


def build_zip(target: Path) -> Path:
    """The packages of this checkout (sources and schema files) in one zip, as docs/spark.md builds it."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for pkg in PACKAGES:
            for path in sorted((REPO / pkg).rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    z.write(path, path.relative_to(REPO).as_posix())
    return target


def bare_python(root: Path) -> str:
    """A venv whose Python sees this venv's third-party packages but not tidegauge."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next(root.glob("lib/python*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = str(root / "bin" / "python")
    probe = subprocess.run(
        [python, "-c", "import pyarrow, fastavro, pyspark\nimport pipelines"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert "No module named 'pipelines'" in probe.stderr, probe.stderr
    return python


def _env(python: str) -> dict[str, str]:
    import pyspark

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_DRIVER_PYTHON")}
    env.update(PYSPARK_PYTHON=python, SPARK_HOME=os.path.dirname(pyspark.__file__))
    return env


def _spark_submit() -> str:
    return str(Path(sys.executable).parent / "spark-submit")


def test_leapfrog_under_spark_submit_with_py_files(tmp_path):
    logs = {}
    for x in (0, 1):
        vt = RegionVt(x)
        vt.start_of_push()
        vt.end_of_push()
        vt.put(b"same", b"1", 0, 10)
        vt.put(b"differs", b"A" if x == 0 else b"B", 1, 20)
        vt.heartbeat(0, 11, [11, 21])
        vt.heartbeat(1, 21, [11, 21])
        logs[x] = write_archive([vt], tmp_path / f"dc-{x}", "sub_v1")
    work = tmp_path / "submit"
    work.mkdir()
    (work / "tidegauge_submit.py").write_text(
        (REPO / "pipelines" / "submit.py").read_text()
    )  # the shipped one
    build_zip(work / "tidegauge.zip")
    python = bare_python(tmp_path / "venv")
    out = tmp_path / "out"
    cmd = [
        _spark_submit(),
        "--master",
        "local[2]",
        "--py-files",
        "tidegauge.zip",
        "tidegauge_submit.py",
        "leapfrog",
        "--master",
        "local[2]",
        "--store",
        "sub",
        "--version",
        "1",
        "--source",
        f"0={logs[0]}",
        "--source",
        f"1={logs[1]}",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=work, env=_env(python), capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr  # spark-submit passes the driver's stderr on as its stdout
    assert (out / "summary.json").exists(), output[-3000:]
    assert proc.returncode == 1  # one finding: spark-submit hands back the job's exit code
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_code"] == 1
    rows = pq.read_table(out / "inconsistencies").to_pylist()
    assert [(r["key"], r["type"]) for r in rows] == [(b"differs", "VALUE_MISMATCH")]
    # tidegauge's own INFO lines reach the user, py4j's (its connections opening and closing) do not
    assert "INFO tidegauge.leapfrog" in output and "INFO py4j" not in output, output[-3000:]


def test_spark_submit_master_and_settings_are_kept(tmp_path):
    """Without --master on the tidegauge command line, the job runs on the master spark-submit was given, and
    spark-submit's --conf beats tidegauge's defaults."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from pipelines.core.spark_session import get_session\n"
        "s = get_session()\n"
        "print('MASTER=' + s.sparkContext.master)\n"
        "print('shuffle.partitions=' + s.conf.get('spark.sql.shuffle.partitions'))\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYSPARK_DRIVER_PYTHON", "SPARK_MASTER")
    }
    env["PYSPARK_PYTHON"] = sys.executable
    proc = subprocess.run(
        [_spark_submit(), "--master", "local[1]", "--conf", "spark.sql.shuffle.partitions=3", str(probe)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    master = next(line for line in proc.stdout.splitlines() if line.startswith("MASTER="))[len("MASTER=") :]
    assert "shuffle.partitions=3" in proc.stdout, proc.stdout[-2000:]
    assert master == "local[1]"
