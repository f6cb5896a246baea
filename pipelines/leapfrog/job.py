"""`tidegauge leapfrog`: Leap Frog divergence checks between every pair of regions, on Spark.

By default (`--plan one-pass`) one task per VT partition reads that partition of every region and does every
stage below in one Python process, without a shuffle (`pipelines.leapfrog.onepass`); it runs stage 3's reduce side
as the fused job does. `--plan shuffle` runs the job below, which a chunked version always takes.

The shuffle job, stage by stage (no stage gathers a partition's history into one Python process):

1. read each region's VT (`<store>_v<N>`) from an archive or a live cluster, one Spark task per split (a region's
   partition or an offset range of it); each task decodes its records in Arrow batches (`pipelines.leapfrog.decode`)
   and keeps the split's running high-water marks with numpy (`pipelines.leapfrog.scan`): a row per data record with
   its local mark, and one summary per split (counts, End of Push, heartbeats, offset gaps, local maxima);
2. from the summaries alone (`leapfrog.plan`): where each region partition's scan starts — right after
   End of Push, else at the first heartbeat that carries a vector (a mid-stream scan), else at the first record —,
   each split's prefix mark, the gaps (compaction) and the final marks. The fused job sends every summary to
   every reduce task, which plans from them; the two-phase job (chunked values, very many splits) plans on the
   driver;
3. rows shuffled by (partition, key) — in the fused job as narrow rows (`pipelines.leapfrog.rows`) —, sorted, and
   compared key by key in `mapInArrow` (`pipelines.leapfrog.keys`, which applies the pure rules of `leapfrog`);
   with `--state`, each reduce task merges in the records the previous run carried for its buckets, read from
   its own files (`pipelines.leapfrog.carried`);
4. findings to `inconsistencies/` (Parquet) and counters, facts and timings to `summary.json`.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from leapfrog.compare import FINDING_STATUSES, OPEN
from leapfrog.plan import RegionPartition, failed_reads, mark_latest_kept, plan_marks, views
from leapfrog.results import divergent_keys
from pipelines.core.evidence import PartitionEvidence, describe_short, summary_fields
from pipelines.core.output import OutputDir, guard, source_inputs, versions, write_parquet_file
from pipelines.core.progress import Progress
from pipelines.core.sources import SourceError, SourceSpec
from pipelines.core.spark_files import read_parquet, write_parquet
from pipelines.core.storage import absolute
from pipelines.leapfrog import chunks as C
from pipelines.leapfrog import decode as V
from pipelines.leapfrog.carried import file_buckets
from pipelines.leapfrog.digest import FIRST_KEYS, digest
from pipelines.leapfrog.keys import OUT_DDL, ROW_COLUMNS, SORT_COLUMNS, CompareContext, ScanReduce, stage_for
from pipelines.leapfrog.withhold import unverified_index, withhold

log = logging.getLogger("tidegauge.leapfrog")

FINDING_COLUMNS = [
    "store",
    "version",
    "partition",
    "region_a",
    "region_b",
    "type",
    "status",
    "key",
    "key_hash",
    "a_value_hash",
    "b_value_hash",
    "a_deleted",
    "b_deleted",
    "a_vt_offset",
    "b_vt_offset",
    "a_vector",
    "b_vector",
    "a_high_watermark",
    "b_high_watermark",
]


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
    regions: int | None = None  # the store's region count; None: learned (pipelines.leapfrog.regions)
    print_digest: bool = (
        False  # the command prints the findings' digest on stdout (pipelines.leapfrog.digest)
    )
    # how records of a key meet: "shuffle" (the fused or two-phase job) or "one-pass" (one task per partition
    # reads it in every region and compares: pipelines.leapfrog.onepass)
    plan: str = "one-pass"
    task_memory_mb: float | None = (
        None  # one-pass: a task's budget for its rows before it spills (default 256)
    )

    def __post_init__(self) -> None:
        # executors read the state's carried files: a relative path would resolve in their working directory
        if self.state_dir is not None:
            self.state_dir = absolute(self.state_dir)

    @property
    def topic(self) -> str:
        return f"{self.store}_v{self.version}"


def _sources(opts: LeapfrogOptions) -> dict[int, str]:
    return {s.region: s.uri for s in opts.sources}


def _scan(
    spark: SparkSession,
    opts: LeapfrogOptions,
    n: int,
    splits,
    buckets: int | None = None,
    records=None,
    carried: dict | None = None,
) -> DataFrame:
    """Stage A's rows: the two-phase job's (`scan.SCAN_SCHEMA`), or with `buckets` the fused job's shuffle
    rows (`rows`, chunk rows left out: a fused run falls back to two-phase when it meets any). `carried`: the
    state's facts, whose schemas learnt from `vtp` headers each split's codec starts from."""
    from pipelines.leapfrog import rows as R
    from pipelines.leapfrog.scan import SCAN_DDL, SplitScan
    from pipelines.leapfrog.source import scan_splits

    if buckets is None:
        scan = SplitScan(n, opts.mode, records=records, facts=carried)
        return scan_splits(spark, splits, opts.topic, opts.kafka_conf, scan, SCAN_DDL)
    scan = SplitScan(n, opts.mode, keep_chunks=False, buckets=buckets, records=records, facts=carried)
    return R.keyed(scan_splits(spark, splits, opts.topic, opts.kafka_conf, scan, R.SCAN_DDL), buckets)


def decode_only(spark: SparkSession, opts: LeapfrogOptions, vectorised: bool = True) -> int:
    """Read and decode every record of every region's VT, nothing else: the floor of any Leap Frog run
    (`vectorised=False`: through the per-record reference loop alone, for benchmarks' comparison)."""
    from pipelines.leapfrog.source import plan, scan_splits

    splits = plan(_sources(opts), opts.topic, opts.kafka_conf)

    def fn(batches):
        dec = V.VtDecoder(vectorised=vectorised)
        for b in batches:
            yield dec.decode(b, None)

    df = scan_splits(spark, splits, opts.topic, opts.kafka_conf, fn, V.DECODED_DDL)
    return df.write.format("noop").mode("overwrite").save() or len(splits)


def _hash_manifests(main: DataFrame) -> DataFrame:
    """Chunked values: each manifest's value hash from its chunks' payloads, in manifest order."""
    manifests = main.where(F.col("kind") == V.MANIFEST).select(
        "region", "partition", "offset", F.posexplode("chunk_keys").alias("idx", "ckey")
    )
    chunks = main.where(F.col("kind") == V.CHUNK).select(
        "region", "partition", F.col("key").alias("ckey"), "payload"
    )
    joined = manifests.join(chunks, ["region", "partition", "ckey"], "left")
    grouped = joined.groupBy("region", "partition", "offset").agg(
        F.sort_array(F.collect_list(F.struct("idx", "payload"))).alias("parts")
    )

    def fn(batches):
        import pyarrow as pa

        for b in batches:
            parts = b.column("parts").to_pylist()
            hashes = [C.manifest_hash((p["idx"], p["payload"]) for p in ps) for ps in parts]
            yield pa.RecordBatch.from_arrays(
                [b.column("region"), b.column("partition"), b.column("offset"), pa.array(hashes, pa.int64())],
                names=["region", "partition", "offset", "manifest_hash"],
            )

    return grouped.mapInArrow(fn, "region int, partition int, offset long, manifest_hash long")


def _prepare(scanned: DataFrame, facts: dict) -> DataFrame:
    """Data rows of stage A; in chunked versions, the values of `pipelines.leapfrog.chunks.resolve` (manifests
    hashed through their chunks here, across the whole run)."""
    main = scanned.where(F.col("order") == 1)
    # Chunking is a property of the whole version (one push): once any region or partition shows a chunked
    # StartOfPush or chunk rows, every data key of every region carries the suffix, whatever a region's view holds.
    if not C.chunked_version(facts.values()):
        return main.where(F.col("kind").isin(*C.DATA_KINDS))
    hashed = _hash_manifests(main)
    # chunks are never values, and their payloads need not travel further (`resolve` leaves them out anyway)
    rows = main.where(F.col("kind") != V.CHUNK).drop("chunk_keys", "payload")
    rows = rows.join(hashed, ["region", "partition", "offset"], "left")
    return rows.mapInArrow(C.resolve_batches, rows.drop("manifest_hash").schema)


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


class _Wider(Exception):
    """The scan met heartbeat vectors wider than the region count the run was planned with."""

    def __init__(self, count: int) -> None:
        self.count = count


def run(opts: LeapfrogOptions, spark: SparkSession | None = None) -> int:
    """Run the job; writes OUT/inconsistencies and OUT/summary.json (and the next --state); returns the exit code."""
    try:
        return _run(opts, spark)
    except _Wider as wider:
        # the probe read only the sources' tails; nothing was published, the scan runs again with the store's width
        log.warning(
            "the heartbeats name %d regions, more than this run was planned with: reading again with %d "
            "(give --regions %d to spare the first read)",
            wider.count,
            wider.count,
            wider.count,
        )
        return _run(opts, spark, learned=wider.count)


def _run(opts: LeapfrogOptions, spark: SparkSession | None, learned: int | None = None) -> int:
    from pipelines.core.spark_session import get_session, warn_local_paths
    from pipelines.leapfrog import state as S
    from pipelines.leapfrog.regions import FROM_HEARTBEATS, StoreRegions, check_distinct, store_regions, tails
    from pipelines.leapfrog.source import check_sources, chunked_version, compaction_deadlines, plan

    guard("leapfrog", {"--out": opts.out, "--state": opts.state_dir}, source_inputs(opts.sources))
    timings: dict[str, float] = {}
    t0 = time.time()
    regions = sorted(s.region for s in opts.sources)
    if len(regions) < 2:
        raise SourceError("leapfrog compares regions: give at least two --source ID=URI")
    pairs = opts.pairs or parse_pairs(None, regions)
    state = None
    if opts.state_dir is not None:
        if opts.mode != "heartbeat":
            raise SourceError(
                f"--state: incremental runs exist for heartbeat mode only, not --mode {opts.mode}"
            )
        try:
            state = S.load(
                opts.state_dir,
                store=opts.store,
                version=opts.version,
                mode=opts.mode,
                pairs=pairs,
                regions=regions,
            )
        except S.StateError as exc:
            raise SourceError(str(exc)) from None
    carried = state.regions if state is not None else {}
    # a source that cannot be read or lacks the topic raises SourceError (exit 2) before Spark starts
    check_sources(_sources(opts), opts.topic, opts.kafka_conf, may_lack_topic={r for r, _ in carried})
    starting = {k: v["last_offset"] + 1 for k, v in carried.items()}
    planned_ms = int(time.time() * 1000)
    splits = [sp for sp in plan(_sources(opts), opts.topic, opts.kafka_conf, starting) if sp.end > sp.start]
    probed = tails(splits, opts.topic, opts.kafka_conf)
    check_distinct(_sources(opts), probed)
    width = store_regions(regions, probed, opts.regions)
    if learned is not None:
        width = StoreRegions(learned, FROM_HEARTBEATS)
    n = width.count
    if state is not None:
        try:
            S.check_width(state, n)
        except S.StateError as exc:
            raise SourceError(str(exc)) from None
    deadlines = compaction_deadlines(_sources(opts), opts.topic, opts.kafka_conf, planned_ms)
    ends: dict[tuple[int, int], int] = {}
    for sp in splits:
        ends[(sp.region, sp.partition)] = max(ends.get((sp.region, sp.partition), 0), sp.end)
    spark = spark or get_session(opts.master, conf=opts.spark_conf)
    warn_local_paths(spark, {**source_inputs(opts.sources), "--state": opts.state_dir, "--out": opts.out})
    buckets = int(spark.conf.get("spark.sql.shuffle.partitions"))
    stage = next_state = None
    if opts.state_dir is not None:  # the reduce tasks write the next state's carried records here
        next_state = S.stage(opts.state_dir)
        stage = next_state.stage()
        (stage / "carried").makedirs()
    progress = Progress("leapfrog", spark=spark)
    job = _Job(
        spark,
        opts,
        n,
        tuple(pairs),
        splits,
        ends,
        buckets,
        carried,
        state,
        (stage / "carried").uri if stage is not None else None,
        deadlines,
        progress,
        _watched(state),
    )
    with OutputDir(opts.out, "leapfrog") as out, progress:
        # (with very many splits the probe would cost a read per region partition, and the splits are small)
        one_pass = opts.plan == "one-pass"
        few = len(splits) * buckets <= FUSED_MAX_SUMMARY_ROWS
        chunked = (few or one_pass) and chunked_version(splits, opts.topic, opts.kafka_conf)
        path = "two-phase" if chunked else "one-pass" if one_pass else "fused" if few else "two-phase"
        if path != "two-phase":
            result, _ = job.one_pass() if path == "one-pass" else job.fused()
            counter_rows, facts, read_errors = _counters(result)
            if facts is None:
                facts, _ = plan_marks([], ends, n, carried)
            if any(rp.chunk_rows for rp in facts.values()):  # chunked values without a StartOfPush in view
                result.unpersist()
                path, chunked = "two-phase", True
                if stage is not None:  # the two-phase run writes the carried records again, with other names
                    (stage / "carried").remove()
                    (stage / "carried").makedirs()
        fused = path == "fused"
        if path == "two-phase":
            result, facts = job.two_phase(chunked)
            counter_rows, _, _ = _counters(result)
            read_errors = job.read_errors
        widest = max((rp.widest_hbw for rp in facts.values()), default=0)
        if widest > n and opts.regions is None:
            result.unpersist()
            raise _Wider(widest)
        timings["scan_and_compare_s"] = round(time.time() - t0, 3)
        for (r, p), rp in sorted(facts.items()):
            if rp.gaps and not rp.latest_kept:
                log.warning(
                    "region %d partition %d: offset gaps, and the topic may have been compacted while it was "
                    "read (past min.compaction.lag.ms, or the cluster did not say): standing marks are frozen "
                    "at the first gap there, so divergences behind it may go unreported",
                    r,
                    p,
                )
        all_partitions = sorted({p for _, p in facts} | {p for _, p in ends})
        failed = []
        for p in all_partitions:
            for r in regions:
                if (r, p) not in facts:
                    error = read_errors.get((r, p), f"region {r} has no records of partition {p}")
                    failed.append({"region": r, "partition": p, "error": error})
        old_settled = state.settled_keys() if state is not None else {}
        by_pair = {(r["partition"], r["region_a"], r["region_b"]): r for r in counter_rows}
        for k, n_settled in old_settled.items():  # settled keys this run did not visit still count as keys
            r = by_pair.get(k)
            if r is None:
                r = by_pair[k] = _pair_counters(k)
                counter_rows.append(r)
            r["keys"] += n_settled - r["settled_touched"]
        unverified, overflow = unverified_index(facts)
        progress.stage("writing the findings" + (" and the next state" if opts.state_dir is not None else ""))
        findings, table, withheld = _findings(result, opts, state, counter_rows, out, unverified, overflow)
        if table is not None:
            finding_counts = defaultdict(int)
            for row in zip(*(table.column(c).to_pylist() for c in _COUNT_BY), strict=True):
                finding_counts[row] += 1
        else:
            finding_counts = {
                tuple(r[c] for c in _COUNT_BY): r["count"]
                for r in findings.groupBy(*_COUNT_BY).count().collect()
            }
        first, divergent = _first_findings(findings, table)
        if opts.state_dir is not None:  # last: everything this run reads from the old state has been read
            _commit_state(
                stage,
                opts,
                facts,
                ends,
                carried,
                findings,
                table,
                pairs,
                regions,
                counter_rows,
                old_settled,
                buckets if fused else None,
            )
            next_state.publish()
        timings["output_s"] = round(time.time() - t0 - sum(timings.values()), 3)
        timings["fused"] = fused
        timings["plan"] = path
        if findings is not None:
            findings.unpersist()
        result.unpersist()
        summary = _summary(opts, facts, counter_rows, finding_counts, pairs, failed, unverified, overflow)
        summary["totals"]["withheld_findings"] = withheld
        summary["totals"]["divergent_keys"] = divergent
        summary["store_regions"], summary["store_regions_from"] = n, width.learned_from
        _warn_out_of_range(summary["totals"]["out_of_range"], width)
        total_findings = sum(summary["totals"]["findings"].values())
        open_findings = sum(summary["totals"]["open_findings"].values())
        evidence = _evidence(
            opts.topic, splits, ends, facts, failed, {s.region for s in opts.sources if s.is_kafka}
        )
        for line in describe_short(evidence):
            log.warning("%s", line)
        # healed findings are history: the verdict and the exit code follow the open ones
        summary = {**summary_fields(open_findings, evidence, len(failed)), **summary}
        code = summary["exit_code"]
        timings["total_s"] = round(time.time() - t0, 3)
        summary = {
            **out.common_fields("leapfrog", code, _sources(opts)),
            **summary,
            "timings": timings,
            "versions": versions(),
        }
        summary["exit_code"] = code
        out.write_json("summary.json", summary)
    if opts.print_digest:
        where = out.published / "summary.json"
        print(digest(opts.topic, finding_counts, first, divergent, summary["verdict"], code, str(where)))
    log.info(
        "leapfrog %s: %d findings over %d pair(s), %d partition(s); summary in %s",
        opts.topic,
        total_findings,
        len(pairs),
        len(all_partitions),
        out.published / "summary.json",
    )
    return code


def _warn_out_of_range(count: int, width) -> None:
    """Say what records outside the store's regions cost: they raise no mark and their values do not stand."""
    from pipelines.leapfrog.regions import FROM_SOURCES

    if not count:
        return
    if width.learned_from == FROM_SOURCES:
        log.warning(
            "%d records name a region above %d or have no footer, and no heartbeat says how many regions the "
            "store has: they were left out, so their positions raised no mark and their values were not "
            "compared. If the store has more regions than the sources, findings in their partitions may be "
            "false or missed: give --regions (the store's region count)",
            count,
            width.count - 1,
        )
    else:
        log.warning(
            "%d records name a region outside the store's %d (%s) or have no footer: left out as damaged "
            "(their positions raised no mark, their values were not compared); see out_of_range_offsets",
            count,
            width.count,
            "from " + width.learned_from,
        )


FINDINGS_ON_DRIVER = 1_000_000
# the columns findings are counted by in summary.json
_COUNT_BY = ("partition", "region_a", "region_b", "type", "status")
# The fused job sends every split summary to every reduce bucket; past this many copies, plan on the driver.
FUSED_MAX_SUMMARY_ROWS = 50_000


@dataclass
class _Job:
    spark: SparkSession
    opts: LeapfrogOptions
    n: int
    pairs: tuple[tuple[int, int], ...]
    splits: list
    ends: dict[tuple[int, int], int]
    buckets: int
    carried: dict[tuple[int, int], dict]
    state: Any
    state_out: str | None = None
    deadlines: dict[int, int] = field(default_factory=dict)  # live regions: see source.compaction_deadlines
    progress: Progress | None = None
    # the earlier runs' findings, whose status this run brings up to date (keys.CompareContext.watched)
    watched: dict[tuple[int, int, int], tuple[bytes, ...]] = field(default_factory=dict)

    def _stage(self, name: str) -> None:
        if self.progress is not None:
            self.progress.stage(name)

    def _records(self):
        return self.progress.accumulator() if self.progress is not None else None

    def _state_carries(self) -> bool:
        """Whether the previous run left carried records."""
        return self.state is not None and bool(self.state.carried_dir.files(".parquet"))

    def _carried_rows(self) -> DataFrame | None:
        """The two-phase job: records the previous run carried, as rows that meet the new ones in the shuffle.
        Settled keys that no new record touches pass the reduce side straight into the next state
        (keys.pass_untouched): cheaper than finding them with a join before the shuffle, which needs the
        new keys first."""
        if not self._state_carries():
            return None
        df = read_parquet(self.spark, self.state.carried_dir)
        cols = {
            "partition": F.col("partition"),
            "key": F.col("key"),
            "region": F.col("region"),
            "offset": F.col("offset"),
            "value_hash": F.col("value_hash"),
            "deleted": F.lit(None).cast("boolean"),
            "src": F.lit(-1).cast("int"),
            "src_offset": F.lit(-1).cast("long"),
            "rmd": F.lit(None).cast("array<long>"),
            "split": F.lit(-1).cast("int"),
            "seg": F.lit(-1).cast("byte"),
            "hw": F.lit(None).cast("binary"),
            "carry": F.col("carry"),
        }
        return df.select(*[cols[c].alias(c) for c in ROW_COLUMNS])

    def _own_carried_files(self) -> tuple[str, dict[str, list[int]]] | None:
        """(directory, file → buckets) when every reduce task can read its carried records itself: the previous
        run was fused with as many buckets, and there is something new to read (else no task would run)."""
        state = self.state
        if state is None or not self.splits or state.meta.get("reduce_buckets") != self.buckets:
            return None
        files = {}
        for f in state.carried_dir.files(".parquet"):
            held = file_buckets(f.uri)
            if held is None:
                return None
            files[f.name] = held
        return state.carried_dir.uri, files

    def fused(self):
        """One Spark job: scan → shuffle by key → per-key stage; each reduce task plans from the summaries it gets."""
        from pipelines.leapfrog import rows as R

        opts = self.opts
        self._stage("reading, shuffling and comparing every region's records (one pass)")
        rows = _scan(self.spark, opts, self.n, self.splits, self.buckets, self._records(), self.carried)
        own = self._own_carried_files()
        reduce = ScanReduce(
            opts.mode,
            self.pairs,
            self.n,
            self.ends,
            self.carried,
            self.state_out,
            self.deadlines,
            own,
            watched=self.watched,
        )
        if own is None and self._state_carries():
            # the previous run's carried records join the shuffle (keys.pass_untouched passes the
            # settled keys no new record touches straight on)
            old = read_parquet(self.spark, self.state.carried_dir).mapInArrow(
                R.carried_batches(self.n), R.SCAN_DDL
            )
            rows = rows.unionByName(R.keyed(old, self.buckets))
        result = (
            rows.repartition(self.buckets, "bucket")
            .sortWithinPartitions("sortkey", *SORT_COLUMNS[1:])
            .mapInArrow(reduce, OUT_DDL)
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        return result, None  # facts come with the counters (one collect)

    def one_pass(self):
        """One Spark job, no shuffle: each task reads its partitions of every region, plans from their summaries
        and compares (`pipelines.leapfrog.onepass`)."""
        from pipelines.leapfrog.onepass import DEFAULT_TASK_MEMORY_MB, PartitionPass, partition_groups

        opts = self.opts
        self._stage("reading and comparing each partition of every region (one pass per partition)")
        groups = partition_groups(self.splits, self.carried, self.spark.sparkContext.defaultParallelism)
        files = (
            tuple(f.name for f in self.state.carried_dir.files(".parquet")) if self._state_carries() else ()
        )
        task = PartitionPass(
            groups,
            self.splits,
            opts.topic,
            opts.kafka_conf,
            opts.mode,
            self.n,
            {
                "mode": opts.mode,
                "pairs": self.pairs,
                "n_regions": self.n,
                "ends": self.ends,
                "state_out": self.state_out,
                "deadlines": self.deadlines,
                "watched": self.watched,
            },
            carried=self.carried,
            carried_dir=self.state.carried_dir.uri if files else None,
            carried_files=files,
            task_memory_mb=opts.task_memory_mb or DEFAULT_TASK_MEMORY_MB,
            records=self._records(),
        )
        count = max(len(groups), 1)
        result = (
            self.spark.range(0, len(groups), 1, count)
            .mapInArrow(task, OUT_DDL)
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        return result, None  # facts come with the counters (one collect)

    def two_phase(self, chunked: bool):
        """Scan (persisted) → plan on the driver → chunked values resolved in Spark → shuffle → per-key stage."""
        opts, n = self.opts, self.n
        self._stage("reading every region's records")
        # A chunked version's scan holds every chunk's bytes, and a split is one cached block. Kept in memory
        # first (MEMORY_AND_DISK: a block is unrolled in memory before it may go to disk), splits of 2.3 GiB of
        # chunks ended in "Java heap space" with a 2 GiB heap; on disk only, the same run completed.
        level = StorageLevel.DISK_ONLY if chunked else StorageLevel.MEMORY_AND_DISK
        scanned = _scan(self.spark, opts, n, self.splits, None, self._records(), self.carried).persist(level)
        summaries = [
            json.loads(r["summary"]) for r in scanned.where(F.col("order") == 0).select("summary").collect()
        ]
        self.read_errors = failed_reads(summaries)
        facts, prefixes = plan_marks(summaries, self.ends, n, self.carried)
        mark_latest_kept(facts, self.deadlines, int(time.time() * 1000))  # the scan has been read (persisted)
        ctx = CompareContext(
            opts.mode,
            self.pairs,
            views(facts, n, opts.mode),
            prefixes,
            n,
            self.state_out,
            watched=self.watched,
        )
        data = _prepare(scanned, facts).select(*ROW_COLUMNS)
        old = self._carried_rows()
        if old is not None:
            data = data.unionByName(old)
        keyed = data.repartition(self.buckets, "partition", F.xxhash64("key")).sortWithinPartitions(
            *SORT_COLUMNS
        )
        result = keyed.mapInArrow(stage_for(ctx), OUT_DDL).persist(StorageLevel.MEMORY_AND_DISK)
        self._stage("shuffling and comparing by key")
        result.count()
        scanned.unpersist()
        return result, facts


_ORDER = [
    ("partition", "ascending"),
    ("region_a", "ascending"),
    ("region_b", "ascending"),
    ("key", "ascending"),
]


def _counters(result: DataFrame) -> tuple[list[dict], dict | None, dict[tuple[int, int], str]]:
    """Counter rows summed per (partition, pair), and the plan's facts and read errors when the reduce tasks sent
    them (fused runs): small, collected in one Spark job."""
    t = (
        result.where(F.col("row").isin("C", "S"))
        .select(
            "row",
            "partition",
            "region_a",
            "region_b",
            "keys",
            "comparable_pairs",
            "skipped_pairs",
            "pending_keys",
            "value_mismatch",
            "missing_in_a",
            "missing_in_b",
            "settled_touched",
            "settled_new",
            "info",
        )
        .toArrow()
    )
    sums: dict[tuple[int, int, int], dict] = {}
    facts = None
    read_errors: dict[tuple[int, int], str] = {}
    for r in t.to_pylist():
        if r["row"] == "S":
            # the fused job's reduce tasks each report every region partition, the one-pass tasks their own
            facts = facts if facts is not None else {}
            info = json.loads(r["info"])
            read_errors.update({(f["region"], f["partition"]): f["error"] for f in info.get("failed", [])})
            for d in info["facts"]:
                rp = RegionPartition.from_json(d)
                facts[(rp.region, rp.partition)] = rp
            continue
        k = (r["partition"], r["region_a"], r["region_b"])
        acc = sums.setdefault(k, _pair_counters(k))
        for c in _SUMMED_COUNTERS:
            acc[c] += r[c] or 0
        acc["new_findings"] += r["value_mismatch"] + r["missing_in_a"] + r["missing_in_b"]
    return list(sums.values()), facts, read_errors


def _findings(
    result: DataFrame,
    opts: LeapfrogOptions,
    state,
    counter_rows,
    out: OutputDir,
    unverified: dict,
    overflow: set,
):
    """This run's findings, and with --state every finding so far: per (pair, key) the one first in
    (B offset, A offset) order, as a full rescan would report, less those that rest on an unreadable record
    (withheld: the key is unverified there). Each has the status this run found for its key (an earlier run's
    finding whose key this run compared again takes this run's status: a repair may have healed it, a new
    write opened it again; one no record of this run touched keeps its own). Written to OUT/inconsistencies.

    Returns (DataFrame, None, withheld) when Spark wrote them (very many), else (None, table, withheld): the usual
    case, where the findings are merged and written on the driver without another Spark job."""
    new = result.where(F.col("row") == "F").select(
        F.lit(opts.store).alias("store"),
        F.lit(opts.version).cast("int").alias("version"),
        *FINDING_COLUMNS[2:],
    )
    old_dir = state.findings_dir if state is not None and state.findings_dir.files(".parquet") else None
    n_new = sum(r["new_findings"] for r in counter_rows)
    status_now = result.where(F.col("row").isin("F", "H")).select(*_STATUS_KEY, "status")
    if n_new + _parquet_rows(old_dir) <= FINDINGS_ON_DRIVER:
        table = new.toArrow()
        if old_dir is not None:
            table = _first_per_key(table, _read_findings(old_dir, table.schema))
            table = _restatus(table, status_now.toArrow())
        before = table.num_rows
        table = withhold(table, unverified, overflow).sort_by(_ORDER)
        out.write_table("inconsistencies", table)
        return None, table, before - table.num_rows
    if old_dir is not None:
        from pyspark.sql import Window

        old = _with_status(read_parquet(result.sparkSession, old_dir)).select(*FINDING_COLUMNS)
        w = Window.partitionBy("partition", "region_a", "region_b", "key").orderBy(
            F.coalesce("b_vt_offset", F.lit(-1)), F.coalesce("a_vt_offset", F.lit(-1))
        )
        now = status_now.withColumnRenamed("status", "_now")
        new = (
            new.unionByName(old)
            .withColumn("_rank", F.row_number().over(w))
            .where(F.col("_rank") == 1)
            .drop("_rank")
            .join(now, list(_STATUS_KEY), "left")
            .withColumn("status", F.coalesce("_now", "status"))
            .select(*FINDING_COLUMNS)
        )
    before = None
    if unverified or overflow:
        schema = new.schema

        def keep(batches):
            for b in batches:
                yield from withhold(pa.Table.from_batches([b]), unverified, overflow).to_batches()

        before = new.count()
        new = new.mapInArrow(keep, schema)
    new = new.persist(StorageLevel.MEMORY_AND_DISK)
    write_parquet(new, out.file("inconsistencies"))
    return new, None, (before - new.count()) if before is not None else 0


_STATUS_KEY = ("partition", "region_a", "region_b", "key")


def _first_findings(findings: DataFrame | None, table: pa.Table | None) -> tuple[list[tuple], int]:
    """The first findings of each pair, type and status as (partition, region A, region B, type, status, key)
    for the stdout digest, and the number of divergent keys (`leapfrog.results.divergent_keys`)."""
    cols = ("partition", "region_a", "region_b", "type", "status", "key")
    if table is not None:
        rows = list(zip(*(table.column(c).to_pylist() for c in cols), strict=True))
        return rows, len(divergent_keys((r[0], r[5], r[4]) for r in rows))
    from pyspark.sql import Window

    w = Window.partitionBy("region_a", "region_b", "type", "status").orderBy("partition", "key")
    first = (
        findings.withColumn("_n", F.row_number().over(w))
        .where(F.col("_n") <= FIRST_KEYS)
        .select(*cols)
        .orderBy("region_a", "region_b", "type", "status", "partition", "key")
        .collect()
    )
    divergent = findings.where(F.col("status") == OPEN).select("partition", "key").distinct().count()
    return [tuple(r) for r in first], divergent


def _with_status(old: DataFrame) -> DataFrame:
    """An earlier state's findings; those of a state written before findings had a status are open."""
    return old if "status" in old.columns else old.withColumn("status", F.lit(OPEN))


def _watched(state) -> dict[tuple[int, int, int], tuple[bytes, ...]]:
    """(partition, region A, region B) → keys of the findings the previous run left in the state, whose status
    this run brings up to date. Empty past FINDINGS_ON_DRIVER of them: those keep the status they had unless
    this run finds them again."""
    if state is None or not state.findings_dir.files(".parquet"):
        return {}
    old_dir = state.findings_dir
    if _parquet_rows(old_dir) > FINDINGS_ON_DRIVER:
        log.warning(
            "more than %d findings in the state: those no record of this run finds again keep their status",
            FINDINGS_ON_DRIVER,
        )
        return {}
    out: dict[tuple[int, int, int], list[bytes]] = defaultdict(list)
    for f in old_dir.files(".parquet"):
        t = pq.read_table(f.path, filesystem=f.fs, columns=list(_STATUS_KEY))
        for p, a, b, k in zip(*(t.column(c).to_pylist() for c in _STATUS_KEY), strict=True):
            out[(p, a, b)].append(k)
    return {k: tuple(v) for k, v in out.items()}


def _restatus(table: pa.Table, status_now: pa.Table) -> pa.Table:
    """`table`'s findings with the status this run found for their (pair, key), where it compared the key."""
    now = {
        (p, a, b, k): st
        for p, a, b, k, st in zip(
            *(status_now.column(c).to_pylist() for c in (*_STATUS_KEY, "status")), strict=True
        )
    }
    if not now:
        return table
    keys = zip(*(table.column(c).to_pylist() for c in _STATUS_KEY), strict=True)
    old = table.column("status").to_pylist()
    merged = [now.get(k, s) for k, s in zip(keys, old, strict=True)]
    i = table.schema.get_field_index("status")
    return table.set_column(i, table.schema.field(i), pa.array(merged, pa.string()))


def _parquet_rows(path) -> int:
    if path is None:
        return 0
    return sum(pq.ParquetFile(f.path, filesystem=f.fs).metadata.num_rows for f in path.files(".parquet"))


def _read_findings(path, schema: pa.Schema) -> pa.Table:
    files = path.files(".parquet")
    if not files:
        return schema.empty_table()
    tables = []
    for f in files:
        t = pq.read_table(f.path, filesystem=f.fs)
        if "status" not in t.schema.names:  # a state written before findings had a status: they were open
            t = t.append_column("status", pa.array([OPEN] * t.num_rows, pa.string()))
        tables.append(t.select(schema.names).cast(schema))
    return pa.concat_tables(tables)


def _first_per_key(new: pa.Table, old: pa.Table) -> pa.Table:
    """Per (partition, pair, key) the finding first in (B offset, A offset) order, nulls first (as -1)."""
    both = pa.concat_tables([new, old])
    if both.num_rows == 0:
        return both
    order_b = pc.fill_null(both.column("b_vt_offset"), -1)
    order_a = pc.fill_null(both.column("a_vt_offset"), -1)
    keyed = both.append_column("_b", order_b).append_column("_a", order_a)
    keyed = keyed.sort_by(
        [
            ("partition", "ascending"),
            ("region_a", "ascending"),
            ("region_b", "ascending"),
            ("key", "ascending"),
            ("_b", "ascending"),
            ("_a", "ascending"),
        ]
    )
    m = keyed.num_rows
    first = np.ones(m, bool)
    if m > 1:
        same = np.ones(m - 1, bool)
        for c in ("partition", "region_a", "region_b", "key"):
            col = keyed.column(c).combine_chunks()
            same &= pc.equal(col.slice(1), col.slice(0, m - 1)).to_numpy(zero_copy_only=False)
        first[1:] = ~same
    return keyed.filter(pa.array(first)).drop_columns(["_b", "_a"])


def _commit_state(
    stage,
    opts: LeapfrogOptions,
    facts: dict,
    ends: dict,
    carried: dict,
    findings: DataFrame | None,
    findings_table,
    pairs,
    regions,
    counter_rows: list[dict],
    old_settled: dict,
    buckets: int | None,
) -> None:
    """Complete the next state in its staging directory (the reduce tasks wrote its carried records there)
    and swap it in (before the output is committed). `buckets`: the fused job's bucket count, under which the
    carried files are tagged (None: the two-phase path, whose files the next run shuffles in)."""
    from pipelines.leapfrog import state as S

    if findings_table is not None:
        (stage / "findings").makedirs()
        write_parquet_file(findings_table, stage / "findings" / "part-00000.parquet")
    else:
        write_parquet(findings, stage / "findings")
    region_rows = S.region_rows(facts, ends, carried)
    settled_counts = []
    for r in counter_rows:
        k = (r["partition"], r["region_a"], r["region_b"])
        settled_counts.append(
            {
                "partition": k[0],
                "region_a": k[1],
                "region_b": k[2],
                "keys": r["settled_new"] + old_settled.get(k, 0) - r["settled_touched"],
            }
        )
    meta = {
        "store": opts.store,
        "version": opts.version,
        "mode": opts.mode,
        "pairs": [list(p) for p in pairs],
        "regions": sorted(regions),
        "settled_keys": settled_counts,
        # the bucket count the carried files' tags belong to (rows.bucket_labels; older states
        # wrote "buckets", tagged otherwise: their records are shuffled in)
        "reduce_buckets": buckets,
    }
    S.write_meta(stage, meta, region_rows)


def _evidence(
    topic: str, splits, ends: dict, facts: dict, failed: list[dict], kafka_regions: set[int]
) -> list[PartitionEvidence]:
    """Per region partition: the offsets planned (the splits, fixed on the driver) against what the executors
    read and decoded (their scan summaries, reconciled into `facts`). An archive's last planned offset is a
    record, so a whole read ends there; a Kafka partition may end in compacted offsets, and its reader reports a
    read that stalled before the planned end as an error (a failed partition)."""
    planned: dict[tuple[int, int], list[int]] = {}
    for sp in splits:
        lo_hi = planned.setdefault((sp.region, sp.partition), [sp.start, sp.end])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], sp.start), max(lo_hi[1], sp.end)
    errors = {(f["region"], f["partition"]): f["error"] for f in failed}
    out = []
    for key in sorted(set(planned) | set(errors)):
        start, end = planned.get(key, [0, 0])
        e = PartitionEvidence(key[0], topic, key[1], start, end, error=errors.get(key))
        rp = facts.get(key)
        if rp is not None and e.error is None:
            e.read_records = rp.records_read
            e.reached_end = key[0] in kafka_regions or (
                rp.last_offset is not None and rp.last_offset >= end - 1
            )
            e.undecodable = rp.undecodable
            e.undecodable_offsets = list(rp.undecodable_offsets)
        out.append(e)
    return out


def _summary(
    opts: LeapfrogOptions,
    facts: dict,
    counter_rows,
    finding_counts: dict,
    pairs,
    failed,
    unverified: dict,
    overflow: set,
) -> dict[str, Any]:
    by_pair = []
    totals = defaultdict(int)
    types = {
        "VALUE_MISMATCH": "value_mismatch",
        "MISSING_IN_A": "missing_in_a",
        "MISSING_IN_B": "missing_in_b",
    }
    found = {(r["partition"], r["region_a"], r["region_b"]): r for r in counter_rows}
    by_type = defaultdict(
        int, finding_counts
    )  # from the findings written (with --state: every finding so far)
    partitions = sorted({p for _, p in facts})
    keys_of: dict[tuple[int, int], set[bytes]] = defaultdict(set)  # (region, partition) → unverified keys
    for region, partition, key in unverified:
        keys_of[(region, partition)].add(key)
    for p in partitions:
        for a, b in pairs:
            r = found.get((p, a, b))
            entry = {"region_a": a, "region_b": b, "partition": p}
            for c in ("keys", "comparable_pairs", "skipped_pairs", "pending_keys"):
                entry[c] = int(r[c]) if r else 0
                totals[c] += entry[c]
            entry["unverified_keys"] = len(keys_of[(a, p)] | keys_of[(b, p)])
            entry["all_keys_unverified"] = (a, p) in overflow or (b, p) in overflow
            entry["findings"] = {t: sum(by_type[(p, a, b, t, st)] for st in FINDING_STATUSES) for t in types}
            for st in FINDING_STATUSES:
                entry[f"{st}_findings"] = {t: by_type[(p, a, b, t, st)] for t in types}
            by_pair.append(entry)
    by_region = []
    for (region, p), rp in sorted(facts.items()):
        by_region.append(
            {
                "region": region,
                "partition": p,
                "records": rp.data_records,
                "heartbeats": rp.heartbeats,
                "heartbeats_by_origin": dict(sorted(rp.heartbeats_by_origin.items())),
                "eop_offset": rp.eop_offset,
                "scan_start": rp.start_kind,
                "first_offset": rp.start_after + 1,
                "last_offset": rp.last_offset,
                "final_high_watermark": list(rp.final_hw),
                "compacted_ranges": [[g[0], g[1]] for g in rp.gaps],
                "latest_records_kept": rp.latest_kept,
                "undecodable": rp.undecodable,
                "undecodable_offsets": rp.undecodable_offsets,
                "unverified_keys": len(keys_of[(region, p)]),
                "all_keys_unverified": rp.unverified_overflow,
                "unverified": [
                    {"key": k.hex(), "offsets": offs[:10]}
                    for (r_, p_, k), offs in sorted(unverified.items())
                    if (r_, p_) == (region, p)
                ][:100],
                "out_of_range": rp.out_of_range,
                "out_of_range_offsets": rp.out_of_range_offsets,
            }
        )
    finding_totals = {t: sum(e["findings"][t] for e in by_pair) for t in types}
    by_status = {
        f"{st}_findings": {t: sum(e[f"{st}_findings"][t] for e in by_pair) for t in types}
        for st in FINDING_STATUSES
    }
    return {
        "store": opts.store,
        "version": opts.version,
        "mode": opts.mode,
        "regions": sorted({r for r, _ in facts}),
        "pairs": [list(p) for p in pairs],
        "incremental": opts.state_dir is not None,
        "totals": {
            "records": sum(rp.data_records for rp in facts.values()),
            "heartbeats": sum(rp.heartbeats for rp in facts.values()),
            "keys": totals["keys"],
            "comparable_pairs": totals["comparable_pairs"],
            "skipped_pairs": totals["skipped_pairs"],
            "pending_keys": totals["pending_keys"],
            "findings": finding_totals,
            **by_status,
            "undecodable": sum(rp.undecodable for rp in facts.values()),
            "unverified_keys": len({(p_, k) for (_, p_, k) in unverified}),
            "out_of_range": sum(rp.out_of_range for rp in facts.values()),
        },
        "by_pair": by_pair,
        "by_region": by_region,
        "failed_partitions": failed,
    }


# the per-pair coverage counters of summary.json, in its key order; all but new_findings are summed as they are
_COUNTERS = (
    "keys",
    "comparable_pairs",
    "skipped_pairs",
    "pending_keys",
    "new_findings",
    "settled_touched",
    "settled_new",
)
_SUMMED_COUNTERS = tuple(c for c in _COUNTERS if c != "new_findings")


def _pair_counters(k: tuple[int, int, int]) -> dict[str, int]:
    """The zeroed counters of one (partition, region A, region B)."""
    return {"partition": k[0], "region_a": k[1], "region_b": k[2], **dict.fromkeys(_COUNTERS, 0)}
