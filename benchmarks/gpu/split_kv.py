"""Split-KV decode for few long sequences, timed eagerly and inside a CUDA graph replay (issue 43).

    python benchmarks/gpu/split_kv.py --reps 20    # CUDA: the sweep below
    python benchmarks/gpu/split_kv.py --quick      # anywhere: the counts the rule picks, no timing

``bench_kernels.py``'s GPU part runs :func:`sweep` after its main table (``run.sh``'s
bench_kernels step). One to 16 sequences of 4k-32k tokens (GQA 32 / 8 heads of 128, bf16, page
16) go through the Triton split kernel and its merge with the split count the rule picks
(``triton_decode.choose_num_splits``) and with fixed counts 8-64. Each is timed with CUDA events
(median of ``reps``, L2 flushed before each) around the eager call (two launches from Python)
and around a replay of a CUDA graph that captured the same call, as the engine's decode graphs
do (``worker/cuda_graph.py``): K/V bytes over the time, as a share of a device-to-device copy's
bandwidth measured in the same run. Issue 43's targets, in a replay: one 32k sequence >= 70%,
one 4k sequence >= 40% (the first GPU run, eager, on an H200: 22% and 8%).

In a graph the block table is a static buffer as wide as the engine's ``max_model_len``, and the
rule sees that width, not the lengths (they are only on the device): the row with a 32k-wide
table and a 4k sequence is the engine's case of a 4k context in graphs captured for 32k.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: bench_kernels

from radixray.kernels.triton_decode import (  # noqa: E402
    _PROGRAMS_PER_SM,
    _launch_config,
    num_splits_for,
    paged_decode_attention,
)

HQ, HKV, D, P = 32, 8, 128, 16
# (sequences, context, block table width in tokens)
SHAPES = (
    (1, 4096, 4096),
    (1, 4096, 32768),
    (1, 32768, 32768),
    (2, 32768, 32768),
    (4, 32768, 32768),
    (16, 32768, 32768),
)
COUNTS = (8, 16, 32, 64)
H100_SMS = 132  # H100 SXM and H200 alike


def replay_ms(fn, reps: int, flush: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Median ms of replaying a CUDA graph of ``fn()`` (warmed up on a side stream first, as
    ``DecodeGraphs.capture`` does) and the graph's output."""
    from bench_kernels import _cuda_time_ms

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return _cuda_time_ms(graph.replay, reps, flush), out


def _case(k_cache, num_pages: int, gen, batch: int, ctx: int, width: int):
    dev = k_cache.device
    pages = torch.randperm(num_pages, generator=gen, device=dev)[: batch * (width // P)]
    table = pages.view(batch, -1).to(torch.int32)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(batch, HQ, D, dtype=torch.bfloat16, device=dev)
    return q, table, lens


def _time_shape(k_cache, v_cache, num_pages, gen, scale, reps, flush, shape) -> dict:
    """One shape's times: the chosen count eager and replayed, each fixed count replayed."""
    from bench_kernels import _cuda_time_ms

    batch, ctx, width = shape
    q, table, lens = _case(k_cache, num_pages, gen, batch, ctx, width)
    block_n = _launch_config(D, HQ // HKV, torch.bfloat16)[1]
    sms = torch.cuda.get_device_properties(k_cache.device).multi_processor_count

    def call(n=None):
        return paged_decode_attention(q, k_cache, v_cache, table, lens, scale, num_splits=n)

    eager = _cuda_time_ms(call, reps, flush)
    replayed, out = replay_ms(call, reps, flush)
    if not torch.equal(out, call()):  # the same kernels on the same inputs
        raise AssertionError(f"{batch} x {ctx}: the replay's output differs from eager")
    fixed = {n: replay_ms(partial(call, n), reps, flush)[0] for n in COUNTS}
    return {
        "seqs": batch,
        "context": ctx,
        "width": width,
        "chosen": num_splits_for(batch, HKV, width, block_n, _PROGRAMS_PER_SM * sms),
        "gb": 2 * batch * ctx * HKV * D * k_cache.element_size() / 1e9,
        "eager_ms": eager,
        "replay_ms": replayed,
        "fixed_replay_ms": fixed,
        "best": min(fixed, key=fixed.get),
    }


def sweep(k_cache, v_cache, num_pages, gen, scale, reps, flush, copy_gbs) -> list[dict]:
    """Print the table (and return its rows): per shape, the chosen count eager and replayed,
    each fixed count replayed, and the chosen count's time over the best fixed count's."""
    sms = torch.cuda.get_device_properties(k_cache.device).multi_processor_count
    print(f"\nSplit-KV decode, eager and in a CUDA graph replay ({sms} SMs; ms, % of the copy)")
    print(
        "| seqs | context | table width | chosen | eager, chosen | replay, chosen | "
        + " | ".join(f"replay, {n}" for n in COUNTS)
        + " | best fixed | chosen / best |"
    )
    print("|---:|---:|---:|---:|---:|---:|" + "---:|" * len(COUNTS) + "---:|---:|")
    rows = []
    for shape in SHAPES:
        r = _time_shape(k_cache, v_cache, num_pages, gen, scale, reps, flush, shape)
        rows.append(r)
        ms = [r["eager_ms"], r["replay_ms"], *r["fixed_replay_ms"].values()]
        cells = [f"{t:.3f}, {r['gb'] / t * 1e3 / copy_gbs:.0%}" for t in ms]
        best = r["fixed_replay_ms"][r["best"]]
        print(
            f"| {r['seqs']} | {r['context']} | {r['width']} | {r['chosen']} | "
            + " | ".join(cells)
            + f" | {r['best']} | {r['replay_ms'] / best:.2f} |",
            flush=True,
        )
    return rows


def plan(sms: int = H100_SMS) -> None:
    """The counts the rule picks for the sweep's shapes at ``sms`` SMs (no device needed)."""
    block_n = _launch_config(D, HQ // HKV, torch.bfloat16)[1]
    fill = _PROGRAMS_PER_SM * sms
    print(f"chosen splits at {sms} SMs ({_PROGRAMS_PER_SM} programs an SM, bf16 D={D}, Hkv={HKV})")
    print("| seqs | context | table width | splits | programs | per SM | tokens a split |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for batch, ctx, width in SHAPES:
        n = num_splits_for(batch, HKV, width, block_n, fill)
        split_len = -(-ctx // n)  # as the kernel cuts the context: in whole chunks
        split_len = -(-split_len // block_n) * block_n
        working = -(-ctx // split_len)
        print(
            f"| {batch} | {ctx} | {width} | {n} | {batch * HKV * n} | "
            f"{batch * HKV * working / sms:.1f} | {split_len} |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the rule's counts only (no device)")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if args.quick or not torch.cuda.is_available():
        plan()
        return 0
    from bench_kernels import _L2_FLUSH_BYTES, _copy_bandwidth

    dev = torch.device("cuda")
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device=dev)
    copy_gbs = _copy_bandwidth(args.reps, flush)
    print(f"# {torch.cuda.get_device_name(dev)}: copy {copy_gbs:.0f} GB/s")
    num_pages = max(b * w for b, _, w in SHAPES) // P + 1
    k_cache = torch.randn(num_pages, P, HKV, D, dtype=torch.bfloat16, device=dev)
    v_cache = torch.randn_like(k_cache)
    gen = torch.Generator(device=dev).manual_seed(0)
    sweep(k_cache, v_cache, num_pages, gen, D**-0.5, args.reps, flush, copy_gbs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
