"""`tidegauge repair apply`: produce a repair plan's writes into one region's real-time topic, as a Venice online
producer (VeniceWriter) does (docs/design.md, "Repair"; docs/outputs.md, `tidegauge repair apply`).

Each write is a Put or a Delete envelope under a new producer GUID (`div.writer.SegmentWriter`: DIV segments,
StartOfSegment, sequence numbers, checksums, a final EndOfSegment per partition on close) whose
`producerMetadata.logicalTimestamp` is the plan's `logical_ts`, as it is: the winner's own timestamp, or one above
the highest any region holds where a region's DCR would keep another record at the winner's
(`leapfrog.repair`, "The stamp") — what every region's leader compares in its conflict resolution (`sim/leader.py`
reads it the same way). The partition is the
plan's: a key's VT partition is its RT partition in Venice.

Values are not chunked, as Venice's online producers do not chunk into a real-time topic: their RT writers run
with chunking disabled (AbstractVeniceProducer: `setChunkingEnabled(false)`; VeniceSystemProducer: "For pushes
made to RT, the producer should not chunk the data") and throw RecordTooLargeException for a key and value over
the per-message limit, and a Venice leader takes every RT Put as a whole value of its raw key (chunk and manifest
records would become values of keys with a chunk suffix, not the user's key). So a plan holding such a write is
refused before anything is produced. (`div.writer.SegmentWriter.put_large` writes chunks as VeniceWriter does into
a chunked *version* topic; it is not used here for that reason.)
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from div import keys
from div.writer import MAX_PAYLOAD_BYTES, SegmentWriter, random_guid
from pipelines.core.errors import EXIT_CLEAN, EXIT_PARTIAL, UsageError
from pipelines.core.output import OutputDir, guard, read_output

log = logging.getLogger("tidegauge.repair")

COMMAND = "repair apply"
PLAN_COMMAND = "repair plan"
VALUE_SCHEMA_ID = 1
MAX_LISTED = 100

WRITES_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("op", pa.string()),
        ("logical_ts", pa.int64()),
        ("rt_offset", pa.int64()),
    ]
)
"""`repair apply --out`'s writes/: one row per write produced, with the RT offset Kafka acknowledged."""


@dataclass
class Plan:
    path: str
    summary: dict[str, Any]
    rows: list[dict[str, Any]]

    @property
    def store(self) -> str:
        return str(self.summary["store"])

    @property
    def version(self) -> int:
        return int(self.summary["version"])

    @property
    def rt_topic(self) -> str:
        return f"{self.store}_rt"


def load_plan(path: str) -> Plan:
    """A `tidegauge repair plan` output: its summary.json and the rows of plan/."""
    flag = f"--plan {path}"
    where, summary = read_output(path, "--plan", PLAN_COMMAND, (PLAN_COMMAND,))
    from pipelines.repair.job import PLAN_DIR, PLAN_SCHEMA

    d = where / PLAN_DIR
    try:
        files = d.files(".parquet") if d.is_dir() else None
        if files is None:
            raise UsageError(f"{flag}: has no {PLAN_DIR}/ directory (docs/outputs.md)")
        tables = [pq.read_table(f.path, filesystem=f.fs, columns=PLAN_SCHEMA.names) for f in files]
    except (OSError, pa.ArrowException, KeyError) as exc:
        raise UsageError(f"{flag}: {PLAN_DIR}/ cannot be read: {exc}") from None
    rows = [r for t in tables for r in t.to_pylist()]
    rows.sort(key=lambda r: (r["partition"], r["key"]))
    return Plan(path, summary, rows)


@dataclass
class ApplyOptions:
    plan: str
    region: int
    bootstrap: str
    dry_run: bool = False
    rate: float | None = None
    kafka_conf: dict[str, Any] = field(default_factory=dict)
    value_schema_id: int = VALUE_SCHEMA_ID
    out: str | None = None


def _check_rows(plan: Plan) -> list[dict[str, Any]]:
    """The rows with a write, checked before anything is produced."""
    writes = []
    for r in plan.rows:
        op = r["op"]
        where = f"--plan {plan.path}: partition {r['partition']} key {bytes(r['key']).hex()}"
        if op == "NONE":
            continue
        if op not in ("PUT", "DELETE"):
            raise UsageError(f"{where}: op {op!r} is not PUT, DELETE or NONE")
        if r["logical_ts"] is None or r["logical_ts"] < 0:
            raise UsageError(f"{where}: a {op} without a logical timestamp (the plan is damaged)")
        if op == "PUT" and r["value"] is None:
            raise UsageError(f"{where}: a PUT without a value (the plan is damaged)")
        size = len(r["key"]) + len(r["value"] or b"")
        if size > MAX_PAYLOAD_BYTES:
            raise UsageError(
                f"{where}: key and value are {size} bytes, over VeniceWriter's {MAX_PAYLOAD_BYTES}-byte limit "
                "for one message; a Venice online producer refuses such a write to a real-time topic too (it "
                "does not chunk into the RT, and leaders do not put RT chunks back together): nothing was "
                "written (repush the store to repair this key)"
            )
        writes.append(r)
    return writes


def _describe(r: dict[str, Any]) -> str:
    value = r["value"] or b""
    what = (
        f"PUT {len(value)} bytes {value[:16].hex()}{'…' if len(value) > 16 else ''}"
        if r["op"] == "PUT"
        else "DELETE"
    )
    fix = ",".join(map(str, r["regions_to_fix"] or []))
    return (
        f"partition {r['partition']} key {keys.shown(bytes(r['key']))} {what} logical_ts {r['logical_ts']} "
        f"cause {r['cause']} regions_to_fix {fix}"
    )


def _ignored(plan: Plan) -> dict[tuple[int, str], list[int]]:
    """(partition, key hex) → regions whose DCR keeps its value against the write: only a plan made before writes
    were stamped above the winner where needed lists them (`writes_dcr_would_ignore`, first 100); a plan made
    since lists none."""
    return {
        (int(e["partition"]), str(e["key"])): list(e["regions"])
        for e in plan.summary.get("writes_dcr_would_ignore") or []
    }


def _open_producer(opts: ApplyOptions, topic: str, partitions_needed: int):
    from confluent_kafka import KafkaException, Producer

    settings: dict[str, Any] = {"enable.idempotence": True, "acks": "all", "linger.ms": 5}
    settings.update(opts.kafka_conf)  # the region's own settings (security included), as they are
    settings["bootstrap.servers"] = opts.bootstrap
    producer = Producer(settings)
    flag = f"--kafka {opts.region}={opts.bootstrap}"
    try:
        md = producer.list_topics(topic, timeout=15)
    except KafkaException as exc:
        raise UsageError(f"{flag}: cannot read the cluster's metadata: {exc}") from None
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        raise UsageError(f"{flag}: no topic {topic!r} (the plan's store's real-time topic)")
    if len(t.partitions) < partitions_needed:
        raise UsageError(
            f"{flag}: {topic} has {len(t.partitions)} partitions, the plan writes to partition "
            f"{partitions_needed - 1}: is this the plan's store?"
        )
    return producer


def run(opts: ApplyOptions) -> int:
    """Check the plan, then produce (or print) its writes. Returns the exit code: 0 every write acknowledged,
    3 some were not (re-running the plan is safe)."""
    if opts.out is not None:
        guard(COMMAND, {"--out": opts.out}, {"--plan": opts.plan})
    if opts.rate is not None and opts.rate <= 0:
        raise UsageError(f"--rate {opts.rate}: writes per second must be more than 0")
    plan = load_plan(opts.plan)
    writes = _check_rows(plan)
    skipped = len(plan.rows) - len(writes)
    ignored = _ignored(plan)
    topic = plan.rt_topic
    started = time.time()
    for (p, k), regions in sorted(ignored.items()):
        log.warning(
            "partition %d key %s: Venice's DCR in regions %s keeps its stored value against this write (same "
            "logical timestamp, higher value hash); the write alone will not fix them (an old plan: a plan made "
            "now stamps such a write one above the winner)",
            p,
            k,
            ", ".join(map(str, regions)),
        )
    guid = random_guid()
    acked: dict[int, int] = {}  # index of the write -> RT offset
    failures: list[str] = []
    produced = 0
    if opts.dry_run:
        for r in writes:
            print(f"would write to {topic}: {_describe(r)}")
    elif writes:
        producer = _open_producer(opts, topic, max(r["partition"] for r in writes) + 1)
        writer = SegmentWriter(guid, host_name=f"tidegauge-repair-{guid.hex()[:8]}")

        def report(i: int | None):
            def cb(err, msg) -> None:
                if err is not None:
                    failures.append(str(err))
                elif i is not None:
                    acked[i] = msg.offset()

            return cb

        def send(recs, i: int | None) -> None:
            nonlocal produced
            for rec in recs:
                data = i is not None and rec is recs[-1]  # the data record comes after any SOS/EOS
                while True:
                    try:
                        producer.produce(
                            topic,
                            value=rec.value,
                            key=rec.key,
                            partition=rec.partition,
                            headers=list(rec.headers) or None,
                            on_delivery=report(i if data else None),
                        )
                        break
                    except BufferError:
                        producer.poll(0.1)
                produced += 1
            producer.poll(0)

        for i, r in enumerate(writes):
            if opts.rate is not None:
                due = started + i / opts.rate
                while (wait := due - time.time()) > 0:
                    producer.poll(min(wait, 0.1))
            p, key, ts = int(r["partition"]), bytes(r["key"]), int(r["logical_ts"])
            if r["op"] == "PUT":
                recs = writer.put(p, key, bytes(r["value"]), opts.value_schema_id, logical_ts=ts)
            else:
                recs = writer.delete(p, key, logical_ts=ts)
            send(recs, i)
        send(writer.close(), None)
        left = producer.flush(120)
        if left:
            failures.append(f"{left} records still unacknowledged after 120 s")
    code = EXIT_PARTIAL if failures else EXIT_CLEAN
    by_op = {op: sum(1 for r in writes if r["op"] == op) for op in ("PUT", "DELETE")}
    doc = {
        "plan": plan.path,
        "store": plan.store,
        "version": plan.version,
        "region": opts.region,
        "topic": topic,
        "dry_run": opts.dry_run,
        "producer_guid": None if opts.dry_run else guid.hex(),
        "rows": len(plan.rows),
        "writes": len(writes),
        "by_op": by_op,
        "skipped_no_write": skipped,
        "records_produced": produced,
        "writes_acknowledged": len(acked),
        "failures": failures[:MAX_LISTED],
        "rate": opts.rate,
        "value_schema_id": opts.value_schema_id,
        "writes_dcr_would_ignore": [
            {"partition": p, "key": k, "regions": v} for (p, k), v in sorted(ignored.items())
        ],
    }
    verb = "would write" if opts.dry_run else "wrote"
    print(
        f"tidegauge repair apply: {verb} {len(writes)} writes ({by_op['PUT']} PUT, {by_op['DELETE']} DELETE) to "
        f"{topic} in region {opts.region}; {skipped} rows without a write skipped"
        + ("" if opts.dry_run else f"; {len(acked)} acknowledged, {len(failures)} failed"),
        file=sys.stdout,
    )
    if ignored:
        print(
            f"warning: {len(ignored)} writes will be ignored by a region's DCR (same timestamp, higher stored "
            "hash; listed above): re-emitting alone will not fix those regions; this plan predates writes stamped "
            "above the winner: plan again",
            file=sys.stdout,
        )
    if failures:
        log.error(
            "%d records were not acknowledged (first: %s); re-running the plan is safe",
            len(failures),
            failures[0],
        )
    if opts.out is not None:
        rows = [
            {
                "partition": int(r["partition"]),
                "key": bytes(r["key"]),
                "op": r["op"],
                "logical_ts": int(r["logical_ts"]),
                "rt_offset": acked.get(i),
            }
            for i, r in enumerate(writes)
        ]
        with OutputDir(opts.out, COMMAND) as out:
            out.write_table("writes", pa.Table.from_pylist(rows, schema=WRITES_SCHEMA))
            doc = {
                **out.common_fields(COMMAND, code, {opts.region: opts.bootstrap}),
                "finished_at_ms": int(time.time() * 1000),
                **doc,
            }
            out.write_json("summary.json", doc)
    return code
