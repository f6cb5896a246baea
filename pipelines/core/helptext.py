"""How `--help` lays out a command's description and epilog: prose wraps at the terminal's width, examples stay
exactly as written.

argparse offers either: its default formatter refills everything (an example's lines run together and cannot be
copied), `RawDescriptionHelpFormatter` keeps everything (prose written 115 columns wide runs past an 80-column
terminal). Here, as in a man page:
- a paragraph of unindented lines is prose, filled to the width argparse uses for the flags' help (the terminal's,
  or $COLUMNS);
- an indented line that starts a command (`tidegauge ...`, `spark-submit ...`, `curl ...`), and the lines its
  trailing backslash continues it on, is an example: kept verbatim, so that it can be copied and run;
- any other indented line is an item of a list or table (the lines under it indented deeper are its own): filled
  to the width, its continuation lines under its text.
"""

from __future__ import annotations

import argparse
import re
import textwrap

COMMANDS = ("tidegauge ", "spark-submit ", "curl ")
_LABEL = re.compile(r"\s*\S+(?: \S+)*?\s{2,}")  # a table row's first column and the spaces after it


def _fill(text: str, width: int, first: str, rest: str) -> str:
    # (flags, paths and URIs are never cut, at hyphens or anywhere)
    return textwrap.fill(
        text,
        width,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    )


class HelpFormatter(argparse.HelpFormatter):
    """The formatter of every tidegauge parser (`pipelines.cli` makes it the default)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        paragraph: list[str] = []
        item: list[str] = []

        def flush() -> None:
            if paragraph:
                out.append(_fill(" ".join(paragraph), width, indent, indent))
                paragraph.clear()
            if item:
                lead = item[0][: len(item[0]) - len(item[0].lstrip())]
                if len(item) > 1:
                    under = item[1][: len(item[1]) - len(item[1].lstrip())]
                else:
                    label = _LABEL.match(item[0])
                    under = " " * len(label.group(0)) if label else lead + "  "
                out.append(_fill(" ".join(ln.strip() for ln in item), width, indent + lead, indent + under))
                item.clear()

        continued = False
        for line in text.splitlines():
            stripped = line.strip()
            if continued or (line[:1].isspace() and stripped.startswith(COMMANDS)):
                flush()
                out.append(indent + line)
                continued = stripped.endswith("\\")
            elif not stripped:
                flush()
                out.append("")
            elif not line[0].isspace():
                if item:
                    flush()
                paragraph.append(stripped)
            elif item and len(line) - len(line.lstrip()) > len(item[0]) - len(item[0].lstrip()):
                item.append(line)
            else:
                flush()
                item.append(line)
        flush()
        return "\n".join(out)
