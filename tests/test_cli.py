"""The command line as a new user meets it (issue 28): a misspelled flag is refused by the command it was given
to, with that command's usage."""

from __future__ import annotations

import pytest

from pipelines.cli import main


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
