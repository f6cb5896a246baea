"""The replication simulator, checked from the outside: its archives are read back with Venice's own schema file
(fastavro) and our protocol schemas from ../shared, and every claim is verified independently of the code that
wrote it — the heartbeat invariant (docs/design.md, rule 3) for every heartbeat, hbd against a replay of the RTs,
convergence of the regions, the findings each injected fault must cause, and determinism for a seed.

One small run with every fault kind (3 regions x 2 partitions, a few thousand writes) is shared by the module.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import defaultdict
from dataclasses import dataclass

import fastavro
import pytest

from div import archive
from div import envelope as E
from div import keys as K
from div.rmd import decode_rmd_vector
from div.validator import PartitionValidator, ValidatorConfig
from sim import QuietPeriod, SimConfig, run

pytestmark = [pytest.mark.kafka]

ALL_FAULTS = {
    "dropped": 2,
    "poisoned": 1,
    "failover": 1,
    "duplicate": 1,
    "gap": 1,
    "corrupt": 1,
    "compaction": 1,
    "broker": 1,
}


def small_config(out, **kw) -> SimConfig:
    base = dict(
        out=str(out),
        seed=11,
        regions=3,
        partitions=2,
        records=4000,
        keys=1500,
        batch_records=300,
        write_rate=[1000.0],
        heartbeat_every_records=150,
        heartbeat_every_ms=400,
        default_lag_ms=120,
        lag_ms={(0, 2): 350},
        quiet=[QuietPeriod(2, 0.3, 0.55, None)],
        failover_delay_ms=250,
        faults=dict(ALL_FAULTS),
        broker_down_s=0.5,
        step_records=1000,
        progress=False,
    )
    base.update(kw)
    return SimConfig(**base)


# A larger run with more of every fault, two failovers, long and short lags and a partial quiet period:
# the same checks, on more heartbeats and interleavings.
MEDIUM = dict(
    records=40_000,
    partitions=4,
    keys=20_000,
    batch_records=2_000,
    heartbeat_every_records=1_000,
    heartbeat_every_ms=5_000,
    default_lag_ms=200,
    lag_ms={(0, 2): 1500, (2, 1): 20},
    quiet=[QuietPeriod(1, 0.2, 0.5, (0, 1))],
    failover_delay_ms=3_000,
    step_records=20_000,
    faults={
        "dropped": 3,
        "poisoned": 2,
        "failover": 2,
        "duplicate": 2,
        "gap": 2,
        "corrupt": 2,
        "compaction": 1,
        "broker": 1,
    },
)


@pytest.fixture(scope="module", params=["small", pytest.param("medium", marks=pytest.mark.slow)])
def sim_run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / request.param
    cfg = small_config(out, **(MEDIUM if request.param == "medium" else {}))
    result = run(cfg)
    result.cfg = cfg
    result.name = request.param
    return result


# ---------------------------------------------------------------------------------------- independent reading
@dataclass
class Row:
    offset: int
    key: bytes
    value: bytes
    headers: dict
    ts_ms: int


def rows(arch: str, topic: str, partition: int) -> list[Row]:
    out = []
    for b in archive.iter_partition(arch, topic, partition):
        cols = b.to_pydict()
        stamps = b.column("timestamp").cast("int64").to_pylist()
        for off, k, v, h, ts in zip(
            cols["offset"], cols["key"], cols["value"], cols["headers"], stamps, strict=True
        ):
            out.append(Row(off, k, v, {e["key"]: e["value"] for e in h or []}, ts // 1000))
    return out


@pytest.fixture(scope="module")
def venice(shared_dir):
    """Decoders built from the reference schema files only."""

    def load(path):
        return fastavro.parse_schema(json.loads(path.read_text()))

    kme = load(shared_dir / "reference" / "schemas" / "KafkaMessageEnvelope.v14.avsc")
    hbw = load(shared_dir / "protocol" / "HeartbeatWatermarks.v1.avsc")
    hbd = load(shared_dir / "protocol" / "HeartbeatDivState.v1.avsc")

    def read(schema, data: bytes, magic: int, version: int) -> dict:
        assert data[0] == magic and data[1] == version, data[:2].hex()
        buf = io.BytesIO(data[2:])
        rec = fastavro.schemaless_reader(buf, schema, None, return_record_name=True)
        assert buf.tell() == len(data) - 2, "trailing bytes"
        return rec

    class V:
        def envelope(self, value: bytes) -> dict:
            return read(kme, value, 23, 14)

        def hbw(self, data: bytes) -> dict:
            return read(hbw, data, 0x48, 1)

        def hbd(self, data: bytes) -> dict:
            return read(hbd, data, 0x44, 1)

    return V()


@dataclass
class VtRecord:
    offset: int
    kind: str  # PUT, DELETE, HB, CONTROL
    key: bytes  # key content
    value: bytes | None
    source: int  # footer upstreamKafkaClusterId
    upstream: int  # footer upstreamOffset
    host: str
    guid: bytes
    hbw: dict | None
    hbd: dict | None
    env: dict
    headers: dict
    rmd: bytes | None


_BRANCH = {
    "com.linkedin.venice.kafka.protocol.Put": "PUT",
    "com.linkedin.venice.kafka.protocol.Delete": "DELETE",
    "com.linkedin.venice.kafka.protocol.ControlMessage": "CONTROL",
}


def vt_records(run_result, venice, region: int, partition: int) -> list[VtRecord]:
    truth = run_result.truth["run"]
    out = []
    for row in rows(run_result.archives[region], truth["vt_topic"], partition):
        env = venice.envelope(row.value)
        branch, body = env["payloadUnion"]
        kind = _BRANCH[branch]
        footer = env["leaderMetadataFooter"][1]
        hbw = hbd = None
        if row.key == K.HEARTBEAT_KEY:
            kind = "HB"
            hbw = venice.hbw(row.headers["hbw"])
            hbd = venice.hbd(row.headers["hbd"])
        out.append(
            VtRecord(
                row.offset,
                kind,
                row.key[1:],
                body.get("putValue"),
                footer["upstreamKafkaClusterId"],
                footer["upstreamOffset"],
                footer["hostName"],
                env["producerMetadata"]["producerGUID"],
                hbw,
                hbd,
                env,
                row.headers,
                body.get("replicationMetadataPayload"),
            )
        )
    return out


@pytest.fixture(scope="module")
def vts(sim_run, venice):
    t = sim_run.truth["run"]
    return {
        (x, q): vt_records(sim_run, venice, x, q) for x in range(t["regions"]) for q in range(t["partitions"])
    }


def leader_data(recs: list[VtRecord]) -> list[VtRecord]:
    return [r for r in recs if r.kind in ("PUT", "DELETE") and r.source >= 0]


# ---------------------------------------------------------------------------------------- wire format
def test_every_vt_record_decodes_with_venices_v14_schema(sim_run, vts):
    total = sum(len(v) for v in vts.values())
    assert total > 3 * 3000
    for recs in vts.values():
        kinds = {r.kind for r in recs}
        assert {"PUT", "DELETE", "HB", "CONTROL"} <= kinds


def test_heartbeats_have_venices_shape(sim_run, vts):
    t = sim_run.truth["run"]
    rt_keys = {}
    for x in range(t["regions"]):
        for q in range(t["partitions"]):
            rt_keys[(x, q)] = {r.offset: r.key for r in rows(sim_run.archives[x], t["rt_topic"], q)}
    for (_, q), recs in vts.items():
        for r in (r for r in recs if r.kind == "HB"):
            pm = r.env["producerMetadata"]
            assert r.env["messageType"] == 2
            assert pm["producerGUID"] == K.HEARTBEAT_GUID and pm["segmentNumber"] == 0
            assert pm["messageSequenceNumber"] == 0 and pm["logicalTimestamp"] == -1
            cm = r.env["payloadUnion"][1]
            assert cm["controlMessageType"] == 2 and cm["debugInfo"] == {}
            assert cm["controlMessageUnion"][1] == {"checksumType": 4, "upcomingAggregates": []}
            assert set(r.headers) == {"vtp", "lcs", "hbw", "hbd"} and len(r.headers["lcs"]) == 1
            assert 0 <= r.source < t["regions"]
            assert r.hbw["originRegionId"] == r.source and r.hbw["originRtOffset"] == r.upstream
            assert rt_keys[(r.source, q)][r.upstream] == K.HEARTBEAT_KEY  # it copies a real RT heartbeat
            assert r.hbw["leaderHostName"] == r.host


def test_every_partition_has_heartbeats_from_every_region(sim_run, vts):
    t = sim_run.truth["run"]
    for recs in vts.values():
        origins = {r.source for r in recs if r.kind == "HB"}
        assert origins == set(range(t["regions"]))
    failover = next(f for f in sim_run.truth["faults"] if f["kind"] == "failover")
    recs = vts[(failover["region"], failover["partition"])]
    terms = {r.hbw["termId"] for r in recs if r.kind == "HB"}
    assert terms == {1, 2}, "heartbeats from the failed leader's term and from its successor's"


# ---------------------------------------------------------------------------------------- docs/design.md, rule 3
def rule3_violations(recs: list[VtRecord], regions: int) -> tuple[list[str], int]:
    """docs/design.md, rule 3 checked on one VT partition: for a heartbeat H with vector V, no record derived from RT[r]
    offset <= V[r] comes after H; V never decreases (within a term, and across terms since a successor resumes
    from the last heartbeat); V[origin] >= originRtOffset. Returns (violations, heartbeats checked)."""
    problems: list[str] = []
    data = leader_data(recs)
    hbs = [r for r in recs if r.kind == "HB"]
    min_after = [float("inf")] * regions
    j = len(data) - 1
    for h in reversed(hbs):
        while j >= 0 and data[j].offset > h.offset:
            min_after[data[j].source] = min(min_after[data[j].source], data[j].upstream)
            j -= 1
        v = h.hbw["upstreamHighWatermarks"]
        if len(v) != regions:
            problems.append(f"H@{h.offset}: vector {v} has {len(v)} entries")
            continue
        for r in range(regions):
            if not min_after[r] > v[r]:
                problems.append(
                    f"H@{h.offset}: V[{r}]={v[r]} but a later record comes from RT[{r}] offset {min_after[r]}"
                )
        if v[h.hbw["originRegionId"]] < h.hbw["originRtOffset"]:
            problems.append(f"H@{h.offset}: V[origin] {v} below the origin offset {h.hbw['originRtOffset']}")
    last_by_term: dict[int, list[int]] = {}
    prev = None
    for h in hbs:
        v = h.hbw["upstreamHighWatermarks"]
        before = last_by_term.get(h.hbw["termId"])
        if before is not None and not all(a <= b for a, b in zip(before, v, strict=True)):
            problems.append(f"H@{h.offset}: V decreased within term {h.hbw['termId']}: {before} -> {v}")
        if prev is not None and not all(a <= b for a, b in zip(prev, v, strict=True)):
            problems.append(f"H@{h.offset}: V decreased across terms: {prev} -> {v}")
        last_by_term[h.hbw["termId"]] = prev = v
    return problems, len(hbs)


def test_heartbeat_invariant_holds_for_every_heartbeat(sim_run, vts):
    checked = 0
    for (x, q), recs in vts.items():
        problems, n = rule3_violations(recs, sim_run.truth["run"]["regions"])
        assert problems == [], (x, q, problems[:5])
        checked += n
    assert checked >= 6 * 6


def test_the_rule3_checker_catches_violations(sim_run, vts):
    """Guard against a vacuous checker: move a data record after the heartbeat that claims it."""
    recs = list(vts[(0, 0)])
    i = next(
        i
        for i, r in enumerate(recs)
        if r.kind == "HB" and i > 0 and any(p.kind in ("PUT", "DELETE") and p.source >= 0 for p in recs[:i])
    )
    j = max(k for k in range(i) if recs[k].kind in ("PUT", "DELETE") and recs[k].source >= 0)
    moved = recs[j]
    swapped = recs[:j] + recs[j + 1 : i + 1] + [moved] + recs[i + 1 :]
    for pos, r in enumerate(swapped):  # keep offsets increasing as the checker reads them
        swapped[pos] = VtRecord(**{**r.__dict__, "offset": pos})
    problems, _ = rule3_violations(swapped, 3)
    assert any(f"later record comes from RT[{moved.source}] offset {moved.upstream}" in p for p in problems)


def test_hbd_matches_a_replay_of_the_rts_and_the_vt(sim_run, vts):
    """hbd.rtProducerStates[r] == RT[r] replayed up to V[r]; hbd.vtProducerStates == VT replayed up to H."""
    t = sim_run.truth["run"]
    codec = E.EnvelopeCodec()
    compaction = next(f for f in sim_run.truth["faults"] if f["kind"] == "compaction")
    compacted_from = {(compaction["region"], compaction["partition"]): compaction["detail"]["range"][0]}
    rt_rows = {
        (r, q): rows(sim_run.archives[r], t["rt_topic"], q)
        for r in range(t["regions"])
        for q in range(t["partitions"])
    }
    compared = 0
    for (x, q), recs in vts.items():
        hbs = [r for r in recs if r.kind == "HB"]
        # RT side: one validator per source region, advanced monotonically (V never decreases here).
        validators = [PartitionValidator(is_realtime=True) for _ in range(t["regions"])]
        pos = [0] * t["regions"]
        vt_val = PartitionValidator()
        vt_rows = rows(sim_run.archives[x], t["vt_topic"], q)
        vt_pos = 0
        for h in hbs:
            v = h.hbw["upstreamHighWatermarks"]
            for r in range(t["regions"]):
                src = rt_rows[(r, q)]
                while pos[r] < len(src) and src[pos[r]].offset <= v[r]:
                    row = src[pos[r]]
                    env = codec.decode(row.value, list(row.headers.items()))
                    validators[r].process(row.offset, row.key, env, row.ts_ms, len(row.value))
                    pos[r] += 1
                claimed = {e["regionId"]: e["producerStates"] for e in h.hbd["rtProducerStates"]}[r]
                replayed = {g.decode("latin-1"): s for g, s in validators[r].producer_states().items()}
                assert claimed == replayed, (x, q, h.offset, r)
            if h.offset < compacted_from.get((x, q), float("inf")):
                while vt_rows[vt_pos].offset < h.offset:
                    row = vt_rows[vt_pos]
                    vt_val.process(row.offset, row.key, codec.decode(row.value), row.ts_ms, len(row.value))
                    vt_pos += 1
                replayed_vt = {g.decode("latin-1"): s for g, s in vt_val.producer_states().items()}
                assert h.hbd["vtProducerStates"] == replayed_vt, (x, q, h.offset)
            assert h.hbd["truncated"] is False
            compared += 1
    assert compared >= 36


# ---------------------------------------------------------------------------------------- truth and faults
def test_truth_lists_every_fault_with_its_fields(sim_run):
    truth, cfg = sim_run.truth, sim_run.cfg
    assert truth["run"]["seed"] == cfg.seed and truth["run"]["regions"] == cfg.regions
    assert truth["run"]["partitions"] == cfg.partitions and truth["run"]["records"] == cfg.records
    assert truth["run"]["store"] == "sim_store" and truth["run"]["version"] == 1
    kinds = defaultdict(int)
    for f in truth["faults"]:
        kinds[f["kind"]] += 1
        assert set(f) >= {"kind", "region", "partition", "key", "rt_offset", "vt_offsets", "detail", "expect"}
        assert set(f["expect"]) == {"leapfrog", "div"}
        if f["kind"] in ("dropped", "poisoned", "duplicate", "gap", "corrupt"):
            assert isinstance(f["rt_offset"], int) and bytes.fromhex(f["key"])
            assert 0 <= f["partition"] < cfg.partitions
    assert dict(kinds) == cfg.faults
    assert truth["faults_shortfall"] == {}
    for qp in cfg.quiet:
        q = truth["regions"][qp.region]["quiet_periods"]
        assert q and q[0]["from"] == qp.start and q[0]["to"] == qp.end
    for x in range(cfg.regions):
        assert truth["regions"][x]["lag_ms_from"] == {str(r): cfg.lag(r, x) for r in range(cfg.regions)}


def test_rt_div_findings_are_exactly_the_expected_ones(sim_run):
    """Replay every RT archive with DIV: the findings are exactly those the truth expects (and what the leaders
    reported while running)."""
    t = sim_run.truth["run"]
    codec = E.EnvelopeCodec()
    found = set()
    for r in range(t["regions"]):
        for q in range(t["partitions"]):
            val = PartitionValidator(is_realtime=True)
            for row in rows(sim_run.archives[r], t["rt_topic"], q):
                env = codec.decode(row.value, list(row.headers.items()))
                for f in val.process(row.offset, row.key, env, row.ts_ms, len(row.value)):
                    found.add((r, t["rt_topic"], q, f.offset, f.type, f.fatal))
    expected = {
        (e["region"], e["topic"], e["partition"], e["offset"], e["type"], e["fatal"])
        for f in sim_run.truth["faults"]
        for e in f["expect"]["div"]
    }
    assert found == expected
    assert {e[4] for e in expected} == {"MISSING", "CORRUPT", "DUPLICATE"}
    by_type = defaultdict(int)
    for e in expected:
        by_type[f"rt{e[0]}:{e[4]}"] += 1
    for x in range(t["regions"]):
        reported = sim_run.summary["leaders"][str(x)]["rt_div_findings"]
        # every leader validates every RT; the failed leader's successor re-validates from its heartbeat
        assert set(reported) == set(by_type)
        assert all(reported[k] >= by_type[k] for k in by_type)


def test_followers_and_vt_div_are_clean(sim_run, vts):
    t = sim_run.truth["run"]
    for x in range(t["regions"]):
        assert sim_run.summary["followers"][str(x)]["div_findings"] == {}
        assert sim_run.summary["followers"][str(x)]["checkpoints"] >= t["partitions"]
    compaction = next(f for f in sim_run.truth["faults"] if f["kind"] == "compaction")
    codec = E.EnvelopeCodec()
    for x in range(t["regions"]):
        for q in range(t["partitions"]):
            strict = PartitionValidator()
            tolerant = PartitionValidator(config=ValidatorConfig(min_compaction_lag_ms=0, now_ms=t["end_ms"]))
            strict_found, tolerant_found = [], []
            for row in rows(sim_run.archives[x], t["vt_topic"], q):
                env = codec.decode(row.value)
                strict_found += strict.process(row.offset, row.key, env, row.ts_ms, len(row.value))
                tolerant_found += tolerant.process(row.offset, row.key, env, row.ts_ms, len(row.value))
            assert tolerant_found == []
            if (x, q) == (compaction["region"], compaction["partition"]):
                assert strict_found, "the compacted range shows as gaps without compaction tolerance"
            else:
                assert strict_found == []


def test_follower_checkpoints_hold_offset_and_div_state_together(sim_run):
    from pathlib import Path

    from div.checkpoint import CheckpointStore

    t = sim_run.truth["run"]
    codec = E.EnvelopeCodec()
    compacted = {(f["region"], f["partition"]) for f in sim_run.truth["faults"] if f["kind"] == "compaction"}
    for x in range(t["regions"]):
        store = CheckpointStore(Path(sim_run.out) / "followers" / f"dc-{x}")
        for q in range(t["partitions"]):
            state = store.load(t["vt_topic"], q)
            end = t["end_offsets"][str(x)][f"{t['vt_topic']}[{q}]"]
            assert state["offset"] == end - 1 and state["endOfPush"] is True
            if (x, q) in compacted:
                continue  # the follower read the VT before the archive was compacted
            val = PartitionValidator()
            for row in rows(sim_run.archives[x], t["vt_topic"], q):
                val.process(row.offset, row.key, codec.decode(row.value), row.ts_ms, len(row.value))
            replayed = {g.decode("latin-1"): st for g, st in val.producer_states().items()}
            assert {
                k: {f: v[f] for f in st}
                for k, v in state["producerStates"].items()
                for st in [replayed.get(k, {})]
            } == replayed


def _final_values(recs: list[VtRecord]) -> dict[bytes, bytes | None]:
    final: dict[bytes, bytes | None] = {}
    for r in recs:
        if r.kind == "PUT":
            final[r.key] = r.value
        elif r.kind == "DELETE":
            final[r.key] = None
    return final


def test_regions_converge_except_on_dropped_and_poisoned_keys(sim_run, vts):
    t = sim_run.truth["run"]
    faults = sim_run.truth["faults"]
    for q in range(t["partitions"]):
        finals = [_final_values(vts[(x, q)]) for x in range(t["regions"])]
        keys = set().union(*finals)
        bad = {k for k in keys if len({f.get(k) for f in finals}) > 1}
        expected_bad = {
            bytes.fromhex(f["key"])
            for f in faults
            if f["kind"] in ("dropped", "poisoned") and f["partition"] == q
        }
        assert bad == expected_bad, q
        for f in faults:
            if f["kind"] not in ("dropped", "poisoned") or f["partition"] != q:
                continue
            key = bytes.fromhex(f["key"])
            if f["kind"] == "dropped":
                origin = f["region"]
                assert list(f["vt_offsets"]) == [str(origin)]
                held = {x: finals[x].get(key) for x in range(t["regions"])}
                assert all(held[x] != held[origin] for x in f["detail"]["dropped_in"])
                for x in f["detail"]["dropped_in"]:  # the dropping leaders wrote nothing for it...
                    assert not any(r.source == origin and r.upstream == f["rt_offset"] for r in vts[(x, q)])
                    # ...but their heartbeats claim it: covered, so Leap Frog can see the divergence
                    last = [r for r in vts[(x, q)] if r.kind == "HB"][-1]
                    assert last.hbw["upstreamHighWatermarks"][origin] >= f["rt_offset"]
                assert (held[f["detail"]["dropped_in"][0]] is not None) == f["detail"]["key_had_value_before"]
                # a value only from the batch load is invisible to Leap Frog's post-EOP scan: MISSING there
                d = f["detail"]
                assert d["key_had_value_before"] or not d["key_had_online_value_before"]
                want = "VALUE_MISMATCH" if d["key_had_online_value_before"] else "MISSING"
                assert all(e["type"].startswith(want) for e in f["expect"]["leapfrog"])
            else:
                x = f["detail"]["poisoned_in"]
                assert set(f["vt_offsets"]) == {str(r) for r in range(t["regions"])}
                others = {finals[y].get(key) for y in range(t["regions"]) if y != x}
                assert len(others) == 1 and finals[x].get(key) not in others


def test_ties_are_resolved_by_venices_merge_in_every_region(tmp_path, venice):
    """Few keys and many writes a millisecond, so that writes of one key often share a logical timestamp: every
    region's final record of a key is the write Venice's merge (`leapfrog.repair.dcr_apply`) keeps among that
    key's RT writes (no failover, so no replay), and some of those ties are ones the old (region, RT offset)
    order decided otherwise."""
    from leapfrog.repair import DELETE, PUT, Record, dcr_apply

    result = run(
        small_config(
            tmp_path / "ties",
            faults={},
            records=3000,
            keys=60,
            batch_records=0,
            write_rate=[20000.0],
            quiet=[],
            workers="inline",
        )
    )
    t = result.truth["run"]
    old_rule_differs = ties = 0
    for q in range(t["partitions"]):
        writes: dict[bytes, list[Record]] = defaultdict(list)
        for r in range(t["regions"]):
            for row in rows(result.archives[r], t["rt_topic"], q):
                if row.key == K.HEARTBEAT_KEY:
                    continue
                env = venice.envelope(row.value)
                branch, body = env["payloadUnion"]
                kind = _BRANCH[branch]
                if kind == "CONTROL":
                    continue
                pm = env["producerMetadata"]
                ts = pm["logicalTimestamp"] if pm["logicalTimestamp"] >= 0 else pm["messageTimestamp"]
                value = body["putValue"] if kind == "PUT" else None
                writes[row.key[1:]].append(
                    Record(PUT if value is not None else DELETE, value, ts, r, row.offset)
                )
        expected: dict[bytes, bytes | None] = {}
        for key, ws in writes.items():
            stored = None
            for w in ws:
                stored = dcr_apply(stored, w)
            expected[key] = stored.value if stored.op == PUT else None
            top = [w for w in ws if w.logical_ts == stored.logical_ts]
            ties += len(top) > 1
            old_winner = max(top, key=lambda w: (w.region, w.offset))
            old_rule_differs += old_winner.content != stored.content
        for x in range(t["regions"]):
            finals = _final_values(leader_data(vt_records(result, venice, x, q)))
            assert finals == expected, (x, q)
    print(
        f"keys whose winner had an equal-timestamp rival: {ties}; the old order picked another: {old_rule_differs}"
    )
    assert ties > 0 and old_rule_differs > 0, (ties, old_rule_differs)


def test_archives_are_complete(sim_run):
    t = sim_run.truth["run"]
    removed = {
        (f["region"], f["partition"]): set(f["detail"]["removed_offsets"])
        for f in sim_run.truth["faults"]
        if f["kind"] == "compaction"
    }
    assert removed and all(removed.values())
    for x in range(t["regions"]):
        infos = {(i.topic, i.partition): i for i in archive.describe(sim_run.archives[x])}
        for topic in (t["rt_topic"], t["vt_topic"]):
            for q in range(t["partitions"]):
                end = t["end_offsets"][str(x)][f"{topic}[{q}]"]
                offsets = [r.offset for r in rows(sim_run.archives[x], topic, q)]
                gone = removed.get((x, q), set()) if topic == t["vt_topic"] else set()
                assert offsets == [o for o in range(end) if o not in gone]
                assert infos[(topic, q)].records == end - len(gone)
    assert sim_run.summary["archive"]["complete"] is True


def test_compaction_removed_only_superseded_records(sim_run):
    t = sim_run.truth["run"]
    f = next(f for f in sim_run.truth["faults"] if f["kind"] == "compaction")
    first, last = f["detail"]["range"]
    recs = rows(sim_run.archives[f["region"]], t["vt_topic"], f["partition"])
    kept_keys_after = defaultdict(list)
    for r in recs:
        kept_keys_after[r.key].append(r.offset)
    assert all(first <= o <= last for o in f["detail"]["removed_offsets"])
    # every kept record inside the range is the last of its key there (anything older was superseded)
    for r in recs:
        if first <= r.offset <= last:
            assert max(kept_keys_after[r.key]) == r.offset or r.key[0] == 2 and r.key != K.HEARTBEAT_KEY


def test_failover_resumes_from_the_last_heartbeat_with_a_new_term(sim_run, vts):
    f = next(f for f in sim_run.truth["faults"] if f["kind"] == "failover")
    d = f["detail"]
    assert d["new_leader"]["term"] == d["old_leader"]["term"] + 1
    assert d["new_leader"]["guid"] != d["old_leader"]["guid"]
    assert d["resumed_from_vt_heartbeat_offset"] is not None
    recs = vts[(f["region"], f["partition"])]
    removed = {
        o
        for c in sim_run.truth["faults"]
        if c["kind"] == "compaction" and (c["region"], c["partition"]) == (f["region"], f["partition"])
        for o in c["detail"]["removed_offsets"]
    }
    if d["resumed_from_vt_heartbeat_offset"] not in removed:  # a compaction fault may have removed it since
        hb = next(r for r in recs if r.offset == d["resumed_from_vt_heartbeat_offset"])
        assert [m + 1 for m in hb.hbw["upstreamHighWatermarks"]] == d["resume_rt_positions"]
    data = leader_data(recs)
    old = [r for r in data if r.guid.hex() == d["old_leader"]["guid"]]
    new = [r for r in data if r.guid.hex() == d["new_leader"]["guid"]]
    assert old and new and old[-1].offset < new[0].offset
    assert (
        min(r.offset for r in recs if r.guid.hex() == d["new_leader"]["guid"])
        == d["first_vt_offset_of_new_term"]
    )
    coords = defaultdict(int)
    for r in data:
        coords[(r.source, r.upstream)] += 1
    duplicates = sum(1 for c in coords.values() if c > 1)
    assert duplicates == d["reapplied_vt_records"] > 0, (
        "the successor re-applied writes (duplicates in the VT)"
    )


# ---------------------------------------------------------------------------------------- determinism
def _archive_digest(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    for b in archive.iter_archive(path):
        for row in b.to_pylist():
            h.update(repr(row).encode())
            n += 1
    return h.hexdigest(), n


def test_same_seed_gives_identical_archives_and_truth(sim_run, tmp_path):
    """Same seed and settings, the other worker mode (inline instead of processes): same bytes everywhere,
    Kafka timestamps included."""
    if sim_run.name != "small":
        pytest.skip("determinism is checked on the small run")
    again = run(small_config(tmp_path / "again", workers="inline"))
    for x in range(3):
        assert _archive_digest(again.archives[x]) == _archive_digest(sim_run.archives[x])
    assert again.truth == sim_run.truth


def test_another_seed_gives_other_archives(sim_run, tmp_path):
    other = run(small_config(tmp_path / "other", seed=12, faults={}, records=1500, workers="inline"))
    assert _archive_digest(other.archives[0])[0] != _archive_digest(sim_run.archives[0])[0]


# ---------------------------------------------------------------------------------------- legacy RMD
def test_legacy_rmd_vectors_and_their_cost(tmp_path, venice):
    plain = run(small_config(tmp_path / "plain", faults={}, records=1500, workers="inline"))
    legacy = run(
        small_config(tmp_path / "legacy", faults={}, records=1500, legacy_rmd=True, workers="inline")
    )
    t = legacy.truth["run"]
    for x in range(t["regions"]):
        for q in range(t["partitions"]):
            vectors: dict[bytes, list[int]] = {}
            for r in leader_data(vt_records(legacy, venice, x, q)):
                vec = decode_rmd_vector(r.rmd)
                # Venice's rule: the previous vector of the key, the record's region slot set to its RT offset
                expected = list(vectors.get(r.key, []))
                expected += [0] * (r.source + 1 - len(expected))
                expected[r.source] = r.upstream
                assert vec == expected
                vectors[r.key] = vec
            for r in leader_data(vt_records(plain, venice, x, q)):
                assert decode_rmd_vector(r.rmd) == []
    pm, lm = plain.summary["metadata_bytes"], legacy.summary["metadata_bytes"]
    assert pm["vt_data_records"] == lm["vt_data_records"]
    assert pm["footer_bytes"] == lm["footer_bytes"]
    assert lm["rmd_bytes"] > pm["rmd_bytes"] + 2 * lm["vt_data_records"]
    assert (
        pm["per_record"]["rmd"] == 10.0
    )  # version id, length, timestamp branch, 6-byte timestamp, empty array


# ---------------------------------------------------------------------------------------- given clusters
def test_runs_against_given_clusters_with_existing_empty_topics(tmp_path):
    """The --kafka REGION=BOOTSTRAP path: clusters the simulator did not start, topics created beforehand (the
    mock cluster refuses AdminClient topic creation, so this also covers "use an existing empty topic")."""
    from sim.cluster import ClusterError
    from sim.embedded_kafka import EmbeddedKafka

    clusters = [EmbeddedKafka() for _ in range(2)]
    try:
        for k in clusters:
            k.create_topic("given_rt", 2)
            k.create_topic("given_v1", 2)
        boots = {i: k.bootstrap_servers for i, k in enumerate(clusters)}
        result = run(
            small_config(
                tmp_path / "given",
                store="given",
                regions=2,
                records=1200,
                lag_ms={},
                quiet=[],
                faults={"broker": 1, "dropped": 1},
                kafka=boots,
                kafka_conf={"client.id": "tidegauge-sim-test"},
                workers="inline",
            )
        )
        truth = result.truth
        assert truth["run"]["kafka"] == {str(i): b for i, b in boots.items()}
        broker = next(f for f in truth["faults"] if f["kind"] == "broker")
        assert "skipped" in broker["detail"]  # cannot take a broker of someone else's cluster down
        assert result.summary["archive"]["complete"] is True
        assert all(v > 1000 for v in result.summary["vt_records_per_region"].values())
        # a second run on the same, now non-empty, topics is refused: offsets could not be predicted
        with pytest.raises(ClusterError, match="given_rt .* is not empty"):
            run(
                small_config(
                    tmp_path / "again",
                    store="given",
                    regions=2,
                    records=100,
                    lag_ms={},
                    quiet=[],
                    faults={},
                    kafka=boots,
                    workers="inline",
                )
            )
    finally:
        for k in clusters:
            k.close()
