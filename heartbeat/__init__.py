"""Leader-side heartbeats that carry high-water marks (`hbw`) and DIV state (`hbd`), and follower-side lag.

Readers trust a VT heartbeat H with vector V to mean: every VT record derived from RT[r] offset ≤ V[r] lies
before H, and every later record of the same term derived from r has offset > V[r] (docs/design.md, rule 3). This
package makes a leader keep that promise with a handful of calls:

    from heartbeat import HeartbeatLeader, LeaderBrokenError

    leader = HeartbeatLeader({"bootstrap.servers": local_cluster}, vt_topic="store_v1", rt_topic="store_rt",
                             partition=p, region=my_region, n_regions=3, host="leader-a:1234", term_id=7)
    leader.take_over(vt_states, rt_states, watermarks)  # optional: state from the last VT heartbeat
    while running:
        for region, msg in consume_rt_partitions():      # every region's RT partition p, each in offset order
            rec = leader.on_rt_record(region, msg.offset(), msg.key(), msg.value(), msg.headers(),
                                      msg.timestamp()[1])
            if rec.is_heartbeat:
                continue                                 # the library writes the VT heartbeat itself
            if rec.is_data and not rec.is_duplicate and wins_conflict_resolution(rec):
                leader.put(rec.key, new_value, schema_id, rmd_version=1, rmd_payload=rmd)  # or leader.delete
            leader.done()                                # 0..n VT records for this RT record
        leader.poll()                                    # delivery reports, due heartbeats
    leader.close()

On `LeaderBrokenError` (a VT send failed for good) restart with a new leader, `term_id + 1`, from the last VT
heartbeat. Readers decode heartbeats with `parse_vt_heartbeat` (works on plain Venice heartbeats too) or the
header codecs directly; `LagMonitor` turns a VT into per-region time and offset lag.

Modules: `records` (heartbeat records, byte-exact with Venice), `watermarks` (the
acknowledged watermark tracker, pure logic), `leader` (HeartbeatLeader), `lag` (LagMonitor), `metrics`
(LeaderMetrics: a leader's `stats` for Prometheus; imported on its own, by a leader process that serves them),
`changes` (the change-capture rule: which VT records a client must see, each change once, and where a reader
resuming at a consistent cut starts, `from_cut`; pure, imported on its own by the readers that drive it), `cuts`
(consistent cuts: one upstream time tied to a position in every topic), `change_events` (records → the events a client applies) and `change_reader`
(`ChangeReader`: a client's change capture from a region's VT on Kafka, each change once, resumable from `state()`).
The hbw/hbd header codecs live in `div.heartbeat_headers` (DIV restore reads them too) and are re-exported here.
"""

from div.heartbeat_headers import (
    DivState,
    HeaderError,
    Watermarks,
    decode_hbd,
    decode_hbw,
    encode_hbd,
    encode_hbw,
)

from .change_events import ChangeEvent
from .change_reader import ChangeReader, ChangeReaderError, ChangeReaderStats, UnendedVersionError
from .changes import ChangeState, StateError
from .lag import LagMonitor, LagRow
from .leader import HeartbeatLeader, LeaderBrokenError, LeaderStats, LeaderUsageError, RtRecord
from .records import VtHeartbeat, parse_vt_heartbeat, rt_heartbeat, vt_heartbeat
from .watermarks import WatermarkTracker

__all__ = [
    "ChangeEvent",
    "ChangeReader",
    "ChangeReaderError",
    "ChangeReaderStats",
    "ChangeState",
    "DivState",
    "HeaderError",
    "HeartbeatLeader",
    "LagMonitor",
    "LagRow",
    "LeaderBrokenError",
    "LeaderStats",
    "LeaderUsageError",
    "RtRecord",
    "StateError",
    "UnendedVersionError",
    "VtHeartbeat",
    "WatermarkTracker",
    "Watermarks",
    "decode_hbd",
    "decode_hbw",
    "encode_hbd",
    "encode_hbw",
    "parse_vt_heartbeat",
    "rt_heartbeat",
    "vt_heartbeat",
]
