"""What `tidegauge leapfrog` prints on stdout: the run's findings in a few lines an operator can act on.

The Parquet findings and summary.json are for programs; someone who ran the job wants to know at once whether
the regions agree, which pairs and keys do not, and which findings a repair or a newer write has healed since.
Keys are shown as `repair plan`'s plan.txt shows them (`div.keys.shown`: hex, and the text of a printable Avro
string), so a key read here is found there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from div.keys import shown
from leapfrog.compare import FINDING_STATUSES, FINDING_TYPES, HEALED, OPEN

FIRST_KEYS = 5  # keys shown per pair, type and status


def digest(
    topic: str,
    counts: Mapping[tuple[int, int, int, str, str], int],
    first: Iterable[tuple[int, int, int, str, str, bytes]],
    divergent: int,
    verdict: str,
    exit_code: int,
    summary_path: str,
) -> str:
    """The stdout summary. `counts`: (partition, region A, region B, type, status) → findings; `first`: some
    findings as (partition, region A, region B, type, status, key), in the output's order (the first keys of each
    pair, type and status among them are shown); `divergent`: the divergent keys
    (`leapfrog.results.divergent_keys`)."""
    per: dict[tuple[int, int, str, str], int] = defaultdict(int)
    for (_p, a, b, t, st), n in counts.items():
        per[(a, b, t, st)] += n
    keys_of: dict[tuple[int, int, str, str], list[tuple[int, bytes]]] = defaultdict(list)
    rows = list(first)
    for p, a, b, t, st, k in rows:
        keys_of[(a, b, t, st)].append((p, k))
    n_open = sum(n for k, n in per.items() if k[3] == OPEN)
    n_healed = sum(n for k, n in per.items() if k[3] == HEALED)
    lines = [
        f"leapfrog {topic}: {n_open} open finding(s), {n_healed} healed; "
        + (
            f"{divergent} divergent key(s) (a key with an open finding in any pair)"
            if n_open
            else "the regions agree on every key compared"
        ),
    ]
    for a, b in sorted({(a, b) for a, b, _t, _st in per}):
        for t in FINDING_TYPES:
            for st in FINDING_STATUSES:
                n = per.get((a, b, t, st), 0)
                if not n:
                    continue
                lines.append(f"  pair {a}-{b} {t} {st}: {n}")
                shown_keys = keys_of[(a, b, t, st)][:FIRST_KEYS]
                for p, k in shown_keys:
                    lines.append(f"    partition {p} key {shown(k)}")
                if n > len(shown_keys):
                    lines.append(f"    ... {n - len(shown_keys)} more in the output's inconsistencies/")
    lines.append(f"verdict: {verdict} (exit {exit_code}); summary in {summary_path}")
    return "\n".join(lines)
