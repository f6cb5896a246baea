"""`tidegauge simulate`: run a simulated active/active store (the `sim` package) into an archive or a Kafka
cluster; `cli` parses arguments, `job.run(options)` runs it."""
