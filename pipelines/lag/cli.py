"""`tidegauge lag`: its arguments, and the options they make for `pipelines.lag.job.run`."""

from __future__ import annotations

import argparse
import textwrap

from pipelines.core import config as cfg
from pipelines.core.errors import UsageError, exit_codes
from pipelines.core.sources import SourceError, SourceSpec, check_unique, parse_source

HELP = textwrap.dedent("""\
    How far behind is each region? For every VT region, partition and source region: when the newest
    heartbeat from that source was emitted (time lag = now minus that origin time) and which RT offset of the
    source the VT is known to reflect (the watermark: the heartbeats' hbw vector, or for plain Venice
    heartbeats the highest footer offset), and how many RT records are not yet reflected
    (offset lag = RT end offset - watermark - 1; needs the source's RT end offsets).

    Leaders write heartbeats even when a region has no traffic, so a quiet region keeps a small time lag and
    an offset lag of 0; a region whose replication is stuck shows both growing.

    Writes, with --out: OUT/lag/ (one row per VT region, partition, source region), OUT/heartbeats/ (one
    row per heartbeat, for plots) and OUT/lag.json. Always prints a table.

    Exit codes: 0 measured, 2 bad usage or unreadable source, 3 some partitions could not be read.""")

EPILOG = textwrap.dedent("""\
    examples:
      tidegauge lag --source 0=out/sim/archive/dc-0 --source 1=out/sim/archive/dc-1 --store sim_store \\
          --version 1 --out out/lag
      tidegauge lag --source 0=kafka://dc0:9092 --source 1=kafka://dc1:9092 --store sim_store --version 1
      tidegauge lag --source 0=out/sim/archive/dc-0 --rt-source 1=out/sim/archive/dc-1 --now-ms 1700000000000""")


def register(sub) -> None:
    p = sub.add_parser(
        "lag",
        help="replication lag per region from VT heartbeats (time and offsets)",
        description=HELP,
        epilog=EPILOG,
    )
    p.add_argument(
        "--source",
        action="append",
        metavar="ID=URI",
        default=[],
        help="a region's version topics: archive directory or kafka://host:port[,...]. Repeatable, "
        "one per VT region. A Kafka source also gives that region's RT end offsets.",
    )
    p.add_argument(
        "--rt-source",
        action="append",
        metavar="ID=URI",
        default=[],
        help="where region ID's real-time topic <store>_rt can be read for its end offsets "
        "(archive or kafka). Repeatable. Default: region ID's --source when it has that topic.",
    )
    p.add_argument(
        "--store",
        metavar="S",
        help="store name: reads topic <S>_v<N> (default: the one store whose *_v<N> topics the sources hold)",
    )
    p.add_argument(
        "--version", type=int, metavar="N", help="store version N (default: the one version present)"
    )
    p.add_argument(
        "--now-ms",
        type=int,
        metavar="T",
        help="the time (epoch ms) time lag is measured against. Default: on archives, the newest record's "
        "timestamp in the sources (an archive is a snapshot of the past: the wall clock would measure its age); "
        "on Kafka, the current time",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="output directory or URI (published whole): lag/, heartbeats/ and lag.json",
    )
    p.add_argument(
        "--conf",
        metavar="FILE",
        help="YAML configuration (sources, rt_sources, kafka settings, store, version); flags "
        "override it (default: conf/tidegauge.yaml when present)",
    )
    p.set_defaults(func=run)


def _specs(flag: str, texts: list[str], from_conf: dict | None) -> list[SourceSpec]:
    specs: dict[int, SourceSpec] = {}
    for region, uri in (from_conf or {}).items():
        try:
            specs[int(region)] = SourceSpec(int(region), str(uri))
        except ValueError:
            raise UsageError(f"configuration {flag}: region id {region!r} is not an integer") from None
    try:
        given = [parse_source(t) for t in texts]
        check_unique(given)
    except SourceError as exc:
        raise UsageError(str(exc).replace("--source", f"--{flag}")) from None
    for s in given:
        specs[s.region] = s
    return [specs[r] for r in sorted(specs)]


@exit_codes(SourceError)
def run(args: argparse.Namespace) -> int:
    from pipelines.lag.job import LagOptions
    from pipelines.lag.job import run as run_job

    conf = cfg.load(args.conf)
    specs = cfg.sources(args.source, conf)
    rt_specs = _specs("rt-source", args.rt_source, conf.get("rt_sources"))
    version = args.version if args.version is not None else conf.get("version")
    return run_job(
        LagOptions(
            sources=specs,
            rt_sources=rt_specs,
            store=args.store if args.store is not None else conf.get("store"),
            version=None if version is None else int(version),
            now_ms=args.now_ms,
            out=args.out,
            kafka_conf={s.region: cfg.kafka_conf(conf, s.region) for s in [*specs, *rt_specs]},
        )
    )
