"""Flag values tidegauge hands to Spark as they are, checked the way Spark checks them, before anything starts.

Spark reads them only once its JVM runs and the job is under way: `tidegauge watch --trigger-interval 5sec` used to
create the checkpoint and the output directory, start Spark, and then fail with a stack trace. So each value is
checked here first, in Python (there is no JVM yet), by the rule Spark applies, and a value Spark would refuse is a
usage error naming the flag and the value (exit 2), before any file is written.

- An interval (`--trigger-interval`): pyspark's `DataStreamWriter.trigger(processingTime=...)` strips it and hands it
  to `Trigger.ProcessingTime`, which parses it with `SparkIntervalUtils.stringToInterval` (Spark 4.x,
  sql/api/.../catalyst/util/SparkIntervalUtils.scala), refuses months and years, and a negative total
  (`Triggers.convert`, `Triggers.validate`). `parse_interval` follows that parser byte by byte, overflow checks
  included; tests/pipelines/core/test_spark_flags.py compares it with Spark's own on many strings.
- A master URL (`--master`, `spark: master:`): spark-submit (which starts pyspark's JVM) accepts `yarn` and what
  starts with `spark`, `k8s` or `local`; the SparkContext then parses it (`SparkMasterRegex`,
  `createTaskScheduler`): `local`, `local[N]`, `local[*]`, `local[N,F]`, `local-cluster[N,C,M]`, `spark://H:P,...`,
  `k8s://...`, `yarn`, N > 0.
"""

from __future__ import annotations

import re

from pipelines.core.errors import UsageError

_LONG = (-(2**63), 2**63 - 1)
_INT = (-(2**31), 2**31 - 1)
# Java's Character.isWhitespace for one byte (a negative byte, UTF-8 beyond ASCII, is never whitespace)
_WHITESPACE = frozenset(b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f ")
# UTF8String.trimAll: whitespace or ISO control characters, at both ends
_TRIMMED = _WHITESPACE | frozenset(range(0x20)) | {0x7F}
_MICROS_PER = {"hour": 3_600_000_000, "minute": 60_000_000, "second": 1_000_000, "millisecond": 1_000}
_MICROS_PER_DAY = 86_400_000_000
_NANOS_PER_SECOND = 1_000_000_000
_UNITS = ("year", "month", "week", "day", "hour", "minute", "second", "millisecond", "microsecond")
INTERVAL_HINT = "a number and a unit, e.g. '10 seconds', '1 minute 30 seconds', '500 milliseconds'"


def _exact(value: int, bounds: tuple[int, int] = _LONG) -> int:
    """Java's Math.*Exact: the result, or the ArithmeticException Spark turns into a parse error."""
    if not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"{'integer' if bounds == _INT else 'long'} overflow")
    return value


def parse_interval(text: str) -> tuple[int, int, int]:
    """(months, days, microseconds) of an interval string, as Spark's `stringToInterval` parses it after pyspark
    strips it; ValueError saying why Spark would refuse it."""
    raw = text.strip().encode("utf-8", "surrogateescape")
    start, end = 0, len(raw)
    while start < end and raw[start] in _TRIMMED:
        start += 1
    while end > start and raw[end - 1] in _TRIMMED:
        end -= 1
    s = raw[start:end].lower()
    if not s:
        raise ValueError("interval string cannot be empty")
    months = days = micros = 0
    value = fraction = 0
    scale, first_scale = -1, _NANOS_PER_SECOND // 10
    negative = point_first = False
    state, i = "prefix", 0
    while i < len(s):
        b = s[i]
        if state == "prefix":
            if s.startswith(b"interval"):
                if len(s) == len(b"interval"):
                    raise ValueError("interval string cannot be empty")
                if s[len(b"interval")] not in _WHITESPACE:
                    raise ValueError("invalid interval prefix")
                i += len(b"interval") + 1
            state = "trim_before_sign"
        elif state == "trim_before_sign":
            if b in _WHITESPACE:
                i += 1
            else:
                state = "sign"
        elif state == "sign":
            value = fraction = 0
            state, scale, point_first = "trim_before_value", -1, False
            if b == ord("-"):
                negative, i = True, i + 1
            elif b == ord("+"):
                negative, i = False, i + 1
            elif ord("0") <= b <= ord("9"):
                negative = False
            elif b == ord("."):
                negative, scale, point_first, i = False, first_scale, True, i + 1
                state = "fraction"
            else:
                raise ValueError("unrecognized number")
        elif state == "trim_before_value":
            if b in _WHITESPACE:
                i += 1
            else:
                state = "value"
        elif state == "value":
            if ord("0") <= b <= ord("9"):
                value = _exact(10 * value + b - ord("0"))
            elif b in _WHITESPACE:
                state = "trim_before_unit"
            elif b == ord("."):
                scale, state = first_scale, "fraction"
            else:
                raise ValueError("invalid value (a number, a space, then a unit)")
            i += 1
        elif state == "fraction":
            if ord("0") <= b <= ord("9") and scale > 0:
                fraction += (b - ord("0")) * scale
                scale //= 10
            elif b in _WHITESPACE and (not point_first or scale < first_scale):
                fraction //= _NANOS_PER_SECOND // 1_000_000  # nanoseconds to microseconds
                state = "trim_before_unit"
            elif ord("0") <= b <= ord("9"):
                raise ValueError("interval can only support nanosecond precision")
            else:
                raise ValueError("invalid value")
            i += 1
        elif state == "trim_before_unit":
            if b in _WHITESPACE:
                i += 1
            else:
                state = "unit"
        elif state == "unit":
            if b != ord("s") and scale >= 0:
                raise ValueError("only seconds can have a fractional part")
            if negative:
                value, fraction = -value, -fraction
            # (in Spark's order: `month` is tried before `minute`, `millisecond` and `microsecond`)
            unit = next((u for u in _UNITS if s.startswith(u.encode(), i)), None)
            if unit is None:
                raise ValueError(f"invalid unit (one of {', '.join(_UNITS)}, or their plurals)")
            if unit == "year":
                months = _exact(months + _exact(12 * value), _INT)
            elif unit == "month":
                months = _exact(months + _exact(value, _INT), _INT)
            elif unit == "week":
                days = _exact(days + _exact(7 * value), _INT)
            elif unit == "day":
                days = _exact(days + _exact(value, _INT), _INT)
            elif unit == "microsecond":
                micros = _exact(micros + value)
            elif unit == "second":
                micros = _exact(_exact(micros + _exact(value * _MICROS_PER["second"])) + fraction)
            else:
                micros = _exact(micros + _exact(value * _MICROS_PER[unit]))
            i += len(unit)
            state = "unit_suffix"
        elif state == "unit_suffix":
            if b == ord("s"):
                state = "unit_end"
            elif b in _WHITESPACE:
                state = "trim_before_sign"
            else:
                raise ValueError("invalid unit")
            i += 1
        elif state == "unit_end":
            if b not in _WHITESPACE:
                raise ValueError("invalid unit")
            i += 1
            state = "trim_before_sign"
    if state not in ("unit_suffix", "unit_end", "trim_before_sign"):
        raise ValueError(
            "a number must be followed by a unit" if state != "trim_before_value" else "no number"
        )
    return months, days, micros


def trigger_interval_ms(text: str) -> int:
    """The milliseconds between micro-batches that `trigger(processingTime=text)` would give; ValueError saying
    why Spark would refuse it."""
    months, days, micros = parse_interval(text)
    if months:
        raise ValueError("months and years are not supported")
    ms = _exact(micros + _exact(days * _MICROS_PER_DAY)) // 1000  # (Java's floorDiv)
    if ms < 0:
        raise ValueError("the interval must not be negative")
    return ms


def trigger_interval(text: str, flag: str = "--trigger-interval") -> str:
    """`text` when Spark accepts it as a processing-time trigger interval, else UsageError naming `flag`."""
    try:
        trigger_interval_ms(text)
    except ValueError as exc:
        raise UsageError(f"{flag} {text!r}: not an interval Spark accepts: {exc} ({INTERVAL_HINT})") from None
    return text


_SPACE = "[ \t\n\x0b\f\r]*"  # what \\s matches in Java
_LOCAL = re.compile(rf"local(\[([0-9]+|\*)\]|\[([0-9]+|\*){_SPACE},{_SPACE}([0-9]+)\])?")
_LOCAL_CLUSTER = re.compile(
    rf"local-cluster\[{_SPACE}([0-9]+){_SPACE},{_SPACE}([0-9]+){_SPACE},{_SPACE}([0-9]+){_SPACE}]"
)
_HOST_PORT = r"([^,:/?#@\[\]\s]+|\[[0-9a-fA-F:.]+\]):[0-9]+"
_SPARK = re.compile(rf"spark://{_HOST_PORT}(,{_HOST_PORT})*")
_K8S = re.compile(r"k8s://((https?)://)?[^/\s]+\S*")
MASTER_HINT = "local, local[N], local[*], local[N,F], spark://HOST:PORT, yarn or k8s://HOST:PORT"


def master(text: str | None, flag: str = "--master") -> str | None:
    """`text` (None: Spark's default) when Spark accepts it as a master URL, else UsageError naming `flag`. (What a
    URL points at — a host that answers, local-cluster's memory against spark.executor.memory — is Spark's to say.)"""
    if text is None:
        return None
    if m := _LOCAL.fullmatch(text):
        counts, others = [m.group(2) or m.group(3)], [m.group(4)]  # threads; task failures allowed
    elif m := _LOCAL_CLUSTER.fullmatch(text):
        counts, others = [m.group(1), m.group(2)], [m.group(3)]  # workers, cores each; memory each (MiB)
    elif text == "yarn" or _SPARK.fullmatch(text) or _K8S.fullmatch(text):
        return text
    else:
        raise UsageError(f"{flag} {text}: not a Spark master URL ({MASTER_HINT})")
    numbers = [int(n) for n in counts + others if n not in (None, "*")]
    if any(n >= 2**31 for n in numbers):  # (Scala's toInt)
        raise UsageError(f"{flag} {text}: a number there is too large for Spark")
    if any(n not in (None, "*") and int(n) == 0 for n in counts):
        raise UsageError(f"{flag} {text}: Spark needs at least 1 thread (or worker, or core) there")
    return text
