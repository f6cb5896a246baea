"""`tidegauge report`: the morning report over the outputs of `leapfrog`, `div validate` and `lag`.

`cli` parses arguments; `job.run_report` runs the Great Expectations suites of conf/expectations.yaml and writes
the HTML page, its JSON twin and the history. `inputs` reads the job outputs, `tables` shapes them for the checks,
`expectations` runs GX, `history` remembers runs, `plots` and `html` draw the page.
"""
