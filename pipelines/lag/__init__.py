"""`tidegauge lag`: replication lag per VT region, partition and source region, read from VT heartbeats.

`cli` parses arguments into `job.LagOptions`; `job.run(options)` reads every region's VT through
`heartbeat.LagMonitor` and writes the lag table.
"""
