"""What a change-capture reader of one region must be delivered, from a simulation's truth.json `changes`.

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
