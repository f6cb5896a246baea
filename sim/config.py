"""What a simulation run is made of: `SimConfig`, built from defaults, a YAML mapping and flags.

Everything that shapes the content of a run lives here, so that one seed plus one `SimConfig` gives identical
archives. Traffic is described in simulated time (rates in writes per simulated second, lags and heartbeat
cadence in simulated milliseconds); quiet periods are fractions of the run's nominal duration (records / total
write rate), so the same YAML fits a run of any size. Kafka client settings (`kafka_conf`) never change the
content and are passed to librdkafka untouched.

A live run (`live`) is the same simulation paced by the wall clock: simulated time is wall-clock time, the
schedule is drawn a chunk (`live_chunk_s`) at a time, and the run ends after `duration_s` or when it is told to
stop. Faults can be given by count (`faults`, placed from the seed) or at set times (`fault_times`, seconds after
the first write), in either mode.

Errors are `ConfigError`s whose message names the bad item (the CLI turns them into exit code 2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

FAULT_KINDS = (
    "dropped",
    "poisoned",
    "failover",
    "duplicate",
    "gap",
    "corrupt",
    "compaction",
    "broker",
    "silent",
    "isolated",
    "redelivery",
    "swap",
)
"""Injectable faults (see sim.faults for what each does and which findings it must cause)."""

STOP_RESUME_KINDS = ("failover", "broker", "silent", "isolated")
"""Faults that start and end: a timed one may say how long it lasts (`KIND@SECONDS+SECONDS`)."""


class ConfigError(ValueError):
    """A simulation setting that cannot be used; the message names the setting and the bad value."""


@dataclass(frozen=True)
class QuietPeriod:
    """Region `region` writes nothing between fractions `start` and `end` of the run's nominal duration, in
    the listed partitions only (None: all). Its leaders keep emitting heartbeats."""

    region: int
    start: float
    end: float
    partitions: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TimedFault:
    """A fault at a set time: `kind` starts `at_s` seconds after the run's first write and, for the kinds of
    STOP_RESUME_KINDS, lasts `for_s` seconds (None: the kind's default, e.g. `outage_ms`)."""

    kind: str
    at_s: float
    for_s: float | None = None

    def __str__(self) -> str:
        return f"{self.kind}@{self.at_s:g}" + ("" if self.for_s is None else f"+{self.for_s:g}")


@dataclass
class SimConfig:
    """One simulation run. Defaults are small enough for a laptop test; `conf/simulate.yaml` documents each."""

    out: str = "sim-out"
    seed: int = 1
    store: str = "sim_store"
    version: int = 1
    regions: int = 3
    partitions: int = 4
    records: int = 20_000  # online writes, all regions together (each region's VT receives about this many)
    batch_records: int = 1_000  # keys loaded by the push job before End of Push
    keys: int = 10_000
    key_skew: float = 0.9  # Zipf exponent of key popularity; 0 = uniform
    delete_ratio: float = 0.05
    value_size_min: int = 64
    value_size_max: int = 256
    producers_per_region: int = 2
    write_rate: list[float] = field(
        default_factory=lambda: [1000.0]
    )  # writes per simulated second, per region
    quiet: list[QuietPeriod] = field(default_factory=list)
    default_lag_ms: int = 200  # replication lag between two different regions
    lag_ms: dict[tuple[int, int], int] = field(default_factory=dict)  # (source, destination) overrides
    heartbeat_every_records: int = 1_000  # a leader heartbeats after this many writes to its RT partition ...
    heartbeat_every_ms: int = 5_000  # ... and at least this often (simulated time)
    segment_max_age_ms: int = 300_000  # producers and leaders roll DIV segments on simulated time
    faults: dict[str, int] = field(default_factory=dict)
    fault_times: list[TimedFault] = field(default_factory=list)  # faults at set times (`KIND@SECONDS`)
    failover_delay_ms: int = 3_000  # simulated time between a leader's failure and its successor's takeover
    broker_down_s: float = 1.0  # wall-clock duration of a broker outage (does not change content)
    outage_ms: int = 20_000  # how long a silent leader stays silent and an isolated region stays cut off
    legacy_rmd: bool = False
    kafka: dict[int, str] | None = None  # region -> bootstrap servers; None: one embedded cluster per region
    kafka_conf: dict[str, Any] = field(default_factory=dict)  # librdkafka settings, passed through
    kafka_conf_by_region: dict[int, dict[str, Any]] = field(default_factory=dict)
    # the clusters started here when `kafka` is None: "mock" (librdkafka's mock cluster, in this process) or
    # "real" (Apache Kafka brokers on loopback, `sim.brokers`), `brokers_per_region` nodes each
    brokers: str = "mock"
    brokers_per_region: int = 1
    start_ms: int = 1_700_000_000_000  # simulated epoch of the first write
    step_records: int = 20_000  # writes per simulation step (bounds memory and mock-cluster retention)
    follower_checkpoint_every: int = 50_000  # VT records between follower checkpoints (per partition)
    progress: bool = True  # progress lines on stderr
    workers: str = "process"  # "process": each region's leaders/followers in a process of its own; "inline"
    live: bool = False  # paced by the wall clock (simulated time = wall time), no planned end
    duration_s: float | None = None  # live: seconds of traffic before a clean stop (None: until told to stop)
    live_step_ms: int = 200  # live: the step (simulated = wall ms) between two hand-overs to the workers
    live_chunk_s: float = 60.0  # live: seconds of traffic drawn at a time (quiet periods repeat per chunk)
    linger_s: float = 0.0  # live: after the stop, keep the clusters serving this long (or until told to stop)
    # After the last write and the leaders' last heartbeats, hold the run open this long (0: no window; or until
    # told to go on) with leaders up: a `tidegauge repair apply` then writes into an RT, and the leaders apply
    # what it wrote through DCR before they step down (sim.runner's `_repair_window`).
    repair_window_s: float = 0.0
    # a `swap` fault (a re-push of version+1 while writes go on): the push job takes `swap_push_ms` from the
    # snapshot to End of Push; the new version's leaders replay the RTs from `swap_rewind_ms` (times a factor drawn
    # from the seed in [0.5, 1.5]) before the snapshot; version N ends with a VersionSwap `swap_overlap_ms` later
    swap_push_ms: int = 1_000
    swap_rewind_ms: int = 5_000
    swap_overlap_ms: int = 3_000

    # -- derived -----------------------------------------------------------------------------------------
    @property
    def rt_topic(self) -> str:
        return f"{self.store}_rt"

    @property
    def vt_topic(self) -> str:
        return f"{self.store}_v{self.version}"

    def rate(self, region: int) -> float:
        rates = self.write_rate
        return float(rates[region] if len(rates) > 1 else rates[0])

    def lag(self, source: int, destination: int) -> int:
        """Simulated ms between a write to RT[source] and its processing by the leader of `destination`."""
        if (source, destination) in self.lag_ms:
            return self.lag_ms[(source, destination)]
        return 0 if source == destination else self.default_lag_ms

    def lag_matrix(self) -> list[list[int]]:
        return [[self.lag(s, d) for d in range(self.regions)] for s in range(self.regions)]

    def nominal_duration_ms(self) -> int:
        total = sum(self.rate(r) for r in range(self.regions))
        return max(1, int(self.records / total * 1000))

    def with_(self, **changes: Any) -> SimConfig:
        return replace(self, **changes)

    def validate(self) -> SimConfig:
        """Raise ConfigError naming the first unusable setting; returns self."""

        def need(cond: bool, what: str) -> None:
            if not cond:
                raise ConfigError(what)

        need(self.regions >= 1, f"regions must be at least 1, got {self.regions}")
        need(self.regions <= 16, f"regions must be at most 16, got {self.regions}")
        need(self.partitions >= 1, f"partitions must be at least 1, got {self.partitions}")
        need(self.records >= 0, f"records must not be negative, got {self.records}")
        need(self.batch_records >= 0, f"batch_records must not be negative, got {self.batch_records}")
        need(self.keys >= 1, f"keys must be at least 1, got {self.keys}")
        need(
            self.batch_records <= self.keys,
            f"batch_records ({self.batch_records}) exceeds keys ({self.keys})",
        )
        need(self.key_skew >= 0, f"key_skew must not be negative, got {self.key_skew}")
        need(0 <= self.delete_ratio < 1, f"delete_ratio must be in [0, 1), got {self.delete_ratio}")
        need(
            16 <= self.value_size_min <= self.value_size_max,
            f"value sizes must satisfy 16 <= min <= max, got min {self.value_size_min} max {self.value_size_max}",
        )
        need(
            self.value_size_max <= 900_000,
            f"value_size_max {self.value_size_max} needs chunking, which the simulator does not do (max 900000)",
        )
        need(
            self.producers_per_region >= 1,
            f"producers_per_region must be at least 1, got {self.producers_per_region}",
        )
        need(
            len(self.write_rate) in (1, self.regions),
            f"write_rate has {len(self.write_rate)} entries; give one, or one per region ({self.regions})",
        )
        need(
            all(r > 0 for r in self.write_rate), f"write_rate entries must be positive, got {self.write_rate}"
        )
        need(self.default_lag_ms >= 0, f"default_lag_ms must not be negative, got {self.default_lag_ms}")
        for (s, d), v in self.lag_ms.items():
            need(
                0 <= s < self.regions and 0 <= d < self.regions,
                f"lag_ms {s}-{d}: regions must be in 0..{self.regions - 1}",
            )
            need(v >= 0, f"lag_ms {s}-{d}: lag must not be negative, got {v}")
        for q in self.quiet:
            need(
                0 <= q.region < self.regions,
                f"quiet period region {q.region} is not in 0..{self.regions - 1}",
            )
            need(
                0 <= q.start < q.end <= 1,
                f"quiet period of region {q.region}: need 0 <= from < to <= 1, got {q.start}..{q.end}",
            )
            if q.partitions is not None:
                bad = [p for p in q.partitions if not 0 <= p < self.partitions]
                need(not bad, f"quiet period of region {q.region}: partitions {bad} do not exist")
        need(
            self.heartbeat_every_records >= 1,
            f"heartbeat_every_records must be at least 1, got {self.heartbeat_every_records}",
        )
        need(
            self.heartbeat_every_ms >= 1,
            f"heartbeat_every_ms must be at least 1, got {self.heartbeat_every_ms}",
        )
        need(
            self.failover_delay_ms >= 0,
            f"failover_delay_ms must not be negative, got {self.failover_delay_ms}",
        )
        need(self.step_records >= 100, f"step_records must be at least 100, got {self.step_records}")
        for kind, n in self.faults.items():
            need(kind in FAULT_KINDS, f"unknown fault kind {kind!r} (known: {', '.join(FAULT_KINDS)})")
            need(
                isinstance(n, int) and n >= 0,
                f"fault {kind}: count must be a non-negative integer, got {n!r}",
            )
            need(
                not (n and self.live and self.duration_s is None and kind != "compaction"),
                f"fault {kind}={n}: a live run without --duration has no length to spread counted faults "
                f"over; give their times instead (e.g. {kind}@30)",
            )
        for tf in self.fault_times:
            _check_timed(tf, need)
            need(
                self.faults.get(tf.kind, 0) == 0,
                f"fault {tf}: {tf.kind} is also given as a count; give it one way",
            )
            if self.live and self.duration_s is not None:
                need(
                    tf.at_s < self.duration_s,
                    f"fault {tf}: at {tf.at_s:g} s, after the run's end (--duration {self.duration_s:g})",
                )
        need(self.outage_ms >= 1, f"outage_ms must be at least 1, got {self.outage_ms}")
        swaps = self.faults.get("swap", 0) + sum(tf.kind == "swap" for tf in self.fault_times)
        need(swaps <= 1, f"at most one version swap per run (swap=1 or swap@SECONDS), got {swaps}")
        for name in ("swap_push_ms", "swap_rewind_ms", "swap_overlap_ms"):
            need(getattr(self, name) >= 1, f"{name} must be at least 1, got {getattr(self, name)}")
        need(self.live_step_ms >= 10, f"live_step_ms must be at least 10, got {self.live_step_ms}")
        need(self.live_chunk_s >= 1, f"live_chunk_s must be at least 1, got {self.live_chunk_s}")
        need(self.linger_s >= 0, f"linger_s must not be negative, got {self.linger_s:g}")
        need(self.repair_window_s >= 0, f"repair_window_s must not be negative, got {self.repair_window_s:g}")
        need(self.live or not self.linger_s, f"linger_s ({self.linger_s:g}) is for live runs only (--live)")
        if self.duration_s is not None:
            need(self.live, f"duration_s ({self.duration_s:g}) is for live runs only (--live)")
            need(self.duration_s > 0, f"duration must be positive, got {self.duration_s:g} s")
        if self.kafka is not None:
            need(
                sorted(self.kafka) == list(range(self.regions)),
                f"--kafka names regions {sorted(self.kafka)}; every region 0..{self.regions - 1} needs one",
            )
        need(
            self.brokers in ("mock", "real"),
            f"brokers must be 'mock' or 'real', got {self.brokers!r}",
        )
        need(
            self.kafka is None or self.brokers == "mock",
            "--brokers real starts a cluster per region; --kafka REGION=BOOTSTRAP names yours: give one of them",
        )
        need(
            1 <= self.brokers_per_region <= 9,
            f"brokers_per_region must be 1 to 9, got {self.brokers_per_region}",
        )
        need(
            self.brokers_per_region == 1 or self.brokers == "real",
            f"brokers_per_region {self.brokers_per_region} needs real brokers (--brokers real); the mock has one",
        )
        need(
            bool(self.store)
            and all(c.isalnum() or c in "._-" for c in self.store)
            and self.store[0] not in "._",
            f"store name {self.store!r} must be letters, digits, '.', '_' or '-' and not start with '.' or '_'",
        )
        need(self.version >= 1, f"version must be at least 1, got {self.version}")
        need(
            self.workers in ("process", "inline"),
            f"workers must be 'process' or 'inline', got {self.workers!r}",
        )
        return self


def _check_timed(tf: TimedFault, need: Callable[[bool, str], None]) -> None:
    need(tf.kind in FAULT_KINDS, f"unknown fault kind {tf.kind!r} (known: {', '.join(FAULT_KINDS)})")
    need(
        tf.kind != "compaction",
        f"fault {tf}: compaction is done to the archive after the run; give it as a count (compaction=1)",
    )
    need(tf.at_s >= 0, f"fault {tf}: the time must not be negative")
    if tf.for_s is not None:
        need(
            tf.kind in STOP_RESUME_KINDS,
            f"fault {tf}: only {', '.join(STOP_RESUME_KINDS)} last a while (+SECONDS)",
        )
        need(tf.for_s > 0, f"fault {tf}: the duration must be positive")


def parse_fault_spec(spec: str | None) -> tuple[dict[str, int], list[TimedFault]]:
    """`dropped=2,poisoned@12,silent@30+20` -> ({"dropped": 2}, [poisoned at 12 s, silent at 30 s for 20 s]).

    KIND=COUNT places COUNT faults from the seed (a bare KIND means 1); KIND@SECONDS puts one at that many
    seconds after the first write, KIND@SECONDS+SECONDS also says how long a stop/resume kind lasts. Raises
    ConfigError naming the bad item."""
    counts: dict[str, int] = {}
    timed: list[TimedFault] = []
    if spec is None or not spec.strip():
        return counts, timed
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        if "@" in item:
            timed.append(_parse_timed(item))
            continue
        name, sep, count = item.partition("=")
        name = name.strip()
        if name not in FAULT_KINDS:
            raise ConfigError(
                f"--faults item {item!r}: unknown fault kind {name!r} (known: {', '.join(FAULT_KINDS)})"
            )
        if not sep:
            n = 1
        else:
            try:
                n = int(count.strip())
            except ValueError:
                raise ConfigError(
                    f"--faults item {item!r}: count {count.strip()!r} is not an integer"
                ) from None
            if n < 0:
                raise ConfigError(f"--faults item {item!r}: count must not be negative")
        if name in counts:
            raise ConfigError(f"--faults item {item!r}: fault kind {name!r} is given twice")
        counts[name] = n
    return counts, timed


def _parse_timed(item: str) -> TimedFault:
    name, _, when = item.partition("@")
    name = name.strip()
    at, plus, length = when.partition("+")
    try:
        at_s = float(at.strip())
        for_s = float(length.strip()) if plus else None
    except ValueError:
        raise ConfigError(
            f"--faults item {item!r}: expected KIND@SECONDS or KIND@SECONDS+SECONDS (e.g. silent@30+20)"
        ) from None
    tf = TimedFault(name, at_s, for_s)

    def need(cond: bool, what: str) -> None:
        if not cond:
            raise ConfigError(f"--faults item {item!r}: {what}")

    _check_timed(tf, need)
    return tf


def parse_faults(spec: str) -> dict[str, int]:
    """`dropped=2,poisoned=1,failover=1` -> {"dropped": 2, ...}. A bare kind means 1. Raises ConfigError
    naming the bad item (also for a timed item: use parse_fault_spec for those)."""
    counts, timed = parse_fault_spec(spec)
    if timed:
        raise ConfigError(f"--faults item {str(timed[0])!r}: a timed fault where only counts are accepted")
    return counts


def parse_kafka(items: list[str]) -> dict[int, str] | None:
    """`--kafka embedded` -> None; `--kafka 0=host:9092 1=host2:9092` -> {0: "host:9092", ...}."""
    if not items or items == ["embedded"]:
        return None
    out: dict[int, str] = {}
    for item in items:
        if item == "embedded":
            raise ConfigError("--kafka: 'embedded' cannot be mixed with REGION=BOOTSTRAP items")
        region, sep, bootstrap = item.partition("=")
        if not sep or not bootstrap.strip():
            raise ConfigError(f"--kafka item {item!r}: expected REGION=BOOTSTRAP (e.g. 0=broker:9092)")
        try:
            r = int(region)
        except ValueError:
            raise ConfigError(f"--kafka item {item!r}: region {region!r} is not an integer") from None
        if r in out:
            raise ConfigError(f"--kafka item {item!r}: region {r} is given twice")
        boot = bootstrap.strip()
        if boot.startswith("kafka://"):
            boot = boot[len("kafka://") :]
        out[r] = boot
    return out


def _parse_lag_key(key: Any) -> tuple[int, int]:
    text = str(key)
    for sep in ("-", ">", ","):
        if sep in text:
            a, _, b = text.partition(sep)
            try:
                return int(a), int(b)
            except ValueError:
                break
    raise ConfigError(f"lag_ms key {key!r}: expected 'SOURCE-DESTINATION', e.g. '0-2'")


def _quiet(item: Any) -> QuietPeriod:
    if not isinstance(item, Mapping):
        raise ConfigError(f"quiet period {item!r}: expected a mapping with region, from, to")
    try:
        parts = item.get("partitions")
        return QuietPeriod(
            int(item["region"]),
            float(item["from"]),
            float(item["to"]),
            None if parts is None else tuple(int(p) for p in parts),
        )
    except KeyError as exc:
        raise ConfigError(f"quiet period {dict(item)!r}: missing {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"quiet period {dict(item)!r}: {exc}") from None


_SIMPLE = {f.name for f in fields(SimConfig)} - {
    "quiet",
    "lag_ms",
    "faults",
    "fault_times",
    "duration_s",
    "kafka",
    "kafka_conf",
    "kafka_conf_by_region",
    "write_rate",
    "value_size_min",
    "value_size_max",
    "out",
    "progress",
}


def from_mapping(data: Mapping[str, Any], base: SimConfig | None = None) -> SimConfig:
    """Overlay a YAML mapping (the `simulate:` section and `kafka:` of a conf file) on `base`."""
    cfg = base or SimConfig()
    changes: dict[str, Any] = {}
    for key, value in data.items():
        if key in _SIMPLE:
            default = getattr(SimConfig(), key)
            try:
                changes[key] = type(default)(value)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"setting {key}: {value!r} is not a valid {type(default).__name__}"
                ) from None
        elif key == "write_rate":
            rates = value if isinstance(value, list) else [value]
            try:
                changes[key] = [float(r) for r in rates]
            except (TypeError, ValueError):
                raise ConfigError(
                    f"setting write_rate: {value!r} is not a number or a list of numbers"
                ) from None
        elif key == "value_size":
            if isinstance(value, Mapping):
                changes["value_size_min"] = int(value.get("min", cfg.value_size_min))
                changes["value_size_max"] = int(value.get("max", cfg.value_size_max))
            else:
                changes["value_size_min"] = changes["value_size_max"] = int(value)
        elif key == "quiet":
            changes[key] = [_quiet(q) for q in (value or [])]
        elif key == "lag_ms":
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"setting lag_ms: expected a mapping 'SOURCE-DESTINATION: ms', got {value!r}"
                )
            changes[key] = {_parse_lag_key(k): int(v) for k, v in value.items()}
        elif key == "faults":
            if isinstance(value, str):
                changes["faults"], changes["fault_times"] = parse_fault_spec(value)
            else:
                changes[key] = {str(k): int(v) for k, v in (value or {}).items()}
        elif key == "duration_s":
            try:
                changes[key] = None if value is None else float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"setting duration_s: {value!r} is not a number of seconds") from None
        elif key == "kafka_bootstrap":
            changes["kafka"] = (
                None if value in (None, "embedded") else {int(k): str(v) for k, v in value.items()}
            )
        else:
            import difflib

            valid = [
                *_SIMPLE,
                "write_rate",
                "value_size",
                "quiet",
                "lag_ms",
                "faults",
                "duration_s",
                "kafka_bootstrap",
            ]
            match = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
            raise ConfigError(
                f"unknown simulate setting {key!r}" + (f" (did you mean {match[0]!r}?)" if match else "")
            )
    return replace(cfg, **changes)
