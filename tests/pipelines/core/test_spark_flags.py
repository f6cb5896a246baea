"""Flag values Spark would refuse are refused before anything starts (issue 28): `tidegauge watch --trigger-interval
5sec` is exit 2 naming the flag and the value, and no checkpoint or output directory is made. The Python check of
an interval is compared with Spark's own parser on many strings, the master URL's with Spark's own patterns."""

from __future__ import annotations

import random
import re

import pytest

from pipelines.cli import main
from pipelines.core import spark_flags
from pipelines.core.errors import UsageError

ACCEPTED = {  # interval -> milliseconds, as Spark's Trigger.ProcessingTime computes them
    "10 seconds": 10_000,
    "2 seconds": 2_000,
    "1 second": 1_000,
    "1 minute": 60_000,
    "1 minute 30 seconds": 90_000,
    "interval 5 seconds": 5_000,
    "INTERVAL 5 SECONDS": 5_000,
    "  3 hours\t": 10_800_000,
    "1 day 2 hours": 93_600_000,
    "2 weeks": 1_209_600_000,
    "500 milliseconds": 500,
    "1500 microseconds": 1,
    "1.5 seconds": 1_500,
    ".5 seconds": 500,
    "0 seconds": 0,
    "+5 seconds": 5_000,
    "1 hour -3600 seconds": 0,
}
REFUSED = [
    "5sec", "10 sec", "5s", "10", "seconds", "", "   ", "5 secs", "5 secondss", "1.5 minutes", "-1 seconds",
    "1 month", "1 year", "interval", "interval5 seconds", "1e3 seconds", "5 seconds,", "2147483648 days",
    "9223372036854775808 microseconds", "1.0000000001 seconds", "5\u00a0seconds",
]  # fmt: skip


@pytest.mark.parametrize("text, ms", sorted(ACCEPTED.items()))
def test_intervals_spark_accepts(text, ms):
    assert spark_flags.trigger_interval_ms(text) == ms
    assert spark_flags.trigger_interval(text) == text


@pytest.mark.parametrize("text", REFUSED)
def test_intervals_spark_refuses_are_usage_errors_naming_flag_and_value(text):
    with pytest.raises(UsageError) as exc:
        spark_flags.trigger_interval(text)
    assert str(exc.value).startswith(f"--trigger-interval {text!r}: not an interval Spark accepts: ")


@pytest.mark.parametrize(
    "url", ["local", "local[2]", "local[*]", "local[2,3]", "local[*, 4]", "local-cluster[2, 1, 1024]",
            "spark://host:7077", "spark://a:7077,b:7078", "spark://[::1]:7077", "yarn", "k8s://https://h:6443"],
)  # fmt: skip
def test_master_urls_spark_accepts(url):
    assert spark_flags.master(url) == url


@pytest.mark.parametrize(
    "url", ["localhost", "local[0]", "local[]", "local[2", "local[-1]", "local[99999999999]", "spark://host",
            "spark://host:7077/", "sparky", "yarn-client", "k8s://", "mesos://h:5050", "bogus", ""],
)  # fmt: skip
def test_master_urls_spark_refuses_are_usage_errors(url):
    with pytest.raises(UsageError, match=rf"^--master {re.escape(url)}: "):
        spark_flags.master(url)


def test_a_refused_trigger_interval_creates_nothing(tmp_path, capsys):
    argv = ["watch", "--store", "s", "--version", "1", "--source", f"0={tmp_path / 'a'}", "--source"]
    argv += [f"1={tmp_path / 'b'}", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "out")]
    assert main([*argv, "--trigger-interval", "5sec"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tidegauge watch: error: --trigger-interval '5sec': not an interval Spark accepts")
    assert err.count("\n") == 1
    assert main([*argv, "--max-records-per-trigger", "0"]) == 2
    assert "--max-records-per-trigger 0: must be 1 or more" in capsys.readouterr().err
    assert main([*argv, "--master", "local[0]"]) == 2
    assert "--master local[0]: " in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_refused_master_in_the_configuration_file_creates_nothing(tmp_path, capsys):
    conf = tmp_path / "tidegauge.yaml"
    conf.write_text("spark:\n  master: 'local[*'\n")
    argv = ["leapfrog", "--store", "s", "--version", "1", "--source", "0=a", "--source", "1=b"]
    assert main([*argv, "--out", str(tmp_path / "out"), "--conf", str(conf)]) == 2
    assert "`spark: master:` in --conf local[*: not a Spark master URL" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["tidegauge.yaml"]
    assert main(["demo", "--master", "local[0]", "--out", str(tmp_path / "demo")]) == 2  # not minutes later
    assert "--master local[0]: " in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["tidegauge.yaml"]


def _fuzz(n: int, seed: int = 28) -> list[str]:
    """Intervals by the grammar (prefix, signs, whole and fractional numbers, units whole, plural, cut or in capitals,
    spaces of every kind, overflowing numbers), a third of them then damaged by one edit."""
    rng = random.Random(seed)
    units = ["week", "day", "hour", "minute", "second", "millisecond", "microsecond"] * 3 + ["year", "month"]
    units += [u + "s" for u in units] + ["sec", "min", "ms", "s", "nanosecond", "secondss", "MINUTES", "Day"]
    numbers = ["0", "1", "5", "10", "25", "007"] * 4 + [".5", "5.", "1.5", "0.000000001", "1.1234567891",
               "2147483647", "2147483648", "106751991", "9223372036854775807", "9223372036854775808", "."]  # fmt: skip
    spaces = [" "] * 12 + ["  ", "\t", "\n", "\x0b", "\x1c", "\u00a0", ""]
    edits = "0123456789 .-+sminx\t\x00"
    out = []
    for _ in range(n):
        text = rng.choice(["", "", "", "", "", "interval ", "INTERVAL\t", "interval", "intervals "])
        for _ in range(rng.randint(1, 3)):
            text += (
                rng.choice(["", "", "", "", "", "-", "+", "- "]) + rng.choice(numbers) + rng.choice(spaces)
            )
            text += rng.choice(units) + rng.choice(spaces)
        text = rng.choice(["", " ", "\x00", "\u2003"]) + text
        if rng.random() < 0.2 and text:
            at = rng.randrange(len(text))
            text = text[:at] + rng.choice(["", rng.choice(edits)]) + text[at + rng.randint(0, 1) :]
        out.append(text)
    return out


@pytest.mark.spark
def test_the_interval_check_agrees_with_sparks_own_parser(spark):
    """Accepted or refused, and the same interval, for every string: pyspark's `trigger(processingTime=)` (its strip,
    then Spark's parser and checks) decides acceptance, Spark's `stringToInterval` the interval."""
    from py4j.java_gateway import get_field
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    jvm = spark.sparkContext._jvm
    utf8 = jvm.org.apache.spark.unsafe.types.UTF8String
    intervals = getattr(getattr(jvm, "org.apache.spark.sql.catalyst.util.SparkIntervalUtils$"), "MODULE$")
    writer = spark.readStream.format("rate").load().writeStream
    texts = [*ACCEPTED, *REFUSED, *_fuzz(1500)]
    disagree = []
    for text in texts:
        try:
            writer.trigger(processingTime=text)
            spark_accepts = True
        except (Py4JJavaError, PySparkException):
            spark_accepts = False
        try:
            spark_flags.trigger_interval_ms(text)
            ours = True
        except ValueError:
            ours = False
        if ours != spark_accepts:
            disagree.append((text, "accepted" if spark_accepts else "refused by Spark"))
            continue
        try:
            cal = intervals.stringToInterval(utf8.fromString(text.strip()))
            spark_interval = tuple(get_field(cal, f) for f in ("months", "days", "microseconds"))
        except (Py4JJavaError, PySparkException):
            spark_interval = None
        try:
            our_interval = spark_flags.parse_interval(text)
        except ValueError:
            our_interval = None
        if our_interval != spark_interval:
            disagree.append((text, spark_interval, our_interval))
    assert not disagree, disagree[:20]
    assert sum(1 for t in texts if _accepted(t)) > 200  # the fuzz reaches the accepting paths too


def _accepted(text: str) -> bool:
    try:
        spark_flags.trigger_interval_ms(text)
        return True
    except ValueError:
        return False


@pytest.mark.spark
def test_the_local_master_patterns_are_sparks(spark):
    """`local[...]` and `local-cluster[...]` as Spark's SparkMasterRegex matches them."""
    regexes = getattr(getattr(spark.sparkContext._jvm, "org.apache.spark.SparkMasterRegex$"), "MODULE$")
    patterns = [regexes.LOCAL_N_REGEX(), regexes.LOCAL_N_FAILURES_REGEX(), regexes.LOCAL_CLUSTER_REGEX()]
    texts = ["local[2]", "local[*]", "local[ 2]", "local[2 ,\t3]", "local[*,1]", "local[2,*]", "local[a]",
             "local-cluster[1,2,3]", "local-cluster[ 1 , 2 , 3 ]", "local-cluster[1,2]", "local[2]x", "local[\u0662]",
             "local[2,\u00a03]", "local[2\n,3]"]  # fmt: skip
    for text in texts:
        sparks = any(p.pattern().matcher(text).matches() for p in patterns)
        ours = bool(spark_flags._LOCAL.fullmatch(text) or spark_flags._LOCAL_CLUSTER.fullmatch(text))
        assert ours == sparks, text
