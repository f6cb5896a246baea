"""JVM jars from Maven Central, named by a descriptor kept in the repository, copied once into a cache outside it.

Two parts of tidegauge need jars that no Python package ships: the Apache Kafka brokers `sim.brokers` starts (the
tests' real brokers, `simulate --brokers real`, `demo --kafka real`) and Spark's S3A connector, which `tidegauge
watch` puts on Spark's class path for an `s3a://` checkpoint (`pipelines.watch.checkpoint`). Both are resolved the
same way, by this module: a `pom.xml` of ours lists the artifacts (never fetched by hand, never committed), `mvn
dependency:copy-dependencies` copies them and their runtime dependencies into

    ~/.cache/tidegauge/jvm/<name>-<version>/lib/

(`$TIDEGAUGE_CACHE_DIR/jvm/...`, or `$XDG_CACHE_HOME/tidegauge/jvm/...` when set)

and a `resolved.json` stamp beside `lib/` records the descriptor's digest and the jars: a cache whose stamp does
not match the descriptor (it was edited) or misses a jar is resolved again. Several processes may ask at once (a
test session's workers, a demo and a watch): a file lock per name and version makes one of them resolve and the
others wait and reuse. Maven runs in a temporary directory beside the cache, renamed into place only when it
succeeded, so nothing half-made is ever used. Without Maven or Java, or when Maven fails or hangs, `JarsError`
says what to install or do.

It lives in `sim` because that is the one layer both users may import: a command package of `pipelines` may import
`sim`, and `sim` may not import `pipelines` (docs/design.md, Layers; tests/test_architecture.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

JAVA_MIN = 17  # Kafka 4.x brokers and Spark 4 need Java 17
MVN_TIMEOUT_S = 900.0
# what Maven's log says when the repository could not be reached at all (rather than an artifact it lacks)
_UNREACHABLE = re.compile(
    r"Could not transfer|UnknownHost|Unknown host|Connect(ion)? (to .* )?(refused|timed out|failed)|"
    r"Network is unreachable|No route to host|Temporary failure in name resolution|offline mode",
    re.I,
)


class JarsError(RuntimeError):
    """Jars that could not be had: no Java or Maven, or Maven failed or hung. The message says what to do."""


@dataclass(frozen=True)
class JarSet:
    """One descriptor's jars. `name` and `version` name the cache directory (`<name>-<version>`); `label` names
    the jars in messages ("Apache Kafka 4.1.2"); `needs` says who needs them, with its verb ("real Kafka brokers
    need"); `marker` is a jar file name whose presence proves Maven resolved what was asked; `properties` are
    passed to Maven as -D (overriding the descriptor's own properties: e.g. the Hadoop version Spark ships)."""

    name: str
    version: str
    pom: Path
    label: str
    needs: str
    marker: str
    properties: Mapping[str, str] = field(default_factory=dict)


def cache_dir() -> Path:
    """Where resolved JVM jars live: outside the repository, shared by every checkout of the machine's user."""
    if os.environ.get("TIDEGAUGE_CACHE_DIR"):
        return Path(os.environ["TIDEGAUGE_CACHE_DIR"]) / "jvm"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tidegauge" / "jvm"


def _java(needs: str) -> str:
    java = shutil.which("java")
    if java is None and os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        java = str(candidate) if candidate.exists() else None
    if java is None:
        raise JarsError(
            f"{needs} Java {JAVA_MIN} or newer and no 'java' is on PATH; on Debian/Ubuntu: "
            "apt-get install -y openjdk-17-jre-headless"
        )
    return java


_java_checked: dict[str, int] = {}


def java_command(needs: str = "Maven needs") -> str:
    """The `java` on PATH (or in $JAVA_HOME), checked to be Java 17 or newer; `needs` starts the error message
    ("real Kafka brokers need")."""
    java = _java(needs)
    if java not in _java_checked:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
        m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
        major = 0 if m is None else int(m.group(1)) if m.group(1) != "1" else int(m.group(2) or 0)
        if major < JAVA_MIN:
            raise JarsError(
                f"{needs} Java {JAVA_MIN} or newer; {java} -version says: "
                f"{(out.stderr or out.stdout).strip().splitlines()[:1]}"
            )
        _java_checked[java] = major
    return java


def _digest(jars: JarSet) -> str:
    """The descriptor's sha256; with properties, of the descriptor and them (another value is another set)."""
    h = hashlib.sha256(jars.pom.read_bytes())
    if jars.properties:
        h.update(json.dumps(dict(sorted(jars.properties.items()))).encode())
    return h.hexdigest()


def _complete(home: Path, digest: str) -> bool:
    try:
        stamp = json.loads((home / "resolved.json").read_text())
    except (OSError, ValueError):
        return False
    lib = home / "lib"
    return stamp.get("pom_sha256") == digest and all((lib / j).is_file() for j in stamp.get("jars", [None]))


def jars(
    jar_set: JarSet, timeout_s: float = MVN_TIMEOUT_S, progress: Callable[[str], None] | None = None
) -> list[Path]:
    """The jar files of `jar_set` (`resolve`)."""
    return sorted(resolve(jar_set, timeout_s, progress).glob("*.jar"))


def resolve(
    jars: JarSet, timeout_s: float = MVN_TIMEOUT_S, progress: Callable[[str], None] | None = None
) -> Path:
    """The directory holding `jars`, resolved from Maven Central on first use (then cached; resolved again when
    the descriptor changes). `progress` is told once when a resolution starts (it may download a lot). Raises
    JarsError naming what is missing, what Maven said, or what to check."""
    digest = _digest(jars)
    key = f"{jars.name}-{jars.version}"
    home = cache_dir() / key
    if _complete(home, digest):
        return home / "lib"
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError(
            f"{jars.needs} the jars of {jars.label}, which Maven resolves from Maven Central ({jars.pom}), and no "
            "'mvn' is on PATH; on Debian/Ubuntu: apt-get install -y maven"
        )
    java_command(jars.needs)
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".{key}.lock", "w") as lock:
        # another process resolving the same jars: wait for it, then reuse what it made
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(home, digest):
            return home / "lib"
        if progress:
            progress(f"resolving the jars of {jars.label} from Maven Central into {home} (once)")
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=home.parent))
        log_path = tmp / "mvn.log"
        cmd = [
            mvn,
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(jars.pom),
            *(f"-D{k}={v}" for k, v in sorted(jars.properties.items())),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={tmp / 'lib'}",
            "-DincludeScope=runtime",
        ]
        t0 = time.monotonic()
        try:
            with open(log_path, "wb") as log:
                code = subprocess.run(
                    cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout_s
                ).returncode
        except subprocess.TimeoutExpired:
            raise JarsError(
                f"mvn did not resolve {jars.label}'s jars in {timeout_s:.0f} s (is Maven Central reachable?); "
                f"its output: {log_path}"
            ) from None
        lib = tmp / "lib"
        if code != 0 or not (lib / jars.marker).is_file():
            said = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if "ERROR" in ln]
            hint = (
                "; Maven Central could not be reached: check the network, or the proxy or mirror in "
                "~/.m2/settings.xml, and run again"
                if any(_UNREACHABLE.search(s) for s in said)
                else ""
            )
            raise JarsError(
                f"mvn could not resolve {jars.label}'s jars (exit {code}): "
                + (" | ".join(said[:3]) or "no error line")
                + f"{hint}; the whole output: {log_path}; the command: {' '.join(cmd)}"
            )
        names = sorted(p.name for p in lib.glob("*.jar"))
        (tmp / "resolved.json").write_text(
            json.dumps(
                {
                    "name": jars.name,
                    "version": jars.version,
                    "pom_sha256": digest,
                    "properties": dict(jars.properties),
                    "resolved_in_s": round(time.monotonic() - t0, 1),
                    "bytes": sum((lib / n).stat().st_size for n in names),
                    "jars": names,
                },
                indent=2,
            )
            + "\n"
        )
        if home.exists():
            shutil.rmtree(home)
        os.rename(tmp, home)
    return home / "lib"
