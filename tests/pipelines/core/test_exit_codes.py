"""What `exit_codes` prints and returns for each kind of failure, including the loss of Spark's JVM."""

from __future__ import annotations

import argparse
import errno

from pipelines.core import errors


def _entry(fail):
    @errors.exit_codes()
    def run(args) -> int:
        fail()
        return 0

    return run


def _in_py4j(exc: BaseException):
    """A function that raises `exc` from a frame whose file is py4j's, as py4j does when the JVM is gone."""
    scope: dict = {}
    code = compile("def call(exc):\n    raise exc\n", "/site-packages/py4j/clientserver.py", "exec")
    exec(code, scope)
    return lambda: scope["call"](exc)


def test_a_dead_jvm_is_named_not_read_as_a_path(capsys):
    code = _entry(_in_py4j(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")))(
        argparse.Namespace(command="leapfrog")
    )
    err = capsys.readouterr().err
    assert code == errors.EXIT_USAGE
    assert "Spark's JVM stopped answering" in err and "out of memory" in err
    assert "nothing was replaced" not in err and "Traceback" not in err


def test_a_refused_connection_elsewhere_stays_an_os_error(capsys):
    def fail():
        raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused", "s3://bucket/x")

    assert _entry(fail)(argparse.Namespace(command="report")) == errors.EXIT_USAGE
    err = capsys.readouterr().err
    assert "s3://bucket/x: Connection refused" in err and "JVM" not in err


def test_usage_errors_os_errors_and_bugs(capsys):
    def usage():
        raise errors.UsageError("--store is required")

    def bug():
        raise KeyError("oops")

    assert _entry(usage)(argparse.Namespace(command="lag")) == 2
    assert capsys.readouterr().err.strip() == "tidegauge lag: error: --store is required"
    assert _entry(bug)(argparse.Namespace(command="lag")) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "internal error" in err


def test_errors_name_the_command_as_typed(tmp_path, capsys):
    """`tidegauge div validate: error: ...`, not `tidegauge div: ...`: the subcommand is part of the command."""
    from pipelines.cli import main

    assert (
        main(["div", "validate", "--source", f"0={tmp_path / 'nowhere'}", "--out", str(tmp_path / "o")]) == 2
    )
    assert capsys.readouterr().err.startswith("tidegauge div validate: error: ")
    assert (
        main(["div", "restore", "--source", "0=x", "--partition", "0", "--at-offset", "0", "--out", "o"]) == 2
    )
    assert capsys.readouterr().err.startswith("tidegauge div restore: error: --store and --version")
