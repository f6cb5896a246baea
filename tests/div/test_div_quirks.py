"""Where Venice has a known quirk (venice-protocol-notes §2.7, §3.3–3.6, §8, §9) we chose a behaviour; each choice is pinned here.

The numbered decisions are those listed in `div/validator.py`'s docstring. Each test says what Venice does, what
we do instead, and shows the difference on a concrete log.
"""

from __future__ import annotations

import venice_reference as ref
from test_div_validator import A, B, Feeder, P

from div import checksum as cks
from div import envelope as E
from div.validator import END_OF_FINAL_SEGMENT, PartitionValidator, Segment, ValidatorConfig
from div.writer import SegmentWriter
from pipelines.core.sources import SourceSpec
from pipelines.div import validate as div_validate

CODEC = E.EnvelopeCodec("fastavro")


# 1. Resync after a post-EOP fault ---------------------------------------------------------------------------------
# Venice re-validates the record with tolerate = true; for CORRUPT-at-EOS and data-after-EOS that second pass
# raises DUPLICATE and the record is dropped. We report one finding per fault and apply the EOS.


def test_corrupt_end_of_segment_after_eop_is_one_finding_and_ends_the_segment():
    d = Feeder()
    d.to_phase(True)
    a = ref.RefProducer(A)
    got = d.feed(a.put(b"k", b"v"), a.end_segment(final=True, checksum=b"\xee" * 8))
    assert got == [("EOS0", "CORRUPT", False)]  # no DUPLICATE from a second pass
    assert d.v.producer_states()[A]["segmentStatus"] == END_OF_FINAL_SEGMENT  # the EOS was applied
    assert d.feed(a.put(b"k", b"w"), a.end_segment()) == []


def test_data_after_end_of_segment_after_eop_is_one_finding():
    d = Feeder()
    d.to_phase(True)
    a = ref.RefProducer(A)
    d.feed(a.put(b"k", b"v"), a.end_segment())
    a.open = True
    got = d.feed(a.put(b"k", b"late"), a.put(b"k", b"later"))
    assert got == [("PUT0.3", "DATA_AFTER_SEGMENT_END", False), ("PUT0.4", "DATA_AFTER_SEGMENT_END", False)]


# 2. Fatal faults before EOP ---------------------------------------------------------------------------------------
# Venice stops the replica at the first one. A batch validator goes on: it resyncs exactly as after EOP, marks
# the finding fatal and judges later records against the resynced state.


def test_validation_goes_on_after_a_fatal_fault():
    d = Feeder()
    push = d.to_phase(False)
    a = ref.RefProducer(A)
    first = a.put(b"k", b"1")
    a.put(b"k", b"lost")
    got = d.feed(first, a.put(b"k", b"3"), a.put(b"k", b"4"))
    assert got == [("PUT0.3", "MISSING", True)]  # PUT0.4 is judged against the resynced state: clean
    got = d.feed(a.end_segment(), push.end_of_push())
    assert got == [("EOS0", "CORRUPT", True)]  # a second fatal finding in the same run
    b = ref.RefProducer(B)
    b.put(b"k", b"1")
    assert d.feed(b.put(b"k", b"2")) == []  # after EOP, an unknown mid-segment producer is fine


# 3. Restored ended segments ---------------------------------------------------------------------------------------
# Venice restores a segment with a fresh, non-finalized checksum even if its status says ended, so data after
# the EOS is accepted after a restart. We keep it finalized.


def test_data_after_end_of_segment_is_still_caught_after_a_restore():
    d = Feeder()
    d.to_phase(True)
    a = ref.RefProducer(A)
    d.feed(a.put(b"k", b"v"), a.end_segment(final=False))
    restored = Feeder(PartitionValidator())
    restored.v.restore(d.v.producer_states(), end_of_push=True)
    assert restored.v.segments[A].ended and restored.v.segments[A].checksum.finalized
    a.open = True
    assert restored.feed(a.put(b"k", b"late")) == [("PUT0.3", "DATA_AFTER_SEGMENT_END", False)]


# 4. Max-age anchor ------------------------------------------------------------------------------------------------
# Venice anchors expiry at the newest producer timestamp of the *previous* checkpoint's OffsetRecord, so it lags
# one checkpoint. We anchor at the current state: a producer expires at the first checkpoint after a newer one
# made it stale.


def test_max_age_anchor_is_the_current_state():
    d = Feeder(max_age_ms=5_000)
    push = ref.RefProducer(P, start_ms=1_002)
    a = ref.RefProducer(A, start_ms=1_000)
    b = ref.RefProducer(B, start_ms=10_000)
    d.feed(a.put(b"k", b"1"), push.start_of_push())  # checkpoint 1: newest 1_004, nothing stale
    assert set(d.v.segments) == {A, P}
    d.feed(b.put(b"k", b"1"), b.control(ref.SOIP, {"version": "i"}))  # checkpoint 2: newest 10_003
    # Venice (anchor 1_004 from checkpoint 1) would keep A until checkpoint 3; we drop A and P now.
    assert set(d.v.segments) == {B}
    assert d.feed(a.put(b"k", b"2")) == [("PUT0.2", "UNREGISTERED_PRODUCER", True)]


# 5. After UNREGISTERED_PRODUCER ----------------------------------------------------------------------------------
# Venice processes the record but leaves the new segment's "new" flag set, so an immediate duplicate of it
# passes unnoticed. We resync, so the duplicate is caught.


def test_duplicate_right_after_an_unregistered_producer_is_caught():
    d = Feeder()
    d.to_phase(True)
    a = ref.RefProducer(A)
    d.feed(a.put(b"k", b"1"), a.end_segment())
    a.put(b"k", b"2")  # SOS1 and PUT1.1 lost
    again = a.put(b"k", b"3")
    got = d.feed(again, again)
    assert got == [("PUT1.2", "UNREGISTERED_PRODUCER", False), ("PUT1.2", "DUPLICATE", False)]


# Venice suppresses the after-EOP warning for records with sequence number 1; we report every fault. -------------


def test_faults_at_sequence_one_are_reported():
    d = Feeder()
    d.to_phase(True)
    a = ref.RefProducer(A)
    recs = a.put(b"k", b"1")
    assert d.feed(recs, recs[1]) == [("PUT0.1", "DUPLICATE", False)]


# Venice's UnsupportedMessageTypeException (a control type that cannot be checksummed, e.g. the deprecated
# StartOfBufferReplay, inside a checksummed segment) is reported as a CORRUPT finding. ----------------------------


def test_unsupported_control_type_is_a_corrupt_finding_after_eop_too():
    d = Feeder()
    d.to_phase(True)
    a = ref.RefProducer(A)
    got = d.feed(
        a.put(b"k", b"1"),
        a.control(ref.SOBR, {"sourceOffsets": [], "sourceKafkaCluster": "c", "sourceTopicName": "t"}),
    )
    assert got == [("StartOfBufferReplay0.2", "CORRUPT", False)]


# CRC32/ADLER32 segments: Venice throws when asked to checkpoint them (venice-protocol-notes §3.10 #9). We checkpoint their running
# 32-bit value as 8 big-endian bytes, so our own restores can continue such a segment. ---------------------------


def test_crc32_and_adler32_segments_can_be_checkpointed_and_continued():
    for ctype in (ref.CRC32, ref.ADLER32):
        d = Feeder()
        d.to_phase(True)
        a = ref.RefProducer(A, checksum_type=ctype)
        d.feed(a.put(b"k", b"1"), a.put(b"k", b"2"))
        state = d.v.producer_states()[A]
        assert state["checksumType"] == ctype and len(state["checksumState"]) == 8
        restored = Feeder(PartitionValidator())
        restored.v.restore({A: state}, end_of_push=True)
        assert restored.feed(a.put(b"k", b"3"), a.end_segment()) == []
        seg = Segment.from_state(state)
        assert seg.checksum.type == ctype and seg.checksum.state() == state["checksumState"]
        assert cks.Checksum.restore(ctype, state["checksumState"]).value() == state["checksumState"]


# Writer retries (venice-protocol-notes §2.7) --------------------------------------------------------------------------------------
# Venice retries a control message after "topic does not exist" with the segment's *current* counter: the retried
# SOS carries sequence 1 and so does the next data message, which a strict consumer drops as a DUPLICATE. Our
# writer hands out finished records; a retry resends the identical bytes.


def test_venices_retry_numbering_loses_the_next_record_and_ours_does_not():
    venice = ref.RefProducer(A)
    sos = venice.put(b"warm-up", b"")[0]  # SOS at sequence 0: this first send failed (topic missing)
    env = ref.decode_envelope(sos.value)
    env["producerMetadata"]["messageSequenceNumber"] = 1  # the retry re-reads the advanced counter
    retried = sos.replace(key=ref.control_key(A, 0, 1), value=ref.encode_envelope(env), sequence=1)
    data = venice.put(b"k", b"v")[0].replace(label="the data record")
    env = ref.decode_envelope(data.value)
    env["producerMetadata"]["messageSequenceNumber"] = 1  # and the next message gets the same number
    data = data.replace(value=ref.encode_envelope(env))
    d = Feeder()
    d.to_phase(True)
    assert d.feed(retried, data) == [("the data record", "DUPLICATE", False)]

    w = SegmentWriter(A, clock=lambda: 5)
    first = w.put(0, b"k", b"v")  # SOS + data; suppose the SOS send failed and was retried
    log = [first[0], first[0], first[1]]  # the failed attempt may or may not have landed: both are fine
    v = PartitionValidator(config=ValidatorConfig())
    v.end_of_push = True
    findings = [
        f for i, r in enumerate(log) for f in v.process(i, r.key, CODEC.decode(r.value, r.headers), 5)
    ]
    assert [(f.offset, f.type) for f in findings] == [(1, "DUPLICATE")]
    assert v.segments[A].sequence == 1  # the data record was accepted


# Compaction tolerance input (venice-protocol-notes §9 #12): an archive cannot tell whether its topic was compacted, and a cluster
# may not answer DescribeConfigs. We are strict (no tolerance) unless --min-compaction-lag-ms says otherwise. ------


class _FakeSource:
    region = 0
    uri = "fake"

    def __init__(self, lag):
        self.lag = lag

    def topics(self):
        return ["s_v1", "s_rt"]

    def partitions(self, topic):
        return [0]

    def min_compaction_lag_ms(self, topic):
        return self.lag


def _lags(source_lag, flag):
    opts = div_validate.ValidateOptions(
        sources=[SourceSpec(0, "fake")], out="x", min_compaction_lag_ms=flag, now_ms=123
    )
    return {
        t.topic: (t.config.min_compaction_lag_ms, t.config.now_ms)
        for t in div_validate.plan(opts, [_FakeSource(source_lag)])
    }


def test_compaction_lag_comes_from_the_flag_else_the_topic_else_strict():
    assert _lags(None, None) == {"s_v1": (None, 123), "s_rt": (None, 123)}  # unknown: strict
    assert _lags(60_000, None) == {"s_v1": (60_000, 123), "s_rt": (None, 123)}  # the topic's own setting
    assert _lags(60_000, 5) == {"s_v1": (5, 123), "s_rt": (5, 123)}  # the flag wins


def test_kafka_source_reads_cleanup_policy_and_min_compaction_lag(monkeypatch):
    from pipelines.core import sources

    cases = [
        ({"cleanup.policy": "compact", "min.compaction.lag.ms": "86400000"}, 86_400_000),
        ({"cleanup.policy": "compact,delete", "min.compaction.lag.ms": "5"}, 5),
        ({"cleanup.policy": "compact"}, 0),  # Kafka's default lag
        ({"cleanup.policy": "delete", "min.compaction.lag.ms": "5"}, None),
        ({}, None),  # the cluster cannot tell (the mock cluster has no DescribeConfigs)
    ]
    for config, expected in cases:
        monkeypatch.setattr(
            sources.kafka_log, "topic_config", lambda bootstrap, conf, topic, name, _c=config: _c.get(name)
        )
        src = object.__new__(sources.KafkaSource)
        src.bootstrap = "127.0.0.1:1"
        src.kafka_conf = {}
        assert src.min_compaction_lag_ms("s_v1") == expected, config
