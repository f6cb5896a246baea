"""Job configuration: a YAML file (`--conf`, default `conf/tidegauge.yaml` when present) overridden by flags.

The file can name the sources (`sources: {0: uri, 1: uri}`), Kafka client settings for every region
(`kafka: {...}`) or per region (`kafka_by_region: {1: {...}}`), Spark settings (`spark: {master: ..., conf: {...}}`)
and job defaults (`store`, `version`, `mode`, ...). Kafka settings are passed to librdkafka verbatim and never
echoed in logs or outputs.

The file is checked against a schema (pydantic, `JobConfig`) before anything runs: a misspelled key (`kafak:`)
would otherwise silently drop the settings under it — security settings included —, so an unknown key is a
usage error naming the file, the key and the closest valid one. Kafka and Spark settings themselves are free-form
(librdkafka and Spark check their own names); only their shape is checked here.
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError

from pipelines.core import spark_flags
from pipelines.core.errors import UsageError
from pipelines.core.sources import SourceSpec, check_unique, parse_source
from pipelines.core.storage import locate

DEFAULT_CONF = Path("conf/tidegauge.yaml")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SparkSettings(_Strict):
    master: str | None = None
    conf: dict[str, str | int | float | bool] = {}


class LeapfrogSettings(_Strict):
    """`tidegauge leapfrog`'s settings (`leapfrog:` in the file)."""

    plan: Literal["shuffle", "one-pass"] | None = None  # how a key's records meet (--plan)
    task_memory_mb: float | None = Field(default=None, gt=0)  # one-pass: a task's rows before it spills


class JobConfig(_Strict):
    """Every key a job configuration file may hold."""

    store: str | None = None
    version: int | None = None
    mode: Literal["heartbeat", "footer", "rmd"] | None = None
    sources: dict[int, str] = {}
    rt_sources: dict[int, str] = {}
    regions: int | None = Field(default=None, ge=2)  # the store's region count (leapfrog, watch: --regions)
    rt: bool | None = None  # `tidegauge watch`: DIV validates each region's RT too
    rt_topic: str | None = None  # `tidegauge watch`: that RT's name when it is not <store>_rt
    changes: int | None = Field(default=None, ge=0)  # `tidegauge watch --changes`: the region whose changes
    heartbeat_interval_ms: PositiveInt | None = (
        None  # `tidegauge watch`: the leaders' interval, for the alerts
    )
    kafka: dict[str, Any] = {}
    kafka_by_region: dict[int, dict[str, Any]] = {}
    spark: SparkSettings = SparkSettings()
    leapfrog: LeapfrogSettings = LeapfrogSettings()
    validators: list[str | dict[str, Any]] = []  # div validate's record validators (docs/validators.md)
    simulate: dict[str, Any] | None = None  # checked by sim.config (tidegauge simulate)


def closest(name: str, valid, prefix: str = "", cutoff: float = 0.5) -> str:
    """ " (did you mean X?)" for the valid name closest to a misspelled one, or "". With `prefix` (a flag's
    `--`), names are compared without it, so that it does not make every flag look alike."""
    bare = [str(v).removeprefix(prefix) for v in valid]
    match = difflib.get_close_matches(str(name).removeprefix(prefix), bare, n=1, cutoff=cutoff)
    return f" (did you mean {prefix + match[0]!r}?)" if match else ""


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model that holds the field at `loc`, for the list of valid keys."""
    model: type[BaseModel] | None = JobConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if model is not None else None
        ann = field.annotation if field is not None else None
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return model


def validation_message(exc: ValidationError, path: str, model: type[BaseModel] = JobConfig) -> str:
    """One line for the first problem: the file, the key's path, what is wrong, and the closest valid key."""
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    where = ".".join(str(p) for p in loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        holder = _model_at(loc) if model is JobConfig else None
        valid = holder.model_fields if holder is not None else {}
        return f"{path}: unknown key {where!r}{closest(loc[-1], valid)}"
    if str(loc[0]).startswith("kafka"):  # client settings may hold credentials: never echo them
        return f"{path}: {where}: {err['msg']}"
    return f"{path}: {where}: {err['msg']} (got {err.get('input')!r})"


def yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what the YAML problem is, without the snippet of the file PyYAML quotes: that line may be a
    Kafka client setting holding a password."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    if mark is None:
        return str(problem)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def load(path: str | None) -> dict[str, Any]:
    """The YAML configuration as a dict ({} when no file is given and no default exists)."""
    if path is None:
        if not DEFAULT_CONF.exists():
            return {}
        path = str(DEFAULT_CONF)
    try:
        where = locate(path)  # a local file or any URI the filesystem layer serves
        if not where.is_file():
            raise UsageError(f"--conf {path}: no such file")
        data = yaml.safe_load(where.read_text()) or {}
    except OSError as exc:
        raise UsageError(f"--conf {path}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--conf {path}: not valid YAML: {yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--conf {path}: the top level must be a mapping")
    try:
        JobConfig.model_validate(data)
    except ValidationError as exc:
        raise UsageError(f"--conf {validation_message(exc, path)}") from None
    return data


def sources(cli_sources: list[str] | None, conf: dict[str, Any]) -> list[SourceSpec]:
    """Sources from flags, else from the file's `sources:` mapping; flags win region by region."""
    specs: dict[int, SourceSpec] = {}
    for region, uri in (conf.get("sources") or {}).items():
        try:
            specs[int(region)] = SourceSpec(int(region), str(uri))
        except ValueError:
            raise UsageError(f"configuration sources: region id {region!r} is not an integer") from None
    cli = [parse_source(s) for s in cli_sources or []]  # a bad one raises SourceError (exit 2)
    check_unique(cli)
    for s in cli:
        specs[s.region] = s
    return [specs[r] for r in sorted(specs)]


def store_version_regions(
    args: Any, conf: dict[str, Any], job: str, infer: bool = False
) -> tuple[str, int, list[SourceSpec]]:
    """What a job comparing regions needs: --store and --version (or the file's `store:`/`version:`) and two
    or more sources (`job` names it in the message). With `infer`, what is not given is read from the sources'
    topics when they hold one store version (`pipelines.core.topics`; several: a usage error naming them)."""
    specs = sources(args.source, conf)
    store = args.store or conf.get("store")
    version = args.version if args.version is not None else conf.get("version")
    if len(specs) < 2:
        raise UsageError(f"{job} compares regions: give at least two --source ID=URI")
    if (not store or version is None) and infer:
        from pipelines.core.topics import infer_store_version

        kafka = {s.region: kafka_conf(conf, s.region) for s in specs}
        why = f"{job} checks one store version at a time"
        store, version = infer_store_version(specs, kafka, store or None, version, why)
    if not store or version is None:
        raise UsageError("--store and --version are required (or `store:` and `version:` in --conf)")
    return store, int(version), specs


def region_count(text: str) -> int:
    """`--regions N`: a store has at least two regions (argparse type; its error names the flag)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 2:
        raise argparse.ArgumentTypeError(f"a store has at least 2 regions, not {n}")
    return n


def kafka_conf(conf: dict[str, Any], region: int) -> dict[str, Any]:
    """librdkafka settings for one region: `kafka:` merged with `kafka_by_region[region]`."""
    merged = dict(conf.get("kafka") or {})
    merged.update((conf.get("kafka_by_region") or {}).get(region, {}) or {})
    merged.update((conf.get("kafka_by_region") or {}).get(str(region), {}) or {})
    return {str(k): v for k, v in merged.items()}


def spark_settings(conf: dict[str, Any], master: str | None) -> tuple[str | None, dict[str, str]]:
    """The Spark master (--master, else `spark: master:` in the file), checked as Spark would check it before
    Spark starts (`spark_flags.master`), and the `spark: conf:` settings, passed as they are."""
    spark = conf.get("spark") or {}
    if master is not None:
        spark_flags.master(master)
    else:
        master = spark_flags.master(spark.get("master"), "`spark: master:` in --conf")
    return master, {str(k): str(v) for k, v in (spark.get("conf") or {}).items()}
