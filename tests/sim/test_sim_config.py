"""The simulator's pure parts: settings and flags, the traffic schedule, fault placement,
archive compaction, and the `tidegauge simulate` command line (no Kafka needed). Conflict resolution: test_dcr.py."""

from __future__ import annotations

import hashlib
import pathlib

import numpy as np
import pytest
import yaml

from div import archive
from pipelines.cli import main
from sim.compaction import compact_range
from sim.config import ConfigError, QuietPeriod, SimConfig, from_mapping, parse_faults, parse_kafka
from sim.faults import _neighbours, plan_faults
from sim.traffic import DELETE, PUT, KeySpace, Values, build_schedule, key_content, poison, venice_partition

REPO = pathlib.Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------- settings
def test_parse_faults():
    assert parse_faults("dropped=2, poisoned=1,failover") == {"dropped": 2, "poisoned": 1, "failover": 1}
    assert parse_faults("") == {}


@pytest.mark.parametrize(
    "spec, named",
    [
        ("dropped=2,oops=1", "'oops=1'"),
        ("dropped=two", "'dropped=two'"),
        ("gap=-1", "'gap=-1'"),
        ("gap=1,gap=2", "'gap=2'"),
    ],
)
def test_bad_fault_specs_name_the_item(spec, named):
    with pytest.raises(ConfigError, match=named):
        parse_faults(spec)


def test_parse_kafka():
    assert parse_kafka(["embedded"]) is None and parse_kafka([]) is None
    assert parse_kafka(["0=a:9092", "1=kafka://b:9092"]) == {0: "a:9092", 1: "b:9092"}
    for bad in (["0=a:1", "0=b:1"], ["x=a:1"], ["0"], ["embedded", "0=a:1"]):
        with pytest.raises(ConfigError):
            parse_kafka(bad)


def test_conf_file_documents_the_built_in_defaults():
    data = yaml.safe_load((REPO / "conf" / "simulate.yaml").read_text())
    assert from_mapping(data["simulate"]) == SimConfig()
    assert data["kafka"] == {}


def test_from_mapping_reads_lags_quiet_periods_and_rates():
    cfg = from_mapping(
        {
            "lag_ms": {"0-2": 900},
            "quiet": [{"region": 1, "from": 0.2, "to": 0.4, "partitions": [0]}],
            "write_rate": [100, 200, 300],
            "value_size": {"min": 20, "max": 30},
            "faults": "dropped=1",
        }
    )
    assert cfg.lag(0, 2) == 900 and cfg.lag(2, 0) == cfg.default_lag_ms and cfg.lag(1, 1) == 0
    assert cfg.quiet == [QuietPeriod(1, 0.2, 0.4, (0,))]
    assert cfg.rate(2) == 300.0 and (cfg.value_size_min, cfg.value_size_max) == (20, 30)
    assert cfg.faults == {"dropped": 1}
    cfg.validate()
    with pytest.raises(ConfigError, match="unknown simulate setting 'colour'"):
        from_mapping({"colour": "red"})
    with pytest.raises(ConfigError, match="lag_ms key 'x'"):
        from_mapping({"lag_ms": {"x": 1}})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"regions": 0}, "regions must be at least 1"),
        ({"write_rate": [1.0, 2.0]}, "write_rate has 2 entries"),
        ({"quiet": [QuietPeriod(5, 0.1, 0.2)]}, "quiet period region 5"),
        ({"lag_ms": {(0, 7): 5}}, "lag_ms 0-7"),
        ({"faults": {"meteor": 1}}, "unknown fault kind 'meteor'"),
        ({"kafka": {0: "a:1"}}, "every region 0..2 needs one"),
        ({"store": "_bad"}, "store name"),
        ({"value_size_max": 2_000_000}, "chunking"),
        ({"brokers": "zookeeper"}, "brokers must be 'mock' or 'real'"),
        ({"brokers": "real", "kafka": {0: "a:1", 1: "b:1", 2: "c:1"}}, "--brokers real starts a cluster per"),
        ({"brokers_per_region": 3}, "brokers_per_region 3 needs real brokers"),
        ({"brokers": "real", "brokers_per_region": 0}, "brokers_per_region must be 1 to 9"),
    ],
)
def test_validate_names_the_bad_setting(change, message):
    with pytest.raises(ConfigError, match=message):
        SimConfig(**change).validate()


# ---------------------------------------------------------------------------------------- command line
def test_cli_rejects_a_malformed_fault_spec_with_exit_2(tmp_path, capsys):
    assert main(["simulate", "--out", str(tmp_path / "o"), "--faults", "dropped=2,oops"]) == 2
    err = capsys.readouterr().err
    assert "'oops'" in err and "unknown fault kind" in err
    assert not (tmp_path / "o").exists()


def test_cli_rejects_bad_regions_with_exit_2(tmp_path, capsys):
    assert main(["simulate", "--out", str(tmp_path / "o"), "--regions", "0"]) == 2
    assert "regions must be at least 1" in capsys.readouterr().err


def test_cli_brokers_flag_reaches_the_config_and_excludes_given_clusters(tmp_path, capsys):
    from pipelines.cli import build_parser
    from pipelines.simulate.cli import build_config

    def cfg(*flags):
        return build_config(build_parser().parse_args(["simulate", "--out", str(tmp_path / "o"), *flags]))

    assert (cfg().brokers, cfg("--brokers", "real").brokers, cfg("--brokers", "mock").brokers) == (
        "mock",
        "real",
        "mock",
    )
    (tmp_path / "c.yaml").write_text("simulate:\n  brokers: real\n  brokers_per_region: 3\n")
    assert (
        cfg("--conf", str(tmp_path / "c.yaml")).brokers_per_region,
        cfg("--conf", str(tmp_path / "c.yaml")).brokers,
    ) == (3, "real")
    argv = [
        "simulate",
        "--out",
        str(tmp_path / "o"),
        "--brokers",
        "real",
        "--kafka",
        "0=a:1",
        "1=b:1",
        "2=c:1",
    ]
    assert main(argv) == 2
    assert "--brokers real starts a cluster per region" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_cli_help_teaches(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for word in (
        "--faults",
        "dropped",
        "compaction",
        "truth.json",
        "archive/dc-<id>",
        "--legacy-rmd",
        "--kafka",
        "--brokers",
    ):
        assert word in out


# ---------------------------------------------------------------------------------------- traffic
def test_keys_and_partitioner_follow_venice():
    k = key_content(42)
    assert k == b"\x18key-00000042"  # Avro string: zig-zag length 12, then the bytes
    assert venice_partition(k, 7) == int.from_bytes(hashlib.md5(k).digest(), "big") % 7


def test_schedule_is_exact_sorted_and_respects_quiet_periods():
    cfg = SimConfig(
        records=30_000,
        keys=2_000,
        partitions=3,
        write_rate=[500.0, 1000.0, 1500.0],
        quiet=[QuietPeriod(1, 0.2, 0.5, None), QuietPeriod(2, 0.6, 0.8, (1,))],
        heartbeat_every_records=100,
    ).validate()
    ks = KeySpace.build(cfg.keys, cfg.partitions)
    s = build_schedule(cfg, ks, np.random.default_rng(5))
    assert len(s) == 30_000
    assert (np.diff(s.time_ms) >= 0).all()
    assert (s.partition == ks.partition[s.key]).all()
    nominal = cfg.nominal_duration_ms()
    rel = s.time_ms - cfg.start_ms
    q1 = (s.region == 1) & (rel >= 0.2 * nominal) & (rel < 0.5 * nominal)
    q2 = (s.region == 2) & (s.partition == 1) & (rel >= int(0.6 * nominal)) & (rel < int(0.8 * nominal))
    assert not q1.any() and not q2.any()
    assert ((s.region == 2) & (s.partition == 0) & (rel >= 0.6 * nominal) & (rel < 0.8 * nominal)).any()
    counts = np.bincount(s.region)
    assert counts[2] > counts[0]  # rates shape the traffic
    # the record-count half of the heartbeat cadence: exactly every 100th write of each (region, partition)
    for r in range(3):
        for q in range(3):
            flags = s.heartbeat_after[(s.region == r) & (s.partition == q)]
            assert flags.sum() == flags.size // 100 and all(flags[99::100])
    again = build_schedule(cfg, ks, np.random.default_rng(5))
    assert (again.key == s.key).all() and (again.time_ms == s.time_ms).all()


def test_values_name_their_write_and_poison_changes_them():
    v = Values(np.random.default_rng(1), 300)
    a, b = v.write(7, 1, 100), v.write(8, 1, 100)
    assert len(a) == 100 and a != b and a[:1] == b"W"
    assert len(poison(a)) == 100 and poison(a) != a


# ---------------------------------------------------------------------------------------- faults
def test_neighbours():
    prev, nxt = _neighbours(np.array([5, 3, 5, 5, 3]))
    assert prev.tolist() == [-1, -1, 0, 2, 1] and nxt.tolist() == [2, 4, 3, -1, -1]


def test_fault_placement_follows_its_rules():
    cfg = SimConfig(
        records=20_000,
        keys=5_000,
        partitions=4,
        producers_per_region=2,
        batch_records=500,
        faults={
            "dropped": 4,
            "poisoned": 3,
            "gap": 3,
            "corrupt": 3,
            "duplicate": 2,
            "failover": 2,
            "compaction": 1,
            "broker": 1,
        },
    ).validate()
    ks = KeySpace.build(cfg.keys, cfg.partitions)
    s = build_schedule(cfg, ks, np.random.default_rng(1))
    plan = plan_faults(cfg, s, ks.keys, np.random.default_rng(2))
    assert plan.injected() == cfg.faults and plan.shortfall == {}
    span = s.end_ms - s.start_ms
    _, nxt = _neighbours(s.key)
    rt_keys = {int(s.key[f.write]) for f in plan.faults if f.kind in ("gap", "corrupt", "duplicate")}
    for f in plan.faults:
        if f.kind in ("dropped", "poisoned"):
            i = f.write
            assert nxt[i] == -1 and s.op[i] == PUT  # the last write of its key: nothing heals it
            assert 0.15 * span <= s.time_ms[i] - s.start_ms < 0.7 * span  # heartbeats will cover it
            assert int(s.key[i]) not in rt_keys
            assert f.expect["leapfrog"] and f.expect["div"] == []
            pairs = {(e["region_a"], e["region_b"]) for e in f.expect["leapfrog"]}
            assert all(a < b for a, b in pairs) and len(pairs) == 2
        if f.kind == "failover":
            assert f.time_ms < f.end_ms <= s.end_ms
    streams = [
        (int(s.region[f.write]), int(s.writer[f.write]), f.partition)
        for f in plan.faults
        if f.kind in ("gap", "corrupt")
    ]
    assert len(streams) == len(set(streams)) == 6
    assert all(s.op[f.write] == PUT for f in plan.of("corrupt"))
    failed = {(f.region, f.partition) for f in plan.of("failover")}
    assert len(failed) == 2
    assert all(
        (f.region, f.partition) not in failed for f in plan.of("compaction")
    )  # faults do not mask each other
    assert DELETE in set(s.op.tolist())


def test_faults_that_cannot_be_placed_are_reported():
    cfg = SimConfig(regions=1, records=500, faults={"dropped": 1, "failover": 9}, partitions=2).validate()
    ks = KeySpace.build(cfg.keys, cfg.partitions)
    s = build_schedule(cfg, ks, np.random.default_rng(1))
    plan = plan_faults(cfg, s, ks.keys, np.random.default_rng(2))
    assert "two regions" in plan.shortfall["dropped"]
    assert "only 2" in plan.shortfall["failover"] and len(plan.of("failover")) == 2


# ---------------------------------------------------------------------------------------- compaction
def test_compact_range_removes_only_superseded_records(tmp_path):
    d = tmp_path / "arch"
    keys = [b"\x00a", b"\x00b", b"\x00a", b"\x02c", b"\x00b", b"\x00d", b"\x00a"]
    with archive.ArchiveWriter(d) as w:
        for off, k in enumerate(keys):
            w.append_record("t", 0, off, k, b"v%d" % off, 1000 + off, 0)
        w.append_record("t", 1, 0, b"\x00a", b"x", 1, 0)
    removed = compact_range(str(d), "t", 0, 1, 4)
    assert removed == [1, 2]  # b@1 (b again at 4) and a@2 (a again at 6); c, b@4 and d are kept
    left = [r["offset"] for b in archive.iter_partition(d, "t", 0) for r in b.to_pylist()]
    assert left == [0, 3, 4, 5, 6]
    assert [r["offset"] for b in archive.iter_partition(d, "t", 1) for r in b.to_pylist()] == [0]
    assert not [n for n in d.iterdir() if n.name.startswith(".")]
