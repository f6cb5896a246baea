"""Benchmark: DIV validate throughput vs decode-only throughput on the same archive, in the same run.

Builds (or reuses) a realistic archive — a push job, several online producers, rolling segments, ~1M records —
then times (a) reading + decoding every value and (b) the full `div validate` partition run over the same
batches. Prints one JSON object; the figure that matters is `ratio` = validate / decode-only throughput
(goal ≥ 0.7). Usage: python bench/bench_div_validate.py [--records N] [--dir DIR] [--decoder cavro|fastavro]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from div.archive import ArchiveWriter, describe, iter_partition
from div.batch import PartitionRun
from div.envelope import EnvelopeCodec
from sim.div_traffic import TrafficSpec, generate


def build(path: str, records: int) -> float:
    t = time.perf_counter()
    spec = TrafficSpec(records=records, partitions=4, producers=8, keys=200_000, segment_every=20_000)
    with ArchiveWriter(path) as w:
        for r in generate(spec):
            w.append_record(
                spec.topic, r.partition, r.offset, r.key, r.value, r.timestamp_ms, 0, list(r.headers) or None
            )
    return time.perf_counter() - t


def decode_only(path: str, decoder: str) -> tuple[int, float]:
    codec = EnvelopeCodec(decoder)
    t = time.perf_counter()
    n = 0
    for info in describe(path):
        for batch in iter_partition(path, info.topic, info.partition):
            values = batch.column("value").to_pylist()
            headers = batch.column("headers").to_pylist()
            decode = codec.decode
            for v, h in zip(values, headers, strict=True):
                decode(v, h)
            n += len(values)
    return n, time.perf_counter() - t


def validate(path: str, decoder: str) -> tuple[int, float, int]:
    t = time.perf_counter()
    n = findings = 0
    for info in describe(path):
        run = PartitionRun(0, info.topic, info.partition, codec=EnvelopeCodec(decoder))
        for batch in iter_partition(path, info.topic, info.partition):
            run.feed(batch)
        run.finish()
        n += run.summary.records
        findings += len(run.rows)
    return n, time.perf_counter() - t, findings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--dir", default="/tmp/tidegauge-bench-div")
    ap.add_argument("--decoder", default="cavro", choices=["cavro", "fastavro"])
    ap.add_argument("--repeat", type=int, default=3, help="alternate the two measurements this many times")
    args = ap.parse_args()
    path = os.path.join(args.dir, f"archive-{args.records}")
    build_s = None
    if not os.path.isdir(path):
        build_s = build(path, args.records)
    dec, val = [], []
    for _ in range(args.repeat):  # alternate so machine noise hits both equally
        n, s = decode_only(path, args.decoder)
        dec.append(n / s)
        n, s, findings = validate(path, args.decoder)
        val.append(n / s)
    result = {
        "benchmark": "div_validate",
        "records": n,
        "decoder": args.decoder,
        "findings": findings,
        "build_s": build_s,
        "decode_only_records_per_s": round(max(dec)),
        "validate_records_per_s": round(max(val)),
        "ratio": round(max(val) / max(dec), 3),
        "goal": "ratio >= 0.7",
        "python": sys.version.split()[0],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
