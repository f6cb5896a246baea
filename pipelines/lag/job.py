"""`tidegauge lag`: replication lag per VT region, partition and source region, read from VT heartbeats.

Each region's VT is read once, in offset order, through `heartbeat.LagMonitor`; RT end offsets (for offset lag)
come from `--rt-source`, or from the region's own source when it holds the store's RT topic (a Kafka cluster,
or an archive of it). Outputs follow docs/outputs.md: `lag/` and `heartbeats/` Parquet and `lag.json`.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from div import envelope as E
from div.records import iter_records
from heartbeat.lag import LagMonitor, LagRow
from pipelines.core.errors import UsageError
from pipelines.core.evidence import PartitionEvidence, describe_short, summary_fields, verdict
from pipelines.core.output import OutputDir, guard, source_inputs
from pipelines.core.progress import Progress, duration
from pipelines.core.sources import Source, SourceError, SourceSpec, open_source
from pipelines.core.topics import VT_TOPIC, select_version_topic

log = logging.getLogger("tidegauge.lag")

LAG_SCHEMA = pa.schema(
    [
        ("vt_region", pa.int32()),
        ("partition", pa.int32()),
        ("source_region", pa.int32()),
        ("heartbeats", pa.int64()),
        ("last_heartbeat_vt_offset", pa.int64()),
        ("last_heartbeat_origin_ms", pa.int64()),
        ("time_lag_ms", pa.int64()),
        ("watermark", pa.int64()),
        ("rt_end_offset", pa.int64()),
        ("offset_lag", pa.int64()),
    ]
)
HEARTBEAT_SCHEMA = pa.schema(
    [
        ("vt_region", pa.int32()),
        ("partition", pa.int32()),
        ("vt_offset", pa.int64()),
        ("origin_region", pa.int32()),
        ("origin_ms", pa.int64()),
        ("vt_timestamp_ms", pa.int64()),
        ("delay_ms", pa.int64()),
        ("watermarks", pa.list_(pa.int64())),
    ]
)


# -- planning --------------------------------------------------------------------------------------------
def select_topic(opened: list[Source], store: str | None, version: int | None) -> str:
    """The one VT topic to measure: <store>_v<version>, completing whatever was not given from the sources."""
    return select_version_topic(opened, store, version, "lag is measured for one store version at a time")


def rt_topic_of(vt_topic: str) -> str:
    m = VT_TOPIC.match(vt_topic)
    return f"{m.group('store') if m else vt_topic}_rt"


def rt_end_offsets(
    rt_by_region: dict[int, Source], rt_topic: str, partitions: set[int]
) -> dict[int, dict[int, int]]:
    """{source region: {partition: RT end offset}} for the regions whose RT can be read."""
    ends: dict[int, dict[int, int]] = {}
    for region, src in rt_by_region.items():
        if rt_topic not in src.topics():
            log.info("region %d: no %s in %s; offset lag unknown", region, rt_topic, src.uri)
            continue
        have = set(src.partitions(rt_topic))
        ends[region] = {p: src.bounds(rt_topic, p)[1] for p in sorted(partitions & have)}
    return ends


# -- reading ---------------------------------------------------------------------------------------------
def monitor_partition(
    src: Source,
    topic: str,
    partition: int,
    n_regions: int,
    evidence: PartitionEvidence | None = None,
    progress: Progress | None = None,
) -> LagMonitor:
    """Read one VT partition into a LagMonitor; undecodable records are skipped and counted in `evidence`, with
    what was read and the newest record time (`evidence.newest_ms`, set as an attribute)."""
    codec = E.EnvelopeCodec()
    mon = LagMonitor(vt_region=src.region, partition=partition, n_regions=n_regions)
    ev = evidence if evidence is not None else PartitionEvidence(src.region, topic, partition, 0, 0)
    newest = None
    batches = src.iter_partition(topic, partition, columns=["key", "value", "headers", "offset", "timestamp"])
    for batch in progress.counted(batches) if progress is not None else batches:
        ev.read_records += batch.num_rows
        if batch.num_rows and batch.column("offset")[-1].as_py() >= ev.end - 1:
            ev.reached_end = True
        for rec in iter_records(batch, codec):
            if rec.ms is not None and (newest is None or rec.ms > newest):
                newest = rec.ms
            if rec.env is None:
                ev.note_undecodable([rec.offset])
                continue
            mon.feed(rec.key, rec.env, rec.headers, rec.offset, rec.ms)
    if src.spec.is_kafka:
        ev.reached_end = True  # the reader raises when it stalls before the end; the end may be compacted
    if newest is not None:
        ev.newest_ms = newest
    if ev.undecodable:
        log.warning(
            "region %d %s[%d]: %d undecodable records skipped", src.region, topic, partition, ev.undecodable
        )
    return mon


# -- output ----------------------------------------------------------------------------------------------
def _fmt_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _fmt_lag(ms: int | None) -> str:
    return "never" if ms is None else duration(ms)


def format_table(rows: list[LagRow]) -> str:
    head = (
        "vt",
        "part",
        "src",
        "heartbeats",
        "last heartbeat (UTC)",
        "time lag",
        "watermark",
        "rt end",
        "offset lag",
    )
    body = [
        (
            str(r.vt_region),
            str(r.partition),
            str(r.source_region),
            str(r.heartbeats),
            _fmt_ms(r.last_heartbeat_origin_ms),
            _fmt_lag(r.time_lag_ms),
            str(r.watermark),
            "-" if r.rt_end_offset is None else str(r.rt_end_offset),
            "-" if r.offset_lag is None else str(r.offset_lag),
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    return "\n".join(lines)


def lag_table(rows: list[LagRow]) -> pa.Table:
    cols = {name: [getattr(r, name) for r in rows] for name in LAG_SCHEMA.names}
    return pa.table(cols, schema=LAG_SCHEMA)


def heartbeat_table(monitors: list[LagMonitor]) -> pa.Table:
    rows = [(m.vt_region, m.partition, h) for m in monitors for h in m.series]
    return pa.table(
        {
            "vt_region": [r for r, _, _ in rows],
            "partition": [p for _, p, _ in rows],
            "vt_offset": [h.vt_offset for _, _, h in rows],
            "origin_region": [h.origin_region for _, _, h in rows],
            "origin_ms": [h.origin_ms for _, _, h in rows],
            "vt_timestamp_ms": [h.vt_timestamp_ms for _, _, h in rows],
            "delay_ms": [h.delay_ms for _, _, h in rows],
            "watermarks": [h.watermarks for _, _, h in rows],
        },
        schema=HEARTBEAT_SCHEMA,
    )


def _write_dataset(out: OutputDir, name: str, table: pa.Table) -> None:
    out.write_table(name, table)


# -- the command -----------------------------------------------------------------------------------------
@dataclass
class LagOptions:
    """What `tidegauge lag` measures (the CLI fills it from flags and --conf; the demo builds it directly)."""

    sources: list[SourceSpec]  # one per VT region
    rt_sources: list[SourceSpec] = field(default_factory=list)  # where a region's RT end offsets are read
    store: str | None = None  # None: the one store the sources hold
    version: int | None = None  # None: the one version present
    now_ms: int | None = None  # None: the newest record of archives, or the wall clock for Kafka
    out: str | None = None  # None: print the table only
    kafka_conf: dict[int, dict[str, Any]] = field(default_factory=dict)  # per region (sources and rt_sources)


def run(options: LagOptions) -> int:
    specs, rt_specs = options.sources, options.rt_sources
    if not specs:
        raise UsageError("no source given: use --source ID=URI (or `sources:` in --conf)")
    guard(
        "lag",
        {"--out": options.out},
        {**source_inputs(specs), **{f"--rt-source {s.region}": s.uri for s in rt_specs}},
    )
    store, version, now_ms = options.store, options.version, options.now_ms
    opened: list[Source] = []
    to_close: list[Source] = []
    try:
        for s in specs:
            opened.append(open_source(s, options.kafka_conf.get(s.region, {})))
        to_close += opened
        topic = select_topic(opened, store, None if version is None else int(version))
        for src in opened:
            if topic not in src.topics():
                raise UsageError(f"source {src.region}={src.uri} has no topic {topic!r}")
        rt_by_region: dict[int, Source] = {s.region: s for s in opened}
        for s in rt_specs:
            rt_by_region[s.region] = open_source(s, options.kafka_conf.get(s.region, {}))
            to_close.append(rt_by_region[s.region])
        n_regions = max([s.region for s in specs] + [s.region for s in rt_specs]) + 1
        partitions = {p for src in opened for p in src.partitions(topic)}
        ends = rt_end_offsets(rt_by_region, rt_topic_of(topic), partitions)
        return _measure(options.out, opened, topic, ends, n_regions, now_ms, {s.region: s.uri for s in specs})
    finally:
        for src in to_close:
            close = getattr(src, "close", None)
            if close is not None:
                close()


def _read_partitions(
    opened: list[Source],
    topic: str,
    n_regions: int,
    monitors: list[LagMonitor],
    failed: list[dict[str, Any]],
    evidence: list[PartitionEvidence],
    progress: Progress,
) -> None:
    """Read every VT partition of every source into a LagMonitor (appended to `monitors`), with its evidence."""
    for src in opened:
        for p in src.partitions(topic):
            progress.stage(f"reading region {src.region} {topic}[{p}]")
            first, end = src.bounds(topic, p)
            ev = PartitionEvidence(
                src.region, topic, p, first, end, planned_records=src.planned_records(topic, p)
            )
            evidence.append(ev)
            try:
                mon = monitor_partition(src, topic, p, n_regions, ev, progress)
            except (SourceError, OSError) as exc:
                ev.error = str(exc)
                failed.append({"region": src.region, "topic": topic, "partition": p, "error": str(exc)})
                log.error("region %d %s[%d]: %s", src.region, topic, p, exc)
                continue
            monitors.append(mon)


def _measure(
    out_dir: str | None,
    opened: list[Source],
    topic: str,
    ends: dict[int, dict[int, int]],
    n_regions: int,
    now_ms: int,
    sources: dict[int, str],
) -> int:
    monitors: list[LagMonitor] = []
    rows: list[LagRow] = []
    failed: list[dict[str, Any]] = []
    evidence: list[PartitionEvidence] = []
    with Progress("lag") as progress:
        _read_partitions(opened, topic, n_regions, monitors, failed, evidence, progress)
    n_regions = max([n_regions, *(r + 1 for mon in monitors for r in mon.regions())])
    now_basis = "--now-ms"
    if now_ms is None:
        newest = [e.newest_ms for e in evidence if e.newest_ms is not None]
        if all(not s.spec.is_kafka for s in opened) and newest:
            # an archive is a snapshot of the past: lag measured against the wall clock would be the archive's
            # age, not the replicas' lag
            now_ms, now_basis = max(newest), "the newest record in the sources"
            log.info(
                "lag measured at %s UTC, the newest record in the archives (give --now-ms to choose)",
                _fmt_ms(now_ms),
            )
        else:
            now_ms, now_basis = int(time.time() * 1000), "the current time"
    for mon in monitors:
        mon.n_regions = n_regions
        rows += mon.rows(now_ms, {r: e[mon.partition] for r, e in ends.items() if mon.partition in e})
    exit_code = verdict(0, evidence, len(failed))[1]
    for line in describe_short(evidence):
        log.warning("%s", line)
    print(f"lag of {topic} at {_fmt_ms(now_ms)} UTC (now_ms={now_ms}, {now_basis})")
    print(format_table(rows))
    if failed:
        print(f"{len(failed)} partition(s) could not be read: see the log")
    if out_dir:
        with OutputDir(out_dir, "lag") as out:
            _write_dataset(out, "lag", lag_table(rows))
            _write_dataset(out, "heartbeats", heartbeat_table(monitors))
            out.write_json(
                "lag.json",
                {
                    **out.common_fields("lag", exit_code, sources),
                    **summary_fields(0, evidence, len(failed)),
                    "now_ms": now_ms,
                    "now_basis": now_basis,
                    "topic": topic,
                    "lag": [r.__dict__ for r in rows],
                    "failed_partitions": failed,
                },
            )
    return exit_code
