"""The worker: a paged KV pool, a prefix cache, a scheduler and a model, driven by Engine.

    from radixray.worker import Engine, EngineConfig, SamplingParams
    engine = Engine(EngineConfig(model="tiny", cache="radix", page_size=16))
    outs = engine.generate_batch(["Hello", [1, 2, 3]], SamplingParams(max_tokens=16))
"""

from .config import EngineConfig
from .engine import Engine, GenerationChunk
from .request import MISS_CAUSES, Completion, SamplingParams

__all__ = [
    "Completion",
    "Engine",
    "EngineConfig",
    "GenerationChunk",
    "MISS_CAUSES",
    "SamplingParams",
]
