"""The worker: a paged KV pool, a prefix cache, a scheduler and a model, driven by Engine.

    from radixray.worker import Engine, EngineConfig, SamplingParams
    engine = Engine(EngineConfig(model="tiny", cache="radix", page_size=16))
    outs = engine.generate_batch(["Hello", [1, 2, 3]], SamplingParams(max_tokens=16))

Names are imported on first use (PEP 562), so ``radixray.worker.engine_config`` can be read (by
the Serve app's config checks) without loading torch.
"""

from __future__ import annotations

import importlib

from radixray.protocol import MISS_CAUSES, SamplingParams, StreamChunk

__all__ = [
    "Completion",
    "Engine",
    "EngineConfig",
    "EngineError",
    "MISS_CAUSES",
    "SamplingParams",
    "StreamChunk",
    "WorkerHost",
]

_LAZY = {
    "Completion": ".request",
    "Engine": ".engine",
    "EngineConfig": ".engine_config",
    "EngineError": ".engine",
    "WorkerHost": ".host",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
