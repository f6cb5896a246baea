"""Which RT offsets a leader may claim: the high-water-mark vector, advanced only by acknowledged sends.

A leader turns each RT record of each region into zero or more VT sends (zero when conflict resolution drops it).
A heartbeat may claim RT offset o of region r only when every VT send caused by RT[r] records ≤ o has been
*acknowledged* by Kafka — produced is not enough, a produced record may still fail (docs/design.md, rule 3). The
tracker keeps, per region, the records whose sends are still in flight, in RT order; acknowledgements may arrive
in any order; the watermark is the offset of the last record of the longest fully acknowledged prefix.

It also keeps the RT DIV state *at* the watermark (docs/design.md, rule 4): a second validator per region that is fed
each RT record only once the watermark passes it. Replaying through Venice's own validator (its fast path costs
about a microsecond) gives exactly the state a full replay of RT[r] up to V[r] would, including resyncs and
new segments, without copying producer states per record.

A failed send freezes its region's watermark below it forever and sets `broken`: the leader must stop claiming
and restart with a new term. Watermarks never decrease during a tracker's lifetime (one leadership term).
Pure logic: no Kafka, no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable

from div.validator import PartitionValidator, ValidatorConfig

# One RT record whose sends are not all acknowledged yet:
# [rt_offset, unacknowledged sends, DIV replay input, region].
_OFFSET, _PENDING, _DIV, _REGION = 0, 1, 2, 3


class WatermarkTracker:
    """Acknowledged high-water marks of `n_regions` RT partitions, and the RT DIV state at those marks.

    `initial[r]`: the last RT offset of region r already covered when the term starts (-1: none); the leader
    resumes RT[r] at `initial[r] + 1`. `rt_producer_states[r]`: DIV state of RT[r] at `initial[r]`
    (e.g. from the last heartbeat's `hbd`). `validator_config`: tolerances of the RT validators (as the
    leader's own RT validators use).
    """

    def __init__(
        self,
        n_regions: int,
        initial: Iterable[int] | None = None,
        rt_producer_states: dict[int, dict[bytes, dict]] | None = None,
        validator_config: ValidatorConfig | None = None,
    ) -> None:
        if n_regions < 1:
            raise ValueError(f"n_regions must be at least 1, got {n_regions}")
        self.n_regions = n_regions
        marks = [-1] * n_regions if initial is None else [int(x) for x in initial]
        if len(marks) != n_regions:
            raise ValueError(f"initial watermarks {marks} do not have one entry per region ({n_regions})")
        if any(m < -1 for m in marks):
            raise ValueError(f"initial watermarks {marks}: offsets below -1 are invalid")
        self._marks = marks
        self._last_processed = list(marks)
        self._queues: list[deque[list]] = [deque() for _ in range(n_regions)]
        self._by_token: dict[Hashable, list] = {}
        self._early_acks: set[Hashable] = set()
        self._pending = 0
        self.broken = False
        self.failed_tokens: list[Hashable] = []
        self._validators: list[PartitionValidator] = []
        for r in range(n_regions):
            v = PartitionValidator(is_realtime=True, config=validator_config)
            if rt_producer_states and rt_producer_states.get(r):
                v.restore(rt_producer_states[r])
            self._validators.append(v)

    # -- the leader's calls ---------------------------------------------------------------------------
    def processed(
        self,
        region: int,
        rt_offset: int,
        sends: Iterable[Hashable] = (),
        div_record: tuple[bytes, dict, int | None] | None = None,
    ) -> None:
        """RT record `rt_offset` of `region` is fully handled; `sends` are the tokens of the VT sends it
        caused (none when it was dropped). `div_record` = (Kafka key, envelope, broker ts) to replay into the
        at-watermark RT validator once the watermark passes this record (None: not a DIV record)."""
        if not 0 <= region < self.n_regions:
            raise ValueError(f"region {region} is not in 0..{self.n_regions - 1}")
        if rt_offset <= self._last_processed[region]:
            raise ValueError(
                f"RT offset {rt_offset} of region {region} is not after the last processed one "
                f"({self._last_processed[region]}): records must be processed once, in RT order"
            )
        self._last_processed[region] = rt_offset
        pending = 0
        early = self._early_acks
        entry = [rt_offset, 0, div_record, region]
        for token in sends:
            if early and token in early:
                early.discard(token)
                continue
            self._by_token[token] = entry
            pending += 1
        queue = self._queues[region]
        if pending == 0 and not queue:
            self._pass(region, entry)
            return
        entry[_PENDING] = pending
        self._pending += pending
        queue.append(entry)

    def acked(self, token: Hashable) -> None:
        """Kafka acknowledged the send `token` (may come before `processed` names it, and in any order)."""
        entry = self._by_token.pop(token, None)
        if entry is None:
            self._early_acks.add(token)
            return
        entry[_PENDING] -= 1
        self._pending -= 1
        if entry[_PENDING] == 0:
            self._advance(entry[_REGION])

    def failed(self, token: Hashable) -> None:
        """The send `token` failed for good: its region's watermark stays below it; the tracker is broken."""
        self.broken = True
        self.failed_tokens.append(token)
        self._by_token.pop(token, None)  # its entry keeps a pending count that never reaches zero

    # -- what heartbeats may claim --------------------------------------------------------------------
    def watermarks(self) -> list[int]:
        """Per region, the highest RT offset whose sends (and those of every earlier record) are acked."""
        return list(self._marks)

    def watermark(self, region: int) -> int:
        return self._marks[region]

    def last_processed(self, region: int) -> int:
        return self._last_processed[region]

    @property
    def pending_sends(self) -> int:
        """Sends named by `processed` and not acknowledged yet."""
        return self._pending

    def rt_producer_states(self, region: int) -> dict[bytes, dict]:
        """DIV state of RT[region] after every record up to and including its watermark."""
        return self._validators[region].producer_states()

    def rt_validator(self, region: int) -> PartitionValidator:
        """The at-watermark validator of a region (read it; do not feed it)."""
        return self._validators[region]

    # -- internals -----------------------------------------------------------------------------------
    def _pass(self, region: int, entry: list) -> None:
        rec = entry[_DIV]
        if rec is not None:
            key, env, broker_ts = rec
            self._validators[region].process(entry[_OFFSET], key, env, broker_ts)
        self._marks[region] = entry[_OFFSET]

    def _advance(self, region: int) -> None:
        queue = self._queues[region]
        while queue and queue[0][_PENDING] == 0:
            self._pass(region, queue.popleft())
