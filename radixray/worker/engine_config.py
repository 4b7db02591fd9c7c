"""Engine configuration: one frozen dataclass, validated on construction. Each field's default
and help are written here once; ``radixray worker`` and ``radixray serve`` generate their engine
flags from them (radixray.settings), and the Serve app and the helm chart start from them."""

from __future__ import annotations

from dataclasses import dataclass

from radixray.cache_index.block_hash import check_page_size
from radixray.cache_index.prefix_cache import CACHE_TYPES
from radixray.cache_index.radix_tree import EVICTION_POLICIES
from radixray.settings import gb_to_bytes, setting

from .scheduler import PACKINGS, PREFILL_ORDERS, SchedulerConfig, check_packing, check_prefill_order

__all__ = ["EngineConfig"]

_DTYPES = ("float32", "float16", "bfloat16")
_SCHED = SchedulerConfig  # the scheduler's own settings keep the scheduler's defaults


@dataclass(frozen=True)
class EngineConfig:
    model: str = setting(
        "smollm2", '"smollm2" (embedded), "tiny" (random test model) or a GGUF/HF path'
    )
    cache: str = setting(
        "radix",
        "prefix reuse: radix (swa_radix for a model with sliding-window layers, mamba_radix "
        "for one with recurrent-state layers), swa_radix, mamba_radix, or chunk (off)",
        choices=CACHE_TYPES,
    )
    page_size: int = setting(16, "tokens per KV page (the router hashes pages of this size)")
    num_pages: int | None = setting(
        None, "KV pool pages (None: sized from --kv-memory-gb, else from free memory)"
    )
    eviction: str = setting("lru", "which cached prefix goes first", choices=EVICTION_POLICIES)
    # The host tier behind the radix cache (docs/host_tier.md): device eviction demotes to it.
    host_pages: int | None = setting(
        None,
        "host-memory KV pages behind the device pool, of the same page size (None: on CUDA 2x "
        "the device pages, at most half the free host memory; on the CPU 0; 0: off)",
    )
    host_write_through_hits: int | None = setting(
        None,
        "copy a cached prefix to the host tier once it has been hit this many times, so its "
        "eviction later frees device pages without a copy (None: write-back only)",
    )
    # The window layers' own pool (docs/window_cache.md), for models with sliding-window layers.
    window_pages: int | None = setting(
        None,
        "window-layer KV pages, for models with sliding-window layers (None: as many as "
        "--num-pages when that is set, else sized from the budget)",
    )
    # The state pool beside the KV pool (worker/state_pool.py), for models with recurrent-state
    # layers: a slot per running request, and the state cache's checkpoints (mamba_radix) in
    # the rest. The default keeps as many checkpoints as requests can run: with fewer slots a
    # request waits for one as for pages, and checkpoints are evicted sooner.
    state_slots: int | None = setting(
        None,
        "recurrent-state slots, for models with state layers (LFM2, Granite 4.0-H): one per "
        "running request, the rest keep prefix checkpoints (None: 2x --max-running; "
        "--max-running with --cache chunk)",
    )
    # 256 is Mamba2's SSD chunk size (mamba_chunk_size, every released Mamba2 checkpoint's):
    # the scan splits a step's tokens into chunks from the step's first token, so a prefill
    # resumed at a multiple of it splits where one pass would and is bitwise equal to it
    # (tests/kernels/test_state_reference.py); short convolutions (LFM2) are exact anywhere.
    state_interval: int = setting(
        256,
        "tokens between state checkpoints of a model with state layers (taken at page ends "
        "that are multiples of it and at each prompt's last full page; prefill chunks end "
        "there): a multiple of the SSD chunk size (256) keeps a resumed prefill bitwise equal "
        "to one pass; smaller: more reuse points, a state slot each",
    )
    # "auto": the accelerator when there is one (what `radixray serve` and `worker` always did).
    device: str = setting("auto", '"auto", "cpu", "cuda" or "cuda:N"')
    dtype: str = setting("float32", "weights and KV cache", choices=_DTYPES)
    seed: int = setting(0, "sampling seed of requests that give none")
    kv_memory_bytes: int | None = setting(
        None,
        "KV pool budget in GB when --num-pages is unset",
        flag="--kv-memory-gb",
        type=float,
        convert=gb_to_bytes,
    )
    max_batch_tokens: int = setting(
        _SCHED.max_batch_tokens, "tokens computed per step (prefill chunks + decodes)"
    )
    max_running: int = setting(_SCHED.max_running, "requests running at once")
    max_model_len: int | None = setting(None, "longest prompt + output (None: the model's)")
    dedupe_in_flight: bool = setting(
        _SCHED.dedupe_in_flight, "a prompt waits a step for the pages a running one prefills"
    )
    prefill_order: str = setting(
        _SCHED.prefill_order,
        "after the decodes, a step's budget goes to the highest (waited + uncomputed) / "
        "uncomputed first, running or waiting (ratio), the fewest uncomputed tokens first "
        "(shortest), or running prefills first, then admissions (fcfs)",
        choices=PREFILL_ORDERS,
    )
    packing: str = setting(
        _SCHED.packing,
        "a step that finishes a prompt takes more prefill only while the prompts behind gain "
        "more than it loses, by the worker's step-cost fits (priced), or every step is filled to "
        "max_batch_tokens (full)",
        choices=PACKINGS,
    )
    enable_events: bool = setting(True, "KV events for routers", cli=False)
    debug_checks: bool = setting(False, "check_integrity() after every step (tests)", cli=False)
    attention_backend: str | None = setting(
        None,
        "flash_attn, triton, cpu or torch (None: RADIXRAY_ATTENTION_BACKEND, else the best this "
        "device runs); a backend that cannot run stops the worker at start-up",
    )
    # SGLang's --cuda-graph-max-bs, vLLM's max capture size: decode steps of up to this many
    # requests replay a CUDA graph (worker/cuda_graph.py); their launches bound a small model.
    cuda_graph_max_batch: int = setting(
        256, "decode batches up to this size replay CUDA graphs, captured at start (0: off; CUDA)"
    )
    # The host's work for one step while the device runs the next (worker/overlap.py).
    overlap: str = setting(
        "auto",
        "schedule and emit while the device runs the step before: on, off (the serial loop), "
        "or auto (on with CUDA, off on a CPU)",
        choices=("auto", "on", "off"),
    )
    # Workers sharing a machine should split the cores: oversubscribed threads made a decode step
    # 10x slower on 2 shared cores.
    cpu_threads: int | None = setting(
        None, "torch threads per CPU worker (None: torch's; serve: cores / workers)"
    )
    # The id routers know this worker by; None: unique by default (its address: host and port,
    # a Ray actor id). See WorkerHost. `radixray worker --worker-id` sets it.
    worker_id: str | None = setting(None, "the id routers know it by", cli=False)

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
        if self.host_pages is not None and (
            isinstance(self.host_pages, bool)
            or not isinstance(self.host_pages, int)
            or self.host_pages < 0
        ):
            raise ValueError(
                f"--host-pages must be an int >= 0 (0: no host tier) or unset, "
                f"got {self.host_pages!r}"
            )
        wt = self.host_write_through_hits
        if wt is not None and (isinstance(wt, bool) or not isinstance(wt, int) or wt < 1):
            raise ValueError(f"--host-write-through-hits must be an int >= 1 or unset, got {wt!r}")
        if self.window_pages is not None and (
            isinstance(self.window_pages, bool)
            or not isinstance(self.window_pages, int)
            or self.window_pages < 1
        ):
            raise ValueError(f"window_pages must be None or an int >= 1, got {self.window_pages!r}")
        ss = self.state_slots
        if ss is not None and (isinstance(ss, bool) or not isinstance(ss, int) or ss < 1):
            raise ValueError(f"--state-slots must be an int >= 1 or unset, got {ss!r}")
        si = self.state_interval
        if isinstance(si, bool) or not isinstance(si, int) or si < 1:
            raise ValueError(f"--state-interval must be an int >= 1, got {si!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {self.dtype!r}")
        dev = self.device
        if not (dev in ("cpu", "cuda", "auto") or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {dev!r}")
        for name in ("max_batch_tokens", "max_running"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if self.overlap not in ("auto", "on", "off"):
            raise ValueError(f"overlap must be 'auto', 'on' or 'off', got {self.overlap!r}")
        check_prefill_order(self.prefill_order)
        check_packing(self.packing)
        if self.cpu_threads is not None and (
            not isinstance(self.cpu_threads, int) or self.cpu_threads < 1
        ):
            raise ValueError(f"cpu_threads must be None or an int >= 1, got {self.cpu_threads!r}")
        cg = self.cuda_graph_max_batch
        if isinstance(cg, bool) or not isinstance(cg, int) or cg < 0:
            raise ValueError(f"--cuda-graph-max-batch must be an int >= 0 (0: off), got {cg!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be None or >= 2, got {self.max_model_len!r}")

    def overlapped(self, device) -> bool:
        """Whether steps overlap on ``device`` (a torch.device)."""
        return self.overlap == "on" or (self.overlap == "auto" and device.type == "cuda")

    def scheduler(self) -> SchedulerConfig:
        """The scheduler's settings among these (the rest keep SchedulerConfig's defaults)."""
        return SchedulerConfig(
            max_batch_tokens=self.max_batch_tokens,
            max_running=self.max_running,
            dedupe_in_flight=self.dedupe_in_flight,
            prefill_order=self.prefill_order,
            packing=self.packing,
            state_interval=self.state_interval,
        )
