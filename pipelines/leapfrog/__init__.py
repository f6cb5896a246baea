"""`tidegauge leapfrog`: the Leap Frog job on Spark.

`cli` parses arguments into `job.LeapfrogOptions`; `job.run(options)` plans the regions' reads (`source`), decodes
and scans each VT partition (`decode`, `scan`, `rows`), and compares keys (`keys`) with the rules of the top-level
`leapfrog` package; `state` and `carried` hold what an incremental run leaves for the next one.
"""
