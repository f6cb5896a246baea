"""What a change-capture reader of one region must be delivered, from a simulation's truth.json `changes`, and two
readers of a simulation's archives to hold it against: `read_with_the_rule` (heartbeat/changes.py over both
versions, following at the VersionSwap) and `read_naively` (Venice's at-least-once changelog consumer), which the
tests and bench/bench_changes.py share.

`expected_changes(truth, region, version_from)` is the set of (partition, source region, RT position) a reader gets
exactly once when it starts on version `version_from` with no state and follows each newer version at the old
one's VersionSwap message, by the rule of heartbeat/changes.py (bulk-load records aside):

- of its first version, every write that version's leaders wrote (each coordinate once, however often the VT
  holds it: a broker redelivery, a failover's re-production);
- of each later version, the writes with a position above the reader's mark W[p][r] at the VersionSwap it followed
  from: the highest of the positions it was delivered from that region and the last `hbw` vector before the
  VersionSwap (heartbeat vectors never fall along a VT, across leader terms included). A write the new version's
  replay repeats is at or below W and is dropped; a write the old version never wrote (it lost conflict
  resolution there, or came after the VersionSwap) but the new one does, in its own interleaving, is delivered only
  if its position lies above W (docs/design.md, "What the rule does not give").
"""

from __future__ import annotations

from collections import Counter

from div import archive
from div.envelope import EnvelopeCodec
from div.records import Kind, iter_records
from heartbeat.changes import ChangeFilter, ChangeState, Role, Verdict, item


def expected_changes(truth: dict, region: int, version_from: int = 1) -> set[tuple[int, int, int]]:
    per_version = truth["changes"]["regions"][str(region)]
    versions = sorted(int(v) for v in per_version if int(v) >= version_from)
    out: set[tuple[int, int, int]] = set()
    marks: dict[
        tuple[int, int], int
    ] = {}  # (partition, source region) -> W when the reader enters the version
    for v in versions:
        entry = per_version[str(v)]
        for p, by_source in entry["applied"].items():
            for r, positions in by_source.items():
                w = marks.get((int(p), int(r)), -1)
                out.update((int(p), int(r), q) for q in positions if q > w)
        swaps = entry["version_swap_offsets"]
        if swaps is None:  # the newest version: the reader stays on it
            break
        hbw = entry["hbw_at_version_swap"] or {}
        for p, by_source in entry["applied"].items():
            vector = hbw.get(p) or []
            for r, positions in by_source.items():
                key = (int(p), int(r))
                marks[key] = max(
                    marks.get(key, -1),
                    positions[-1] if positions else -1,
                    vector[int(r)] if int(r) < len(vector) else -1,
                )
    return out


def _records(arch: str, topic: str, partition: int):
    codec = EnvelopeCodec()
    for batch in archive.iter_partition(arch, topic, partition):
        for rec in iter_records(batch, codec):
            yield rec, item(rec)


def read_with_the_rule(
    truth: dict, archives: dict, region: int
) -> tuple[list[tuple[int, int, int]], Counter]:
    """Region `region`'s VTs read by a reader that starts on version 1 with no state and follows version 2 at
    version 1's VersionSwap. Returns the delivered coordinates (bulk loads aside) in order, and every verdict."""
    run_, changes = truth["run"], truth["changes"]["regions"][str(region)]
    n, arch = run_["regions"], archives[region]
    delivered: list[tuple[int, int, int]] = []
    verdicts: Counter = Counter()
    for p in range(run_["partitions"]):
        f = ChangeFilter.fresh(n)
        swapped = False
        for rec, it in _records(arch, changes["1"]["topic"], p):
            v = f.step(it)
            verdicts[v] += 1
            if v is Verdict.NEW:
                delivered.append((p, it.region, it.rt_position))
            if rec.kind is Kind.VERSION_SWAP:
                assert it.position == changes["1"]["version_swap_offsets"][str(p)]
                swapped = True
                break
        assert swapped, f"partition {p}: version 1 has no VersionSwap"
        state = ChangeState(run_["store"], 1, n, {p: f.state()}).follow(2).partition(p)
        f = ChangeFilter(state)
        for _rec, it in _records(arch, changes["2"]["topic"], p):
            v = f.step(it)
            verdicts[v] += 1
            assert v is not Verdict.SNAPSHOT, "a reader that follows a version never gets its bulk load"
            if v is Verdict.NEW:
                delivered.append((p, it.region, it.rt_position))
    return delivered, verdicts


def read_naively(truth: dict, archives: dict, region: int) -> Counter:
    """Venice's at-least-once changelog consumer: every data record after End of Push of version 1 up to its
    VersionSwap, then every data record after version 2's End of Push."""
    run_, changes = truth["run"], truth["changes"]["regions"][str(region)]
    got: Counter = Counter()
    for p in range(run_["partitions"]):
        for v in ("1", "2"):
            eop = changes[v]["eop_offsets"][str(p)]
            vs = (changes[v]["version_swap_offsets"] or {}).get(str(p))
            for _rec, it in _records(archives[region], changes[v]["topic"], p):
                if vs is not None and it.position >= vs:
                    break
                if it.position > eop and it.role == Role.CHANGE and it.region >= 0:
                    got[(p, it.region, it.rt_position)] += 1
    return got


def swap_sim_config(out, **kw):
    """A small simulation with every source of duplicates a change reader meets: 3 regions, 2 partitions, two VT
    redeliveries, a leader failover and a version swap at 1.2 s while writes go on (the rewind, 300-900 ms, lies
    inside the RTs and is longer than every lag). `kw` overrides any setting (e.g. the seed)."""
    from sim import SimConfig
    from sim.config import TimedFault

    base = dict(
        out=str(out),
        seed=5,
        regions=3,
        partitions=2,
        records=4000,
        write_rate=[500.0],  # 2.7 s of writes
        keys=400,
        batch_records=100,
        heartbeat_every_records=100,
        heartbeat_every_ms=400,
        default_lag_ms=100,
        lag_ms={(0, 2): 250},
        faults={"redelivery": 2, "failover": 1},
        fault_times=[TimedFault("swap", 1.2)],
        failover_delay_ms=200,
        swap_push_ms=150,
        swap_rewind_ms=600,
        swap_overlap_ms=300,
        step_records=500,
        progress=False,
        workers="inline",
    )
    base.update(kw)
    return SimConfig(**base)
