"""Engine configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from radixray.cache_index.block_hash import check_page_size
from radixray.cache_index.prefix_cache import CACHE_TYPES
from radixray.cache_index.radix_tree import EVICTION_POLICIES

from .scheduler import check_prefill_order

__all__ = ["EngineConfig"]

_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2"  # "smollm2" (embedded), "tiny" (random, for tests) or a path
    cache: str = "radix"  # "radix" or "chunk" (reuse off)
    page_size: int = 16
    num_pages: int | None = None  # None: size the pool from kv_memory_bytes / free memory
    eviction: str = "lru"
    device: str = "cpu"  # "cpu", "cuda", "cuda:N" or "auto"
    dtype: str = "float32"
    seed: int = 0
    kv_memory_bytes: int | None = None  # pool budget when num_pages is None
    max_batch_tokens: int = 1024
    max_running: int = 64
    max_model_len: int | None = None  # None: the model's context length
    dedupe_in_flight: bool = True
    prefill_order: str = "fcfs"  # "fcfs" or "shortest": SchedulerConfig.prefill_order
    enable_events: bool = True
    debug_checks: bool = False  # check_integrity() after every step (tests)
    attention_backend: str | None = None
    # torch intra-op threads on CPU (None: torch's default). Workers sharing a machine should
    # split the cores: oversubscribed threads made a decode step 10x slower on 2 shared cores.
    cpu_threads: int | None = None
    # The id routers know this worker by; None: unique by default (its address: host and port,
    # a Ray actor id). See WorkerHost.
    worker_id: str | None = None

    def __post_init__(self):
        if self.cache not in CACHE_TYPES:
            raise ValueError(f"cache must be one of {sorted(CACHE_TYPES)}, got {self.cache!r}")
        if self.eviction not in EVICTION_POLICIES:
            raise ValueError(
                f"eviction must be one of {sorted(EVICTION_POLICIES)}, got {self.eviction!r}"
            )
        check_page_size(self.page_size)
        if self.num_pages is not None and (
            not isinstance(self.num_pages, int) or self.num_pages < 2
        ):
            raise ValueError(f"num_pages must be None or an int >= 2, got {self.num_pages!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {self.dtype!r}")
        dev = self.device
        if not (dev in ("cpu", "cuda", "auto") or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {dev!r}")
        for name in ("max_batch_tokens", "max_running"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        check_prefill_order(self.prefill_order)
        if self.cpu_threads is not None and (
            not isinstance(self.cpu_threads, int) or self.cpu_threads < 1
        ):
            raise ValueError(f"cpu_threads must be None or an int >= 1, got {self.cpu_threads!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be None or >= 2, got {self.max_model_len!r}")
