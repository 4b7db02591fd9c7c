"""The engine at the sizes people serve, against the card's own limits (issue 43's GPU kit).

    python benchmarks/gpu/big_check.py --json out.json            # CUDA: 8B and 0.6B shapes
    python benchmarks/gpu/big_check.py --quick --json out.json    # CPU, tiny model: a dry run

Random bf16 weights made on the device (``random_hf_state_dict(device=...)``: an 8B model in
seconds, nothing to carry), no tokenizer: prompts are token ids. Everything is measured in the
one run, on one card:

- **limits**: a device-to-device copy's bandwidth (bytes read and written over the time) and a
  bf16 matmul's rate (8192^3), the medians of 5.
- **decode** at Llama-3.1-8B's shapes (vocab 128,256, hidden 4,096, MLP 14,336, 32 layers,
  32 / 8 heads, head 128): ms a step at batch 1 / 8 / 64 x context 1k / 4k. The requests share
  the context's prompt (computed once, cached) and each reads all of it every step, so the
  bytes a step are the weights plus every request's KV; ``roofline`` is those bytes over the
  time as a share of the copy's bandwidth (issue 43: >= 70% at 1 x 1k and 64 x 1k, >= 75% at
  64 x 4k).
- **prefill** at 8B shapes: tokens/s of 1 x 4k and 8 x 1k cold prompts, and their FLOPs (2 x
  the non-embedding parameters a token, plus causal attention) as a share of the matmul rate
  (issue 43: >= 50% for 1 x 4k).
- **ttft**: a 4k prompt cold, and with 90% of it cached.
- **hf**: HF transformers on the same card and weights, decoding with a static cache at batch 1
  and 8 x 1k, beside radixray's figure (the peer of the same run; eager, no target).
- **sim_timing**: the simulator's ``TimingModel`` fitted at the 8B shapes as ``radixray sim
  calibrate`` fits it (``sim_timing.py``, ~75 s at most), written beside ``--json`` as
  ``timing_<card>_<date>_<shapes>.json`` (``radixray sim --timing FILE`` reads it).
- **offline** at Qwen3-0.6B's shapes: nano-vllm's ``bench.py`` workload (256 sequences of random
  ids, input and output lengths uniform in 100-1,024, temperature 0.6, EOS ignored): output
  tokens/s (issue 43: >= 13,000 on an H100).

Each engine runs at its defaults for the device (CUDA graphs and overlapped steps on CUDA).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixray.model_meta import ModelConfig, tiny_config  # noqa: E402
from radixray.worker import Engine, EngineConfig, SamplingParams  # noqa: E402
from radixray.worker.model.linear import pack_linears  # noqa: E402
from radixray.worker.model.llama import LlamaModel  # noqa: E402
from radixray.worker.model.loader import random_hf_state_dict  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sim_timing  # noqa: E402

LLAMA_8B = ModelConfig(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rope_theta=500000.0,
    max_position_embeddings=8192,
    name="llama-3.1-8b-shapes",
)
QWEN3_06B = ModelConfig(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_layers=28,
    num_heads=16,
    num_kv_heads=8,
    head_dim=128,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
    qk_norm=True,
    architecture="qwen3",
    name="qwen3-0.6b-shapes",
)
PAGE = 16


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, reps: int = 5) -> float:
    """Median seconds of ``fn()`` (one warm-up first)."""
    fn()
    each = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        each.append(time.perf_counter() - t0)
    return statistics.median(each)


def limits(device: str, quick: bool) -> dict:
    n = (1 << 20) if quick else (1 << 29)  # bf16 elements: 2 MB / 1 GiB
    src = torch.empty(n, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src), device)
    m = 256 if quick else 8192
    a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    mm_s = timed(lambda: a @ b, device)
    return {
        "copy_gb_s": 2 * n * 2 / copy_s / 1e9,  # read + written
        "matmul_tflops": 2 * m**3 / mm_s / 1e12,
        "copy_bytes": 2 * n,
        "matmul_n": m,
    }


def load(mcfg: ModelConfig, device: str, dtype: torch.dtype = torch.bfloat16):
    """(model, config, None) with random bf16 weights made on ``device``."""
    model = LlamaModel(mcfg, device=torch.device(device), dtype=dtype)
    model.load_hf_state_dict(random_hf_state_dict(mcfg, 0, device, dtype))
    pack_linears(model)
    return model.eval(), mcfg, None


def engine(loaded, device: str, **kw) -> Engine:
    cfg = {"device": device, "dtype": "bfloat16", "page_size": PAGE, "host_pages": 0, "seed": 0}
    return Engine(EngineConfig(model=loaded[1].name, **(cfg | kw)), loaded=loaded)


def weight_bytes(model) -> int:
    """Bytes a decode step reads of the weights: all but the embedding table (one row a token
    is read; a tied head reads all of it, and then it is counted)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    total += sum(b.numel() * b.element_size() for n, b in model.named_buffers() if "rope" not in n)
    if not model.config.tie_word_embeddings:
        emb = model.embed_tokens.weight
        total -= emb.numel() * emb.element_size()
    return total


def kv_bytes_per_token(mcfg: ModelConfig) -> int:
    return mcfg.num_layers * 2 * mcfg.num_kv_heads * mcfg.head_dim * 2  # K and V, bf16


def ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, min(vocab, 10000)) for _ in range(n)]


def decode_row(loaded, device: str, batch: int, ctx: int, steps: int, lim: dict) -> dict:
    """ms a decode step of ``batch`` requests reading ``ctx`` tokens each (a shared prompt)."""
    mcfg = loaded[1]
    rng = random.Random(batch * 100003 + ctx)
    shared = ids(rng, ctx - 1, mcfg.vocab_size)
    pages = -(-(ctx + steps + 8) // PAGE) * (batch + 1) + 64
    e = engine(loaded, device, num_pages=pages, max_running=batch, max_batch_tokens=8192)
    params = SamplingParams(max_tokens=steps + 4, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        e.add_request(shared + [3 + i], params)
    times, reading = [], []
    try:
        while e.has_work():
            running = e.scheduler.running
            decoding = len(running) == batch and all(r.num_output > 0 for r in running)
            ctx_now = sum(r.num_computed for r in running)
            t0 = time.perf_counter()
            e.step()
            if decoding:
                times.append(time.perf_counter() - t0)
                reading.append(ctx_now)
    finally:
        e.shutdown()
    times, reading = times[2:-2] or times, reading[2:-2] or reading
    step_s = statistics.median(times)
    bytes_step = weight_bytes(loaded[0]) + statistics.median(reading) * kv_bytes_per_token(mcfg)
    return {
        "batch": batch,
        "context": ctx,
        "ms_per_step": 1000 * step_s,
        "tokens_per_s": batch / step_s,
        "bytes_per_step": bytes_step,
        "roofline": bytes_step / step_s / 1e9 / lim["copy_gb_s"],
        "steps": len(times),
    }


def prefill_flops(mcfg: ModelConfig, model, n: int, length: int) -> float:
    params = sum(p.numel() for p in model.parameters()) - model.embed_tokens.weight.numel()
    if mcfg.tie_word_embeddings:
        params += model.embed_tokens.weight.numel()
    attention = 2 * mcfg.num_layers * mcfg.num_heads * mcfg.head_dim * length * length
    return n * (2 * params * length + attention)


def prefill_row(loaded, device: str, n: int, length: int, lim: dict) -> dict:
    mcfg = loaded[1]
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    rng = random.Random(n * 7 + length)
    e = engine(
        loaded,
        device,
        num_pages=n * (length // PAGE + 2) + 64,
        max_running=n,
        max_batch_tokens=max(8192, length),
    )
    try:
        e.generate_batch([ids(rng, length, mcfg.vocab_size) for _ in range(n)], params)  # warm
        each = []
        for _ in range(3):
            prompts = [ids(rng, length, mcfg.vocab_size) for _ in range(n)]
            sync(device)
            t0 = time.perf_counter()
            e.generate_batch(prompts, params)
            sync(device)
            each.append(time.perf_counter() - t0)
    finally:
        e.shutdown()
    s = statistics.median(each)
    flops = prefill_flops(mcfg, loaded[0], n, length)
    return {
        "prompts": n,
        "length": length,
        "tokens_per_s": n * length / s,
        "seconds": s,
        "matmul_share": flops / s / 1e12 / lim["matmul_tflops"],
    }


def ttft(loaded, device: str, length: int, cached: float) -> dict:
    """Seconds to the first token of a ``length``-token prompt with ``cached`` of it cached."""
    mcfg = loaded[1]
    rng = random.Random(length)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    e = engine(loaded, device, num_pages=8 * (length // PAGE + 2), max_batch_tokens=8192)
    out = {}
    try:
        e.generate_batch([ids(rng, length, mcfg.vocab_size)], params)  # warm-up
        for name, frac in (("cold", 0.0), ("cached", cached)):
            keep = int(length * frac)
            prefix = ids(rng, keep, mcfg.vocab_size)
            if keep:
                e.generate_batch([prefix + ids(rng, 1, mcfg.vocab_size)], params)
            prompt = prefix + ids(rng, length - keep, mcfg.vocab_size)
            sync(device)
            t0 = time.perf_counter()
            got = e.generate_batch([prompt], params)[0]
            out[name] = {"seconds": time.perf_counter() - t0, "cached_tokens": got.cached_tokens}
    finally:
        e.shutdown()
    return {"length": length, **out}


def offline(loaded, device: str, quick: bool) -> dict:
    """nano-vllm's bench.py workload (seed 0): output tokens/s."""
    mcfg = loaded[1]
    n, lo, hi = (8, 10, 40) if quick else (256, 100, 1024)
    rng = random.Random(0)
    prompts = [ids(rng, rng.randint(lo, hi), mcfg.vocab_size) for _ in range(n)]
    params = [
        SamplingParams(max_tokens=rng.randint(lo, hi), temperature=0.6, ignore_eos=True)
        for _ in range(n)
    ]
    kv = (1 << 26) if quick else 40 * (1 << 30)
    e = engine(loaded, device, kv_memory_bytes=kv, max_running=n, max_batch_tokens=16384)
    try:
        e.generate_batch(prompts[:2], params[:2])  # warm-up
        sync(device)
        t0 = time.perf_counter()
        outs = e.generate_batch(prompts, params)
        sync(device)
        s = time.perf_counter() - t0
    finally:
        e.shutdown()
    tokens = sum(o.completion_tokens for o in outs)
    return {"sequences": n, "output_tokens": tokens, "seconds": s, "tokens_per_s": tokens / s}


def hf_decode(mcfg: ModelConfig, device: str, batch: int, ctx: int, new: int) -> dict:
    """HF transformers on the same card and the same weights (``random_hf_state_dict``'s, made
    again from the seed), decoding with a static cache (``cache_implementation="static"``,
    eager): ms a step, from a full generate less a prefill-only one, medians of 3."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_cfg = LlamaConfig(
        vocab_size=mcfg.vocab_size,
        hidden_size=mcfg.hidden_size,
        intermediate_size=mcfg.intermediate_size,
        num_hidden_layers=mcfg.num_layers,
        num_attention_heads=mcfg.num_heads,
        num_key_value_heads=mcfg.num_kv_heads,
        head_dim=mcfg.head_dim,
        rope_theta=mcfg.rope_theta,
        rms_norm_eps=mcfg.rms_norm_eps,
        max_position_embeddings=mcfg.max_position_embeddings,
        tie_word_embeddings=mcfg.tie_word_embeddings,
    )
    with torch.device(device):
        try:
            hf = LlamaForCausalLM._from_config(hf_cfg, dtype=torch.bfloat16).eval()
        except TypeError:  # transformers before 4.56 names it torch_dtype
            hf = LlamaForCausalLM._from_config(hf_cfg, torch_dtype=torch.bfloat16).eval()
    state = random_hf_state_dict(mcfg, 0, device, torch.bfloat16)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    del state
    rng = random.Random(batch)
    x = torch.tensor([ids(rng, ctx, mcfg.vocab_size) for _ in range(batch)], device=device)
    kw = {"do_sample": False, "cache_implementation": "static", "pad_token_id": 0}

    def gen(model, n: int):
        with torch.inference_mode():
            model.generate(x, max_new_tokens=n, min_new_tokens=n, **kw)

    full = timed(lambda: gen(hf, new), device, 3)
    step_s = (full - timed(lambda: gen(hf, 1), device, 3)) / (new - 1)
    return {
        "batch": batch,
        "context": ctx,
        "ms_per_step": 1000 * step_s,
        "tokens_per_s": batch / step_s,
    }


def save(path: Path | None, out: dict) -> None:
    """The results so far into ``path`` (after each section: a run cut short by its time limit
    still leaves what it measured)."""
    if path:
        path.write_text(json.dumps(out, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CPU, tiny model, small sizes")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--steps", type=int, default=24, help="decode steps measured a row")
    ap.add_argument("--timing-dir", type=Path, help="the timing JSON's folder (--json's)")
    args = ap.parse_args()
    args.timing_dir = args.timing_dir or (args.json.parent if args.json else None)
    device = "cpu" if args.quick else "cuda"
    big = tiny_config() if args.quick else LLAMA_8B
    small = tiny_config(tie_word_embeddings=True) if args.quick else QWEN3_06B
    batches, contexts = ([1, 4], [64, 256]) if args.quick else ([1, 8, 64], [1024, 4096])
    out: dict = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"}
    out["limits"] = lim = limits(device, args.quick)
    print(
        f"# {out['device']}: copy {lim['copy_gb_s']:.0f} GB/s, "
        f"bf16 matmul {lim['matmul_tflops']:.1f} TFLOP/s",
        flush=True,
    )
    loaded = load(big, device)
    print(f"\n{big.name}: decode", flush=True)
    print(
        "| batch | context | ms/step | tokens/s | GB a step | roofline |\n|---|---|---|---|---|---|"
    )
    out["decode"] = []
    for ctx in contexts:
        for b in batches:
            r = decode_row(loaded, device, b, ctx, args.steps, lim)
            out["decode"].append(r)
            print(
                f"| {b} | {ctx} | {r['ms_per_step']:.2f} | {r['tokens_per_s']:.0f} | "
                f"{r['bytes_per_step'] / 1e9:.2f} | {r['roofline']:.0%} |",
                flush=True,
            )
    save(args.json, out)
    print(
        f"\n{big.name}: prefill\n| prompts | length | tokens/s | matmul share |\n|---|---|---|---|"
    )
    out["prefill"] = []
    for n, length in ((1, contexts[-1]), (8, contexts[0])):
        r = prefill_row(loaded, device, n, length, lim)
        out["prefill"].append(r)
        print(f"| {n} | {length} | {r['tokens_per_s']:.0f} | {r['matmul_share']:.0%} |", flush=True)
    out["ttft"] = t = ttft(loaded, device, contexts[-1], 0.9)
    save(args.json, out)
    print(
        f"\nTTFT of a {t['length']}-token prompt: cold {t['cold']['seconds'] * 1000:.1f} ms, "
        f"90% cached {t['cached']['seconds'] * 1000:.1f} ms "
        f"({t['cached']['cached_tokens']} tokens cached)",
        flush=True,
    )
    print(f"\n{big.name}: the simulator's timing model", flush=True)
    try:  # the fit's failure is recorded; the rest still runs
        # the dry run's tiny model in float32 (sim_timing.QUICK_PROBES says why)
        fitted = load(big, device, torch.float32) if args.quick else loaded
        t = sim_timing.fit_and_write(fitted, device, args.quick, args.timing_dir or Path.cwd())
        out["sim_timing"] = t
        print(sim_timing.report(t), flush=True)
    except Exception as e:
        out["sim_timing"] = {"error": f"{type(e).__name__}: {e}"}
        print(f"sim timing failed: {out['sim_timing']['error']}", flush=True)
    save(args.json, out)
    del loaded
    if device == "cuda":
        torch.cuda.empty_cache()
    print(
        "\nHF transformers, static cache, same weights\n| batch | context | ms/step | "
        "tokens/s | radixray ms/step |\n|---|---|---|---|---|",
        flush=True,
    )
    out["hf"] = []
    for b in batches[:2]:
        try:
            r = hf_decode(big, device, b, contexts[0], args.steps)
        except Exception as e:  # the peer's failure is recorded; the rest still runs
            out["hf"].append({"batch": b, "error": f"{type(e).__name__}: {e}"})
            print(f"| {b} | {contexts[0]} | failed: {type(e).__name__}: {e} | | |", flush=True)
            continue
        ours = next(d for d in out["decode"] if d["batch"] == b and d["context"] == contexts[0])
        r["radixray_ms_per_step"] = ours["ms_per_step"]
        out["hf"].append(r)
        print(
            f"| {b} | {contexts[0]} | {r['ms_per_step']:.2f} | {r['tokens_per_s']:.0f} | "
            f"{ours['ms_per_step']:.2f} |",
            flush=True,
        )
        if device == "cuda":
            torch.cuda.empty_cache()
    save(args.json, out)
    out["offline"] = o = offline(load(small, device), device, args.quick)
    print(
        f"\n{small.name}: nano-vllm's offline workload: {o['output_tokens']} tokens in "
        f"{o['seconds']:.1f} s, {o['tokens_per_s']:.0f} tokens/s",
        flush=True,
    )
    if args.json:
        save(args.json, out)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
