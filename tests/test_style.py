"""The code style is checked in CI, not left to habit: `ruff check` (lint rules of pyproject.toml) and
`ruff format --check` (the formatter, line length as configured) over the whole repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "args", [["check", "--no-cache", "."], ["format", "--check", "--no-cache", "."]], ids=["lint", "format"]
)
def test_ruff(args):
    done = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, f"ruff {' '.join(args)}:\n{done.stdout}{done.stderr}"
