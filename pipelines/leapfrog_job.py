"""`tidegauge leapfrog`: Leap Frog divergence checks between every pair of regions, on Spark.

The job, stage by stage (no stage gathers a partition's history into one Python process):

1. read each region's VT (`<store>_v<N>`) from an archive or a live cluster, and decode it in Arrow batches
   into narrow rows (`pipelines.vt_decode`): kind, key, value hash, footer (region, RT offset), `hbw`;
2. per (region, partition), from small aggregates: where the scan starts — right after End of Push, else at the
   first heartbeat that carries a vector (a mid-stream scan), else at the first record;
3. running high-water marks per region in VT order with Spark window functions (one component per region;
   heartbeats raise every component in heartbeat mode), offset gaps (compaction) and final marks;
4. rows shuffled by (partition, key), sorted, and compared key by key in `mapInArrow` (`pipelines.leapfrog_keys`,
   which applies the pure rules of `leapfrog`);
5. findings to `inconsistencies/` (Parquet) and counters, facts and timings to `summary.json`.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from leapfrog.history import RegionView
from leapfrog.vectors import nothing

from . import vt_decode as V
from .leapfrog_keys import IN_COLUMNS, OUT_DDL, CompareContext, KeyStage
from .output import OutputDir, versions
from .sources import SourceError, SourceSpec

log = logging.getLogger("tidegauge.leapfrog")
EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3
OUT_OF_RANGE = 9
FINDING_COLUMNS = [
    "store", "version", "partition", "region_a", "region_b", "type", "key", "key_hash", "a_value_hash",
    "b_value_hash", "a_deleted", "b_deleted", "a_vt_offset", "b_vt_offset", "a_vector", "b_vector",
    "a_high_watermark", "b_high_watermark",
]
MAX_LISTED_OFFSETS = 100


@dataclass
class LeapfrogOptions:
    store: str
    version: int
    sources: list[SourceSpec]
    out: str
    pairs: list[tuple[int, int]] | None = None  # None: every pair
    mode: str = "heartbeat"
    state_dir: str | None = None
    master: str | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    kafka_conf: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def topic(self) -> str:
        return f"{self.store}_v{self.version}"


@dataclass
class RegionPartition:
    """What the driver learns about one region's partition before comparing."""

    region: int
    partition: int
    records_read: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    eop_offset: int | None = None
    chunked: bool = False
    undecodable: int = 0
    undecodable_offsets: list[int] = field(default_factory=list)
    start_after: int = -1
    prefix_known: bool = True
    baseline: tuple[int, ...] | None = None
    start_kind: str = "end_of_push"
    data_records: int = 0
    heartbeats: int = 0
    heartbeats_by_origin: dict[str, int] = field(default_factory=dict)
    out_of_range: int = 0
    out_of_range_offsets: list[int] = field(default_factory=list)
    final_hw: tuple[int, ...] = ()
    gaps: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)


def _region_frames(spark: SparkSession, opts: LeapfrogOptions) -> DataFrame:
    """Every region's VT records with a `region` column, in the archive schema."""
    from .archive_source import read_archive

    frames = []
    for spec in opts.sources:
        if spec.is_kafka:
            from div import kafka_log

            from .kafka_source import read_kafka

            bootstrap = kafka_log.parse_kafka_uri(spec.uri)
            conf = opts.kafka_conf.get(spec.region) or {}
            try:
                topics = kafka_log.list_topics(bootstrap, conf)
            except kafka_log.KafkaLogError as exc:
                raise SourceError(f"source {spec.region}={spec.uri}: {exc}") from exc
            if opts.topic not in topics:
                raise SourceError(f"source {spec.region}={spec.uri}: no topic {opts.topic!r}")
            df = read_kafka(spark, bootstrap, opts.topic, conf=conf)
        else:
            from div import archive

            path = spec.uri[len("file://"):] if spec.uri.startswith("file://") else spec.uri
            if not os.path.isdir(path):
                raise SourceError(f"source {spec.region}={spec.uri}: no such archive directory")
            try:
                topics = archive.topics(path)
            except archive.ArchiveError as exc:
                raise SourceError(f"source {spec.region}={spec.uri}: {exc}") from exc
            if opts.topic not in topics:
                raise SourceError(f"source {spec.region}={spec.uri}: no topic {opts.topic!r} "
                                  f"(it has {', '.join(topics) or 'none'})")
            df = read_archive(spark, path, opts.topic)
        frames.append(df.select(F.lit(spec.region).cast("int").alias("region"), "key", "value", "partition",
                                "offset", "headers"))
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def _decode(df: DataFrame) -> DataFrame:
    def fn(batches):
        dec = V.VtDecoder()
        for b in batches:
            yield dec.decode(b)

    return df.mapInArrow(fn, V.DECODED_DDL)


def _facts(decoded: DataFrame, opts: LeapfrogOptions, n: int) -> dict[tuple[int, int], RegionPartition]:
    """Small per-(region, partition) aggregates → where each scan starts."""
    k = F.col("kind")
    rows = decoded.groupBy("region", "partition").agg(
        F.count(F.lit(1)).alias("records"),
        F.min("offset").alias("first"),
        F.max("offset").alias("last"),
        F.min(F.when(k == V.END_OF_PUSH, F.col("offset"))).alias("eop"),
        F.max(F.when(k == V.START_OF_PUSH, F.col("chunked"))).alias("chunked"),
        F.sum((k == V.UNDECODABLE).cast("long")).alias("undecodable"),
        F.slice(F.sort_array(F.collect_list(F.when(k == V.UNDECODABLE, F.col("offset")))), 1,
                MAX_LISTED_OFFSETS).alias("undecodable_offsets"),
        F.min(F.when((k == V.HEARTBEAT) & F.col("hbw").isNotNull() & (F.size("hbw") == n), F.col("offset")))
        .alias("first_hbw"),
    ).collect()
    facts: dict[tuple[int, int], RegionPartition] = {}
    need_baseline = []
    for r in rows:
        rp = RegionPartition(r["region"], r["partition"], r["records"], r["first"], r["last"], r["eop"],
                             bool(r["chunked"]), r["undecodable"], list(r["undecodable_offsets"] or []))
        if rp.eop_offset is not None:
            rp.start_after, rp.prefix_known, rp.start_kind = rp.eop_offset, True, "end_of_push"
        elif r["first_hbw"] is not None:  # mid-stream: every mode scans the same window
            rp.start_after, rp.prefix_known, rp.start_kind = r["first_hbw"], False, "heartbeat"
            need_baseline.append((rp.region, rp.partition, r["first_hbw"]))
        else:
            rp.start_after, rp.prefix_known, rp.start_kind = rp.first_offset - 1, False, "first_record"
            rp.baseline = nothing(n)
        facts[(rp.region, rp.partition)] = rp
    if need_baseline:
        cond = None
        for region, partition, offset in need_baseline:
            c = (F.col("region") == region) & (F.col("partition") == partition) & (F.col("offset") == offset)
            cond = c if cond is None else cond | c
        for r in decoded.where(cond).select("region", "partition", "hbw").collect():
            facts[(r["region"], r["partition"])].baseline = tuple(r["hbw"])
    return facts


def _starts_frame(spark: SparkSession, facts: dict[tuple[int, int], RegionPartition], n: int) -> DataFrame:
    rows = [(rp.region, rp.partition, rp.start_after, list(rp.baseline or nothing(n)), rp.chunked)
            for rp in facts.values()]
    return spark.createDataFrame(rows, "region int, partition int, start_after long, init_hw array<long>, "
                                       "chunk_version boolean")


def _hash_manifests(main: DataFrame) -> DataFrame:
    """Chunked values: each manifest's value hash from its chunks' payloads, in manifest order."""
    manifests = (main.where(F.col("kind") == V.MANIFEST)
                 .select("region", "partition", "offset", F.posexplode("chunk_keys").alias("idx", "ckey")))
    chunks = main.where(F.col("kind") == V.CHUNK).select("region", "partition", F.col("key").alias("ckey"), "payload")
    joined = manifests.join(chunks, ["region", "partition", "ckey"], "left")
    grouped = joined.groupBy("region", "partition", "offset").agg(
        F.sort_array(F.collect_list(F.struct("idx", "payload"))).alias("parts"))

    def fn(batches):
        import pyarrow as pa

        for b in batches:
            parts = b.column("parts").to_pylist()
            hashes = []
            for ps in parts:
                payloads = [p["payload"] for p in ps]
                hashes.append(None if any(p is None for p in payloads) else V.chunked_value_hash(payloads))
            yield pa.RecordBatch.from_arrays([b.column("region"), b.column("partition"), b.column("offset"),
                                              pa.array(hashes, pa.int64())],
                                             names=["region", "partition", "offset", "manifest_hash"])

    return grouped.mapInArrow(fn, "region int, partition int, offset long, manifest_hash long")


def _prepare(decoded: DataFrame, starts: DataFrame, n: int, any_chunked: bool) -> DataFrame:
    """Rows after each scan's start, keys without the chunking suffix, manifests hashed, out-of-range marked."""
    main = decoded.join(F.broadcast(starts), ["region", "partition"]).where(F.col("offset") > F.col("start_after"))
    if any_chunked:
        hashed = _hash_manifests(main)
        main = main.join(hashed, ["region", "partition", "offset"], "left")
        is_manifest = F.col("kind") == V.MANIFEST
        main = main.withColumn("value_hash", F.when(is_manifest, F.col("manifest_hash")).otherwise(F.col("value_hash")))
        main = main.withColumn("kind", F.when(is_manifest & F.col("manifest_hash").isNull(), F.lit(V.UNDECODABLE))
                               .when(is_manifest, F.lit(V.DATA)).otherwise(F.col("kind")).cast("byte"))
        # In a chunked version every data key ends with a ChunkedKeySuffix: `02 00` for values and manifests.
        # Other suffixes are chunk keys (chunks, and the DELETEs that clean them up): not values.
        suffix = F.substring(F.col("key"), -2, 2)
        nonchunk = F.lit(bytes([2, 0]))
        chunk_key = F.col("chunk_version") & (F.col("kind") == V.DATA) & (suffix != nonchunk)
        main = main.withColumn("kind", F.when(chunk_key, F.lit(V.OTHER)).otherwise(F.col("kind")).cast("byte"))
        strip = F.col("chunk_version") & (F.col("kind") == V.DATA)
        main = main.withColumn("key", F.when(strip, F.expr("substring(key, 1, length(key) - 2)"))
                               .otherwise(F.col("key")))
    in_range = (F.col("src") >= 0) & (F.col("src") < n)
    data_bad = (F.col("kind") == V.DATA) & (F.col("src").isNull() | ~in_range)
    hb_bad = (F.col("kind") == V.HEARTBEAT) & (F.col("src").isNull() | ~in_range)
    main = main.withColumn("kind", F.when(data_bad | hb_bad, F.lit(OUT_OF_RANGE)).otherwise(F.col("kind"))
                           .cast("byte"))
    return main.drop("payload", "chunk_keys")


def _with_marks(main: DataFrame, n: int, mode: str) -> DataFrame:
    """Running marks per region partition in VT order: `hw_before`, `hw_at`, and the previous offset."""
    w = Window.partitionBy("region", "partition").orderBy("offset")
    upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    k = F.col("kind")
    hb_ok = (k == V.HEARTBEAT) & F.col("hbw").isNotNull() & (F.size("hbw") == n)
    at_cols, before_cols = [], []
    for r in range(n):
        comp = F.when((k == V.DATA) & (F.col("src") == r), F.col("src_offset"))
        if mode == "heartbeat":
            own = F.when(F.col("src") == r, F.col("src_offset")).otherwise(F.lit(-1))
            comp = comp.when(hb_ok, F.greatest(F.element_at("hbw", r + 1), own)).when(k == V.HEARTBEAT, own)
        comp = comp.otherwise(F.lit(-1))
        init = F.element_at("init_hw", r + 1)
        at_cols.append(F.greatest(init, F.max(comp).over(upto)))
        before_cols.append(F.greatest(init, F.coalesce(F.max(comp).over(before), F.lit(-1))))
    return main.select("*", F.array(*before_cols).alias("hw_before"), F.array(*at_cols).alias("hw_at"),
                       F.coalesce(F.lag("offset").over(w), F.col("start_after")).alias("prev_offset"))


def _collect_marks(marked: DataFrame, facts: dict, n: int, ends: dict[tuple[int, int], int]) -> None:
    """Gaps, final marks and record counts per region partition (all small) into `facts`."""
    for r in marked.where(F.col("offset") > F.col("prev_offset") + 1).select(
            "region", "partition", "prev_offset", "offset", "hw_before").collect():
        facts[(r["region"], r["partition"])].gaps.append((r["prev_offset"] + 1, r["offset"] - 1, tuple(r["hw_before"])))
    k = F.col("kind")
    agg = marked.groupBy("region", "partition").agg(
        *[F.max(F.element_at("hw_at", i + 1)).alias(f"hw{i}") for i in range(n)],
        F.max("offset").alias("last"),
        F.sum((k == V.DATA).cast("long")).alias("data"),
        F.sum((k == V.HEARTBEAT).cast("long")).alias("heartbeats"),
        F.sum((k == OUT_OF_RANGE).cast("long")).alias("out_of_range"),
        F.slice(F.sort_array(F.collect_list(F.when(k == OUT_OF_RANGE, F.col("offset")))), 1, MAX_LISTED_OFFSETS)
        .alias("oor_offsets"),
    ).collect()
    for r in agg:
        rp = facts[(r["region"], r["partition"])]
        rp.final_hw = tuple(r[f"hw{i}"] for i in range(n))
        rp.data_records, rp.heartbeats = r["data"], r["heartbeats"]
        rp.out_of_range, rp.out_of_range_offsets = r["out_of_range"], list(r["oor_offsets"] or [])
    for r in marked.where(k == V.HEARTBEAT).groupBy("region", "partition", "src").count().collect():
        facts[(r["region"], r["partition"])].heartbeats_by_origin[str(r["src"])] = r["count"]
    for rp in facts.values():
        if not rp.final_hw:
            rp.final_hw = tuple(rp.baseline or nothing(n))
        rp.gaps.sort()
        end = ends.get((rp.region, rp.partition))
        last = rp.last_offset if rp.last_offset is not None else rp.start_after
        if end is not None and end - 1 > last:  # records compacted away at the end of the planned range
            rp.gaps.append((last + 1, end - 1, rp.final_hw))


def _views(facts: dict, n: int, mode: str) -> dict[tuple[int, int], RegionView]:
    views = {}
    for key, rp in facts.items():
        baseline = None if rp.prefix_known else tuple(rp.baseline or nothing(n))
        default = baseline if (baseline is not None and mode == "heartbeat") else nothing(n)
        views[key] = RegionView(n, mode, rp.start_after, rp.prefix_known, default, rp.final_hw,
                                tuple(g[0] for g in rp.gaps), tuple(g[2] for g in rp.gaps))
    return views


def parse_pairs(text: str | None, regions: list[int]) -> list[tuple[int, int]]:
    """`all` (default) or `A-B,C-D` → sorted pairs (a < b) of known regions."""
    from itertools import combinations

    if not text or text == "all":
        return list(combinations(sorted(regions), 2))
    out = set()
    for item in text.split(","):
        parts = item.strip().split("-")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise SourceError(f"--pairs {text!r}: {item!r} is not A-B (region ids, e.g. 0-1)")
        a, b = sorted(int(p) for p in parts)
        if a == b:
            raise SourceError(f"--pairs {text!r}: {item!r} pairs a region with itself")
        for r in (a, b):
            if r not in regions:
                raise SourceError(f"--pairs {text!r}: region {r} has no --source")
        out.add((a, b))
    return sorted(out)


def run(opts: LeapfrogOptions, spark: SparkSession | None = None) -> int:
    """Run the job; writes OUT/inconsistencies and OUT/summary.json; returns the exit code."""
    from .spark_session import get_session

    timings: dict[str, float] = {}
    t0 = time.time()
    regions = sorted(s.region for s in opts.sources)
    if len(regions) < 2:
        raise SourceError("leapfrog compares regions: give at least two --source ID=URI")
    n = max(regions) + 1
    pairs = opts.pairs or parse_pairs(None, regions)
    spark = spark or get_session(opts.master, conf=opts.spark_conf)
    with OutputDir(opts.out) as out:
        raw = _region_frames(spark, opts)
        decoded = _decode(raw).persist(StorageLevel.MEMORY_AND_DISK)
        facts = _facts(decoded, opts, n)
        timings["decode_and_plan_s"] = round(time.time() - t0, 3)
        all_partitions = sorted({p for _, p in facts})
        failed = []
        for p in all_partitions:
            for r in regions:
                if (r, p) not in facts:
                    failed.append({"region": r, "partition": p,
                                   "error": f"region {r} has no records of partition {p}"})
        starts = _starts_frame(spark, facts, n)
        any_chunked = any(rp.chunked for rp in facts.values())
        main = _prepare(decoded, starts, n, any_chunked)
        marked = _with_marks(main, n, opts.mode).persist(StorageLevel.MEMORY_AND_DISK)
        _collect_marks(marked, facts, n, ends={})
        timings["marks_s"] = round(time.time() - t0 - sum(timings.values()), 3)
        ctx = CompareContext(opts.mode, tuple(pairs), _views(facts, n, opts.mode))
        data = marked.where(F.col("kind") == V.DATA).select(*IN_COLUMNS)
        shuffle_parts = int(spark.conf.get("spark.sql.shuffle.partitions"))
        keyed = (data.repartition(shuffle_parts, "partition", F.xxhash64("key"))
                 .sortWithinPartitions("partition", "key", "region", "offset"))
        result = keyed.mapInArrow(KeyStage(ctx), OUT_DDL).persist(StorageLevel.MEMORY_AND_DISK)
        findings = (result.where(F.col("row") == "F")
                    .select(F.lit(opts.store).alias("store"), F.lit(opts.version).cast("int").alias("version"),
                            *FINDING_COLUMNS[2:])
                    .orderBy("partition", "region_a", "region_b", "key"))
        findings.coalesce(1).write.mode("overwrite").parquet(str(out.file("inconsistencies")))
        counter_rows = result.where(F.col("row") == "C").groupBy("partition", "region_a", "region_b").agg(
            *[F.sum(c).alias(c) for c in ("keys", "comparable_pairs", "skipped_pairs", "pending_keys",
                                          "value_mismatch", "missing_in_a", "missing_in_b")]).collect()
        timings["compare_s"] = round(time.time() - t0 - sum(timings.values()), 3)
        result.unpersist()
        marked.unpersist()
        decoded.unpersist()
        summary = _summary(opts, facts, counter_rows, pairs, failed)
        total_findings = sum(summary["totals"]["findings"].values())
        code = EXIT_FINDINGS if total_findings else (EXIT_PARTIAL if failed else EXIT_CLEAN)
        timings["total_s"] = round(time.time() - t0, 3)
        summary = {**out.common_fields("leapfrog", code, {s.region: s.uri for s in opts.sources}), **summary,
                   "timings": timings, "versions": versions()}
        out.write_json("summary.json", summary)
    log.info("leapfrog %s: %d findings over %d pair(s), %d partition(s); summary in %s", opts.topic,
             total_findings, len(pairs), len(all_partitions), os.path.join(opts.out, "summary.json"))
    return code


def _summary(opts: LeapfrogOptions, facts: dict, counter_rows, pairs, failed) -> dict[str, Any]:
    by_pair = []
    totals = defaultdict(int)
    types = {"VALUE_MISMATCH": "value_mismatch", "MISSING_IN_A": "missing_in_a", "MISSING_IN_B": "missing_in_b"}
    found = {(r["partition"], r["region_a"], r["region_b"]): r for r in counter_rows}
    partitions = sorted({p for _, p in facts})
    for p in partitions:
        for a, b in pairs:
            r = found.get((p, a, b))
            entry = {"region_a": a, "region_b": b, "partition": p}
            for c in ("keys", "comparable_pairs", "skipped_pairs", "pending_keys"):
                entry[c] = int(r[c]) if r else 0
                totals[c] += entry[c]
            entry["findings"] = {t: int(r[c]) if r else 0 for t, c in types.items()}
            by_pair.append(entry)
    by_region = []
    for (region, p), rp in sorted(facts.items()):
        by_region.append({
            "region": region, "partition": p, "records": rp.data_records, "heartbeats": rp.heartbeats,
            "heartbeats_by_origin": dict(sorted(rp.heartbeats_by_origin.items())),
            "eop_offset": rp.eop_offset, "scan_start": rp.start_kind, "first_offset": rp.start_after + 1,
            "last_offset": rp.last_offset, "final_high_watermark": list(rp.final_hw),
            "compacted_ranges": [[g[0], g[1]] for g in rp.gaps], "undecodable": rp.undecodable,
            "undecodable_offsets": rp.undecodable_offsets, "out_of_range": rp.out_of_range,
            "out_of_range_offsets": rp.out_of_range_offsets,
        })
    finding_totals = {t: sum(e["findings"][t] for e in by_pair) for t in types}
    return {
        "store": opts.store, "version": opts.version, "mode": opts.mode,
        "regions": sorted({r for r, _ in facts}), "pairs": [list(p) for p in pairs],
        "incremental": opts.state_dir is not None,
        "totals": {
            "records": sum(rp.data_records for rp in facts.values()),
            "heartbeats": sum(rp.heartbeats for rp in facts.values()),
            "keys": totals["keys"], "comparable_pairs": totals["comparable_pairs"],
            "skipped_pairs": totals["skipped_pairs"], "pending_keys": totals["pending_keys"],
            "findings": finding_totals,
            "undecodable": sum(rp.undecodable for rp in facts.values()),
            "out_of_range": sum(rp.out_of_range for rp in facts.values()),
        },
        "by_pair": by_pair,
        "by_region": by_region,
        "failed_partitions": failed,
    }
