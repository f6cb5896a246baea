"""The report's two ways to be given bad input, kept light so the CLI can name them without importing GX."""

from __future__ import annotations


class InputError(Exception):
    """A job output the report reads is missing or does not follow docs/outputs.md; the message names it."""


class ExpectationsConfigError(Exception):
    """The expectations file is missing or malformed; the message names the file and the entry."""
