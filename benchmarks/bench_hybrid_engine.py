"""Hybrid decode benchmark: radixray vs HF transformers on random-weight hybrids, float32, CPU.

    python benchmarks/bench_hybrid_engine.py                  # both families, 3 runs, threads 1
    python benchmarks/bench_hybrid_engine.py --family granite_h --runs 5 --threads 2
    python benchmarks/bench_hybrid_engine.py --profile        # radixray's decode step, profiled
    python benchmarks/bench_hybrid_engine.py --quick          # tiny sizes: a smoke test

Issue 45's CPU target: decode tokens/s of a hybrid at batch 8 >= 2x transformers' torch path on
the same weights. No hybrid checkpoint is downloaded: each family's model is built by
transformers from a config of a realistic small size (below, ~150M parameters), its weights
spread (transformers' init leaves the logits near-uniform, so greedy would be decided by
rounding), written with ``save_pretrained`` to a temporary folder and loaded from there by both
sides, each in a child process with the same torch threads.

- ``granite_h``: Granite 4.0-H's layout scaled down: 12 layers, Mamba2 mixers (24 heads of 64,
  state 128, one B/C group) with attention at layers 5 and 11 (NoPE), the shared MLP, no MoE.
- ``lfm2``: LFM2's layout scaled down: 12 layers, gated short convolutions (kernel 3) with
  GQA attention at layers 2, 5, 8 and 10.

Decode is measured as benchmarks/bench_engine.py measures it (its sides' ``decode``: the window
from every request having its first token to the last token, greedy, EOS ignored, the prompts
distinct random ids of --prompt-len tokens). transformers runs ``generate`` with its default cache
(the family's hybrid cache) and with ``cache_implementation="static"``; the peer is the better of
the two at each batch. The sides' order rotates every run; medians over --runs, speed-up as the
median of per-run ratios, greedy agreement as the mean common prefix.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_engine import HF_LABEL, HFSide, RadixSide, _decode_row  # noqa: E402

from radixray.sysinfo import cpu_model  # noqa: E402

COMMON = {
    "vocab_size": 49160,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "eos_token_id": None,
}
# family -> (transformers config class, model class, fields beyond COMMON)
FAMILIES = {
    "granite_h": (
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        {
            "layer_types": (["mamba"] * 5 + ["attention"]) * 2,
            "intermediate_size": 2048,
            "shared_intermediate_size": 2048,
            "num_local_experts": 0,
            "mamba_n_heads": 24,
            "mamba_d_head": 64,
            "mamba_d_state": 128,
            "mamba_n_groups": 1,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_chunk_size": 256,
            "position_embedding_type": "nope",
        },
    ),
    "lfm2": (
        "Lfm2Config",
        "Lfm2ForCausalLM",
        {
            "full_attn_idxs": [2, 5, 8, 10],
            "intermediate_size": 3072,
            "block_auto_adjust_ff_dim": False,
            "conv_L_cache": 3,
        },
    ),
}
# --quick: the same layouts at a toy size
QUICK = {"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4}
QUICK_EXTRA = {
    "granite_h": {
        "layer_types": ["mamba", "mamba", "attention"] * 2,
        "mamba_n_heads": 4,
        "mamba_d_head": 32,
        "mamba_d_state": 16,
    },
    "lfm2": {"full_attn_idxs": [2, 5], "intermediate_size": 128},
}


def build(family: str, path: Path, quick: bool) -> int:
    """Write ``family``'s random model to ``path``; its parameter count."""
    import torch
    import transformers

    config_cls, model_cls, extra = FAMILIES[family]
    fields = COMMON | extra
    if quick:
        fields |= QUICK | QUICK_EXTRA[family]
        fields["num_key_value_heads"] = 2
    config = getattr(transformers, config_cls)(**fields)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # activations O(1), logits spread (std ~3)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            elif p.dim() >= 2:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


class HybridRadix(RadixSide):
    """bench_engine's radixray side on a checkpoint folder, with a state slot per request."""

    def __init__(self, threads: int, path: str, num_pages: int):
        import torch

        from radixray.worker import Engine, EngineConfig
        from radixray.worker.model import load_model

        torch.set_num_threads(threads)
        config = EngineConfig(model=path, num_pages=num_pages, cpu_threads=threads)
        self.loaded = tuple(load_model(path))
        self.engine = lambda: Engine(config, loaded=self.loaded)
        self.greedy = _greedy()
        self.cached_fraction = 0.9

    def profile(self, prompts: list[list[int]], max_tokens: int) -> str:
        """The decode steps' operators under torch's profiler, top 25 by self CPU time."""
        from torch.profiler import ProfilerActivity, profile

        engine = self.engine()
        for p in prompts:
            engine.add_request(p, self.greedy(max_tokens=max_tokens))
        engine.step()  # the prefill, out of the profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            while engine.has_work():
                engine.step()
        return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)


def _greedy():
    from functools import partial

    from radixray.worker import SamplingParams

    return partial(SamplingParams, temperature=0.0, ignore_eos=True)


class HybridHF(HFSide):
    """bench_engine's transformers side on the checkpoint folder."""

    def __init__(self, threads: int, path: str):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


_SIDE: dict = {}  # in a child process: its kind, threads, and the side on the loaded model


def _start(side: str, threads: int) -> None:
    _SIDE.update(kind=side, threads=threads)


def _run(cmd: str, kwargs: dict):
    if cmd == "load":  # one child per side serves every family in turn
        cls = HybridRadix if _SIDE["kind"] == "radixray" else HybridHF
        _SIDE["side"] = cls(threads=_SIDE["threads"], **kwargs)
        return None
    return getattr(_SIDE["side"], cmd)(**kwargs)


class Child:
    """One side in a spawned process of its own; a call's exception is raised here."""

    def __init__(self, side: str, threads: int):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        ctx = mp.get_context("spawn")
        self.pool = ProcessPoolExecutor(1, ctx, initializer=_start, initargs=(side, threads))

    def call(self, cmd: str, **kwargs):
        return self.pool.submit(_run, cmd, kwargs).result()

    def close(self) -> None:
        self.pool.shutdown()


def _args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both sides")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--num-pages", type=int, default=640, help="radixray KV pool, pages of 16")
    ap.add_argument("--profile", action="store_true", help="profile radixray's decode, no HF")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 run, tiny sizes")
    ap.add_argument("--json", default="/tmp/bench_hybrid_engine.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.batches, args.prompt_len, args.max_tokens = 1, [1, 2], 16, 4
    return args


def _measure(args, radix: Child, hf: Child, prompts: dict) -> list[dict]:
    """Every run: decode at each batch, the sides' order rotated by one a run."""
    sides = ["radixray", *HF_LABEL]

    def call(side: str, **kw):
        if side == "radixray":
            return radix.call("decode", **kw)
        return hf.call("decode", cache=side.removeprefix("hf_"), **kw)

    for side in sides:  # warm up: first-call costs out of the runs
        call(side, prompts=prompts[args.batches[0]], max_tokens=2)
    runs = []
    for run in range(args.runs):
        order = sides[run % len(sides) :] + sides[: run % len(sides)]
        kw = {"max_tokens": args.max_tokens}
        runs.append(
            {b: {s: call(s, prompts=prompts[b], **kw) for s in order} for b in args.batches}
        )
        runs[-1]["load"] = os.getloadavg()[0]
    return runs


def _family(args, family: str, folder: Path, radix: Child, hf: Child | None) -> dict:
    """One family: build, load on both sides, measure (or profile); its summary."""
    import torch

    path = folder / family
    params = build(family, path, args.quick)
    g = torch.Generator().manual_seed(1)
    vocab = 512 if args.quick else COMMON["vocab_size"]
    prompts = {
        b: torch.randint(0, vocab, (b, args.prompt_len), generator=g).tolist() for b in args.batches
    }
    radix.call("load", path=str(path), num_pages=args.num_pages)
    if hf is None:  # --profile
        b = max(args.batches)
        print(f"\n{family}: radixray decode at batch {b}, {args.max_tokens} tokens")
        print(radix.call("profile", prompts=prompts[b], max_tokens=args.max_tokens))
        return {"params": params}
    hf.call("load", path=str(path))
    runs = _measure(args, radix, hf, prompts)
    sides = ["radixray", *HF_LABEL]
    decode = {b: _decode_row({s: [r[b][s] for r in runs] for s in sides}) for b in args.batches}
    loads = [r["load"] for r in runs]
    return {"params": params, "decode": decode, "load_avg_1min": loads}


def _print(family: str, summary: dict) -> None:
    print(f"\n{family}: {summary['params'] / 1e6:.0f}M parameters, load {summary['load_avg_1min']}")
    cols = ["batch", "radixray tok/s", *(f"{HF_LABEL[s]} tok/s" for s in HF_LABEL)]
    cols += ["radixray ms/step", "peer", "speed-up vs peer", "greedy agreement"]
    print("| " + " | ".join(cols) + " |\n|" + "---:|" * len(cols))
    for b, row in summary["decode"].items():
        p = row["peer"]
        cells = [b, f"{row['radixray']['tok_s']:.1f}"]
        cells += [f"{row[s]['tok_s']:.1f}" for s in HF_LABEL]
        cells += [f"{row['radixray']['ms_step']:.0f}", HF_LABEL[p]]
        cells += [f"**{row[p]['speedup']:.2f}x**", f"{row[p]['agreement']:.2f}"]
        print("| " + " | ".join(map(str, cells)) + " |")


def main(argv: list[str] | None = None) -> dict:
    args = _args(argv)
    import torch

    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs; torch {torch.__version__}; ", end="")
    print(f"threads {args.threads}; load average at start {os.getloadavg()}")
    t0 = time.time()
    out = {"args": vars(args), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0))}
    radix = Child("radixray", args.threads)
    hf = None if args.profile else Child("transformers", args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.family:
            out[family] = _family(args, family, Path(tmp), radix, hf)
            if hf:
                _print(family, out[family])
    for child in (radix, hf):
        if child:
            child.close()
    out["wall_s"] = time.time() - t0
    if not args.profile:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {args.json}; wall {out['wall_s']:.0f} s")
    return out


if __name__ == "__main__":
    main()
