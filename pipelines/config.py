"""Job configuration: a YAML file (`--conf`, default `conf/tidegauge.yaml` when present) overridden by flags.

The file can name the sources (`sources: {0: uri, 1: uri}`), Kafka client settings for every region
(`kafka: {...}`) or per region (`kafka_by_region: {1: {...}}`), Spark settings (`spark: {master: ..., conf: {...}}`)
and job defaults (`store`, `version`, `mode`, ...). Kafka settings are passed to librdkafka verbatim and never
echoed in logs or outputs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from .cli import UsageError
from .sources import SourceError, SourceSpec, check_unique, parse_source

DEFAULT_CONF = Path("conf/tidegauge.yaml")


def load(path: str | None) -> dict[str, Any]:
    """The YAML configuration as a dict ({} when no file is given and no default exists)."""
    if path is None:
        if not DEFAULT_CONF.exists():
            return {}
        path = str(DEFAULT_CONF)
    if not os.path.exists(path):
        raise UsageError(f"--conf {path}: no such file")
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"--conf {path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--conf {path}: the top level must be a mapping")
    return data


def sources(cli_sources: list[str] | None, conf: dict[str, Any]) -> list[SourceSpec]:
    """Sources from flags, else from the file's `sources:` mapping; flags win region by region."""
    specs: dict[int, SourceSpec] = {}
    for region, uri in (conf.get("sources") or {}).items():
        try:
            specs[int(region)] = SourceSpec(int(region), str(uri))
        except ValueError:
            raise UsageError(f"configuration sources: region id {region!r} is not an integer") from None
    try:
        cli = [parse_source(s) for s in cli_sources or []]
        check_unique(cli)
    except SourceError as exc:
        raise UsageError(str(exc)) from None
    for s in cli:
        specs[s.region] = s
    return [specs[r] for r in sorted(specs)]


def kafka_conf(conf: dict[str, Any], region: int) -> dict[str, Any]:
    """librdkafka settings for one region: `kafka:` merged with `kafka_by_region[region]`."""
    merged = dict(conf.get("kafka") or {})
    merged.update((conf.get("kafka_by_region") or {}).get(region, {}) or {})
    merged.update((conf.get("kafka_by_region") or {}).get(str(region), {}) or {})
    return {str(k): v for k, v in merged.items()}


def spark_settings(conf: dict[str, Any], master: str | None) -> tuple[str | None, dict[str, str]]:
    spark = conf.get("spark") or {}
    return master or spark.get("master"), {str(k): str(v) for k, v in (spark.get("conf") or {}).items()}
