"""A validation cut anywhere and resumed (`PartitionValidator.run_state` / `resume`) decides as the uninterrupted one.

What a streaming DIV keeps between micro-batches is Venice's checkpointed producer states plus what a running
validator knows beyond them; the partition of tests/support/div_faults.py holds every fault whose decision reads
some of it (sequence numbers, checksums in progress, MD5 included, End of Push, undecodable records that explain a
later gap, a producer max-age has made stale but not yet expired). It is cut at every offset, the state saved
through div's own encodings (PartitionState v24 for the producer states, JSON for the rest), and resumed. The
codec's part is what it learnt from `vtp` headers (`EnvelopeCodec.learned`).
"""

from __future__ import annotations

import json

import div_faults as D
import pyarrow as pa
import pytest
from newer_protocol import encode_newer, newer_vtp, to_newer

from div import archive
from div import envelope as E
from div import partition_state as ps
from div.batch import PartitionRun, is_realtime_topic
from div.validator import UNREGISTERED_PRODUCER, PartitionValidator, ValidatorConfig

CONFIG = ValidatorConfig(min_compaction_lag_ms=D.LAG, now_ms=D.NOW, max_age_ms=D.MAX_AGE)


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, pa.Table]:
    d = D.write(tmp_path_factory.mktemp("faulty"))
    return {t: pa.Table.from_batches(list(archive.iter_partition(d, t, 0))) for t in (D.VT, D.RT)}


def _run(topic: str, table: pa.Table, saved: tuple | None = None) -> PartitionRun:
    validator = PartitionValidator(is_realtime=is_realtime_topic(topic), config=CONFIG)
    if saved is not None:
        validator.resume(*saved)
    run = PartitionRun(0, topic, 0, config=CONFIG, validator=validator)
    run.feed(table)
    return run


def _saved(v: PartitionValidator) -> tuple:
    venice = ps.decode(ps.encode(ps.build(0, v.producer_states(), end_of_push=v.end_of_push)))
    return ps.producer_states(venice), venice["endOfPush"], json.loads(json.dumps(v.run_state()))


@pytest.mark.parametrize("topic", [D.VT, D.RT])
def test_a_run_resumed_at_any_offset_decides_as_the_uninterrupted_one(records, topic):
    table = records[topic]
    whole = _run(topic, table)
    types = {r[7] for r in whole.rows}
    # the cuts cross faults of every kind that reads the carried state
    assert {"MISSING", "CORRUPT", "DUPLICATE", "UNDECODABLE", "EXPLAINED_BY_UNDECODABLE"} <= types
    for k in range(table.num_rows + 1):
        first = _run(topic, table.slice(0, k))
        second = _run(topic, table.slice(k), _saved(first.validator))
        assert first.rows + second.rows == whole.rows, f"cut before row {k}"
        assert second.validator.producer_states() == whole.validator.producer_states(), k
        assert second.validator.run_state() == whole.validator.run_state(), k


def test_restore_is_a_restart_and_expires_what_resume_keeps(records):
    # Where S is stale but not yet expired, a replica's restore expires it (Venice loads a checkpoint so), and the
    # run then reports S's next record as an unregistered producer; the uninterrupted run does not.
    table = records[D.VT]
    offsets = table.column("offset").to_pylist()
    k = next(i for i, (_, r) in enumerate(D.faulty_partition()) if (r.guid, r.sequence) == (D.S, 4))
    first = _run(D.VT, table.slice(0, k))
    restarted = PartitionValidator(config=CONFIG)
    restarted.restore(first.validator.producer_states(), end_of_push=first.validator.end_of_push)
    assert D.S in first.validator.segments and D.S not in restarted.segments
    resumed = _run(D.VT, table.slice(k, 1), _saved(first.validator))
    assert resumed.rows == []
    after_restore = PartitionRun(0, D.VT, 0, config=CONFIG, validator=restarted)
    after_restore.feed(table.slice(k, 1))
    assert [(r[3], r[7]) for r in after_restore.rows] == [(offsets[k], UNREGISTERED_PRODUCER)]


def test_a_codec_given_what_another_learnt_decodes_as_it_does(records):
    # a newer writer's schema is announced once, in the vtp header of a producer's first record; a run resumed
    # elsewhere reads the producer's later records without it
    codec = E.EnvelopeCodec()
    first, later = (records[D.VT].slice(i, 1).to_pylist()[0] for i in (2, 3))  # S's StartOfSegment and a PUT
    with_vtp = encode_newer(to_newer(codec.decode(first["value"], first["headers"])), 16)
    without = encode_newer(to_newer(codec.decode(later["value"], later["headers"])), 16)
    assert codec.learned() == {}
    codec.decode(with_vtp, [{"key": "vtp", "value": newer_vtp()}])
    assert set(codec.learned()) == {16}
    resumed = E.EnvelopeCodec()
    for version, schema in codec.learned().items():
        resumed.learn(version, schema)
    assert resumed.decode(without) == codec.decode(without)
    with pytest.raises(E.UndecodableError, match="unknown protocol version 16"):
        E.EnvelopeCodec().decode(without)
