"""Live serving benchmark: radixray's router vs SGLang's router on the same four workers.

    .venv/bin/python benchmarks/bench_serving.py            # the published table's settings
    .venv/bin/python benchmarks/bench_serving.py --help     # every knob (radixray bench compare)
    .venv/bin/python benchmarks/bench_serving.py --quick    # a smoke run: 2 tiny workers, seconds

Writes /tmp/bench_serving/bench_serving.{json,png,md}; the table and the reading of it
are in benchmarks/README.md ("Live serving benchmark").
"""

from __future__ import annotations

import sys

from radixray.bench.bench_cli import main

# The smoke run: radixray's router only (no SGLang needed), two tiny workers, a few requests of
# each workload; any flag given after --quick overrides these.
QUICK = [
    "--targets", "radixray:ttft",
    "--workers", "2",
    "--model", "tiny",
    "--repeats", "1",
    "--mooncake-requests", "12",
    "--mtbench-sessions", "2",
    "--probe-requests", "2",
    "--no-progress",
]  # fmt: skip

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--quick" in args:
        args.remove("--quick")
        args = QUICK + args
    sys.exit(main(["compare", *args]))
