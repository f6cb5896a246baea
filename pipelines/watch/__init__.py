"""`tidegauge watch`: Leap Frog and DIV run continuously on Spark Structured Streaming, with Prometheus metrics on
the driver (issue 19). `metrics` holds what the driver exposes on `--metrics-port`."""
