"""An archive's records produced into a real broker's topic, partition by partition in offset order, so that a test
(or a benchmark) can read the same VT from Kafka and from the archive (an archive written from offset 0 without
gaps gets the same offsets in an empty topic)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import Producer

from div import archive


def produce_archive(
    bootstrap: str,
    directory: str,
    source_topic: str,
    topic: str,
    partitions: Iterable[int],
    conf: Mapping[str, object] | None = None,
    flush_timeout_s: float = 60,
    keep_timestamps: bool = False,
) -> None:
    """Every record of the archive's partitions, in order, into `topic` (empty: offsets come out the archive's);
    `conf`: producer settings over the defaults (a benchmark's larger batches). A full local queue waits for room
    rather than failing, so any number of records can be copied. `keep_timestamps`: each record keeps the
    archive's timestamp (a CreateTime topic then holds the same times: a cut at T reads the same there)."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "log_level": 0,
            **dict(conf or {}),
        }
    )
    failed: list = []
    for part in partitions:
        for batch in archive.iter_partition(directory, source_topic, part):
            times = archive.timestamps_ms(batch) if keep_timestamps else [None] * batch.num_rows
            for r, ms in zip(batch.to_pylist(), times, strict=True):
                stamp = {"timestamp": ms} if ms is not None else {}
                while True:
                    try:
                        p.produce(
                            topic,
                            key=r["key"],
                            value=r["value"],
                            headers=[(h["key"], h["value"]) for h in r["headers"] or []] or None,
                            partition=part,
                            on_delivery=lambda err, _m: err and failed.append(err),
                            **stamp,
                        )
                        break
                    except BufferError:
                        p.poll(0.05)
            p.poll(0)
    assert p.flush(flush_timeout_s) == 0 and not failed, failed[:3]
