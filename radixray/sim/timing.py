"""How long a simulated worker's forward step takes.

One step of a continuous-batching engine runs every decoding request for one token plus up to
``max_batch_tokens`` prefill tokens (chunked prefill), so a step costs::

    step_s = step_overhead_s
           + decode_seq_s * decode_batch + decode_ctx_s * decode_context_tokens
           + prefill_token_s * prefill_tokens + prefill_attn_s * prefill_tokens * context_tokens

(the last term is attention over the prefix each new token attends to; it is what makes a long
uncached context more expensive than its length alone).

Presets:

- ``cpu`` -- SmolLM2-135M, HF transformers, float32, on this project's 2-core CPU machine, from
  the task brief's measurements: ~0.98 s to prefill 512 tokens, 42 ms per decode step at batch 1
  and ~125 ms at batch 8 (radixray's own engine on the same machine is in benchmarks/README.md,
  "Worker engine"). A line through the two decode points gives 30.1 ms of fixed cost per step
  and 11.86 ms per decoding sequence; the prefill point then gives (0.98 - 0.030) / 512 = 1.855 ms
  per prefill token. The attention terms are small estimates (135M parameters, 30 layers of 576
  wide: the matmuls dominate at these lengths).
- ``gpu`` -- illustrative numbers for an 8B model (Llama-3.1-8B, 32 layers) on one modern
  datacenter GPU (~12k prefill tokens/s, 12 ms decode steps growing slowly with batch), taken
  from published specifications and typical serving figures, not measured by this project: for
  shape, not for claims. The GPU kit measures them: ``bash benchmarks/gpu/run.sh big`` fits
  this model to radixray's engine at Llama-3.1-8B's shapes on the lent card
  (``benchmarks/gpu/sim_timing.py``: ``sim calibrate``'s probes and fit) and leaves
  ``timing_<card>_<date>_<shapes>.json`` in $OUT (``radixray sim --timing FILE`` reads it as it
  is). To make it the preset, copy the file into this folder and change one line below,
  ``"gpu": _GPU_SPECIFIED`` to ``"gpu": measured_preset(_GPU_SPECIFIED, "<the file's name>")``
  (:func:`measured_preset`: the file's five step coefficients and load-back figures, these
  batch limits and layers; the name says the card and the date).

The host tier (docs/host_tier.md): a step that demotes or loads back pages first copies them, as
the engine does before its forward, for ``load_overhead_s + bytes / load_bytes_per_s`` (the cost
the engine fits to its copies, both directions, per step; ``EngineStats.load_cost``), at
``kv_bytes_per_token`` bytes per token of a page:

- ``cpu``: SmolLM2-135M in float32 (30 layers x 3 KV heads x 64 x 4 bytes, K and V: 46,080 bytes
  per token); 13.8 GB/s, what ``benchmarks/bench_host_tier.py`` measured for a load-back on this
  machine (benchmarks/README.md, "Host tier"); 50 us per step's copies, an estimate (the Python
  calls around one run of pages).
- ``gpu``: Llama-3.1-8B in bfloat16 (32 layers x 8 KV heads x 128 x 2 bytes, K and V: 128 KiB per
  token); 50 GB/s, a PCIe Gen5 x16 link one way (64 GB/s line rate; ~50 GB/s is what pinned
  host-to-device copies reach on H100, the figure issue 24 takes; not measured by this project,
  which has no GPU); 20 us per step's copies, an estimate of the DMA launches.

How a step's copies meet its forward (``overlap_layers``) is part of each preset, as each
device runs them: ``gpu`` overlaps them layer by layer with the forward over the model's 32
layers (on CUDA the engine copies on its own stream, layer l's forward waiting only for layer
l's copy: docs/host_tier.md); ``cpu`` runs them in series (0: the CPU engine's per-layer copies
are synchronous, so a step costs its copies plus its forward). ``timing_preset("gpu",
overlap_layers=0)`` (``--overlap-layers 0``) prices the gpu preset's copies in series.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

__all__ = [
    "TimingModel",
    "TIMING_PRESETS",
    "DEFAULT_TIMING",
    "load_timing",
    "measured_preset",
    "timing_preset",
]


@dataclass(frozen=True)
class TimingModel:
    step_overhead_s: float
    decode_seq_s: float
    decode_ctx_s: float
    prefill_token_s: float
    prefill_attn_s: float
    max_batch_tokens: int  # prefill tokens + decoding sequences per step (chunked prefill)
    max_running: int  # decoding requests per worker
    # The host tier's copies (0: unknown; a simulated host tier needs all but the overhead).
    kv_bytes_per_token: int = 0
    load_bytes_per_s: float = 0.0
    load_overhead_s: float = 0.0
    # False: demotions cost the step nothing (copied out in the background, as an engine that
    # overlaps its write-back would); the engine today runs them before the forward: True
    charge_demotions: bool = True
    # 0 (or 1): the copies and the forward in series (the CPU engine: copy, then compute).
    # L > 1: the copies run on their own stream overlapped layer by layer with a forward of L
    # layers (the CUDA engine, as HiCache's load-back and write-back): only the first layer's
    # copy waits, and what of the copies outlasts the forward (``with_copies``)
    overlap_layers: int = 0

    def __post_init__(self):
        for name in ("step_overhead_s", "decode_seq_s", "decode_ctx_s", "prefill_attn_s",
                     "kv_bytes_per_token", "load_bytes_per_s", "load_overhead_s",
                     "overlap_layers"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.prefill_token_s <= 0:
            raise ValueError(f"prefill_token_s must be > 0, got {self.prefill_token_s}")
        if self.max_batch_tokens < 1 or self.max_running < 1:
            raise ValueError(
                f"max_batch_tokens and max_running must be >= 1, got "
                f"{self.max_batch_tokens} and {self.max_running}"
            )

    def step_time(
        self, decode_batch: int, decode_ctx: int, prefill_tokens: int, prefill_ctx_sum: int
    ) -> float:
        """Seconds for one step. ``prefill_ctx_sum`` is the sum over prefill tokens of the
        context each attends to (the caller computes it per chunk)."""
        return (
            self.step_overhead_s
            + self.decode_seq_s * decode_batch
            + self.decode_ctx_s * decode_ctx
            + self.prefill_token_s * prefill_tokens
            + self.prefill_attn_s * prefill_ctx_sum
        )

    def copy_time(self, nbytes: int) -> float:
        """Seconds for one step's host-tier copies of ``nbytes`` (0 for none)."""
        if nbytes <= 0:
            return 0.0
        if self.load_bytes_per_s <= 0:
            raise ValueError("a host tier needs load_bytes_per_s > 0 in the timing model")
        return self.load_overhead_s + nbytes / self.load_bytes_per_s

    def with_copies(self, forward_s: float, copy_s: float) -> float:
        """Seconds for a step whose forward takes ``forward_s`` and whose copies (charged ones,
        ``copy_time``) take ``copy_s``: one after the other, or overlapped layer by layer
        (``overlap_layers`` = L): layer l's forward starts when layer l's copy is done, so the
        step is ``max(copy / L + forward, copy + forward / L)`` (the first layer's copy
        exposed, or the last layer's forward)."""
        L = self.overlap_layers
        if not L or copy_s <= 0:
            return forward_s + copy_s
        return max(copy_s / L + forward_s, copy_s + forward_s / L)

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prefill throughput of a full chunk with no decoding: a worker's initial estimate."""
        t = self.step_time(0, 0, self.max_batch_tokens, 0)
        return self.max_batch_tokens / t

    def with_(self, **changes) -> TimingModel:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)


_OPTIONAL = ("kv_bytes_per_token", "load_bytes_per_s", "load_overhead_s", "charge_demotions",
             "overlap_layers")  # fmt: skip


def _read_timing_file(path: Path) -> TimingModel:
    """The TimingModel of a JSON file of its fields (extra keys, as a fit's report, ignored)."""
    if not path.is_file():
        raise ValueError(f"no such timing file: {path}")
    data = json.loads(path.read_text())
    names = [f.name for f in fields(TimingModel)]
    # the host tier's fields have defaults: files written before it still load
    missing = [n for n in names if n not in data and n not in _OPTIONAL]
    if missing:
        raise ValueError(f"{path}: a timing model needs the fields {missing}")
    return TimingModel(**{n: data[n] for n in names if n in data})


_MEASURED = ("step_overhead_s", "decode_seq_s", "decode_ctx_s", "prefill_token_s",
             "prefill_attn_s", "load_bytes_per_s", "load_overhead_s")  # fmt: skip


def measured_preset(base: TimingModel, file: str | Path) -> TimingModel:
    """``base`` with the step coefficients and load-back figures of a fitted timing file (a
    name is looked up in this folder: ``benchmarks/gpu/sim_timing.py``'s file, copied here);
    its batch limits, bytes a token and overlapped layers stay ``base``'s, and the file must
    have been fitted at the same bytes a token (the same model's shapes)."""
    path = Path(file) if Path(file).is_absolute() else Path(__file__).with_name(str(file))
    fit = _read_timing_file(path)
    if fit.kv_bytes_per_token != base.kv_bytes_per_token:
        raise ValueError(
            f"{path.name}: fitted at kv_bytes_per_token={fit.kv_bytes_per_token}, the preset "
            f"models {base.kv_bytes_per_token} (another model's shapes)"
        )
    return base.with_(**{name: getattr(fit, name) for name in _MEASURED})


# The gpu preset as specified (module docstring), not measured
_GPU_SPECIFIED = TimingModel(
    step_overhead_s=0.012,
    decode_seq_s=0.00015,
    decode_ctx_s=2e-8,
    prefill_token_s=1 / 12000,
    prefill_attn_s=2e-10,
    max_batch_tokens=8192,
    max_running=256,
    kv_bytes_per_token=2 * 32 * 8 * 128 * 2,
    load_bytes_per_s=50e9,
    load_overhead_s=2e-5,
    overlap_layers=32,  # Llama-3.1-8B's layers: copies on their own stream, layer by layer
)


# The presets' batch limits are part of what they model, not the engine's defaults: the cpu
# preset's 512 tokens and 32 sequences per step are the measured HF setup above, and every
# simulator figure in benchmarks/README.md was run with them (what `radixray sim` has always
# used). A preset for radixray's own engine is `radixray sim calibrate`'s JSON, which records
# the EngineConfig limits it ran with (1024 and 64 by default).
TIMING_PRESETS: dict[str, TimingModel] = {
    "cpu": TimingModel(
        step_overhead_s=0.0301,
        decode_seq_s=0.01186,
        decode_ctx_s=2e-6,
        prefill_token_s=0.001855,
        prefill_attn_s=1e-8,
        max_batch_tokens=512,
        max_running=32,
        kv_bytes_per_token=2 * 30 * 3 * 64 * 4,
        load_bytes_per_s=13.8e9,
        load_overhead_s=5e-5,
        overlap_layers=0,  # copy, then forward: the CPU engine's copies are synchronous
    ),
    # not measured (module docstring): a GPU kit's fit replaces it here in one line
    "gpu": _GPU_SPECIFIED,
}


DEFAULT_TIMING = "cpu"  # SimConfig's and `radixray sim --timing`'s


def load_timing(spec: str) -> TimingModel:
    """A preset by name, or a JSON file of TimingModel fields (``radixray sim calibrate`` writes
    one fitted to a live engine on this machine; extra keys such as its fit report are kept in
    the file, not in the model)."""
    if spec in TIMING_PRESETS:
        return TIMING_PRESETS[spec]
    if not Path(spec).is_file():
        raise ValueError(
            f"timing must be a preset ({', '.join(sorted(TIMING_PRESETS))}) or a JSON file "
            f"written by `radixray sim calibrate`; no such file: {spec}"
        )
    return _read_timing_file(Path(spec))


def timing_preset(name: str, **overrides) -> TimingModel:
    """A preset by name ("cpu" or "gpu"), with fields overridden."""
    if name not in TIMING_PRESETS:
        raise ValueError(f"timing preset must be one of {sorted(TIMING_PRESETS)}, got {name!r}")
    return replace(TIMING_PRESETS[name], **overrides)
