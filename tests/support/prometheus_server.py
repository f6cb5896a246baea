"""Prometheus itself for the tests: its two binaries, `promtool` and the `prometheus` server, taken from Debian's
`prometheus` package into a cache; a copy of conf/alerts.yaml whose `for:` durations are scaled to a test's
heartbeat interval; and a Prometheus server on loopback, started with a temporary data directory and stopped
(its process and directories removed) afterwards.

The package is downloaded (`apt-get download`) and unpacked (`dpkg-deb -x`), never installed: installing would
also install and, where services start, start a Prometheus server and its node exporter. Only the two binaries
are kept (about 100 MB together); the package (about 19 MB) and the rest of it are deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from standalone_cluster import free_port

BINARIES = ("promtool", "prometheus")
PACKAGE = "prometheus"


# -- the binaries --------------------------------------------------------------------------------------------
def fetch_from_debian(cache: Path) -> tuple[dict[str, Path], list[str]]:
    """`promtool` and `prometheus` from Debian's `prometheus` package, kept in `cache` (taken out of the package
    on first use, found there afterwards). `apt-get download` needs no root; the package lists are refreshed
    (`apt-get update`, as root) only when the download fails. Returns (name → path of those there, the errors
    met)."""
    cache.mkdir(parents=True, exist_ok=True)
    have = {name: cache / name for name in BINARIES if (cache / name).exists()}
    if len(have) == len(BINARIES):
        return have, []
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        return have, ["no apt-get and dpkg-deb here"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    errors: list[str] = []

    def run(cmd: list[str]) -> bool:
        try:
            proc = subprocess.run(cmd, cwd=cache, env=env, capture_output=True, text=True, timeout=1200)
        except subprocess.TimeoutExpired:
            errors.append(f"{' '.join(cmd)} timed out")
            return False
        if proc.returncode != 0:
            errors.append(f"{' '.join(cmd)}: {proc.stderr.strip()[-300:]}")
        return proc.returncode == 0

    download = ["apt-get", "download", "-qq", PACKAGE]
    ok = run(download) or (os.geteuid() == 0 and run(["apt-get", "update", "-qq"]) and run(download))
    debs = sorted(cache.glob(f"{PACKAGE}_*.deb"))
    if ok and debs and run(["dpkg-deb", "-x", debs[-1].name, "package"]):
        for name in BINARIES:
            extracted = cache / "package" / "usr" / "bin" / name
            if extracted.exists():
                extracted.replace(cache / name)
    for deb in debs:
        deb.unlink()
    shutil.rmtree(cache / "package", ignore_errors=True)
    have = {name: cache / name for name in BINARIES if (cache / name).exists()}
    missing = [name for name in BINARIES if name not in have]
    if missing and not errors:
        errors.append(f"no {' and '.join(missing)} in the package")
    return have, errors


@dataclass
class Binaries:
    """Where each binary is (None: neither on PATH nor obtainable), and why one is missing."""

    paths: dict[str, str | None]
    errors: list[str] = field(default_factory=list)

    def get(self, name: str) -> str | None:
        return self.paths.get(name)

    def why_missing(self, name: str) -> str:
        return (
            f"{name} is not on PATH and could not be taken from Debian's `{PACKAGE}` package ("
            + ("; ".join(self.errors) or "no reason given")
            + ")"
        )


def find_binaries(cache: Path | None, tmp_dir: Path) -> Binaries:
    """Each binary from PATH, else from Debian's package kept in `cache` (pytest's cache directory; `tmp_dir`
    when the cache is off): both are taken out of the package together, once."""
    paths: dict[str, str | None] = {name: shutil.which(name) for name in BINARIES}
    errors: list[str] = []
    if any(p is None for p in paths.values()):
        found, errors = fetch_from_debian(cache if cache is not None else tmp_dir)
        for name, path in found.items():
            paths[name] = paths[name] or str(path)
    return Binaries(paths, errors)


# -- the rules, scaled ---------------------------------------------------------------------------------------
PRODUCTION_INTERVAL_S = 60.0
"""The heartbeat interval conf/alerts.yaml's `for:` durations were chosen for (its header: "chosen for Venice's
default 60 s interval"). Its thresholds are counted in intervals, read from the interval metrics, and need no
scaling; its `for:` durations are wall-clock time."""

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_FOR_LINE = re.compile(r"^(?P<indent>\s*)for:(?P<space>\s*)(?P<value>\S+)(?P<rest>\s*(#.*)?)$")


def duration_ms(text: str) -> int:
    """A Prometheus duration (`1m`, `90s`, `1h30m`, `0m`) in milliseconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a Prometheus duration")
    return sum(int(n) * _UNITS_MS[u] for n, u in parts)


def duration_text(ms: int) -> str:
    """Milliseconds as a Prometheus duration: whole seconds as `Ns`, else `Nms`; zero as `0s`."""
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def scale_for_durations(rules_text: str, factor: float) -> str:
    """conf/alerts.yaml's text with every rule's `for:` multiplied by `factor` (rounded to the millisecond), and
    not one other character changed: the expressions, labels and annotations a test loads are the real file's.

    For a test whose heartbeat interval is `interval_s`, `factor = interval_s / PRODUCTION_INTERVAL_S`: a rule
    then waits as many intervals as it does in production (`for: 1m` at a 60 s interval is one interval, so 5 s
    at a 5 s interval). What stays unscaled, because it is in the expressions: the thresholds (already counted in
    intervals), the offset-lag limit (records), and the divergence rules' 10-minute windows (which only keep an
    alert up longer)."""
    if not factor > 0:
        raise ValueError(f"factor must be positive, got {factor!r}")
    lines = rules_text.splitlines(keepends=True)
    scaled = 0
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        m = _FOR_LINE.match(body)
        if m is None:
            continue
        ms = round(duration_ms(m["value"]) * factor)
        new = f"{m['indent']}for:{m['space']}{duration_text(ms)}{m['rest']}"
        lines[i] = new + line[len(body) :]
        scaled += 1
    rules = [r for g in yaml.safe_load(rules_text)["groups"] for r in g["rules"]]
    if scaled != sum("for" in r for r in rules):
        raise ValueError(
            f"{scaled} `for:` lines found for {sum('for' in r for r in rules)} rules with a `for`"
        )
    return "".join(lines)


# -- the server ----------------------------------------------------------------------------------------------
class PrometheusError(RuntimeError):
    """The server did not start, or its API answered with an error."""


@dataclass
class Prometheus:
    """A running server: `url` (http://127.0.0.1:PORT) and its HTTP API."""

    url: str
    process: subprocess.Popen
    log: Path

    def api(self, path: str, **params: object) -> object:
        """GET /api/v1/`path` with `params`; returns its `data` (raises PrometheusError on an error status)."""
        query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - our loopback server
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def alerts(self) -> list[dict]:
        """/api/v1/alerts: every active alert, pending or firing, with its labels, state and activeAt."""
        return self.api("alerts")["alerts"]

    def query(self, expr: str, at: float | None = None) -> dict:
        """/api/v1/query: {"resultType", "result"} of `expr` evaluated now, or at `at` (epoch seconds)."""
        return self.api("query", query=expr, **({} if at is None else {"time": f"{at:.3f}"}))

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def config_text(
    jobs: dict[str, list[str]], rule_files: list[Path], scrape_interval_s: float, evaluation_interval_s: float
) -> str:
    """prometheus.yml: one scrape job per name (its targets, host:port), the rule files, the intervals. A scrape
    may take up to its interval (Prometheus refuses a longer timeout)."""
    every = duration_text(round(scrape_interval_s * 1000))
    doc = {
        "global": {
            "scrape_interval": every,
            "scrape_timeout": every,
            "evaluation_interval": duration_text(round(evaluation_interval_s * 1000)),
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": name, "static_configs": [{"targets": list(targets)}]}
            for name, targets in jobs.items()
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False)


@contextlib.contextmanager
def prometheus_server(
    binary: str,
    jobs: dict[str, list[str]],
    rules: str,
    *,
    scrape_interval_s: float = 1.0,
    evaluation_interval_s: float = 1.0,
    ready_timeout_s: float = 120.0,
) -> Iterator[Prometheus]:
    """Prometheus on a free loopback port, scraping `jobs` (name → targets) with `rules` (a rules file's text)
    loaded, its data in a new temporary directory. Ready once /-/ready answers. On the way out, however the
    body ended, the server gets SIGTERM (SIGKILL after 30 s) and its directory (config, rules, data, log) is
    removed; the log's tail is printed first, so a failing test shows it."""
    root = Path(tempfile.mkdtemp(prefix="tg-prometheus-"))
    proc: subprocess.Popen | None = None
    log = root / "prometheus.log"
    try:
        (root / "alerts.yaml").write_text(rules, encoding="utf-8")
        (root / "prometheus.yml").write_text(
            config_text(jobs, [root / "alerts.yaml"], scrape_interval_s, evaluation_interval_s),
            encoding="utf-8",
        )
        for _attempt in range(3):  # another process may take the free port first: try another
            port = free_port()
            with open(log, "ab") as out:
                proc = subprocess.Popen(
                    [
                        binary,
                        f"--config.file={root / 'prometheus.yml'}",
                        f"--storage.tsdb.path={root / 'data'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--storage.tsdb.retention.time=1d",
                    ],
                    cwd=root,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own group: nothing of it outlives the stop below
                )
            server = Prometheus(f"http://127.0.0.1:{port}", proc, log)
            if _ready(server, ready_timeout_s):
                break
            if proc.poll() is None:
                raise PrometheusError(f"not ready within {ready_timeout_s:g} s:\n{server.log_tail()}")
            if "address already in use" not in server.log_tail():
                raise PrometheusError(f"exited with {proc.returncode}:\n{server.log_tail()}")
        else:
            raise PrometheusError(f"no free port after 3 attempts:\n{server.log_tail()}")
        try:
            yield server
        except BaseException:
            print(f"prometheus's log (tail):\n{server.log_tail()}")
            raise
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def _ready(server: Prometheus, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=5) as response:  # noqa: S310
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False
