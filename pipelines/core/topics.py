"""Which store version the sources hold: a command given no --store or --version reads it from their topics.

A region's source (an archive or a Kafka cluster) holds a store's version topics `<store>_v<N>` and its real-time
topic `<store>_rt`. When the sources hold one store version, asking for it is a chore; when they hold several,
the command must not guess: it names them, and the user chooses. `lag` and `leapfrog` share this one rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from div.batch import is_realtime_topic
from pipelines.core.errors import UsageError
from pipelines.core.sources import Source, SourceSpec, open_source

VT_TOPIC = re.compile(r"^(?P<store>.+)_v(?P<version>\d+)$")


def select_version_topic(opened: Iterable[Source], store: str | None, version: int | None, why: str) -> str:
    """The one VT topic `<store>_v<version>`, completing whatever was not given from the sources' topics.
    `why` ends the message when several match (what the command does with one store version at a time)."""
    candidates: set[str] = set()
    for src in opened:
        for topic in src.topics():
            m = VT_TOPIC.match(topic)
            if not m or is_realtime_topic(topic):
                continue
            if store is not None and m.group("store") != store:
                continue
            if version is not None and int(m.group("version")) != version:
                continue
            candidates.add(topic)
    if store is not None and version is not None:
        return f"{store}_v{version}"
    if not candidates:
        wanted = f"{store or '*'}_v{version if version is not None else 'N'}"
        raise UsageError(f"no version topic {wanted} in the sources; give --store and --version")
    if len(candidates) > 1:
        raise UsageError(
            f"several version topics match ({', '.join(sorted(candidates))}): choose one with "
            f"--store and --version ({why})"
        )
    return candidates.pop()


def store_and_version(topic: str) -> tuple[str, int]:
    """(store, version) of a VT topic name `<store>_v<N>`."""
    m = VT_TOPIC.match(topic)
    if m is None:
        raise UsageError(f"{topic!r} is not a version topic <store>_v<N>")
    return m.group("store"), int(m.group("version"))


def infer_store_version(
    specs: Iterable[SourceSpec],
    kafka_conf: Mapping[int, Mapping[str, Any]],
    store: str | None,
    version: int | None,
    why: str,
) -> tuple[str, int]:
    """--store and --version, the missing ones read from the sources' topics (`select_version_topic`)."""
    if store is not None and version is not None:
        return store, int(version)
    opened: list[Source] = []
    try:
        for s in specs:
            opened.append(open_source(s, kafka_conf.get(s.region, {})))
        return store_and_version(select_version_topic(opened, store, version, why))
    finally:
        for src in opened:
            close = getattr(src, "close", None)
            if close is not None:
                close()
