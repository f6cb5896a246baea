"""`tidegauge div validate` and `tidegauge div restore`: DIV over archived or live logs.

`cli` parses arguments; `validate` runs the per-partition validator of the top-level `div` package locally, `spark`
runs the same tasks on Spark, `restore` rebuilds follower DIV state from heartbeats.
"""
