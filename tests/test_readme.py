"""The README keeps its promises: the two setup commands first (and that CI runs the second verbatim), at most 200
lines, every link leads to a page of the documentation site, and every command line it shows is one `tidegauge`
accepts. The site itself, its generated reference and the commands of its pages: tests/test_docs.py."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DEMO_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/tidegauge demo"
TEST_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest -n 2"
)


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_readme_opens_with_the_demo_and_the_test_command():
    text = README.read_text()
    first, second = (b.strip() for b in _blocks(text, "sh")[:2])
    assert (first, second) == (DEMO_COMMAND, TEST_COMMAND)
    assert text.index(DEMO_COMMAND) < text.index("## ")  # before any section


def test_ci_runs_exactly_the_readme_test_command():
    script = (REPO / ".ci" / "run").read_text()
    commands = [ln.strip() for ln in script.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert TEST_COMMAND in commands
    assert (REPO / ".ci" / "run").stat().st_mode & 0o111, ".ci/run must be executable"
    assert "java" in script and "17" in script  # Java is checked first, with a message


def test_the_readme_is_short_and_every_link_leads_into_the_site():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 15
    for link in local:
        assert (REPO / link).is_file(), f"README links to {link}, which does not exist"
        assert link.startswith("docs/") and link.endswith(".md"), link  # a page of the site
    # what a new user looks for first: the demo explained, the nightly job, secured clusters, the watch
    first_pages = {
        "docs/getting-started.md",
        "docs/guides/nightly.md",
        "docs/security.md",
        "docs/guides/watch.md",
    }
    assert first_pages <= set(local), first_pages - set(local)
    # the README names the question each command answers; every command has its own line in the table
    from pipelines.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    table = text[text.index("## What it answers") : text.index("## What the demo prints")]
    missing = {c for c in commands if f"`tidegauge {c}" not in table and c not in {"demo", "simulate"}}
    assert not missing, f"the README's first table does not name {sorted(missing)}"


def _tidegauge_argv(command: str) -> list[str] | None:
    """The tidegauge arguments of a shell command: `tidegauge ...`, or spark-submit with the launcher."""
    words = shlex.split(command)
    if words and words[0] in ("tidegauge", ".venv/bin/tidegauge"):
        return words[1:]
    for i, word in enumerate(words):
        if "pipelines.submit --path" in word:
            return words[i + 1 :]
    return None


def test_every_command_line_the_readme_shows_is_one_tidegauge_accepts():
    from pipelines.cli import build_parser

    seen = []
    for block in _blocks(README.read_text(), "sh")[2:]:
        for command in re.sub(r"\\\n", " ", block).splitlines():
            argv = _tidegauge_argv(command.replace("$(date -u +%F)", "2026-11-29"))
            if argv is None:
                continue
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    args = build_parser().parse_args(argv)
            except SystemExit:
                pytest.fail(f"README: `{command.strip()}` does not parse: {err.getvalue().strip()}")
            seen.append(args.command_name)
    assert {"leapfrog", "watch"} <= set(seen), seen
