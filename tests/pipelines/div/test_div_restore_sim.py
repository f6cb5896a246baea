"""Proof that restoring helps, on simulated traffic: leader failovers, a compacted VT range (real DIV findings),
RT faults, and followers restarting mid-segment at many offsets of every region's VT.

For each restart offset O, three follower validations of the VT after O are compared with a full validation:
resumed from the state `div validate --restore-at O` restores (the hook both engines use) — exactly the full
run's findings after O; resumed cold, with no state at all (what a follower does when its checkpoint is lost) —
false fatal UNREGISTERED_PRODUCER findings for every producer it joins mid-segment and, for those segments, real
checksum failures it cannot see; resumed knowing only that End of Push passed — no false alarm, but the same
blind spots. The counts are printed by bench/bench_div_restore.py on the same kind of traffic.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

from div import archive
from div import envelope as E
from div.batch import PartitionRun
from div.restore import Replay, restore_rt, restore_vt
from div.validator import PartitionValidator, ValidatorConfig
from pipelines.core.sources import SourceSpec, open_source
from pipelines.div.restore import source_reader
from pipelines.div.validate import PartitionTask, ValidateOptions, validate_partition
from sim import SimConfig, run

pytestmark = [pytest.mark.kafka]


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("restore-sim") / "run"
    cfg = SimConfig(
        out=str(out),
        seed=5,
        regions=3,
        partitions=2,
        records=4000,
        keys=1500,
        batch_records=300,
        write_rate=[1000.0],
        heartbeat_every_records=150,
        heartbeat_every_ms=400,
        default_lag_ms=120,
        failover_delay_ms=250,
        faults={"failover": 2, "compaction": 1, "gap": 1, "corrupt": 1},
        step_records=1000,
        progress=False,
        workers="inline",
    )
    return run(cfg)


@pytest.fixture(scope="module")
def damaged(sim_run, tmp_path_factory):
    """A copy of the archives in which one leader PUT of a VT partition with no other fault is corrupted at rest
    (a real finding: CORRUPT at that segment's EndOfSegment): {region: archive dir}, and where the damage is."""
    t = sim_run.truth["run"]
    busy = {
        (f["region"], f["partition"])
        for f in sim_run.truth["faults"]
        if f["kind"] in ("failover", "compaction")
    }
    x, q = next((x, q) for x in range(t["regions"]) for q in range(t["partitions"]) if (x, q) not in busy)
    codec = E.EnvelopeCodec()
    target = tmp_path_factory.mktemp("damaged") / f"dc-{x}"
    first, end = archive.describe(sim_run.archives[x])[0].first_offset, None
    damaged_at = None
    with archive.ArchiveWriter(target) as w:
        for info in archive.describe(sim_run.archives[x]):
            for batch in archive.iter_partition(sim_run.archives[x], info.topic, info.partition):
                if (info.topic, info.partition) == (t["vt_topic"], q) and damaged_at is None:
                    rows = batch.to_pylist()
                    cut = info.first_offset + (info.last_offset - info.first_offset) * 6 // 10
                    for row in rows:
                        if row["offset"] >= cut and row["key"][0] == 0 and damaged_at is None:
                            env = codec.decode(row["value"], row["headers"])
                            if env["messageType"] == 0:
                                env["payloadUnion"][1]["putValue"] = env["payloadUnion"][1]["putValue"] + b"!"
                                row["value"] = codec.encode(env)
                                damaged_at = row["offset"]
                    batch = pa.RecordBatch.from_pylist(rows, schema=archive.KAFKA_ARROW_SCHEMA)
                w.append(batch)
    assert damaged_at is not None and first is not None and end is None
    return {**sim_run.archives, x: str(target)}, (x, q, damaged_at)


def restart_offsets(sim_run, x: int, q: int, first: int, end: int, damage: tuple) -> list[int]:
    """Offsets where a follower restarts: spread over the partition, around each failover (the old leader's
    segment is open there), and just before a compacted range or damaged record."""
    picked = {first + (end - first) * k // 9 for k in range(1, 9)}
    for f in sim_run.truth["faults"]:
        if f["region"] != x or f["partition"] != q:
            continue
        if f["kind"] == "failover":
            d = f["detail"]
            picked.update(
                {
                    d["resumed_from_vt_heartbeat_offset"] + 2,
                    d["first_vt_offset_of_new_term"] - 1,
                    d["first_vt_offset_of_new_term"] + 3,
                }
            )
        if f["kind"] == "compaction":
            lo = f["vt_offsets"][str(x)][0]
            picked.update({lo - 5, lo - 1})
    if damage[:2] == (x, q):
        picked.update({damage[2] - 7, damage[2] - 1})
    return sorted(o for o in picked if first <= o < end - 1)


def _keys(rows) -> set[tuple]:
    return {(r[3], r[4], r[7]) for r in rows}


def log_changed_at(sim_run, damage, x: int, q: int) -> int | None:
    """The first VT offset of (x, q) that differs from what its leader wrote (compaction, damage at rest)."""
    for f in sim_run.truth["faults"]:
        if f["kind"] == "compaction" and (f["region"], f["partition"]) == (x, q):
            return f["vt_offsets"][str(x)][0]
    return damage[2] if damage[:2] == (x, q) else None


def test_restored_followers_report_what_a_full_replay_reports_and_cold_ones_do_not(sim_run, damaged):
    archives, damage = damaged
    t = sim_run.truth["run"]
    topic = t["vt_topic"]
    counts: Counter = Counter()
    for x, path in archives.items():
        src = open_source(SourceSpec(x, path))
        for q in src.partitions(topic):
            first, end = src.bounds(topic, q)
            task = PartitionTask(x, topic, q, ValidatorConfig(now_ms=0))
            full = validate_partition(src, task, ValidateOptions(sources=[src.spec], out=""))
            changed = log_changed_at(sim_run, damage, x, q)
            eop = full.validator.eop_offset
            for o in restart_offsets(sim_run, x, q, eop + 1, end, damage):
                counts["restarts"] += 1
                after = [r for r in full.rows if r[3] > o]
                counts["real_findings_after_restart"] += len(after)
                restored = validate_partition(
                    src, task, ValidateOptions(sources=[src.spec], out="", restore_at=o)
                )
                hb = restored.summary.restored_from_heartbeat
                counts["from_heartbeat"] += hb is not None
                # never a finding the full replay does not report ...
                assert set(restored.rows) <= set(after), (x, q, o)
                # ... and exactly its findings unless the heartbeat vouches for records changed after it was
                # written (compaction, damage at rest): a heartbeat states the log as its leader wrote it
                if changed is None or hb is None or hb < changed:
                    assert restored.rows == after, (x, q, o)
                else:
                    counts["restored_missed_behind_changed_log"] += len(after) - len(restored.rows)

                cold = PartitionRun(x, topic, q, config=task.config)
                aware = PartitionRun(
                    x, topic, q, config=task.config, validator=PartitionValidator(config=task.config)
                )
                aware.validator.end_of_push = True  # knows End of Push passed, knows no producer
                for batch in src.iter_partition(topic, q, start=o + 1):
                    cold.feed(batch)
                    aware.feed(batch)
                for name, r in (("cold", cold), ("eop_only", aware)):
                    false, missed = _keys(r.rows) - _keys(after), _keys(after) - _keys(r.rows)
                    counts.update(f"{name}_false_{k[2]}" for k in false)
                    counts.update(f"{name}_missed_{k[2]}" for k in missed)
                    if name == "cold":
                        assert all(
                            f[8] for f in r.rows if f[7] != "DUPLICATE"
                        )  # it believes it is before EOP
                if damage[:2] == (x, q) and o < damage[2]:
                    counts["restarts_before_damage"] += 1
    print(dict(counts))
    assert counts["restarts"] >= 40 and counts["real_findings_after_restart"] > 0
    assert counts["from_heartbeat"] >= 0.8 * counts["restarts"]
    # a cold follower raises a false fatal alarm for every producer it joins mid-segment (at nearly every
    # restart: only a restart right where a new leader's first segment starts joins none) ...
    assert counts["cold_false_UNREGISTERED_PRODUCER"] >= 0.9 * counts["restarts"]
    assert {k for k in counts if k.startswith("cold_false_")} <= {
        "cold_false_UNREGISTERED_PRODUCER",
        "cold_false_MISSING",
    }
    # ... and stateless followers miss the damaged record inside the segment they joined mid-way
    assert counts["cold_missed_CORRUPT"] >= counts["restarts_before_damage"] > 0
    assert counts["eop_only_missed_CORRUPT"] >= counts["restarts_before_damage"]
    assert not any(k.startswith("eop_only_false_") for k in counts)


def test_with_compaction_tolerance_a_restored_follower_equals_the_full_run_everywhere(sim_run):
    """Venice tolerates compaction gaps: with that tolerance the compacted partition, too, resumes exactly."""
    t = sim_run.truth["run"]
    f = next(f for f in sim_run.truth["faults"] if f["kind"] == "compaction")
    x, q = f["region"], f["partition"]
    src = open_source(SourceSpec(x, sim_run.archives[x]))
    task = PartitionTask(x, t["vt_topic"], q, ValidatorConfig(now_ms=1 << 60, min_compaction_lag_ms=0))
    full = validate_partition(src, task, ValidateOptions(sources=[src.spec], out=""))
    first, end = src.bounds(t["vt_topic"], q)
    for o in range(first, end, 41):
        restored = validate_partition(src, task, ValidateOptions(sources=[src.spec], out="", restore_at=o))
        assert restored.rows == [r for r in full.rows if r[3] > o], o


def test_a_new_leader_gets_the_rt_state_a_full_rt_replay_gives(sim_run):
    """At every failover, restoring at the VT offset where the successor took over gives each region's RT state
    at its resume offset exactly as a replay of that RT from offset 0 does."""
    t = sim_run.truth["run"]
    failovers = [f for f in sim_run.truth["faults"] if f["kind"] == "failover"]
    assert len(failovers) == 2
    for f in failovers:
        x, q = f["region"], f["partition"]
        at = f["detail"]["first_vt_offset_of_new_term"] - 1
        vt_src = open_source(SourceSpec(x, sim_run.archives[x]))
        restored = restore_vt(source_reader(vt_src, t["vt_topic"], q), at)
        assert restored.heartbeat is not None
        for r, path in sim_run.archives.items():
            rt_src = open_source(SourceSpec(r, path))
            entry = restore_rt(restored, r, source_reader(rt_src, t["rt_topic"], q))
            assert entry.warning is None and entry.state_offset == entry.resume_offset
            replay = PartitionValidator(is_realtime=True)
            feeder = Replay(replay)
            for batch in rt_src.iter_partition(t["rt_topic"], q, end=entry.resume_offset + 1):
                feeder.feed(batch)
            assert entry.validator.producer_states() == replay.producer_states(), (f["id"], r)
            # the successor's own resume point (the heartbeat's watermark) is never beyond ours
            assert f["detail"]["resume_rt_positions"][r] - 1 <= entry.resume_offset
