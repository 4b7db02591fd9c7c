"""Trace-driven routing simulator: the router's own policies, dispatch core and ApproxIndex over
simulated workers that run the engine's own scheduler over real RadixCaches, with a timing model
(a preset, or one fitted to a live engine by ``radixray sim calibrate``) in place of a model.

>>> from radixray.sim import load_mooncake, simulate, SimConfig
>>> result = simulate(load_mooncake(limit=500), "ttft", SimConfig(num_workers=4))
>>> result.summary()["hit_rate"]  # doctest: +SKIP
"""

from .data import data_dir, mooncake_trace_path
from .generators import azure_shared_prefix, hot_prefix, multiturn_chat
from .results import RequestRecord, RunResult, ceiling, percentile
from .simulator import SimConfig, Simulator, simulate
from .timing import TIMING_PRESETS, TimingModel, timing_preset
from .workload import SimRequest, Workload, load_mooncake, resolve_trace

__all__ = [
    "RequestRecord",
    "RunResult",
    "SimConfig",
    "SimRequest",
    "Simulator",
    "TIMING_PRESETS",
    "TimingModel",
    "Workload",
    "azure_shared_prefix",
    "ceiling",
    "data_dir",
    "hot_prefix",
    "load_mooncake",
    "mooncake_trace_path",
    "multiturn_chat",
    "percentile",
    "resolve_trace",
    "simulate",
    "timing_preset",
]
