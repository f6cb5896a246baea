"""A wheel installed on a machine without the source tree runs the product (issue 16, finding 5).

Reported: `pip wheel . && pip install tidegauge-*.whl` (the README's route for cluster nodes) lacked
conf/expectations.yaml, so `report` exited 2 and `demo` 3. The test builds the wheel, installs it into a fresh
virtualenv and runs `tidegauge demo` from an unrelated working directory. The fresh virtualenv borrows the
dependencies already installed for this test run (a .pth line to their site-packages, which does not run the
editable install's hook) instead of downloading them again; the test checks that `pipelines` is imported from
the wheel, not from this checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.kafka]
REPO = Path(__file__).resolve().parent.parent


def test_the_wheel_runs_the_demo_from_anywhere(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
        check=True,
        cwd=tmp_path,
    )
    wheel = next(dist.glob("tidegauge-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "borrowed-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
        check=True,
    )
    elsewhere = tmp_path / "somewhere-else"
    elsewhere.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    where = subprocess.run(
        [str(py), "-c", "import pipelines; print(pipelines.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
    ).stdout.strip()
    assert where.startswith(str(site)), where
    run = subprocess.run(
        [str(env_dir / "bin" / "tidegauge"), "demo", "--out", str(elsewhere / "demo")],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (elsewhere / "demo" / "report" / "report.html").exists()
