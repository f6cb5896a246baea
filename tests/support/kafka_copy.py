"""An archive's records produced into a real broker's topic, partition by partition in offset order, so that a test
can read the same VT from Kafka and from the archive (an archive written from offset 0 without gaps gets the same
offsets in an empty topic)."""

from __future__ import annotations

from confluent_kafka import Producer

from div import archive


def produce_archive(bootstrap: str, directory: str, source_topic: str, topic: str, partitions) -> None:
    """Every record of the archive's partitions, in order, into `topic` (empty: offsets come out the archive's)."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, "log_level": 0})
    failed: list = []
    for part in partitions:
        for batch in archive.iter_partition(directory, source_topic, part):
            for r in batch.to_pylist():
                p.produce(
                    topic,
                    key=r["key"],
                    value=r["value"],
                    headers=[(h["key"], h["value"]) for h in r["headers"] or []] or None,
                    partition=part,
                    on_delivery=lambda err, _m: err and failed.append(err),
                )
            p.poll(0)
    assert p.flush(60) == 0 and not failed, failed
