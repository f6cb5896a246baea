"""Record validator modules for tests: the example of docs/validators.md, run as written, and a flaky one.

They are written to a directory as real modules (`producer_checks`, `flaky_checks`) so that `module:Class` specs
resolve them in this process and, shipped with `SparkContext.addPyFile`, on Spark executors too.
"""

from __future__ import annotations

import pathlib
import re

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "validators.md"

FLAKY_SOURCE = '''
from div.validators.base import RecordValidator


class Flaky(RecordValidator):
    """Raises on every `every`-th record it sees in a partition; rejects nothing."""

    def __init__(self, every: int = 10) -> None:
        self.every = every
        self.seen = 0

    def reset(self, context) -> None:
        self.seen = 0

    def validate(self, record):
        self.seen += 1
        if self.seen % self.every == 0:
            raise RuntimeError(f"boom at {record.offset}")
        return None
'''


def docs_example() -> str:
    """The python block of docs/validators.md that defines ProducerClockBackwards."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    return next(b for b in blocks if "class ProducerClockBackwards" in b)


def write_modules(directory: pathlib.Path) -> list[pathlib.Path]:
    directory.mkdir(parents=True, exist_ok=True)
    files = [directory / "producer_checks.py", directory / "flaky_checks.py"]
    files[0].write_text(docs_example())
    files[1].write_text(FLAKY_SOURCE)
    return files
