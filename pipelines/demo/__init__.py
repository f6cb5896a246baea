"""`tidegauge demo`: simulate a small store, run every job over it and compare their findings with the faults the
simulation injected (`job.run_demo`); `cli` parses arguments."""
