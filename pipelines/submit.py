"""Entry point for `spark-submit`, which runs a Python driver only when its primary resource is a `.py` file.

    spark-submit --master yarn --py-files tidegauge.zip "$(python -m pipelines.submit --path)" leapfrog ...

(`python -m pipelines.submit --path` prints this file's location.) Everything after the script path is the
usual `tidegauge` command line; see docs/spark.md.
"""

from __future__ import annotations

import sys


def main() -> int:
    if sys.argv[1:] == ["--path"]:
        print(__file__)
        return 0
    from pipelines.cli import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
