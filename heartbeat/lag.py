"""Follower-side replication lag from a version topic: how old is the newest news from each source region, and
how many of that region's RT records are not yet reflected in this VT.

A `LagMonitor` reads one VT partition (in offset order) and keeps, per source region s:

* heartbeats — VT heartbeats whose origin is s, the VT offset of the last one and the newest origin time;
* watermark — the last RT[s] offset known to be reflected in this VT. With our heartbeats it is the highest
  `hbw.upstreamHighWatermarks[s]` seen on any heartbeat (every heartbeat carries the whole vector, so a quiet
  region's watermark still advances). Without any `hbw` (plain Venice heartbeats) it falls back to the highest
  footer offset of records from s (data records and heartbeats), an estimate rather than a guarantee.

Lag, given a "now" and optionally the RT end offsets:

* `time_lag_ms` = now − origin time of the newest heartbeat from s (None before the first one). Heartbeats are
  emitted every interval even when a region writes nothing, so a quiet region keeps a small time lag.
* `offset_lag` = RT[s] records not yet covered = rt_end_offset − (watermark + 1), never below 0, where
  `rt_end_offset` is Kafka's end offset (the offset the next record will get). None when the RT end is unknown.

The monitor also keeps every heartbeat seen (VT offset, origin, times, vector) for plots over time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from div import keys
from div.heartbeat_headers import HeaderError
from div.records import footer_source

from .records import parse_vt_heartbeat


@dataclass
class SourceState:
    """What one VT partition tells about one source region."""

    source_region: int
    heartbeats: int = 0
    last_heartbeat_vt_offset: int | None = None
    last_heartbeat_origin_ms: int | None = None
    hbw_watermark: int = -1  # highest hbw component for this region; -1 = none
    footer_offset: int = -1  # highest footer upstreamOffset of records from this region
    has_hbw: bool = False

    @property
    def watermark(self) -> int:
        return self.hbw_watermark if self.has_hbw else self.footer_offset


@dataclass
class HeartbeatSeen:
    """One VT heartbeat, for the heartbeats series (docs/outputs.md `heartbeats/`)."""

    vt_offset: int
    origin_region: int
    origin_ms: int
    vt_timestamp_ms: int
    delay_ms: int
    watermarks: list[int] | None
    term_id: int | None = None


@dataclass
class LagRow:
    """The latest lag of one (VT region, partition, source region): a row of `lag/`."""

    vt_region: int
    partition: int
    source_region: int
    heartbeats: int
    last_heartbeat_vt_offset: int | None
    last_heartbeat_origin_ms: int | None
    time_lag_ms: int | None
    watermark: int
    rt_end_offset: int | None
    offset_lag: int | None


@dataclass
class LagMonitor:
    """Feed the records of one VT partition in offset order with `feed`; read `rows(now_ms, rt_end_offsets)`.

    `n_regions`, when given, makes every region 0..n-1 appear in `rows` even before anything names it.
    `keep_series=False` drops the per-heartbeat series (for long-running monitors).
    """

    vt_region: int = 0
    partition: int = 0
    n_regions: int | None = None
    keep_series: bool = True
    sources: dict[int, SourceState] = field(default_factory=dict)
    series: list[HeartbeatSeen] = field(default_factory=list)
    records: int = 0
    bad_headers: int = 0  # heartbeats whose hbw could not be decoded (read as plain Venice heartbeats)

    def _source(self, region: int) -> SourceState:
        st = self.sources.get(region)
        if st is None:
            st = self.sources[region] = SourceState(region)
        return st

    def feed(
        self, key: bytes | None, env: dict, headers: Iterable | None, vt_offset: int, broker_ts_ms: int | None
    ) -> HeartbeatSeen | None:
        """One decoded VT record. Returns the heartbeat it was, if it was one."""
        self.records += 1
        if key is not None and keys.is_heartbeat_key(bytes(key)):
            return self._heartbeat(key, env, headers, vt_offset, broker_ts_ms)
        if key and key[0] == keys.HEADER_PUT_OR_DELETE:
            up = footer_source(env)
            if up is not None and up[0] >= 0:
                st = self._source(up[0])
                if up[1] > st.footer_offset:
                    st.footer_offset = up[1]
        return None

    def _heartbeat(self, key, env, headers, vt_offset, broker_ts_ms) -> HeartbeatSeen | None:
        try:
            hb = parse_vt_heartbeat(key, env, headers, decode_div_state=False)
        except HeaderError:
            self.bad_headers += 1
            hb = parse_vt_heartbeat(
                key,
                env,
                [h for h in headers or [] if (h["key"] if isinstance(h, dict) else h[0]) != "hbw"],
                decode_div_state=False,
            )
        if hb is None:
            return None
        st = self._source(hb.origin_region)
        st.heartbeats += 1
        st.last_heartbeat_vt_offset = vt_offset
        if st.last_heartbeat_origin_ms is None or hb.origin_ms > st.last_heartbeat_origin_ms:
            st.last_heartbeat_origin_ms = hb.origin_ms
        if hb.origin_rt_offset > st.footer_offset:
            st.footer_offset = hb.origin_rt_offset
        vector = None
        term = None
        if hb.watermarks is not None:
            vector = list(hb.watermarks.high_watermarks)
            term = hb.watermarks.term_id
            for region, mark in enumerate(vector):
                s = self._source(region)
                s.has_hbw = True
                if mark > s.hbw_watermark:
                    s.hbw_watermark = mark
        vt_ts = broker_ts_ms if broker_ts_ms is not None and broker_ts_ms > 0 else hb.origin_ms
        seen = HeartbeatSeen(
            vt_offset, hb.origin_region, hb.origin_ms, vt_ts, vt_ts - hb.origin_ms, vector, term
        )
        if self.keep_series:
            self.series.append(seen)
        return seen

    def regions(self) -> list[int]:
        known = set(self.sources)
        if self.n_regions is not None:
            known |= set(range(self.n_regions))
        return sorted(r for r in known if r >= 0)

    def rows(self, now_ms: int, rt_end_offsets: Mapping[int, int | None] | None = None) -> list[LagRow]:
        """Lag per source region at `now_ms`; `rt_end_offsets[s]` = Kafka end offset of RT[s] (same partition)."""
        out = []
        for region in self.regions():
            st = self.sources.get(region) or SourceState(region)
            end = (rt_end_offsets or {}).get(region)
            origin = st.last_heartbeat_origin_ms
            out.append(
                LagRow(
                    vt_region=self.vt_region,
                    partition=self.partition,
                    source_region=region,
                    heartbeats=st.heartbeats,
                    last_heartbeat_vt_offset=st.last_heartbeat_vt_offset,
                    last_heartbeat_origin_ms=origin,
                    time_lag_ms=None if origin is None else now_ms - origin,
                    watermark=st.watermark,
                    rt_end_offset=end,
                    offset_lag=None if end is None else max(0, end - (st.watermark + 1)),
                )
            )
        return out
