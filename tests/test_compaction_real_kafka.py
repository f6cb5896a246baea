"""Version-topic compaction done by Apache Kafka's own log cleaner, not by the simulator (issue 29).

`sim.compaction` removes superseded records from an archive as Kafka would; here a real broker does it. A small
two-region simulation (16 keys, each overwritten dozens of times; leaders roll DIV segments often) gives each
region's VT. Region 0's is produced twice into the session's broker: as `<store C>_v1`, compacted
(`cleanup.policy=compact`, `min.compaction.lag.ms` one hour, dirty ratio 0.01), and as `<store U>_v1`, an
uncompacted copy. Region 1's VT goes, under both names, to the session's three-node cluster: Leap Frog reads one
topic name per region, so two regions need two clusters. About the first two thirds of region 0's VT, up to the
end of a leader's DIV segment, keep the simulation's timestamps (years ago, past the lag: the cleaner may take
them, DIV tolerates their gaps); the rest is stamped now (within the lag: the cleaner leaves it, DIV is strict
there). One record of that recent part — a key's last write in region 0 — is left out of both copies: a real
fault, not a compaction artefact. The lag of one hour is also what lets Leap Frog promise `latest_records_kept`:
its read ends long before a record written after it was planned could make the cleaner take an older one.

The test waits until the cleaner has compacted the old part exactly as Kafka's rule says (of the cleanable
records, each key's latest stays and the rest goes) and prints the counts before and after. Then:

- DIV (`div validate`, over kafka://) on the compacted topic learns from the broker that it is compacted and
  tolerates the gaps the cleaner left: its findings are exactly those of the uncompacted copy — the left-out
  record's MISSING and its segment's CORRUPT checksum, warnings after End of Push, so exit 0 — while the same
  topic judged as if not compacted has MISSING and CORRUPT rows in the old part: the gaps are there, and only
  tolerance hides them;
- Leap Frog over the two clusters reports `latest_records_kept` true for the compacted region (the broker says
  compacted, with a lag far longer than the read) and gives exactly the findings it gives over the uncompacted
  copies: the left-out write, and nothing the cleaner did.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from heartbeat_fixtures import read_topic

from div import archive
from div import envelope as E
from div import keys as K
from pipelines.core.sources import SourceSpec
from sim import SimConfig
from sim import run as simulate

pytestmark = pytest.mark.slow

LAG_MS = 3_600_000
COMPACTED = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": LAG_MS,
    "min.cleanable.dirty.ratio": 0.01,
    # Records are stamped by the simulation's clock: a segment rolls when a record's timestamp is segment.ms past
    # the segment's first one, so the jump to records stamped now closes the old part's last segment. 1 MiB is the
    # smallest segment.bytes Kafka 4 accepts.
    "segment.ms": 60_000,
    "segment.bytes": 1 << 20,
    "delete.retention.ms": 1000,
}
CLEANER_DEADLINE_S = 180  # only against a cleaner that never runs


def _records(directory: str, topic: str) -> list[tuple[bytes, bytes, list, int]]:
    """(key, value, headers, timestamp ms) of partition 0 of an archive's topic, in offset order."""
    t = pa.Table.from_batches(
        list(archive.iter_partition(directory, topic, 0)), schema=archive.KAFKA_ARROW_SCHEMA
    )
    return [
        (
            r["key"],
            r["value"],
            [(h["key"], h["value"]) for h in r["headers"] or []],
            round(r["timestamp"].timestamp() * 1000),
        )
        for r in t.to_pylist()
    ]


def _produce(bootstrap: str, topic: str, records, timestamp_ms: int | None = None) -> None:
    """Records in order with their own timestamps (or `timestamp_ms`), all acknowledged before it returns: the
    old part and the recent part go in separate calls, so no batch mixes them."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, "log_level": 0})
    failed: list = []
    for key, value, headers, ts in records:
        p.produce(
            topic,
            key=key,
            value=value,
            headers=headers or None,
            partition=0,
            timestamp=timestamp_ms or ts,
            on_delivery=lambda err, _m: err and failed.append(err),
        )
    assert p.flush(60) == 0 and not failed, failed


def _split(records, codec: E.EnvelopeCodec) -> int:
    """Where the recent part starts: right after the first leader EndOfSegment at or past 60 % of the records.

    No DIV segment spans both parts. DIV judges a gap or a checksum by the timestamp of the record that reveals it
    (Venice's rule, venice-protocol-notes §3.4): the EndOfSegment of a segment whose older records the cleaner took
    but which ended within the lag does not match its checksum, and is not old enough to be tolerated. Measured
    with the split 40 records into a segment: one CORRUPT (not fatal after End of Push) at that EndOfSegment over
    the compacted topic, none over the uncompacted copy. A segment straddles the lag's edge only while its first
    records are older than the lag and its EndOfSegment is not (a window as long as the segment); this test keeps
    to the common case, a DIV run outside that window."""
    push_guid = codec.decode(records[0][1], records[0][2])["producerMetadata"]["producerGUID"]
    for i, (key, value, headers, _) in enumerate(records):
        if i < len(records) * 0.6 or K.is_heartbeat_key(key) or key[0] != K.HEADER_CONTROL_MESSAGE:
            continue
        env = codec.decode(value, headers)
        if E.control_type(env) == E.END_OF_SEGMENT and env["producerMetadata"]["producerGUID"] != push_guid:
            return i + 1
    raise AssertionError("no leader EndOfSegment in the last 40 % of the VT")


def _left_out(records, start: int, codec: E.EnvelopeCodec) -> int:
    """The record of the recent part to leave out: the first PUT that is its key's last record and has two VT
    heartbeats after it (so both regions' marks cover it and Leap Frog can judge it)."""
    last_of_key = {key: i for i, (key, *_rest) in enumerate(records)}
    heartbeats_after = [0] * (len(records) + 1)
    for i in range(len(records) - 1, -1, -1):
        heartbeats_after[i] = heartbeats_after[i + 1] + K.is_heartbeat_key(records[i][0])
    for i in range(start, len(records)):
        key, value, headers, _ = records[i]
        if key[0] == K.HEADER_PUT_OR_DELETE and last_of_key[key] == i and heartbeats_after[i] >= 2:
            if codec.decode(value, headers)["messageType"] == 0:  # a PUT
                return i
    raise AssertionError("no key's last PUT followed by two heartbeats in the recent part")


def _kafka_keeps(produced: list[bytes], cleanable_end: int) -> list[int]:
    """Offsets Kafka's cleaner keeps once it has cleaned [0, cleanable_end): there, each key's latest record in that
    range (the offset map is built from the cleanable records only); after it, everything."""
    latest = {key: off for off, key in enumerate(produced[:cleanable_end])}
    return [off for off, key in enumerate(produced) if off >= cleanable_end or latest[key] == off]


@pytest.fixture(scope="module")
def vts(tmp_path_factory, real_kafka, real_kafka_three_session):
    """The simulation, its VTs on the brokers, and the compacted topic as the cleaner left it."""
    t0 = time.monotonic()
    root = tmp_path_factory.mktemp("broker-compaction")
    sim = simulate(
        SimConfig(
            out=str(root / "sim"),
            seed=3,
            regions=2,
            partitions=1,
            records=1200,
            keys=16,
            batch_records=16,
            heartbeat_every_records=60,
            heartbeat_every_ms=400,
            default_lag_ms=100,
            segment_max_age_ms=100,  # leaders roll DIV segments every ~100 records: the split falls between two
            step_records=1200,
            progress=False,
            workers="inline",
        )
    )
    run = sim.truth["run"]
    topic = f"{run['store']}_v{run['version']}"
    codec = E.EnvelopeCodec()
    r0 = _records(sim.archives[0], topic)
    r1 = _records(sim.archives[1], topic)
    start = _split(r0, codec)
    dropped = _left_out(r0, start, codec)
    old, recent = r0[:start], [x for i, x in enumerate(r0[start:], start) if i != dropped]
    name = uuid.uuid4().hex[:8]
    stores = {"compacted": f"bc_{name}", "plain": f"bu_{name}"}
    c_topic, u_topic = (f"{s}_v1" for s in stores.values())
    real_kafka.create_topics({c_topic: 1, u_topic: 1}, configs={c_topic: COMPACTED})
    real_kafka_three_session.create_topics({c_topic: 1, u_topic: 1})
    now_ms = int(time.time() * 1000)
    # the compacted topic first: its old part's last segment rolls (and becomes cleanable) with the recent part
    for t in (c_topic, u_topic):
        _produce(real_kafka.bootstrap_servers, t, old)
        _produce(real_kafka.bootstrap_servers, t, recent, timestamp_ms=now_ms)
        if t == c_topic:
            t_rolled = time.monotonic()
    for t in (c_topic, u_topic):
        _produce(real_kafka_three_session.bootstrap_servers, t, r1)
    produced = [x[0] for x in old + recent]
    keeps = _kafka_keeps(produced, len(old))
    assert len(keeps) < len(produced) // 2, "the history overwrites too little for compaction to show"

    counts = []
    while True:
        got = [o for o, *_ in read_topic(real_kafka.bootstrap_servers, c_topic)]
        counts.append(len(got))
        if got == keeps:
            break
        assert len(got) >= len(keeps) and set(keeps) <= set(got), (
            f"the cleaner removed records Kafka's rule keeps: {sorted(set(keeps) - set(got))[:20]}"
        )
        assert time.monotonic() - t_rolled < CLEANER_DEADLINE_S, (
            f"the cleaner has not compacted {c_topic} as expected in {CLEANER_DEADLINE_S} s: {len(got)} records, "
            f"{len(keeps)} expected"
        )
        time.sleep(0.5)
    cleaner_s = time.monotonic() - t_rolled  # at most: the first read that showed it
    assert [o for o, *_ in read_topic(real_kafka.bootstrap_servers, u_topic)] == list(range(len(produced)))
    return {
        "stores": stores,
        "topics": {"compacted": c_topic, "plain": u_topic},
        "before": len(produced),
        "after": counts[-1],
        "old": len(old),
        "old_after": sum(1 for o in keeps if o < len(old)),
        "cleaner_s": cleaner_s,
        "setup_s": time.monotonic() - t0,
        "dropped_key": r0[dropped][0],
        "left_out_at": dropped,  # the offset the left-out record would have had (the next record has it)
        "uris": (real_kafka.uri, real_kafka_three_session.uri),
    }


def _div(uri: str, topic: str, out: Path, lag: int | None = None) -> tuple[int, dict, list[tuple]]:
    from pipelines.div.validate import ValidateOptions, run_local

    code = run_local(
        ValidateOptions(sources=[SourceSpec(0, uri)], topics=[topic], out=str(out), min_compaction_lag_ms=lag)
    )
    summary = json.loads((out / "summary.json").read_text())
    rows = pq.read_table(out / "errors").to_pylist()
    return (
        code,
        summary,
        sorted((r["offset"], r["type"], r["fatal"], r["producer_guid"], r["sequence"]) for r in rows),
    )


def test_div_tolerates_the_cleaners_gaps_and_still_finds_a_record_left_out(vts, tmp_path, capsys):
    uri = vts["uris"][0]
    code_u, sum_u, found_u = _div(uri, vts["topics"]["plain"], tmp_path / "plain")
    code_c, sum_c, found_c = _div(uri, vts["topics"]["compacted"], tmp_path / "compacted")
    _, _, found_s = _div(uri, vts["topics"]["compacted"], tmp_path / "strict", lag=-1)
    at = vts["left_out_at"]
    # the uncompacted copy: the left-out record is MISSING at the next record of its producer, and its segment's
    # EndOfSegment checksum does not match; after End of Push both are warnings (exit 0), as Venice has them
    assert [t for _, t, *_ in found_u] == ["MISSING", "CORRUPT"] and found_u[0][0] >= at
    assert not any(fatal for _, _, fatal, *_ in found_u) and code_u == 0
    # compacted by the broker: exactly the same findings, nothing for the gaps the cleaner left
    assert found_c == found_u and code_c == code_u == 0
    assert sum_c["records_read"] == vts["after"] < sum_u["records_read"] == vts["before"]
    # ... which are real: judged as if the topic were not compacted, DIV reports them
    gaps = [f for f in found_s if f[0] < vts["old"]]
    assert gaps and {t for _, t, *_ in gaps} == {"MISSING", "CORRUPT"}
    assert [f for f in found_s if f[0] >= vts["old"]] == found_u
    with capsys.disabled():
        print(
            f"\n[broker compaction] {vts['topics']['compacted']}: {vts['before']} records before the cleaner, "
            f"{vts['after']} after ({vts['old']} -> {vts['old_after']} in the cleanable part); compacted "
            f"within {vts['cleaner_s']:.1f} s of the roll (setup {vts['setup_s']:.1f} s); DIV: "
            f"{len(found_c)} findings compacted = uncompacted, {len(found_s)} if the gaps were not tolerated"
        )


def test_leapfrog_finds_the_same_over_a_broker_compacted_vt(vts, spark, tmp_path, capsys):
    from pipelines.demo.job import read_leapfrog_findings
    from pipelines.leapfrog.job import LeapfrogOptions
    from pipelines.leapfrog.job import run as leapfrog

    sources = [SourceSpec(x, u) for x, u in enumerate(vts["uris"])]
    out = {}
    took = {}
    for kind, store in vts["stores"].items():
        t0 = time.monotonic()
        code = leapfrog(
            LeapfrogOptions(store=store, version=1, sources=sources, out=str(tmp_path / kind)), spark=spark
        )
        summary = json.loads((tmp_path / kind / "summary.json").read_text())
        rows = pq.read_table(tmp_path / kind / "inconsistencies").drop_columns(["store"]).to_pylist()
        out[kind] = (code, summary, rows, read_leapfrog_findings(tmp_path / kind))
        took[kind] = time.monotonic() - t0
    code_c, sum_c, rows_c, found_c = out["compacted"]
    code_u, sum_u, rows_u, found_u = out["plain"]
    # the left-out write is found, and only it, whether the cleaner ran or not
    assert found_u and {key for *_, key in found_u} == {vts["dropped_key"][1:].hex()}
    assert rows_c == rows_u and code_c == code_u == 1
    by_region = {r["region"]: r for r in sum_c["by_region"]}
    assert by_region[0]["latest_records_kept"] is True and by_region[0]["compacted_ranges"]
    assert by_region[1]["latest_records_kept"] is True and not by_region[1]["compacted_ranges"]
    assert all(r["latest_records_kept"] and not r["compacted_ranges"] for r in sum_u["by_region"])
    with capsys.disabled():
        print(
            f"\n[broker compaction] leapfrog over kafka://: compacted {took['compacted']:.1f} s, "
            f"uncompacted {took['plain']:.1f} s; {len(rows_c)} finding(s), the same"
        )
