"""Synthetic version-topic archives for Leap Frog benchmarks: N regions, last-writer-wins leaders, heartbeats.

Faster than the full simulator (no Kafka): online writes are drawn per region, each region's leader applies
them in RT order with a small lag towards remote regions, writes a VT record when the write wins, and a VT
heartbeat (with an `hbw` vector of what it has processed) every `heartbeat_every` RT records of each region.
`split` writes the VT in two archives per region (day 1 and day 2) for incremental-run benchmarks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from div import envelope as E
from div import keys as K
from div.archive import ArchiveWriter
from div.heartbeat_headers import Watermarks, encode_hbw

# what `generate` writes, numbered: every cache of its archives carries it in its name, so a change rebuilds them
# (2: the leader's producer opens its segment with a StartOfSegment)
LAYOUT = 2


@dataclass
class Workload:
    regions: int = 2
    partitions: int = 4
    vt_records: int = 2_000_000  # per region, approximately
    keys: int = 400_000
    value_size: int = 64
    heartbeat_every: int = 1_000
    lag: int = 200  # RT records a leader trails a remote region by
    seed: int = 1
    store: str = "bench"
    # skew: `hot_share` of all online writes go to `hot_keys` keys. By default every partition has its own hot
    # set (10 % of its writes on 100 keys); with `hot_partitions` = h only the first h partitions have one, and
    # they receive the hot writes of the whole store on top of their share of the others (hot_keys=1,
    # hot_partitions=1: one key holds hot_share of all writes)
    hot_keys: int = 100
    hot_share: float = 0.1
    hot_partitions: int | None = None


def generate(w: Workload, root: str, split: bool = False) -> dict[str, dict[int, str]]:
    """Write archives under root; returns {"full"|"day1"|"day2": {region: dir}}."""
    rng = random.Random(w.seed)
    codec = E.EnvelopeCodec("cavro")
    topic = f"{w.store}_v1"
    names = ["day1", "day2"] if split else ["full"]
    dirs = {name: {x: f"{root}/{name}/dc-{x}" for x in range(w.regions)} for name in names}
    writers = {name: {x: ArchiveWriter(d) for x, d in m.items()} for name, m in dirs.items()}
    guid = bytes(16)
    sos = {"checksumType": 4, "upcomingAggregates": []}
    values = [rng.randbytes(w.value_size) for _ in range(256)]
    writes_per_partition = int(w.vt_records / w.partitions * 1.15)
    for p in range(w.partitions):
        writes, hot = _partition_writes(w, writes_per_partition, p)
        # RT logs of every region for this partition: (key, value index or None, timestamp)
        rts = [[] for _ in range(w.regions)]
        ts = 0
        for _ in range(writes):
            ts += 1
            r = rng.randrange(w.regions)
            # mostly uniform over the key space, a share on a hot set of keys (skew)
            k = rng.randrange(w.hot_keys) if rng.random() < hot else rng.randrange(w.keys)
            rts[r].append((b"key-%d" % k, None if rng.random() < 0.05 else rng.randrange(256), ts))
        for x in range(w.regions):
            state: dict[bytes, tuple] = {}
            pos = [0] * w.regions
            offset = 0
            seq = 0
            total = sum(len(rt) for rt in rts)
            half = total // 2
            done = 0
            out = writers["full"][x] if not split else writers["day1"][x]
            out.append_record(
                topic,
                p,
                offset,
                K.control_key(guid, 0, 0),
                codec.encode(
                    {
                        "messageType": 2,
                        "producerMetadata": E.producer_metadata(guid, 0, 0, 0),
                        "payloadUnion": E.control_message(E.END_OF_PUSH, {}),
                        "leaderMetadataFooter": E.default_footer("push"),
                    }
                ),
            )
            offset += 1
            # the leader's producer opens its segment as Venice's writers do (ADHASH, the default): DIV then tracks
            # it as registered, which is what a real VT gives the watch's DIV to do
            out.append_record(
                topic,
                p,
                offset,
                K.control_key(guid, 1, 0),
                codec.encode(
                    {
                        "messageType": 2,
                        "producerMetadata": E.producer_metadata(guid, 1, 0, 0),
                        "payloadUnion": E.control_message(E.START_OF_SEGMENT, sos),
                        "leaderMetadataFooter": E.default_footer("push"),
                    }
                ),
            )
            offset += 1
            while done < total:
                # consume own region first, remote ones `lag` behind
                r = rng.randrange(w.regions)
                limit = len(rts[r]) if r == x else max(0, min(len(rts[r]), pos[x] + w.lag))
                if pos[r] >= limit:
                    r = max(range(w.regions), key=lambda q: len(rts[q]) - pos[q])
                    if pos[r] >= len(rts[r]):
                        break
                key, v, t = rts[r][pos[r]]
                order = (t, r, pos[r])
                cur = state.get(key)
                if cur is None or order > cur:
                    state[key] = order
                    seq += 1
                    footer = E.leader_footer(f"leader-{x}", pos[r], r)
                    if v is None:
                        payload = (
                            E.DELETE,
                            {
                                "schemaId": -1,
                                "replicationMetadataVersionId": -1,
                                "replicationMetadataPayload": b"",
                            },
                        )
                        mt = 1
                    else:
                        payload = (
                            E.PUT,
                            {
                                "putValue": values[v],
                                "schemaId": 1,
                                "replicationMetadataVersionId": -1,
                                "replicationMetadataPayload": b"",
                            },
                        )
                        mt = 0
                    out.append_record(
                        topic,
                        p,
                        offset,
                        b"\x00" + key,
                        codec.encode(
                            {
                                "messageType": mt,
                                "producerMetadata": E.producer_metadata(guid, 1, seq, t, -2),
                                "payloadUnion": payload,
                                "leaderMetadataFooter": footer,
                            }
                        ),
                    )
                    offset += 1
                pos[r] += 1
                done += 1
                if pos[r] % w.heartbeat_every == 0:
                    hw = [q - 1 for q in pos]
                    env = {
                        "messageType": 2,
                        "producerMetadata": E.producer_metadata(K.HEARTBEAT_GUID, 0, 0, t, -1),
                        "payloadUnion": E.control_message(E.START_OF_SEGMENT, sos),
                        "leaderMetadataFooter": E.leader_footer(f"leader-{x}", pos[r] - 1, r),
                    }
                    hbw = encode_hbw(Watermarks(r, pos[r] - 1, hw, f"leader-{x}"))
                    out.append_record(
                        topic, p, offset, K.HEARTBEAT_KEY, codec.encode(env), t, 0, [("hbw", hbw)]
                    )
                    offset += 1
                if split and out is writers["day1"][x] and done >= half:
                    out = writers["day2"][x]
    for m in writers.values():
        for wr in m.values():
            wr.close()
    return dirs


def _partition_writes(w: Workload, per_partition: int, p: int) -> tuple[int, float]:
    """(online writes, share of them on the hot set) of partition p."""
    if w.hot_partitions is None:
        return per_partition, w.hot_share
    cold = per_partition * (1 - w.hot_share)
    hot = per_partition * w.hot_share * w.partitions / w.hot_partitions if p < w.hot_partitions else 0
    return int(cold + hot), hot / (cold + hot)
