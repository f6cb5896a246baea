"""heartbeat.LagMonitor alone, record by record: plain Venice heartbeats and footers give watermarks and lags; a
footer's RT offset is read as every other reader reads it. `tidegauge lag` over whole archives is tested in
tests/pipelines/lag/test_lag.py."""

from __future__ import annotations

from div import envelope as E
from div import keys
from div.records import footer_source
from div.writer import SegmentWriter
from heartbeat import LagMonitor
from heartbeat.records import vt_heartbeat

NOW = 1_750_000_000_000


def test_monitor_reads_plain_venice_heartbeats_from_footers():
    codec = E.EnvelopeCodec()
    mon = LagMonitor(vt_region=2, partition=3)
    w = SegmentWriter(b"L" * 16, host_name="l", clock=lambda: NOW)
    for off, rec in enumerate(w.put(3, b"k", b"v", footer=E.leader_footer("l", 77, 1))):
        mon.feed(rec.key, codec.decode(rec.value), rec.headers, off, NOW)
    hb = vt_heartbeat("l", origin_region=0, origin_rt_offset=12, timestamp_ms=NOW - 5_000, partition=3)
    seen = mon.feed(hb.key, codec.decode(hb.value), hb.headers, 2, NOW - 4_000)
    assert seen.delay_ms == 1_000 and seen.watermarks is None
    rows = {r.source_region: r for r in mon.rows(NOW, {0: 20, 1: 78})}
    assert (rows[0].watermark, rows[0].offset_lag, rows[0].time_lag_ms) == (12, 7, 5_000)
    assert (rows[1].watermark, rows[1].offset_lag, rows[1].time_lag_ms) == (77, 0, None)
    assert rows[1].heartbeats == 0 and rows[0].last_heartbeat_vt_offset == 2
    bad = [(k, v[:-2] if k == "hbw" else v) for k, v in hb.headers] + [("hbw", b"\x48\x01")]
    mon.feed(hb.key, codec.decode(hb.value), bad, 3, NOW)
    assert mon.bad_headers == 1 and mon.sources[0].heartbeats == 2


def test_lag_reads_a_footers_position_as_every_other_reader_does():
    # Issue 17: heartbeat/lag.py read the raw upstreamOffset long while every other reader applies Venice's
    # position fallback (div.records.footer_source). A footer whose long is the -1 sentinel but whose position blob
    # says 41 reflects RT offset 41.
    footer = E.leader_footer("leader-1", 41, 2)
    footer[1]["upstreamOffset"] = -1
    env = {
        "messageType": 0,
        "producerMetadata": {},
        "payloadUnion": (E.PUT, {}),
        "leaderMetadataFooter": footer,
    }
    mon = LagMonitor(vt_region=0, partition=0, n_regions=3)
    mon.feed(bytes([keys.HEADER_PUT_OR_DELETE]) + b"k", env, None, 7, None)
    assert mon.sources[2].footer_offset == 41
    assert footer_source(env) == (2, 41)
