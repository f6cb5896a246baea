"""Checkpoints: offsets and DIV state saved together in Venice's PartitionState v24 form (venice-protocol-notes §3.7), atomically.

The PartitionState bytes are checked against Venice's schema file with fastavro directly (magic 24/24, GUID map
keys as Latin-1 text stored as UTF-8). A writer process is killed with SIGKILL at random moments, many times,
and every load must give a complete checkpoint; damaged or foreign files are refused with an error naming them.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import fastavro
import pytest
import venice_reference as ref

from div import checkpoint as ck
from div import partition_state as ps
from div.validator import IN_PROGRESS

HIGH_GUID = bytes([0xFF, 0x80, 0x00, 0x7F, 0xC3, 0xA9, 0x01, 0xFE] * 2)  # bytes ≥ 0x80 and a UTF-8 look-alike
LOW_GUID = bytes(range(16))


def _venice_schema():
    return fastavro.parse_schema(ref.schema_json("PartitionState.v24.avsc"))


def _pps(seq: int, ts: int = 1_000, ctype: int = ref.ADHASH, state: bytes = b"\0" * 7 + b"\x05") -> dict:
    return {
        "segmentNumber": 2,
        "segmentStatus": IN_PROGRESS,
        "isRegistered": True,
        "messageSequenceNumber": seq,
        "messageTimestamp": ts,
        "checksumType": ctype,
        "checksumState": state,
        "aggregates": {"n": 3},
        "debugInfo": {"host": "h"},
    }


def test_partition_state_framing_and_guid_keys_per_venices_schema():
    blob = ps.encode(ps.build(41, {HIGH_GUID: _pps(7), LOW_GUID: _pps(9)}, end_of_push=True, last_update=5))
    assert blob[:2] == bytes([24, 24])
    buf = io.BytesIO(blob[2:])
    raw = fastavro.schemaless_reader(buf, _venice_schema(), None)
    assert buf.tell() == len(blob) - 2
    # Map keys: the 16 GUID bytes read as ISO-8859-1 characters, written as an Avro (UTF-8) string.
    key = HIGH_GUID.decode("latin-1")
    assert set(raw["producerStates"]) == {key, LOW_GUID.decode("latin-1")}
    encoded_key = key.encode("utf-8")
    assert len(encoded_key) == 16 + sum(b >= 0x80 for b in HIGH_GUID)  # every byte ≥ 0x80 became 2 bytes
    assert encoded_key.startswith(b"\xc3\xbf\xc2\x80\x00\x7f")
    assert encoded_key in blob and HIGH_GUID not in blob
    assert raw["producerStates"][key]["messageSequenceNumber"] == 7
    assert raw["offset"] == 41 and raw["endOfPush"] is True and raw["lastUpdate"] == 5
    assert raw["lastConsumedVersionTopicOffset"] == 41
    assert raw["lastConsumedVersionTopicPubSubPosition"] == bytes.fromhex("2201000252")  # offset 41 blob


def test_partition_state_written_by_venices_schema_decodes_with_ours():
    record = ps.build(3, {}, end_of_push=False, last_update=1)
    record["producerStates"] = {HIGH_GUID.decode("latin-1"): _pps(11, ctype=ref.MD5, state=b"x" * 36)}
    record["realtimeTopicProducerStates"] = {"broker:9092": {LOW_GUID.decode("latin-1"): _pps(4)}}
    out = io.BytesIO()
    out.write(bytes([24, 24]))
    fastavro.schemaless_writer(out, _venice_schema(), record)
    state = ps.decode(out.getvalue())
    assert ps.producer_states(state) == {HIGH_GUID: _pps(11, ctype=ref.MD5, state=b"x" * 36)}
    assert ps.key_to_guid(next(iter(state["realtimeTopicProducerStates"]["broker:9092"]))) == LOW_GUID


def test_partition_state_refuses_bad_input():
    good = ps.encode(ps.build(1, {LOW_GUID: _pps(1)}, end_of_push=True))
    for bad, why in (
        (b"", "short"),
        (b"\x18", "short"),
        (b"\x17\x18" + good[2:], "magic"),
        (b"\x18\x17" + good[2:], "magic"),
        (good[:-3], "decode"),
        (good + b"\x00", "trailing"),
    ):
        with pytest.raises(ps.PartitionStateError, match=why):
            ps.decode(bad)
    record = ps.build(1, {}, end_of_push=True)
    record["producerStates"] = {"fifteen-chars!!": _pps(1)}
    with pytest.raises(ps.PartitionStateError, match="16-byte"):
        ps.decode(ps.encode(record))
    with pytest.raises(ps.PartitionStateError):
        ps.key_to_guid("\u0100" * 16)  # not Latin-1


def test_store_round_trip(tmp_path):
    store = ck.CheckpointStore(tmp_path / "ckpt")
    assert store.load("store_v1", 0) is None
    states = {HIGH_GUID: _pps(7), LOW_GUID: _pps(8, ctype=ref.NONE, state=b"")}
    path = store.save(
        "store_v1", 0, 99, states, end_of_push=True, heartbeat_timestamp=77, upstream_offsets={"dc-1": 5}
    )
    store.save("store_v1", 1, 5, {}, end_of_push=False)
    loaded = store.load("store_v1", 0)
    assert loaded["offset"] == 99 and loaded["endOfPush"] is True and loaded["heartbeatTimestamp"] == 77
    assert loaded["upstreamOffsetMap"] == {"dc-1": 5}
    assert ps.producer_states(loaded) == states
    assert store.load("store_v1", 1)["offset"] == 5
    # The file is the PartitionState bytes plus a 12-byte trailer; nothing else is in the directory.
    assert path.read_bytes()[:2] == bytes([24, 24])
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "store_v1-0.partition_state",
        "store_v1-1.partition_state",
    ]
    with pytest.raises(ValueError):
        store.path("../escape", 0)


def _corruptions(data: bytes, rng: random.Random):
    yield "empty", b""
    for n in sorted({1, 5, 11, 12, len(data) // 2, len(data) - 13, len(data) - 12, len(data) - 1}):
        yield f"truncated to {n}", data[:n]
    for _ in range(40):
        i = rng.randrange(len(data))
        flipped = bytearray(data)
        flipped[i] ^= 1 << rng.randrange(8)
        yield f"bit flip at {i}", bytes(flipped)
    yield "appended", data + b"\x00"
    yield "raw PartitionState", data[:-12]
    yield "json", json.dumps({"offset": 5}).encode()
    yield "random", rng.randbytes(len(data))
    yield "framed garbage", ck.frame(b"\x18\x18garbage")
    yield "framed non-PartitionState", ck.frame(b"not a checkpoint at all")
    record = ps.build(1, {}, end_of_push=True)
    record["producerStates"] = {"\u0100" * 16: _pps(1)}  # a map key that is no Latin-1 GUID
    yield "framed PartitionState with a bad GUID key", ck.frame(ps.encode(record))


def test_damaged_or_foreign_files_are_refused_with_their_name(tmp_path):
    store = ck.CheckpointStore(tmp_path)
    path = store.save("store_v1", 3, 1234, {HIGH_GUID: _pps(7)}, end_of_push=True)
    good = path.read_bytes()
    rng = random.Random(11)
    for what, data in _corruptions(good, rng):
        path.write_bytes(data)
        with pytest.raises(ck.CorruptCheckpointError) as info:
            store.load("store_v1", 3)
        assert str(path) in str(info.value), what
    path.write_bytes(good)
    assert store.load("store_v1", 3)["offset"] == 1234


_WRITER = textwrap.dedent("""\
    import sys
    from div.checkpoint import CheckpointStore

    store = CheckpointStore(sys.argv[1])
    guids = [bytes([g % 256, 0x80 | (g // 256)]) * 8 for g in range(int(sys.argv[2]))]
    i = int(sys.argv[3])
    while True:
        i += 1
        states = {g: {"segmentNumber": i % 7, "segmentStatus": 1, "isRegistered": True,
                      "messageSequenceNumber": i, "messageTimestamp": 1000 + i, "checksumType": 4,
                      "checksumState": i.to_bytes(8, "big"), "aggregates": {}, "debugInfo": {}} for g in guids}
        store.save("store_v1", 0, i, states, end_of_push=True, last_update=i)
        print(i, flush=True)
""")


def _check_complete(state: dict, producers: int) -> int:
    """Every producer state must belong to the same checkpoint as the offset: a mix would be garbage."""
    offset = state["offset"]
    states = ps.producer_states(state)
    assert len(states) == producers
    for s in states.values():
        assert (s["messageSequenceNumber"], s["messageTimestamp"], s["checksumState"]) == (
            offset,
            1000 + offset,
            offset.to_bytes(8, "big"),
        )
    assert state["lastUpdate"] == offset and state["lastConsumedVersionTopicOffset"] == offset
    return offset


@pytest.mark.slow
def test_a_writer_killed_at_random_moments_always_leaves_a_complete_checkpoint(tmp_path):
    producers = 1500  # ~100 KB per checkpoint: encoding and writing take long enough to be interrupted
    store = ck.CheckpointStore(tmp_path)
    rng = random.Random(2024)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    last = 0
    kills = 0
    for _ in range(20):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path), str(producers), str(last)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        try:
            first = proc.stdout.readline()  # at least one checkpoint written by this process
            assert first, proc.stderr.read()
            time.sleep(rng.uniform(0, 0.08))
            proc.send_signal(signal.SIGKILL)
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == -signal.SIGKILL
        kills += 1
        acknowledged = int(([first] + out.split())[-1])
        offset = _check_complete(store.load("store_v1", 0), producers)
        # The last acknowledged save is durable; at most the one in flight landed after it.
        assert acknowledged <= offset <= acknowledged + 1
        assert offset > last
        last = offset
    assert kills == 20
    # Killed writers may leave hidden temporary files; they never hide or replace the checkpoint.
    assert all(p.name.startswith(".") for p in tmp_path.iterdir() if p.name != "store_v1-0.partition_state")
