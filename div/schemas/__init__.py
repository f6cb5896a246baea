"""Our own copies of the Avro schemas we read and write (the product never reads ../shared at run time).

Venice's schemas (KafkaMessageEnvelope v14, PartitionState v24, PubSubPositionWireFormat, GlobalRtDivState) and
ours (HeartbeatWatermarks, HeartbeatDivState) are loaded from this directory. Older envelope versions are
derived from v14 by `div.envelope_versions`.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any


@functools.cache
def _load_text(name: str) -> str:
    # importlib.resources also works when the package runs from a zip (spark-submit --py-files)
    res = resources.files(__name__).joinpath(name)
    if not res.is_file():
        raise FileNotFoundError(f"schema {name} is missing from the installed package ({res})")
    return res.read_text()


def load_json(name: str) -> Any:
    """A fresh JSON structure of the named .avsc (callers may mutate it)."""
    return json.loads(_load_text(name))


def envelope_versions() -> list[int]:
    try:
        from .. import envelope_versions as ev
    except ImportError:
        return [14]
    return ev.known_versions()


def envelope_writer_schema(version: int) -> Any | None:
    """The KME writer schema of a protocol version we ship, or None if we do not know it."""
    if version == 14:
        return load_json("KafkaMessageEnvelope.v14.avsc")
    try:
        from .. import envelope_versions as ev
    except ImportError:
        return None
    try:
        return ev.writer_schema(version)
    except ev.UnknownProtocolVersion:
        return None
