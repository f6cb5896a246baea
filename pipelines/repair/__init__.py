"""`tidegauge repair`: plan the writes that make divergent regions agree (issue 31)."""
