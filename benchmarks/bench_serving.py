"""Live serving benchmark: radixray's router vs SGLang's router on the same four workers.

    .venv/bin/python benchmarks/bench_serving.py            # the published table's settings
    .venv/bin/python benchmarks/bench_serving.py --help     # every knob (radixray bench compare)

Writes /tmp/bench_serving/bench_serving.{json,png,md}; the table and the reading of it
are in benchmarks/README.md ("Live serving benchmark").
"""

from __future__ import annotations

import sys

from radixray.bench.cli import main

if __name__ == "__main__":
    sys.exit(main(["compare", *sys.argv[1:]]))
