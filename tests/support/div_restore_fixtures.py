"""Acceptance scenarios for DIV restore, built outside the product: RTs of several regions and the VT a leader
writes from them, with heartbeats carrying `hbw`/`hbd`, leader failovers, faults, and an independent oracle of
the DIV state a consumer holds at every offset.

Records come from `venice_reference` (an independent Venice producer; it imports nothing from `div`). The
oracle (`RefConsumer`) follows the reference venice-protocol-notes §3.3 for the situations the scenarios contain (in-order
records, sequence gaps, duplicates, skipped segments, producers first seen mid-segment, checksum mismatches) and
computes ProducerPartitionState dicts from the records' own bytes decoded with Venice's schema. The only product
code used is the `hbw`/`hbd` header codec, to write the heartbeat headers.

A scenario's VT: a push job (with a gap before End of Push: fatal findings), then leader terms. The leader of a
term consumes the RTs in a seeded interleaving, writes a PUT/DELETE (its own DIV, footer = RT region and offset)
for every RT data record the RT oracle does not drop as a duplicate, and a VT heartbeat for every RT heartbeat:
`hbw` = what it processed per region, `hbd` = the oracle's VT state just before the heartbeat and each region's
RT oracle state at the watermark. A failover stops a leader without EndOfSegment (mid-segment) and starts the
next term from its last heartbeat (the RTs re-read from the watermarks + 1, so some writes are applied twice).
Also in the VT: a producer without checksums, a producer first seen mid-segment, a dropped, a duplicated and a
corrupted leader record, and heartbeats that cannot be restored from (plain Venice, truncated `hbd`, broken
`hbd`).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field

import venice_reference as V

from div.heartbeat_headers import DivState, Watermarks, encode_hbd, encode_hbw

STORE = "rs"
VT = f"{STORE}_v1"
RT = f"{STORE}_rt"
START_MS = 1_700_000_000_000
MASK64 = 0xFFFFFFFFFFFFFFFF


def guid(*parts: int) -> bytes:
    return zlib.crc32(repr(parts).encode()).to_bytes(4, "big") * 4


# ------------------------------------------------------------------------------------------------ the oracle


@dataclass
class _Seg:
    number: int
    seq: int
    ctype: int
    registered: bool
    ts: int
    adhash: int = 0
    ended: bool = False
    final: bool = False


def _feeds(env: dict, key_content: bytes) -> list[bytes] | None:
    """Checksum feeds of venice-protocol-notes §2.3; None for an EndOfSegment (it verifies instead of feeding)."""
    mt = env["messageType"]
    name, body = env["payloadUnion"]
    if mt == V.PUT:
        return [V.i32(V.PUT), key_content, V.i32(body["schemaId"]), body["putValue"]]
    if mt == V.DELETE:
        return [V.i32(V.DELETE), key_content]
    ctype = body["controlMessageType"]
    if ctype == V.EOS:
        return None
    return [V.i32(V.CONTROL), V.i32(ctype)]


class RefConsumer:
    """Consumer DIV state per producer GUID, from the notes' rules, for the record kinds the scenarios use."""

    def __init__(self) -> None:
        self.segs: dict[bytes, _Seg] = {}

    def _start(self, g: bytes, pm: dict, env: dict) -> _Seg:
        name, body = env["payloadUnion"]
        is_sos = env["messageType"] == V.CONTROL and body["controlMessageType"] == V.SOS
        ctype = body["controlMessageUnion"][1]["checksumType"] if is_sos else V.NONE
        seg = _Seg(pm["segmentNumber"], pm["messageSequenceNumber"], ctype, is_sos, pm["messageTimestamp"])
        self.segs[g] = seg
        return seg

    def consume(self, key: bytes, value: bytes) -> None:
        if key in (V.HB_KEY, V.DOL_KEY):
            return
        env = V.decode_envelope(value)
        pm = env["producerMetadata"]
        g, n, s, ts = (
            pm["producerGUID"],
            pm["segmentNumber"],
            pm["messageSequenceNumber"],
            pm["messageTimestamp"],
        )
        seg = self.segs.get(g)
        if seg is None or n > seg.number:  # new producer, next segment, or skipped segments: (re)start
            seg = self._start(g, pm, env)
        elif n < seg.number or s <= seg.seq:
            return  # a duplicate: nothing changes
        else:
            seg.seq = s  # the next in sequence, or the first after a gap (resynchronised)
        feeds = _feeds(env, key[1:])
        if feeds is None:  # EndOfSegment ends the segment whatever its checksum says
            seg.ended = True
            seg.final = env["payloadUnion"][1]["controlMessageUnion"][1]["finalSegment"]
        elif seg.registered and seg.ctype == V.ADHASH:
            for f in feeds:
                seg.adhash = (seg.adhash + zlib.crc32(f)) & MASK64
        seg.ts = ts

    def states(self) -> dict[bytes, dict]:
        """ProducerPartitionState dicts (Venice's checkpoint form), keyed by GUID."""
        out = {}
        for g, seg in self.segs.items():
            status = 1 if not seg.ended else (3 if seg.final else 2)
            out[g] = {
                "segmentNumber": seg.number,
                "segmentStatus": status,
                "isRegistered": seg.registered,
                "messageSequenceNumber": seg.seq,
                "messageTimestamp": seg.ts,
                "checksumType": seg.ctype if seg.registered else V.NONE,
                "checksumState": seg.adhash.to_bytes(8, "big")
                if seg.registered and seg.ctype == V.ADHASH
                else b"",
                "aggregates": {},
                "debugInfo": {},
            }
        return out


# ------------------------------------------------------------------------------------------------ scenarios


def with_footer(rec: V.Rec, host: str, region: int, offset: int) -> V.Rec:
    """The record with a leader footer pointing at RT `region` offset `offset` (the footer is not checksummed)."""
    env = V.decode_envelope(rec.value)
    env["leaderMetadataFooter"] = (
        V.NS + "LeaderMetadata",
        {
            "hostName": host,
            "upstreamOffset": offset,
            "upstreamKafkaClusterId": region,
            "upstreamPubSubPosition": b"",
            "termId": -1,
            "upstreamMessageTimestamp": -1,
        },
    )
    return rec.replace(value=V.encode_envelope(env))


def corrupt_value(rec: V.Rec) -> V.Rec:
    env = V.decode_envelope(rec.value)
    name, body = env["payloadUnion"]
    env["payloadUnion"] = (name, {**body, "putValue": body["putValue"] + b"!"})
    return rec.replace(value=V.encode_envelope(env), label=rec.label + "-corrupt")


@dataclass
class Scenario:
    regions: int
    rts: dict[int, list[V.Rec]]  # region -> RT records (offset = index)
    vt: list[V.Rec]  # offset = index
    vt_states: list[dict[bytes, dict]]  # oracle VT state after each offset
    rt_states: dict[int, list[dict[bytes, dict]]]  # oracle RT state after each offset
    heartbeats: dict[int, str] = field(default_factory=dict)  # VT offset -> "usable" | why not
    eop_offset: int = -1
    failover_offsets: list[int] = field(default_factory=list)  # first VT offset of each new term

    def write(self, root) -> tuple[str, dict[int, str]]:
        """(VT archive dir, {region: RT archive dir}) written with pyarrow alone."""
        vt_dir = str(root / "vt")
        V.write_archive(vt_dir, VT, 0, list(enumerate(self.vt)))
        rt_dirs = {}
        for r, recs in self.rts.items():
            rt_dirs[r] = str(root / f"rt-{r}")
            V.write_archive(rt_dirs[r], RT, 0, list(enumerate(recs)))
        return vt_dir, rt_dirs


def _rt_streams(rng: random.Random, regions: int, per_region: int, hb_every: int) -> dict[int, list[V.Rec]]:
    rts: dict[int, list[V.Rec]] = {}
    for r in range(regions):
        prods = [
            V.RefProducer(guid(1, r, i), V.ADHASH, host=f"rt-producer-{r}-{i}", start_ms=START_MS + 7 * i)
            for i in range(2)
        ]
        out: list[V.Rec] = []
        writes = 0
        while writes < per_region:
            p = rng.choice(prods)
            if p.open and rng.random() < 0.04:
                out += p.end_segment(final=False)
            elif rng.random() < 0.1:
                out += p.delete(f"k{rng.randrange(60)}".encode())
                writes += 1
            else:
                out += p.put(f"k{rng.randrange(60)}".encode(), f"v{r}-{writes}".encode())
                writes += 1
            if writes % hb_every == 0 and out[-1].label != "HB":
                out.append(V.heartbeat(START_MS + len(out), host=f"leader-{r}"))
        rts[r] = out
    # RT faults: a lost record in region 1 (MISSING, then CORRUPT at its EndOfSegment) and a redelivery in 2
    if regions > 1:
        i = next(i for i in range(len(rts[1]) // 3, len(rts[1])) if rts[1][i].label.startswith("PUT"))
        del rts[1][i]
    if regions > 2:
        i = next(i for i in range(len(rts[2]) // 2, len(rts[2])) if rts[2][i].label.startswith("PUT"))
        rts[2].insert(i + 3, rts[2][i])
    return rts


def build(
    seed: int = 1,
    regions: int = 3,
    per_region: int = 150,
    hb_every: int = 9,
    failovers: int = 2,
    push_records: int = 30,
    faults: bool = True,
    segment_every: int = 45,
) -> Scenario:
    """A seeded scenario (see the module docstring). `per_region` RT writes per region."""
    rng = random.Random(seed)
    rts = _rt_streams(rng, regions, per_region, hb_every)
    rt_states: dict[int, list[dict]] = {}
    rt_dup: dict[int, set[int]] = {}
    for r, recs in rts.items():
        c = RefConsumer()
        states, dups = [], set()
        for off, rec in enumerate(recs):
            before = c.segs.get(rec.guid)
            before_seq = (before.number, before.seq) if before else None
            c.consume(rec.key, rec.value)
            after = c.segs.get(rec.guid)
            if (
                rec.key != V.HB_KEY
                and before_seq is not None
                and after is before
                and (after.number, after.seq) == before_seq
            ):
                dups.add(off)
            states.append(c.states())
        rt_states[r], rt_dup[r] = states, dups

    vt: list[V.Rec] = []
    vt_states: list[dict] = []
    oracle = RefConsumer()
    scen = Scenario(regions, rts, vt, vt_states, rt_states)

    def append(rec: V.Rec) -> int:
        vt.append(rec)
        oracle.consume(rec.key, rec.value)
        vt_states.append(oracle.states())
        return len(vt) - 1

    # push job (a record lost before End of Push: fatal MISSING, and CORRUPT at its EndOfSegment)
    push = V.RefProducer(guid(2, 0), V.ADHASH, host="push-job", start_ms=START_MS - 100_000)
    recs = push.start_of_push()
    for i in range(push_records):
        recs += push.put(f"k{i}".encode(), f"batch-{i}".encode())
    recs += push.end_of_push()
    recs += push.end_segment(final=True)
    if faults:
        del recs[len(recs) // 2]
    for rec in recs:
        off = append(rec)
        if rec.label.startswith("EndOfPush"):
            scen.eop_offset = off

    others = [V.RefProducer(guid(3, 0), V.NONE, host="side-writer", start_ms=START_MS + 5)]
    ghost = V.RefProducer(guid(4, 0), V.ADHASH, host="ghost", start_ms=START_MS + 9)
    ghost_recs = []
    for i in range(12):
        ghost_recs += ghost.put(f"g{i}".encode(), b"g")
    ghost_recs = ghost_recs[4:]  # first seen mid-segment: its StartOfSegment never reached this VT

    processed = [-1] * regions
    pos = [0] * regions
    term = 1
    fail_at = (
        sorted(rng.sample(range(per_region, per_region * regions - per_region // 2), failovers))
        if failovers
        else []
    )
    last_hb: tuple[list[int], int] | None = None
    steps = 0
    while True:
        leader = V.RefProducer(
            guid(5, term), V.ADHASH, host=f"vt-leader-t{term}", start_ms=START_MS + 1000 * term
        )
        if term > 1:
            scen.failover_offsets.append(len(vt))
        written_by_leader = 0
        term_puts = 0
        crashed = False
        while any(pos[r] < len(rts[r]) for r in range(regions)):
            r = rng.choice([x for x in range(regions) if pos[x] < len(rts[x])])
            off = pos[r]
            rec = rts[r][off]
            pos[r] += 1
            processed[r] = off
            steps += 1
            if rec.key == V.HB_KEY:
                hb = V.heartbeat(START_MS + steps, host=leader.host)
                hb = with_footer(hb, leader.host, r, off)
                marks = list(processed)
                state = DivState(
                    {g: s for g, s in vt_states[-1].items()} if vt_states else {},
                    {x: rt_states[x][marks[x]] if marks[x] >= 0 else {} for x in range(regions)},
                )
                hbw = encode_hbw(Watermarks(r, off, marks, leader.host, term_id=term))
                kind = "usable"
                if faults and len(scen.heartbeats) in (5, 17, 29):
                    kind = {5: "plain", 17: "truncated", 29: "broken"}[len(scen.heartbeats)]
                if kind == "plain":
                    headers = [("lcs", b"\x00")]
                elif kind == "truncated":
                    headers = [
                        ("lcs", b"\x00"),
                        ("hbw", hbw),
                        ("hbd", encode_hbd(DivState({}, {}, truncated=True))),
                    ]
                elif kind == "broken":
                    headers = [("lcs", b"\x00"), ("hbw", hbw), ("hbd", b"\x44\x01\xff\xff\xff")]
                else:
                    headers = [("lcs", b"\x00"), ("hbw", hbw), ("hbd", encode_hbd(state))]
                scen.heartbeats[append(hb.replace(headers=headers))] = kind
                last_hb = (marks, len(vt) - 1)
                continue
            if off in rt_dup[r] or rec.label.startswith(("SOS", "EOS")):
                continue  # duplicates are dropped; producers' own segment markers are not copied to the VT
            env = V.decode_envelope(rec.value)
            key = rec.key[1:]
            if env["messageType"] == V.PUT:
                out = leader.put(key, env["payloadUnion"][1]["putValue"])
            else:
                out = leader.delete(key)
            written_by_leader += 1
            if written_by_leader % segment_every == 0:
                out += leader.end_segment(final=False)
            for o in out:
                o = with_footer(o, leader.host, r, off)
                if faults and o.label.startswith("PUT"):
                    term_puts += 1
                    if term_puts == 15:  # lost: MISSING at the next record, CORRUPT at the EndOfSegment
                        continue
                    if term_puts == 30:  # delivered twice: DUPLICATE
                        append(o)
                    elif term_puts == 45:  # changed after the checksum: CORRUPT at the EndOfSegment
                        o = corrupt_value(o)
                append(o)
            if rng.random() < 0.05:
                for o in others[0].put(f"s{steps}".encode(), b"side"):
                    append(with_footer(o, "side-writer", -1, -1))
            if ghost_recs and rng.random() < 0.08:
                append(ghost_recs.pop(0))
            if fail_at and steps >= fail_at[0] and last_hb is not None:
                fail_at.pop(0)
                crashed = True
                break
        if not crashed:
            for o in leader.end_segment(final=True):
                append(with_footer(o, leader.host, -1, -1))
            break
        # failover: the next term resumes the RTs right after the last heartbeat's watermarks
        marks, _ = last_hb
        processed = list(marks)
        pos = [m + 1 for m in marks]
        term += 1
    return scen


def _reflected(recs: list[V.Rec]) -> dict[int, int]:
    """Per region, the highest RT offset among the records' footers and heartbeat vectors."""
    from div.heartbeat_headers import decode_hbw

    out: dict[int, int] = {}
    for rec in recs:
        f = V.decode_envelope(rec.value)["leaderMetadataFooter"][1]
        if f["upstreamKafkaClusterId"] >= 0 and f["upstreamOffset"] >= 0:
            r = f["upstreamKafkaClusterId"]
            out[r] = max(out.get(r, -1), f["upstreamOffset"])
        for k, v in rec.headers:
            if k == "hbw":
                for r, w in enumerate(decode_hbw(v).high_watermarks):
                    if w >= 0:
                        out[r] = max(out.get(r, -1), w)
    return out


def restore_point(scen: Scenario, at: int) -> int | None:
    """The last usable heartbeat at or before `at` (None: there is none)."""
    usable = [h for h, k in scen.heartbeats.items() if k == "usable" and h <= at]
    return max(usable) if usable else None


def resume_offsets(scen: Scenario, at: int) -> dict[int, int]:
    """Per region, the resume offset DIV restore defines: the highest RT offset reflected by the restore point's
    vector and by the VT records after it up to `at` (all records up to `at` without a restore point)."""
    h = restore_point(scen, at)
    return _reflected(scen.vt[h if h is not None else 0 : at + 1])


def highest_upstream(scen: Scenario, at: int) -> dict[int, int]:
    """Per region, the highest RT offset any VT record up to `at` reflects (old terms included)."""
    return _reflected(scen.vt[: at + 1])
