"""Run the data-quality suites of conf/expectations.yaml with Great Expectations (GX Core 1.x).

The suites live in YAML, not in code, so an operator can tighten a threshold or add an expectation without a
release. Each suite reads one of the tables built by `tables.py`; each table becomes a pandas batch in an
ephemeral (in-memory) GX context that never touches the network or the disk.

GX is imported lazily (it costs most of a second) and quietly: no analytics, no progress bars, no warnings on
our output.
"""

from __future__ import annotations

import difflib
import logging
import os
import pathlib
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import yaml

from pipelines.core.storage import locate
from pipelines.report.errors import ExpectationsConfigError
from pipelines.report.tables import ID_COLUMNS, TABLES

# Package data, so that a wheel installed on a cluster node has it; the repository's conf/expectations.yaml is a
# link to this file (one copy, no drift)
DEFAULT_EXPECTATIONS = pathlib.Path(__file__).resolve().parent / "expectations.yaml"

# Keys of an expectation entry that are ours, not arguments of the GX expectation.
_OWN_KEYS = {"type", "meaning"}
_MAX_ROWS_REPORTED = 20
# Seconds the first `import great_expectations` of this process took (0.0: imported before us).
GX_IMPORT_SECONDS = [0.0]


@dataclass
class ExpectationSpec:
    type: str
    kwargs: dict[str, Any]
    meaning: str
    thresholds: dict[str, str]  # argument name -> threshold name it was taken from


@dataclass
class SuiteSpec:
    name: str
    table: str
    meaning: str
    expectations: list[ExpectationSpec]


@dataclass
class ExpectationsConfig:
    thresholds: dict[str, float]
    suites: dict[str, SuiteSpec]
    files: list[str]


@dataclass
class ExpectationOutcome:
    type: str
    column: str | None
    meaning: str
    kwargs: dict[str, Any]
    thresholds: dict[str, str]
    success: bool
    element_count: int | None = None
    unexpected_count: int | None = None
    observed_value: Any = None
    unexpected_rows: list[dict[str, Any]] = field(default_factory=list)
    exception: str | None = None


@dataclass
class SuiteOutcome:
    name: str
    table: str
    meaning: str
    success: bool | None  # None: not run (its table is not available)
    skipped_reason: str | None = None
    expectations: list[ExpectationOutcome] = field(default_factory=list)
    gx_result: dict[str, Any] | None = None


@dataclass
class ValidationRun:
    suites: list[SuiteOutcome]
    gx_version: str
    timings: dict[str, float]

    @property
    def evaluated(self) -> int:
        return sum(len(s.expectations) for s in self.suites if s.success is not None)

    @property
    def failed(self) -> int:
        return sum(1 for s in self.suites for e in s.expectations if not e.success)

    @property
    def success(self) -> bool:
        return self.failed == 0

    def suite(self, name: str) -> SuiteOutcome | None:
        return next((s for s in self.suites if s.name == name), None)


# ---------------------------------------------------------------------------------------------------- config


def _read_yaml(path: pathlib.Path | str) -> dict[str, Any]:
    try:
        where = locate(path)  # a local file or any URI the filesystem layer serves
        found = where.is_file()
    except OSError as exc:
        raise ExpectationsConfigError(f"expectations file {path}: cannot read: {exc}") from exc
    if not found:
        hint = (
            " (it ships inside the tidegauge package: reinstall it)" if path == DEFAULT_EXPECTATIONS else ""
        )
        raise ExpectationsConfigError(f"expectations file {path} not found{hint}")
    try:
        data = yaml.safe_load(where.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ExpectationsConfigError(f"expectations file {path} is not readable YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ExpectationsConfigError(
            f"expectations file {path}: expected a mapping with `thresholds:` and/or `suites:`"
        )
    for key in data:
        if key not in ("thresholds", "suites"):
            raise ExpectationsConfigError(
                f"expectations file {path}: unknown key {key!r}"
                f"{_closest(key, ['thresholds', 'suites'])}; expected `thresholds:` "
                "and/or `suites:`"
            )
    return data


def _closest(name: Any, valid) -> str:
    match = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _parse_thresholds(raw: Any, path: pathlib.Path) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ExpectationsConfigError(
            f"expectations file {path}: `thresholds:` must be a mapping of name: number"
        )
    out = {}
    for name, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ExpectationsConfigError(
                f"expectations file {path}: threshold {name!r} is {value!r}, expected a number"
            )
        out[str(name)] = value
    return out


def _parse_suite(name: str, raw: Any, path: pathlib.Path) -> SuiteSpec:
    where = f"expectations file {path}: suite {name!r}"
    if not isinstance(raw, dict):
        raise ExpectationsConfigError(f"{where} must be a mapping with `table:` and `expectations:`")
    table = raw.get("table")
    if table not in TABLES:
        raise ExpectationsConfigError(f"{where}: table {table!r} is not one of {', '.join(TABLES)}")
    entries = raw.get("expectations")
    if not isinstance(entries, list) or not entries:
        raise ExpectationsConfigError(f"{where}: `expectations:` must be a non-empty list")
    specs = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            raise ExpectationsConfigError(f"{where}, expectation #{i + 1}: needs `type: expect_...`")
        kwargs = {k: v for k, v in entry.items() if k not in _OWN_KEYS}
        refs = {k: v[1:] for k, v in kwargs.items() if isinstance(v, str) and v.startswith("$")}
        specs.append(
            ExpectationSpec(
                type=entry["type"], kwargs=kwargs, meaning=str(entry.get("meaning", "")), thresholds=refs
            )
        )
    return SuiteSpec(name=name, table=table, meaning=str(raw.get("meaning", "")), expectations=specs)


def load_expectations(
    override: str | pathlib.Path | None = None, default: str | pathlib.Path = DEFAULT_EXPECTATIONS
) -> ExpectationsConfig:
    """Read conf/expectations.yaml, then `override` on top (its thresholds and whole suites replace ours).

    Every `$name` argument is checked against the thresholds and every expectation type against GX, so a
    typo fails here, naming the file and the entry, not halfway through a nightly run.
    """
    default = pathlib.Path(default)
    files = [default] + (
        [override if "://" in str(override) else pathlib.Path(override)] if override is not None else []
    )
    thresholds: dict[str, float] = {}
    suites: dict[str, SuiteSpec] = {}
    suite_file: dict[str, pathlib.Path | str] = {}
    overridden: dict[str, pathlib.Path | str] = {}
    for path in files:
        data = _read_yaml(path)
        given = _parse_thresholds(data.get("thresholds"), path)
        if path != default:
            overridden.update(dict.fromkeys(given, path))
        thresholds.update(given)
        raw_suites = data.get("suites") or {}
        if not isinstance(raw_suites, dict):
            raise ExpectationsConfigError(
                f"expectations file {path}: `suites:` must be a mapping of name: suite"
            )
        for name, raw in raw_suites.items():
            suites[str(name)] = _parse_suite(str(name), raw, path)
            suite_file[str(name)] = path
    used = {
        ref for suite in suites.values() for spec in suite.expectations for ref in spec.thresholds.values()
    }
    for name, path in overridden.items():
        if name not in used:  # a misspelled threshold would otherwise change nothing, silently
            raise ExpectationsConfigError(
                f"expectations file {path}: threshold {name!r} is used by no expectation"
                f"{_closest(name, sorted(used))}"
            )
    for suite in suites.values():
        for i, spec in enumerate(suite.expectations):
            where = f"expectations file {suite_file[suite.name]}: suite {suite.name!r}, expectation #{i + 1}"
            for arg, ref in spec.thresholds.items():
                if ref not in thresholds:
                    raise ExpectationsConfigError(
                        f"{where}: {arg}: ${ref} names no threshold (known: {', '.join(sorted(thresholds))})"
                    )
            try:
                _build_expectation(spec, thresholds, suite.name)
            except ExpectationsConfigError as exc:
                raise ExpectationsConfigError(f"{where}: {exc}") from exc
    return ExpectationsConfig(thresholds=thresholds, suites=suites, files=[str(p) for p in files])


# ---------------------------------------------------------------------------------------------------- GX


def _import_gx():
    """Import GX offline and quietly.

    GX imports PySpark's Spark Connect module when PySpark is installed. Without grpc, that module calls
    `sys.exit(0)` if `__main__` looks like a doctest run (no `__file__`, as under `python -c` or an embedded
    interpreter), which would end our process with exit code 0 = "clean". Marking the process interactive for
    the import makes the module raise ImportError instead, which GX handles.
    """
    os.environ["GX_ANALYTICS_ENABLED"] = "false"
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    main = sys.modules.get("__main__")
    fake_ps1 = (
        main is not None
        and getattr(main, "__spec__", None) is None
        and not hasattr(main, "__file__")
        and not hasattr(sys, "ps1")
    )
    if fake_ps1:
        sys.ps1 = ">>> "
    already = "great_expectations" in sys.modules
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import great_expectations as gx
    finally:
        if fake_ps1:
            del sys.ps1
    if not already:
        GX_IMPORT_SECONDS[0] = time.perf_counter() - t0
    return gx


def _expectation_class(type_name: str):
    gx = _import_gx()
    if not re.fullmatch(r"expect_[a-z0-9_]+", type_name):
        raise ExpectationsConfigError(f"type {type_name!r} is not a GX expectation name (expect_...)")
    class_name = "".join(part.capitalize() for part in type_name.split("_"))
    cls = getattr(gx.expectations, class_name, None)
    if cls is None:
        raise ExpectationsConfigError(f"type {type_name!r} is not a GX Core expectation")
    return cls


def _resolve(spec: ExpectationSpec, thresholds: dict[str, float]) -> dict[str, Any]:
    return {
        k: (thresholds[spec.thresholds[k]] if k in spec.thresholds else v) for k, v in spec.kwargs.items()
    }


def _build_expectation(spec: ExpectationSpec, thresholds: dict[str, float], suite: str):
    cls = _expectation_class(spec.type)
    kwargs = _resolve(spec, thresholds)
    meta = {"suite": suite, "meaning": spec.meaning, "thresholds": dict(spec.thresholds)}
    try:
        return cls(**kwargs, meta=meta)
    except Exception as exc:  # GX validates arguments with pydantic; its message names the bad argument
        raise ExpectationsConfigError(f"{spec.type}: invalid arguments {kwargs}: {exc}") from exc


def _context(gx):
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
    )
    return gx.get_context(mode="ephemeral", project_config=config)


def _plain(value: Any) -> Any:
    """numpy scalars and containers to plain Python, so outcomes serialise to JSON."""
    if hasattr(value, "item") and not isinstance(value, list | dict | str | bytes):
        try:
            return value.item()
        except (ValueError, AttributeError):
            return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _outcome(spec: ExpectationSpec, kwargs: dict[str, Any], result: dict[str, Any]) -> ExpectationOutcome:
    body = result.get("result") or {}
    info = result.get("exception_info") or {}
    exception = info.get("exception_message") if info.get("raised_exception") else None
    return ExpectationOutcome(
        type=spec.type,
        column=kwargs.get("column"),
        meaning=spec.meaning,
        kwargs=_plain(kwargs),
        thresholds=dict(spec.thresholds),
        success=bool(result.get("success")),
        element_count=body.get("element_count"),
        unexpected_count=body.get("unexpected_count"),
        observed_value=_plain(body.get("observed_value")),
        unexpected_rows=_plain(list(body.get("partial_unexpected_index_list") or [])[:_MAX_ROWS_REPORTED]),
        exception=str(exception) if exception else None,
    )


def run_suites(config: ExpectationsConfig, tables: dict[str, pd.DataFrame]) -> ValidationRun:
    """Validate every suite against its table; a suite whose table is absent is reported as not run."""
    timings: dict[str, float] = {}
    gx = _import_gx()
    timings["gx_import_s"] = GX_IMPORT_SECONDS[0]
    t1 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        context = _context(gx)
        source = context.data_sources.add_pandas("tidegauge")
        batches = {}
        for name in sorted({s.table for s in config.suites.values()} & set(tables)):
            batches[name] = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe(
                "whole table"
            )
        timings["gx_context_s"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        outcomes = []
        for suite_spec in config.suites.values():
            if suite_spec.table not in tables:
                outcomes.append(
                    SuiteOutcome(
                        name=suite_spec.name,
                        table=suite_spec.table,
                        meaning=suite_spec.meaning,
                        success=None,
                        skipped_reason=f"not run: table {suite_spec.table!r} needs an input that was not given"
                        + {"lag": " (--lag DIR)", "div_partitions": " (--div DIR)"}.get(suite_spec.table, ""),
                    )
                )
                continue
            outcomes.append(
                _run_suite(
                    gx,
                    context,
                    suite_spec,
                    batches[suite_spec.table],
                    tables[suite_spec.table],
                    config.thresholds,
                )
            )
        timings["gx_validate_s"] = time.perf_counter() - t2
    return ValidationRun(suites=outcomes, gx_version=gx.__version__, timings=timings)


def _run_suite(
    gx, context, spec: SuiteSpec, batch_definition, frame: pd.DataFrame, thresholds: dict[str, float]
) -> SuiteOutcome:
    for i, exp in enumerate(spec.expectations):
        for arg in ("column", "column_A", "column_B"):
            column = exp.kwargs.get(arg)
            if column is not None and column not in frame.columns:
                raise ExpectationsConfigError(
                    f"suite {spec.name!r}, expectation #{i + 1}: table {spec.table!r} has no column {column!r} "
                    f"(it has {', '.join(frame.columns)})"
                )
    suite = context.suites.add(
        gx.ExpectationSuite(
            name=spec.name,
            expectations=[_build_expectation(e, thresholds, spec.name) for e in spec.expectations],
            meta={"meaning": spec.meaning, "table": spec.table},
        )
    )
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name=spec.name, data=batch_definition, suite=suite)
    )
    result = definition.run(
        batch_parameters={"dataframe": frame},
        result_format={
            "result_format": "SUMMARY",
            "unexpected_index_column_names": ID_COLUMNS[spec.table],
            "partial_unexpected_count": _MAX_ROWS_REPORTED,
            "return_unexpected_index_query": False,
        },
    )
    as_json = result.to_json_dict()
    # GX reports results in its own order; ours follows the file, matched by the expectation's id
    by_id = {r["expectation_config"].get("id"): r for r in as_json.get("results", [])}
    outcomes = []
    for exp_spec, expectation in zip(spec.expectations, suite.expectations, strict=True):
        kwargs = _resolve(exp_spec, thresholds)
        outcomes.append(_outcome(exp_spec, kwargs, by_id.get(expectation.id, {})))
    return SuiteOutcome(
        name=spec.name,
        table=spec.table,
        meaning=spec.meaning,
        success=all(o.success for o in outcomes),
        expectations=outcomes,
        gx_result=_plain(as_json),
    )
