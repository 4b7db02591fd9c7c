"""Where an engine step's time goes on a GPU: Python (cProfile) and CUDA (torch.profiler).

    python benchmarks/gpu/profile_step.py --out DIR            # CUDA, SmolLM2's shapes, bf16
    python benchmarks/gpu/profile_step.py --quick --out DIR    # CPU, tiny model: a dry run

The engine of engine_check.py (SmolLM2-135M's architecture, random weights), decode at
--batch: one warm-up run, then the same decode run under cProfile (``cprofile.txt``: the top
functions by own time and by cumulative time) and under torch.profiler (``torch_ops.txt``:
operators by self CPU time, kernels by device time, and the count of each runtime call, the
synchronising ones among them). ``split.txt`` times a decode step's parts with a device sync
around each: the runner's inputs and forward, sampling, the rest (scheduler, bookkeeping).
``kernels.txt`` counts an eager decode step's device kernels by name, a step and a layer, with
every fusion on (worker/fused.py) and again on PyTorch's path; the summary lines give both
counts a layer and both eager steps' wall time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_check import engine, greedy, load, model_config, prompts  # noqa: E402


def decode(e, ps, max_tokens: int) -> int:
    for p in ps:
        e.add_request(p, greedy(max_tokens))
    steps = 0
    while e.has_work():
        e.step()
        steps += 1
    return steps


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def split_step(e, device: str, ps, max_tokens: int) -> str:
    """Wall time of the runner's forward and the sampler inside each step, a sync at each
    boundary (the syncs themselves add a little)."""
    spent = {"forward": 0.0, "sample": 0.0}

    def timed(fn, key: str):
        def wrapper(*a, **kw):
            sync(device)
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            sync(device)
            spent[key] += time.perf_counter() - t0
            return out

        return wrapper

    e.runner.run = timed(e.runner.run, "forward")
    e.sampler.sample = timed(e.sampler.sample, "sample")
    sync(device)
    t0 = time.perf_counter()
    steps = decode(e, ps, max_tokens)
    sync(device)
    total = time.perf_counter() - t0
    rest = total - spent["forward"] - spent["sample"]
    lines = [f"steps {steps}, ms per step: total {1000 * total / steps:.2f}"]
    for k, v in (*spent.items(), ("rest", rest)):
        lines.append(f"  {k}: {1000 * v / steps:.2f} ms/step ({100 * v / total:.0f}%)")
    return "\n".join(lines) + "\n"


def torch_profile(e, device: str, ps, max_tokens: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        steps = decode(e, ps, max_tokens)
        sync(device)
    ka = prof.key_averages()
    out = [f"# {steps} steps\n## by self CPU time"]
    out.append(ka.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60))
    if device.startswith("cuda"):
        out.append("## by device time")
        out.append(
            ka.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=60)
        )
    out.append("## runtime calls per step (cuda*, aten::item, aten::_local_scalar_dense, to/copy)")
    for ev in sorted(ka, key=lambda ev: -ev.count):
        name = ev.key
        if name.startswith(
            ("cuda", "aten::item", "aten::_local_scalar", "aten::to", "aten::copy_")
        ):
            out.append(f"{ev.count / steps:10.1f}  {name}")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CPU, tiny model")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    device = args.device or ("cpu" if args.quick else "cuda")
    dtype = "float32" if device == "cpu" else args.dtype
    args.out.mkdir(parents=True, exist_ok=True)
    mcfg = model_config(args.quick)
    loaded = load(mcfg, device, dtype)
    pages = args.batch * (-(-(args.prompt_len + args.max_tokens) // 16) + 1) + 16
    kw = {"num_pages": pages, "max_running": args.batch, "max_batch_tokens": 4096}
    kw["overlap"] = "off"  # the serial loop: its parts are timed one after another, synced

    def fresh(seed: int):
        return engine(loaded, device, dtype, **kw), prompts(mcfg, args.batch, args.prompt_len, seed)

    e, ps = fresh(0)
    decode(e, ps, args.max_tokens)  # warm-up: kernels compile, the allocator grows
    e, ps = fresh(1)
    text = split_step(e, device, ps, args.max_tokens)
    (args.out / "split.txt").write_text(text)
    print(text, flush=True)

    e, ps = fresh(2)
    pr = cProfile.Profile()
    pr.enable()
    decode(e, ps, args.max_tokens)
    sync(device)
    pr.disable()
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf)
    st.sort_stats("tottime").print_stats(45)
    st.sort_stats("cumulative").print_stats(45)
    (args.out / "cprofile.txt").write_text(buf.getvalue())
    print(buf.getvalue()[:6000], flush=True)

    e, ps = fresh(3)
    text = torch_profile(e, device, ps, args.max_tokens)
    (args.out / "torch_ops.txt").write_text(text)
    print(text[-5000:], flush=True)

    kw["cuda_graph_max_batch"] = 0  # eager: every kernel launched on its own, counted
    e, ps = fresh(4)
    fused = count_kernels(e, device, ps, args.max_tokens, mcfg.num_layers)
    fusions = (
        f"fused: norms {e.runner.fused_norms or 'on'}, activation {e.runner.fused_act or 'on'}, "
        f"rope+store {e.runner.fused_rope or 'on'}"
    )
    e, ps = fresh(5)
    unfuse(e)
    unfused = count_kernels(e, device, ps, args.max_tokens, mcfg.num_layers)
    text = f"{fused}\n# PyTorch's path (every fusion off)\n{unfused}"
    (args.out / "kernels.txt").write_text(text)
    print(text, flush=True)
    ms = [eager_ms(fresh, device, args.max_tokens, on) for on in (True, False)]
    print(f"summary: {fused.splitlines()[0]}; {fusions}")
    print(f"summary: PyTorch's path: {unfused.splitlines()[0]}")
    print(f"summary: eager ms/step fused {ms[0]:.2f}, PyTorch's path {ms[1]:.2f}")
    return 0


def eager_ms(fresh, device: str, max_tokens: int, fused: bool) -> float:
    """Wall ms a step of an eager decode run (a first run warms up), fused or PyTorch's path."""
    for seed in (6, 7):
        e, ps = fresh(seed)
        if not fused:
            unfuse(e)
        sync(device)
        t0 = time.perf_counter()
        steps = decode(e, ps, max_tokens)
        sync(device)
    return 1000 * (time.perf_counter() - t0) / steps


def unfuse(e) -> None:
    """Every fused kernel off in ``e``'s model (worker/fused.py): PyTorch's path."""
    for m in e.runner.model.modules():
        for name in ("fused", "fused_add", "fused_act", "fused_rope"):
            if getattr(m, name, None) is not None:
                setattr(m, name, None)


def count_kernels(e, device: str, ps, max_tokens: int, layers: int) -> str:
    """Device kernels per eager decode step, and per layer (issue 43: <= 12 a layer)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        steps = decode(e, ps, max_tokens)
        sync(device)
    by_name: dict[str, int] = {}
    for ev in prof.key_averages():
        if ev.device_type == DeviceType.CUDA:
            by_name[ev.key] = by_name.get(ev.key, 0) + ev.count
    steps = max(steps, 1)
    per_step = sum(by_name.values()) / steps
    # a kernel launched at least once a layer belongs to the layers (the step's own, embedding,
    # final norm, LM head, sampling and copies, run fewer times than there are layers)
    in_layers = {k: n / steps / layers for k, n in by_name.items() if n / steps >= layers}
    lines = [
        f"eager decode, {steps} steps: {per_step:.1f} device kernels a step, "
        f"{per_step / layers:.1f} a layer on average ({layers} layers); "
        f"per layer {sum(in_layers.values()):.1f} (tests/worker/test_fused_norms.py: <= 10)"
    ]
    lines += ["## a step's kernels by name: per step, per layer"]
    for name, n in sorted(by_name.items(), key=lambda kv: -kv[1]):
        lines.append(f"{n / steps:8.1f} {n / steps / layers:6.2f}  {name[:100]}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
