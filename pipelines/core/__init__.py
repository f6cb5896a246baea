"""What every command shares, and the only part of `pipelines` a command may import besides itself: exit codes
and the usage error (`errors`), what Ctrl-C did (`interrupts`), configuration files (`config`), safe outputs
(`output`), the table of source kinds (`sources`, with the Spark readers `kafka_source` and `archive_source`), the
Spark session (`spark_session`) and the flag values handed to it (`spark_flags`), the evidence behind a verdict
(`evidence`) and progress lines (`progress`)."""
