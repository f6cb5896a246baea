"""Benchmark: Spark's `from_avro` (the JVM's Avro reader, spark-avro) against tidegauge's numpy read of the VT
envelope, on the same archives in one Spark session: the comparison issue 32 asked for before choosing how Leap Frog
extracts its columns.

Builds (once, cached) the Leap Frog benchmark's archives (`leapfrog_workload`: 2 regions × `--records` VT records)
and times, best of `--repeat` rounds after `--warmup` untimed ones:

- `parquet_scan_s`: Spark's Parquet reader summing the length of every key, value and header value (the floor);
- `decode_only_s`: Leap Frog's decode-only pass as the job runs it (`pipelines.leapfrog.job.decode_only`: each
  split read in a Python task, the envelopes read with numpy, the columns made, handed back to the JVM);
- `from_avro_s`: the JVM alone: each version-14 value after Venice's 2-byte framing through `from_avro` (PERMISSIVE,
  against our copy of KafkaMessageEnvelope v14), the columns Leap Frog reads taken out with SQL (message type,
  producer GUID, segment and sequence, the Put's value with its `xxhash64` and length, schema id, the Delete
  branch, the RMD's length, the leader footer's cluster, offset and position) and summed in the JVM;
- `from_avro_to_python_s`: the same columns handed to Python through `mapInArrow` (a function that counts the
  rows), as Leap Frog's per-key stage, which is numpy in Python, would receive them.

A correctness check first: for every version-14 data record of one archive file, what `from_avro` reads (message
type, GUID, segment, sequence, the Put's value length, schema id) equals what `div.envelope_columns` reads.
spark-avro is resolved from Maven Central by bench/jvm/avro/pom.xml the first time (`spark_connectors`). Prints one
JSON object.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from bench_leapfrog import decode_pass, parquet_scan  # noqa: E402
from leapfrog_workload import LAYOUT, Workload, generate  # noqa: E402
from spark_connectors import connector_jars  # noqa: E402

from div import schemas  # noqa: E402
from pipelines.core.spark_jars import with_jars  # noqa: E402
from pipelines.core.spark_session import get_session  # noqa: E402


def envelope_columns(df):
    """The columns Leap Frog reads of each version-14 record, taken out of `from_avro` with SQL."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    schema = json.dumps(schemas.load_json("KafkaMessageEnvelope.v14.avsc"))
    v14 = (F.substring("value", 1, 1) == F.unhex(F.lit("17"))) & (
        F.substring("value", 2, 1) == F.unhex(F.lit("0E"))
    )
    env = from_avro(F.expr("substring(value, 3)"), schema, {"mode": "PERMISSIVE"})
    e = df.where(v14).select(F.substring("key", 1, 1).alias("key_header"), env.alias("e"))
    put, delete = F.col("e.payloadUnion.member0"), F.col("e.payloadUnion.member2")
    footer = F.col("e.leaderMetadataFooter")
    return e.select(
        "key_header",
        F.col("e.messageType").alias("message_type"),
        F.col("e.producerMetadata.producerGUID").alias("guid"),
        F.col("e.producerMetadata.segmentNumber").alias("segment"),
        F.col("e.producerMetadata.messageSequenceNumber").alias("sequence"),
        F.xxhash64(put.getField("putValue")).alias("value_hash"),
        F.length(put.getField("putValue")).alias("value_len"),
        F.coalesce(put.getField("schemaId"), delete.getField("schemaId")).alias("schema_id"),
        delete.isNotNull().alias("is_delete"),
        F.length(
            F.coalesce(
                put.getField("replicationMetadataPayload"), delete.getField("replicationMetadataPayload")
            )
        ).alias("rmd_len"),
        footer.getField("upstreamKafkaClusterId").alias("upstream_cluster"),
        footer.getField("upstreamOffset").alias("upstream_offset"),
        footer.getField("upstreamPubSubPosition").alias("position"),
    )


def _files(dirs: dict[int, str]) -> list[str]:
    return [os.path.join(d, "*.parquet") for d in dirs.values()]


def from_avro_pass(spark, dirs: dict[int, str]) -> tuple[float, int]:
    from pyspark.sql import functions as F

    t = time.perf_counter()
    cols = envelope_columns(spark.read.parquet(*_files(dirs)))
    row = cols.agg(
        F.count("*").alias("n"),
        F.bit_xor("value_hash").alias("h"),  # (a sum of 64-bit hashes overflows)
        F.sum("segment").alias("s"),
        F.sum(F.coalesce(F.length("position"), F.lit(0)) + F.coalesce("rmd_len", F.lit(0))).alias("b"),
    ).first()
    return time.perf_counter() - t, int(row["n"])


def _count_rows(batches):
    import pyarrow as pa

    for b in batches:
        yield pa.RecordBatch.from_pydict({"n": [b.num_rows]})


def from_avro_to_python_pass(spark, dirs: dict[int, str]) -> float:
    t = time.perf_counter()
    cols = envelope_columns(spark.read.parquet(*_files(dirs)))
    cols.mapInArrow(_count_rows, "n long").write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t


def check_equal(spark, dirs: dict[int, str]) -> int:
    """What `from_avro` reads of every version-14 data record of one archive file equals what
    `div.envelope_columns` reads; returns how many records were compared."""
    import numpy as np
    import pyarrow.parquet as pq

    from div.envelope_columns import read_envelopes

    path = sorted(glob.glob(_files(dirs)[0]))[0]
    table = pq.read_table(path)
    heads = read_envelopes(table)
    rows = np.flatnonzero(heads.read)
    mine = {
        "message_type": heads.message_type[rows].tolist(),
        "guid": heads.guids(heads.read),
        "segment": heads.segment[rows].tolist(),
        "sequence": heads.sequence[rows].tolist(),
        "value_len": np.where(heads.is_put, heads.value_end - heads.value_start, -1)[rows].tolist(),
        "schema_id": heads.schema_id[rows].tolist(),
    }
    mine["guid"] = [g for g in mine["guid"] if g is not None]
    theirs = envelope_columns(spark.read.parquet(path)).toArrow()
    data = [h == b"\x00" for h in theirs.column("key_header").to_pylist()]  # a data key: Put or Delete
    got = {
        c: [v for v, keep in zip(theirs.column(c).to_pylist(), data, strict=True) if keep]
        for c in ("message_type", "guid", "segment", "sequence", "value_len", "schema_id")
    }
    got["value_len"] = [-1 if v is None else v for v in got["value_len"]]
    for c, values in mine.items():
        assert got[c] == values, f"from_avro and envelope_columns differ on {c} in {path}"
    return len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--records", type=int, default=1_000_000, help="VT records per region (default 1,000,000)"
    )
    ap.add_argument("--dir", default="/tmp/tidegauge-bench-leapfrog")
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    w = Workload(vt_records=args.records)
    root = os.path.join(args.dir, f"w{args.records}-l{LAYOUT}")
    if not os.path.isdir(os.path.join(root, "full")):
        generate(w, root)
    dirs = {x: f"{root}/full/dc-{x}" for x in range(w.regions)}
    jars = connector_jars("spark-avro", "avro", "spark-avro", "Spark's Avro functions")
    conf = {"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "4g"}
    spark = get_session(args.master, conf=with_jars(conf, args.master, jars))
    cores = spark.sparkContext.defaultParallelism
    checked = check_equal(spark, dirs)
    runs: dict[str, list[float]] = {
        "parquet_scan": [],
        "decode_only": [],
        "from_avro": [],
        "from_avro_to_python": [],
    }
    v14_records = 0
    for i in range(args.warmup + args.repeat):
        timed = {
            "parquet_scan": parquet_scan(spark, dirs)[0],
            "decode_only": decode_pass(spark, dirs, w.store),
        }
        timed["from_avro"], v14_records = from_avro_pass(spark, dirs)
        timed["from_avro_to_python"] = from_avro_to_python_pass(spark, dirs)
        if i >= args.warmup:
            for k, v in timed.items():
                runs[k].append(v)
    best = {k: min(v) for k, v in runs.items()}
    records = spark.read.parquet(*_files(dirs)).count()  # every record, heartbeats and control messages too
    result = {
        "benchmark": "from_avro",
        "regions": w.regions,
        "vt_records_per_region": args.records,
        "records": records,
        "v14_records": v14_records,
        "cores": cores,
        "checked_rows": checked,
        **{f"{k}_s": round(v, 2) for k, v in best.items()},
        **{f"{k}_runs_s": [round(x, 2) for x in v] for k, v in runs.items()},
        **{
            f"{k}_records_per_s_per_core": round(records / v / cores)
            for k, v in best.items()
            if k != "parquet_scan"
        },
        "from_avro_over_decode_only": round(best["from_avro"] / best["decode_only"], 3),
        "from_avro_to_python_over_decode_only": round(best["from_avro_to_python"] / best["decode_only"], 3),
        "decode_only_over_scan": round(best["decode_only"] / best["parquet_scan"], 3),
        "from_avro_over_scan": round(best["from_avro"] / best["parquet_scan"], 3),
        "from_avro_to_python_over_scan": round(best["from_avro_to_python"] / best["parquet_scan"], 3),
        "exit_code": 0,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
