"""The command line as a new user meets it (issue 28): a misspelled flag is refused by the command it was given
to, with that command's usage; `--version`; `--help` examples that run as printed, and prose that wraps at the
terminal's width while the examples stay as written."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

from pipelines.cli import build_parser, main
from pipelines.core.helptext import COMMANDS

REPO = Path(__file__).resolve().parents[1]


def _usage_error(capsys, argv: list[str]) -> tuple[str, str]:
    """(the usage's first line, the error line) of a command line argparse refuses (exit 2)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    return lines[0], lines[-1]


@pytest.mark.parametrize(
    "argv, command, error",
    [
        (["leapfrog", "--sotre", "x", "--out", "o"], "leapfrog", "--sotre x (did you mean '--store'?)"),
        (["leapfrog", "--sotre", "x"], "leapfrog", "--sotre (did you mean '--store'?)"),
        (["div", "validate", "--bogus"], "div validate", "--bogus"),
        (
            ["div", "validate", "--out", "o", "--max-age-ms", "-1", "--topic=t", "--bogus=3"],
            "div validate",
            "--bogus=3",
        ),
        (["lag", "--rt-sorce", "1=x"], "lag", "--rt-sorce 1=x (did you mean '--rt-source'?)"),
        (["div", "--bogus"], "div", "--bogus"),
    ],
)
def test_a_misspelled_flag_is_refused_by_its_command_with_its_usage(capsys, argv, command, error):
    """argparse would leave a subcommand's unknown flags to the top-level parser (`usage: tidegauge [-h] ...`),
    and report a missing required flag rather than the misspelled one beside it."""
    usage, line = _usage_error(capsys, argv)
    assert usage.startswith(f"usage: tidegauge {command} [-h]")
    assert line == f"tidegauge {command}: error: unrecognized arguments: {error}"


def test_abbreviations_and_negative_values_are_not_unknown_flags(capsys):
    usage, line = _usage_error(capsys, ["div", "validate", "--max-age-ms", "-1", "--fail"])
    assert line == "tidegauge div validate: error: the following arguments are required: --out"


def test_version_prints_the_installed_package_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"tidegauge {version('tidegauge')}\n"


# -- --help: examples that run as printed, prose that wraps at the terminal's width ---------------------------------


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """`tidegauge`, `tidegauge leapfrog`, `tidegauge div validate`, ...: every parser, by its command line."""
    out = {}

    def walk(parser: argparse.ArgumentParser) -> None:
        out[parser.prog] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)

    walk(build_parser())
    return out


def _examples(parser: argparse.ArgumentParser) -> list[list[str]]:
    """The example command lines of a parser's --help, as printed: each with the lines its `\\` continues on."""
    examples, current = [], None
    for line in f"{parser.description or ''}\n{parser.epilog or ''}".splitlines():
        if current is None and not (line[:1].isspace() and line.strip().startswith(COMMANDS)):
            continue
        current = (current or []) + [line]
        if not line.rstrip().endswith("\\"):
            examples.append(current)
            current = None
    return examples


def _words(example: list[str]) -> list[str]:
    """What a shell passes for an example (`\\` continuations joined, quotes and `# comments` as a shell reads them)."""
    return shlex.split(" ".join(line.rstrip().removesuffix("\\") for line in example), comments=True)


def test_every_help_example_is_a_command_line_the_parser_accepts():
    """`leapfrog --help` said `--store demo` (a simulation's store is `sim_store`) and `leapfrog ... --state`;
    `simulate --help` had a backslash eaten by Python, which ran two lines into one."""
    seen = 0
    for prog, parser in _parsers().items():
        for example in _examples(parser):
            words = _words(example)
            if words[0] != "tidegauge":
                continue  # (spark-submit, curl)
            seen += 1
            try:
                build_parser().parse_args(words[1:])
            except SystemExit:
                pytest.fail(f"{prog} --help: this example does not parse: {' '.join(words)}")
            assert "..." not in words, words
            if "--store" in words and any(w.startswith(("0=out/", "1=out/")) for w in words):
                assert words[words.index("--store") + 1] == "sim_store", words  # what `simulate` writes
    assert seen >= 15


@pytest.mark.parametrize("columns", [60, 150])
def test_help_prose_wraps_at_the_terminal_width_and_examples_stay_as_written(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    width = columns - 2  # argparse leaves two columns
    for prog, parser in _parsers().items():
        text = parser.format_help()
        lines = text.splitlines()
        usage = lines[: lines.index("")]  # (argparse's own, wrapped by it)
        examples = {line for example in _examples(parser) for line in example}
        for example in examples:
            assert example in lines, (
                f"{prog} --help at {columns} columns changed the example line {example!r}"
            )
        for line in lines[len(usage) :]:
            if line in examples or len(line) <= width or line.startswith("  -"):
                continue  # (an example; a flag with its metavar, which argparse does not break)
            assert " " not in line.strip(), f"{prog} --help at {columns} columns: {line!r} is not wrapped"
    assert (
        "--out DIR" not in _parsers()["tidegauge report"].description
    )  # the flags are listed once, by argparse


@pytest.mark.slow
@pytest.mark.spark
def test_the_help_examples_on_archives_run_as_printed(spark, tmp_path, monkeypatch):
    """The first example of each batch command that reads only what `tidegauge simulate --out out/sim` writes,
    run in that order in an empty directory: simulate, lag, leapfrog, div validate, div restore, report."""
    monkeypatch.chdir(tmp_path)
    parsers = _parsers()
    order = ["simulate", "lag", "leapfrog", "div validate", "div restore", "report"]
    runs = []
    for command in order:
        for example in _examples(parsers[f"tidegauge {command}"]):
            words = _words(example)
            if not any(
                w.startswith(("kafka://", "--live", "--conf", "--engine")) or "kafka://" in w for w in words
            ):
                runs.append(words)
                break
        else:
            pytest.fail(f"tidegauge {command} --help has no example on archives")
    for words in runs:
        assert main(words[1:]) in (0, 1), " ".join(words)
    assert (tmp_path / "reports" / "2026-09-21" / "report.html").is_file()


def test_the_demos_default_output_directories_are_ignored_by_git():
    """A first `tidegauge demo` in a checkout must not leave hundreds of untracked files in `git status`."""
    from pipelines.demo.watch import WatchDemoOptions

    ignored = (REPO / ".gitignore").read_text().splitlines()
    for out in (_parsers()["tidegauge demo"].get_default("out"), WatchDemoOptions.out):
        assert f"/{out}/" in ignored, out
