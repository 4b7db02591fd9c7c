"""Live serving benchmark: a load generator, workloads and the radixray-vs-SGLang comparison.

``radixray bench run`` drives any OpenAI-compatible endpoint; ``radixray bench compare`` runs
radixray's router and SGLang's router in turn in front of the same ``radixray worker``
processes. Results: benchmarks/README.md ("Live serving benchmark").
"""

from .loadgen import LoadConfig, RequestResult, RunResult, run_load
from .report import markdown_table, percentile, summarize
from .workloads import (
    BenchWorkload,
    Session,
    Turn,
    build_workload,
    mooncake_workload,
    mtbench_workload,
)

__all__ = [
    "LoadConfig",
    "RequestResult",
    "RunResult",
    "run_load",
    "markdown_table",
    "percentile",
    "summarize",
    "BenchWorkload",
    "Session",
    "Turn",
    "build_workload",
    "mooncake_workload",
    "mtbench_workload",
]
