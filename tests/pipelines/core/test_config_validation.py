"""Typos never pass silently (issue 16, finding 4): every YAML the product reads is checked against a schema.

Reported: unknown keys in `--conf` files were ignored — `kafak:` meant the security settings never reached the
client; `sourcez:` and a misspelled threshold in an expectations override the same. Now an unknown key is exit 2
naming the file, the key and the closest valid key, and client settings are never echoed.
"""

from __future__ import annotations

import contextlib
import io

import pytest

from pipelines.cli import main


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


COMMANDS = {
    "leapfrog": [
        "leapfrog",
        "--store",
        "s",
        "--version",
        "1",
        "--source",
        "0=/nowhere/a",
        "--source",
        "1=/nowhere/b",
    ],
    "div validate": ["div", "validate", "--source", "0=/nowhere/a"],
    "lag": ["lag", "--store", "s", "--version", "1", "--source", "0=/nowhere/a"],
    "div restore": [
        "div",
        "restore",
        "--store",
        "s",
        "--version",
        "1",
        "--source",
        "0=/nowhere/a",
        "--partition",
        "0",
        "--at-offset",
        "5",
    ],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    "text,key,hint",
    [
        ("kafak:\n  security.protocol: SASL_SSL\n  sasl.password: hunter2\n", "'kafak'", "'kafka'"),
        ("sourcez:\n  0: /tmp/a\n", "'sourcez'", "'sources'"),
        ("spark:\n  conff: {spark.executor.memory: 2g}\n", "'spark.conff'", "'conf'"),
    ],
)
def test_an_unknown_key_is_exit_2_naming_file_key_and_closest(tmp_path, command, text, key, hint):
    conf = tmp_path / "job.yaml"
    conf.write_text(text)
    code, err = _cli([*COMMANDS[command], "--out", str(tmp_path / "out"), "--conf", str(conf)])
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert str(conf) in line and key in line and f"did you mean {hint}" in line
    assert "hunter2" not in err
    assert not (tmp_path / "out").exists()


def test_wrong_types_name_the_key_and_never_echo_client_settings(tmp_path):
    conf = tmp_path / "job.yaml"
    conf.write_text("version: one\n")
    code, err = _cli([*COMMANDS["lag"], "--out", str(tmp_path / "o"), "--conf", str(conf)])
    assert code == 2 and "version" in err and "integer" in err
    conf.write_text("kafka_by_region:\n  1: sasl-secret-value\n")
    code, err = _cli([*COMMANDS["lag"], "--out", str(tmp_path / "o"), "--conf", str(conf)])
    assert code == 2 and "kafka_by_region.1" in err and "sasl-secret-value" not in err


def test_a_misspelled_threshold_in_an_expectations_override_is_exit_2(tmp_path):
    from report_fixtures import build_outputs

    outputs = build_outputs(tmp_path / "in")
    override = tmp_path / "exp.yaml"
    override.write_text("thresholds:\n  max_lag_msx: 60000\n")
    code, err = _cli(
        [
            "report",
            "--leapfrog",
            str(outputs.leapfrog),
            "--div",
            str(outputs.div),
            "--out",
            str(tmp_path / "report"),
            "--expectations",
            str(override),
        ]
    )
    assert code == 2
    assert "'max_lag_msx'" in err and "did you mean 'max_lag_ms'" in err
    override.write_text("threshold:\n  max_lag_ms: 60000\n")
    code, err = _cli(
        [
            "report",
            "--leapfrog",
            str(outputs.leapfrog),
            "--div",
            str(outputs.div),
            "--out",
            str(tmp_path / "report"),
            "--expectations",
            str(override),
        ]
    )
    assert code == 2 and "did you mean 'thresholds'" in err


def test_an_unknown_simulate_setting_names_the_closest(tmp_path):
    conf = tmp_path / "sim.yaml"
    conf.write_text("simulate:\n  recrods: 100\n")
    code, err = _cli(["simulate", "--conf", str(conf), "--out", str(tmp_path / "sim")])
    assert code == 2 and "'recrods'" in err and "did you mean 'records'" in err
    assert f"--conf {conf}" in err  # the file is named


def test_simulate_on_an_unreachable_cluster_is_a_usage_error_before_anything_is_written(tmp_path):
    code, err = _cli(
        [
            "simulate",
            "--out",
            str(tmp_path / "sim"),
            "--records",
            "100",
            "--kafka",
            "0=127.0.0.1:1",
            "1=127.0.0.1:1",
            "2=127.0.0.1:1",
        ]
    )
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "--kafka 0=127.0.0.1:1" in lines[0] and "Traceback" not in err
    assert not (tmp_path / "sim").exists()


def test_an_unknown_validator_parameter_names_the_closest(tmp_path):
    conf = tmp_path / "v.yaml"
    conf.write_text("validators:\n  - {class: 'builtin:timestamp_drift', max_drift: 5}\n")
    code, err = _cli([*COMMANDS["div validate"], "--out", str(tmp_path / "o"), "--conf", str(conf)])
    assert code == 2 and "did you mean 'max_drift_ms'" in err


def test_the_shipped_configuration_files_are_valid():
    import pathlib

    import yaml

    from pipelines.core.config import JobConfig
    from pipelines.report.expectations import load_expectations

    repo = pathlib.Path(__file__).resolve().parents[3]
    JobConfig.model_validate(yaml.safe_load((repo / "conf" / "simulate.yaml").read_text()))
    load_expectations()


def test_the_watch_reads_the_heartbeat_interval_from_its_configuration(tmp_path):
    from pipelines.core import config as cfg
    from pipelines.core.errors import UsageError

    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("store: s\nheartbeat_interval_ms: 2000\n")
    bad.write_text("store: s\nheartbeat_interval_ms: 0\n")
    assert cfg.load(str(good))["heartbeat_interval_ms"] == 2000
    with pytest.raises(UsageError, match="heartbeat_interval_ms"):
        cfg.load(str(bad))


@pytest.mark.parametrize("command", ["leapfrog", "watch"])
def test_comparing_jobs_need_a_store_a_version_and_two_regions(command, capsys, tmp_path):
    from pipelines.cli import main

    base = [command, "--source", f"0={tmp_path}", "--out", str(tmp_path / "o")]
    base += ["--checkpoint", str(tmp_path / "ck")] if command == "watch" else []
    assert main([*base, "--source", f"1={tmp_path}"]) == 2
    # leapfrog infers them when it can: from these empty sources it cannot
    assert "--store and --version" in capsys.readouterr().err
    assert main([*base, "--store", "s", "--version", "1"]) == 2
    assert f"{command} compares regions: give at least two --source" in capsys.readouterr().err


def test_malformed_yaml_is_located_without_quoting_the_line_that_may_hold_a_password(tmp_path) -> None:
    conf = tmp_path / "bad.yaml"
    conf.write_text("kafka:\n  security.protocol: SASL_SSL\n  sasl.password: s3cr3t: oops\n")
    code, err = _cli(COMMANDS["lag"] + ["--conf", str(conf)])
    assert code == 2
    assert "not valid YAML: line 3" in err
    assert "s3cr3t" not in err
