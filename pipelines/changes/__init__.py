"""`tidegauge changes`: every change of a version topic delivered once, from an archive or a live cluster.

`cli` parses arguments; `job` runs `heartbeat.change_events.PartitionChanges` (the one rule) over each partition in
this process, `spark` runs the same per-partition step as one Spark task per partition, `state` keeps the reader's
state between runs (`--state`) and commits it after the output, so that a run killed anywhere repeats nothing.
"""
