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
import io
import json
import os
import pathlib
import shutil
import subprocess

import pytest
from devtools_pipe import Browser, Tab
from machine_lock import installs_lock
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
    plots: Array.from(document.querySelectorAll('svg.plot')).filter(s => s.getClientRects().length)  // shown
      .map(s => ({name: s.dataset.plot, size: size(s),
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
    with installs_lock():  # apt allows one client at a time, and the other xdist worker may be one
        for cmd in attempts:
            if _find_chromium():
                return _find_chromium()
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
            except subprocess.TimeoutExpired:
                errors.append(f"{' '.join(cmd)} timed out")
                continue
            if proc.returncode != 0:
                errors.append(f"{' '.join(cmd)}: {proc.stderr.strip()[-300:]}")
        if _find_chromium():
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


# Measured in the page through the DevTools protocol (which runs it whatever the page's policy). Every <details>
# is opened first: a reader may open any of them, and the page must fit then too.
LAYOUT = r"""
(async () => {
  await document.fonts.ready;
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const lines = (rects) => {  // text lines a set of boxes spans: boxes that overlap vertically share a line
    const boxes = Array.from(rects).filter(r => r.width > 0 && r.height > 0).sort((a, b) => a.top - b.top);
    let count = 0, bottom = -Infinity;
    for (const r of boxes) {
      if (r.top >= bottom - 1) { count += 1; bottom = r.bottom; } else { bottom = Math.max(bottom, r.bottom); }
    }
    return count;
  };
  const find = (text) => {  // a Range over each occurrence of `text` in the page, across element boundaries
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    const nodes = [];
    let all = '';
    for (let n = walker.nextNode(); n; n = walker.nextNode()) { nodes.push([all.length, n]); all += n.data; }
    const at = (i) => { let k = nodes.length - 1; while (nodes[k][0] > i) k -= 1; return [nodes[k][1], i - nodes[k][0]]; };
    const ranges = [];
    for (let i = all.indexOf(text); i >= 0; i = all.indexOf(text, i + 1)) {
      const range = document.createRange();
      range.setStart(...at(i));
      range.setEnd(...at(i + text.length - 1));
      range.setEnd(range.endContainer, range.endOffset + 1);
      ranges.push(range);
    }
    return ranges;
  };
  const needs = find('(needs --lag)').map(range => {
    let block = range.startContainer.parentElement;
    while (getComputedStyle(block).display.startsWith('inline')) block = block.parentElement;
    const natural = lines(range.getClientRects());
    const before = block.style.width;
    block.style.width = '1px';  // as narrow as it gets: the text breaks wherever the browser may break it
    const squeezed = lines(range.getClientRects());
    block.style.width = before;
    return {natural, squeezed, text: range.toString()};
  });
  // the plots shown (each wide plot has a narrow drawing beside it; CSS shows one of the two)
  const plots = Array.from(document.querySelectorAll('svg.plot')).filter(s => s.getClientRects().length).map(s => {
    const r = s.getBoundingClientRect();
    const box = s.viewBox.baseVal;
    const scale = r.width / box.width;  // matplotlib's font sizes are in the SVG's own units
    const text = Array.from(s.querySelectorAll('text')).map(t => parseFloat(getComputedStyle(t).fontSize) * scale);
    return {name: s.dataset.plot, cls: s.getAttribute('class'), left: r.left, right: r.right, width: r.width,
            height: r.height, drawn: parseFloat(s.style.maxWidth), room: s.parentElement.clientWidth,
            aspect: box.height / box.width, smallestText: Math.min(...text)};
  });
  return {innerWidth: window.innerWidth, scrollWidth: document.documentElement.scrollWidth,
          bodyScrollWidth: document.body.scrollWidth, needs, plots};
})()
"""


@pytest.mark.parametrize(
    "width, height, mobile", [(1280, 900, False), (390, 844, True)], ids=["desktop-1280", "phone-390"]
)
def test_the_page_fits_the_screen(chromium, report, tmp_path, width, height, mobile):
    """Issue 28: no sideways scrolling on a 390 px phone (the nav bar and the expectations path overflowed),
    plots scaled to the width and their text still legible (a desktop plot scaled to a phone showed 4-6 px
    text: the phone gets the narrow drawings), "(needs --lag)" never broken inside the flag. A phone (mobile
    emulation) zooms out a page wider than its screen, so window.innerWidth must stay the emulated width."""
    profile = tmp_path / "chromium-profile"
    with Browser(chromium, [*_FLAGS, f"--user-data-dir={profile}"], log=tmp_path / "chromium.log") as browser:
        tab = Tab(browser, width, height, scale=2 if mobile else 1, mobile=mobile)
        tab.open(report.as_uri())
        got = tab.evaluate(LAYOUT)
        shot = tab.screenshot() if mobile else None

    assert got["innerWidth"] == width, got  # a phone zooms out to fit a page that is too wide
    assert got["scrollWidth"] <= got["innerWidth"], got
    assert got["bodyScrollWidth"] <= got["innerWidth"], got

    plots = {p["name"]: p for p in got["plots"]}
    assert set(plots) == {"trends", "divergences", "div", "lag", "coverage"}
    for name, plot in plots.items():
        assert plot["width"] <= width and 0 <= plot["left"] and plot["right"] <= width, (name, plot)
        # scaled to its box (never beyond its drawn size), not cropped, and not squashed
        assert plot["width"] == pytest.approx(min(plot["drawn"], plot["room"]), abs=1), (name, plot)
        assert plot["height"] / plot["width"] == pytest.approx(plot["aspect"], rel=0.02), (name, plot)
        assert plot["smallestText"] >= 8, (name, plot)  # CSS px: the smallest text of the plot as shown
        if name != "divergences":  # the heatmap is small already and has one drawing
            assert plot["cls"] == ("plot narrow" if mobile else "plot wide"), (name, plot)

    assert got["needs"], "the page no longer says (needs --lag)"
    for needs in got["needs"]:
        assert needs["text"] == "(needs --lag)"
        assert needs["natural"] == 1, needs
        assert needs["squeezed"] == 1, needs  # on one line even where the browser breaks every word

    if shot is not None:
        from PIL import Image

        with Image.open(io.BytesIO(shot)) as image:
            assert image.width == 2 * width  # the whole page is as wide as the phone
            colours = image.convert("RGB").resize((195, 400)).getcolors(maxcolors=100_000)
        assert colours is not None and len(colours) > 50  # text, tiles and plots, not a blank page
        keep = os.environ.get("TIDEGAUGE_KEEP_PHONE_SCREENSHOT")
        if keep:
            pathlib.Path(keep).write_bytes(shot)
