"""Open report.html in headless Chromium and check that the verdict, the plots and the tables render.

The report page itself carries no script (its Content-Security-Policy forbids any). To measure what the
browser actually laid out, the test loads a copy of the page with one small probe script added and
allowed by its hash; the probe writes rendered sizes into a data attribute that `--dump-dom` returns.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import html
import json
import os
import pathlib
import shutil
import subprocess

import pytest
from report_fixtures import build_outputs

from pipelines.report.job import run_report

pytestmark = pytest.mark.browser

_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]

PROBE = """
window.addEventListener('load', () => {
  const size = (el) => { const r = el.getBoundingClientRect(); return [Math.round(r.width), Math.round(r.height)]; };
  const verdict = document.getElementById('verdict');
  const out = {
    verdict: verdict ? {size: size(verdict), text: verdict.innerText.slice(0, 3000)} : null,
    plots: Array.from(document.querySelectorAll('svg.plot')).map(s => ({name: s.dataset.plot, size: size(s),
      shapes: s.querySelectorAll('path, rect, use, text').length})),
    tables: Array.from(document.querySelectorAll('table')).filter(t => t.offsetParent !== null)
      .map(t => ({size: size(t), rows: t.rows.length})),
    scripts: document.scripts.length,
  };
  document.body.dataset.probe = JSON.stringify(out);
});
"""


def _find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium: found on PATH, else installed with apt when running as root, else the test skips."""
    found = _find_chromium()
    if found:
        return found
    if os.name != "posix" or os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(
            "headless Chromium not found and cannot be installed here (needs root and apt-get): "
            "install Debian's `chromium` package to run the browser check"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    attempts = [
        ["apt-get", "install", "-y", "-qq", "chromium"],
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "chromium"],
    ]
    errors = []
    for cmd in attempts:
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
        except subprocess.TimeoutExpired:
            errors.append(f"{' '.join(cmd)} timed out")
            continue
        if proc.returncode != 0:
            errors.append(f"{' '.join(cmd)}: {proc.stderr.strip()[-300:]}")
        if cmd[1] == "install" and proc.returncode == 0 and _find_chromium():
            return _find_chromium()
    pytest.skip("headless Chromium could not be installed with apt-get: " + "; ".join(errors))


def _run(chromium: str, tmp: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp / "chromium-profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run(
        [chromium, *_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=180
    )


def _with_probe(page: str, script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    page = page.replace("default-src 'none';", f"default-src 'none'; script-src 'sha256-{digest}';", 1)
    return page.replace("</body>", f"<script>{script}</script></body>", 1)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> pathlib.Path:
    """A report with findings of every kind and two runs of history (so the trends plot is drawn)."""
    tmp = tmp_path_factory.mktemp("browser-report")
    history = tmp / "history"
    when = dt.datetime(2026, 9, 20, 6, tzinfo=dt.UTC)
    first = build_outputs(tmp / "in1", ["fatal_div"], divergent_keys=[b"old"], hostile=True)
    run_report(first.leapfrog, first.div, tmp / "out1", lag_dir=first.lag, history_dir=history, now=when)
    second = build_outputs(
        tmp / "in2", ["divergence", "lag", "div_warning", "missing_heartbeats"], hostile=True
    )
    result = run_report(
        second.leapfrog,
        second.div,
        tmp / "out",
        lag_dir=second.lag,
        history_dir=history,
        now=when + dt.timedelta(days=1),
    )
    return result.html_path.local  # a Location; the report was written to local disk


def test_verdict_plots_and_tables_render(chromium, report, tmp_path):
    probe_page = tmp_path / "probe.html"
    probe_page.write_text(_with_probe(report.read_text(encoding="utf-8"), PROBE), encoding="utf-8")
    proc = _run(chromium, tmp_path, "--virtual-time-budget=5000", "--dump-dom", probe_page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    marker = 'data-probe="'
    assert marker in proc.stdout, "the probe did not run: " + proc.stderr[-1000:]
    raw = proc.stdout.split(marker, 1)[1].split('"', 1)[0]
    probe = json.loads(html.unescape(raw))

    verdict = probe["verdict"]
    assert verdict is not None
    assert verdict["size"][0] > 300 and verdict["size"][1] > 100
    for words in ("FAIL", "DIVERGENT", "LOGS WHOLE", "region 2: 20.0 min behind", "healed", "Heartbeats"):
        assert words in verdict["text"], words

    plots = {p["name"]: p for p in probe["plots"]}
    assert set(plots) == {"trends", "divergences", "div", "lag", "coverage"}
    for name, plot in plots.items():
        width, height = plot["size"]
        assert width > 200 and height > 80, (name, plot)
        assert plot["shapes"] > 10, (name, plot)

    assert len(probe["tables"]) >= 8
    assert all(t["size"][0] > 0 and t["size"][1] > 0 and t["rows"] >= 2 for t in probe["tables"])
    assert probe["scripts"] == 1  # ours; the hostile strings in the data added none


def test_the_page_policy_blocks_scripts_in_a_real_browser(chromium, report, tmp_path):
    """Defence in depth: even markup that escaped escaping could not run, because the page's policy forbids it."""
    page = report.read_text(encoding="utf-8").replace("</body>", f"<script>{PROBE}</script></body>", 1)
    unhashed = tmp_path / "unhashed.html"
    unhashed.write_text(page, encoding="utf-8")
    proc = _run(chromium, tmp_path, "--virtual-time-budget=3000", "--dump-dom", unhashed.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'id="verdict"' in proc.stdout
    assert "data-probe=" not in proc.stdout


def test_screenshot_shows_a_page(chromium, report, tmp_path):
    shot = tmp_path / "report.png"
    proc = _run(chromium, tmp_path, "--window-size=1280,2200", f"--screenshot={shot}", report.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    from PIL import Image  # matplotlib depends on Pillow

    with Image.open(shot) as image:
        assert image.size == (1280, 2200)
        colours = image.convert("RGB").resize((320, 550)).getcolors(maxcolors=100_000)
    assert colours is not None and len(colours) > 50  # text, tiles and plots, not a blank page
    keep = os.environ.get("TIDEGAUGE_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)
