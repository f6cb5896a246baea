"""The exit-code contract, written once, and the error that means "exit 2".

0 clean: every planned record read and decoded, nothing found. 1 findings (findings outrank missing evidence).
2 bad usage or unreadable input: the message names the flag, path or value; nothing is written. 3 partial: no
finding, but some planned record was not read or decoded (the outputs say where). A bug also exits 2, never 1:
a pager must not read a crash as a divergence.
"""

from __future__ import annotations

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_PARTIAL = 0, 1, 2, 3


class UsageError(Exception):
    """Bad command-line input; the message names the offending flag or value. Exit code 2."""
