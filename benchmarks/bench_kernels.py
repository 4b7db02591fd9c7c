"""Paged-attention kernel benchmark.

    python benchmarks/bench_kernels.py            # GPU part when CUDA exists, else the CPU part
    python benchmarks/bench_kernels.py --cpu      # the CPU part only
    python benchmarks/bench_kernels.py --compile-check 90   # registers/spills for sm_90, no GPU
    python benchmarks/bench_kernels.py --window 512   # CPU decode, sliding window vs full

GPU: decode for batch 1/16/64/256 x context 512/4k/32k, GQA 32/8 heads x 128, bf16, page 16.
Each shape is first checked against the float32 reference (where it fits), then timed with CUDA
events (median of --reps, L2 flushed before each rep). Achieved bandwidth = K/V bytes read / time,
against a device-to-device copy (read + write bytes / time) measured in the same run. The same
shapes go through vLLM's flash-attn fork or flash-attn when it imports. Then few long sequences by
split count, eager and in a CUDA graph replay (``gpu/split_kv.py``).

CPU: the torch reference's time per decode step for the worker's default model (SmolLM2-135M:
30 layers, 9 query / 3 KV heads, head_dim 64, page 16), batch 1/8/16 x context 512/2048, as the
engine calls it: store_kv then extend_attention (one new token per sequence) in every layer.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import radixray.kernels as K  # noqa: E402
from radixray.kernels import flash_attn, reference  # noqa: E402

# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------

GPU_BATCHES = (1, 16, 64, 256)
GPU_CONTEXTS = (512, 4096, 32768)
GPU_HQ, GPU_HKV, GPU_D, GPU_P = 32, 8, 128, 16
_L2_FLUSH_BYTES = 256 << 20  # larger than any GPU's L2 (H200: 50 MB)


def _cuda_time_ms(fn, reps: int, flush: torch.Tensor) -> float:
    """Median time of fn() in ms, CUDA events, L2 flushed before each rep."""
    fn()  # warm up (and compile)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _copy_bandwidth(reps: int, flush: torch.Tensor) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _cuda_time_ms(lambda: dst.copy_(src), reps, flush)
    return 2 * src.numel() / ms / 1e6


def run_gpu(reps: int, check: bool) -> None:
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device=dev)
    copy_gbs = _copy_bandwidth(reps, flush)
    has_fa = flash_attn.available()
    print(f"# {name}, torch {torch.__version__}, copy bandwidth {copy_gbs:.0f} GB/s")
    print(f"# flash-attn: {flash_attn._load().module if has_fa else 'not importable'}")

    # One pool big enough for the largest shape; each shape takes random pages from it.
    max_tokens = max(GPU_BATCHES) * max(GPU_CONTEXTS)
    num_pages = max_tokens // GPU_P + 1
    shape = (num_pages, GPU_P, GPU_HKV, GPU_D)
    k_cache = torch.randn(shape, dtype=torch.bfloat16, device=dev)
    v_cache = torch.randn(shape, dtype=torch.bfloat16, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    scale = GPU_D**-0.5

    rows = []
    shapes = [(b, c) for b in GPU_BATCHES for c in GPU_CONTEXTS]
    for batch, ctx in tqdm(shapes, desc="decode shapes", file=sys.stderr):
        pages_per_seq = ctx // GPU_P
        perm = torch.randperm(num_pages, generator=gen, device=dev)[: batch * pages_per_seq]
        block_table = perm.view(batch, pages_per_seq).to(torch.int32)
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
        q = torch.randn(batch, GPU_HQ, GPU_D, dtype=torch.bfloat16, device=dev)
        args = (q, k_cache, v_cache, block_table, seq_lens, scale)
        err = float("nan")
        if check and batch * ctx <= 1 << 19:
            out = K.paged_decode_attention(*args, backend="triton")
            err = (out.float() - reference.paged_decode_attention(*args).float()).abs().max()
            err = float(err)
            if err > 3e-2:
                raise AssertionError(f"triton decode B={batch} ctx={ctx}: max error {err}")
        kv_bytes = 2 * batch * ctx * GPU_HKV * GPU_D * k_cache.element_size()
        ms = _cuda_time_ms(
            lambda a=args: K.paged_decode_attention(*a, backend="triton"), reps, flush
        )
        fa_ms = float("nan")
        if has_fa:
            fa_ms = _cuda_time_ms(
                lambda a=args: K.paged_decode_attention(*a, backend="flash_attn"), reps, flush
            )
        gbs = kv_bytes / ms / 1e6
        rows.append((batch, ctx, ms, gbs, gbs / copy_gbs, fa_ms, fa_ms / ms, err))

    print(
        "| batch | context | triton ms | GB/s | % of copy | flash-attn ms | fa/triton | max err |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b, c, ms, gbs, frac, fa_ms, ratio, err in rows:
        print(
            f"| {b} | {c} | {ms:.3f} | {gbs:.0f} | {100 * frac:.0f}% | {fa_ms:.3f} | "
            f"{ratio:.2f} | {err:.1e} |"
        )
    print()
    try:  # after the main table: a failure here loses nothing above
        sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
        import split_kv  # the split count eager and in a CUDA graph replay, few long sequences

        split_kv.sweep(k_cache, v_cache, num_pages, gen, scale, reps, flush, copy_gbs)
    except Exception as e:
        print(f"split sweep failed: {type(e).__name__}: {e}")


# ---------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------

SMOL = {"layers": 30, "hq": 9, "hkv": 3, "d": 64, "page": 16}
CPU_BATCHES = (1, 8, 16)
CPU_CONTEXTS = (512, 2048)
# The engine keeps one cache per layer; distinct caches for every one of 30 layers would take
# 1.5 GB at batch 16 x 2048. Cycling through this many keeps the working set (>= 100 MB at the
# large shapes) far beyond any CPU cache, as in the real engine, at a fraction of the memory.
_DISTINCT_LAYER_CACHES = 4


def run_cpu(reps: int) -> None:
    """A decode step of every layer, as the model runs it: the backend object prepares the
    step's plan once, then stores and attends per layer; the "torch" reference beside the "cpu"
    fast path, interleaved per shape."""
    m = SMOL
    P, D = m["page"], m["d"]
    scale = D**-0.5
    print(
        f"# CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch "
        f"threads, torch {torch.__version__}; SmolLM2-135M shapes {m}"
    )
    backends = [K.make_backend(name, "cpu", torch.float32, P, D) for name in ("torch", "cpu")]
    rows = []
    shapes = [(b, c) for b in CPU_BATCHES for c in CPU_CONTEXTS]
    for batch, ctx in tqdm(shapes, desc="cpu shapes", file=sys.stderr):
        case = _cpu_case(batch, ctx)
        ref, fast = _time_steps([(b, case, scale, None) for b in backends], reps)
        rows.append((batch, ctx, ref, fast, ref / fast))

    print("| batch | context | torch (reference) ms / step | cpu ms / step | speed-up |")
    print("|---:|---:|---:|---:|---:|")
    for b, c, ref, fast, ratio in rows:
        print(f"| {b} | {c} | {ref:.1f} | {fast:.1f} | {ratio:.2f}x |")


def _cpu_case(batch: int, ctx: int) -> dict:
    """A decode step's tensors for SmolLM2-135M shapes: every sequence ``ctx`` tokens long."""
    m = SMOL
    P, Hq, Hkv, D = m["page"], m["hq"], m["hkv"], m["d"]
    gen = torch.Generator().manual_seed(batch * ctx)
    pages_per_seq = ctx // P + 1  # room for the new token
    num_pages = batch * pages_per_seq
    caches = [
        (
            torch.randn(num_pages, P, Hkv, D, generator=gen),
            torch.randn(num_pages, P, Hkv, D, generator=gen),
        )
        for _ in range(_DISTINCT_LAYER_CACHES)
    ]
    table = torch.randperm(num_pages, generator=gen).view(batch, pages_per_seq).to(torch.int32)
    pos = ctx - 1
    return {
        "caches": caches,
        "table": table,
        "lens": torch.full((batch,), ctx, dtype=torch.int32),  # context incl. the new token
        "slots": table[:, pos // P].long() * P + pos % P,
        "cu": torch.arange(batch + 1, dtype=torch.int32),
        "q": torch.randn(batch, Hq, D, generator=gen),
        "k": torch.randn(batch, Hkv, D, generator=gen),
    }


def _cpu_step(backend, case: dict, scale: float, window: int | None) -> None:
    """One decode step as the model runs it: one plan, then store and attend in every layer."""
    plan = backend.prepare(case["slots"], case["table"], case["cu"], case["lens"], 1)
    for layer in range(SMOL["layers"]):
        kc, vc = case["caches"][layer % _DISTINCT_LAYER_CACHES]
        backend.store(plan, case["k"], case["k"], kc, vc)
        backend.attend(plan, case["q"], kc, vc, scale, window)


def _time_steps(runs: list[tuple], reps: int) -> list[float]:
    """Median ms per step of each (backend, case, scale, window), interleaved rep by rep."""
    times: list[list[float]] = [[] for _ in runs]
    for run in runs:
        _cpu_step(*run)  # warm up
    for _ in range(reps):
        for i, run in enumerate(runs):
            t0 = time.perf_counter()
            _cpu_step(*run)
            times[i].append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


def run_cpu_window(window: int, reps: int) -> None:
    """A decode step with every layer's attention windowed (``window`` tokens) against full
    attention, on long contexts: the "cpu" path reads only the window's pages, the "torch"
    reference reads the whole context and masks it."""
    m = SMOL
    P, D = m["page"], m["d"]
    print(
        f"# CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch "
        f"threads, torch {torch.__version__}; SmolLM2-135M shapes {m}; window {window}"
    )
    backends = [K.make_backend(name, "cpu", torch.float32, P, D) for name in ("torch", "cpu")]
    print("| batch | context | torch full ms | torch window ms | cpu full ms | cpu window ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch, ctx in ((1, 2048), (1, 8192), (1, 32768), (8, 8192)):
        case = _cpu_case(batch, ctx)
        runs = [(b, case, D**-0.5, w) for b in backends for w in (None, window)]
        t = _time_steps(runs, reps)
        print(f"| {batch} | {ctx} | " + " | ".join(f"{x:.1f}" for x in t) + " |", flush=True)
        del case


# ---------------------------------------------------------------------------------------------
# Offline compile check (no GPU needed)
# ---------------------------------------------------------------------------------------------


def run_compile_check(arch: int) -> None:
    """Compile every kernel configuration the wrappers launch for sm_<arch> with Triton's bundled
    ptxas and report registers and spill bytes (STACK). Launches specialise strides and pointers
    divisible by 16, so the check does too: that is what lets loads vectorise."""
    import os
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixray.kernels import triton_decode, triton_extend, triton_rope_store, triton_store

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    target = GPUTarget("cuda", arch, 32)
    tl_dtype = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}

    def compile_one(fn, types: dict, consts: dict, num_warps: int, **options) -> str:
        signature = {n: types.get(n, "i32") for n in fn.arg_names}
        signature.update(dict.fromkeys(consts, "constexpr"))
        attrs = {
            (i,): [["tt.divisibility", 16]]
            for i, n in enumerate(fn.arg_names)
            if n.endswith("_ptr") or n.startswith("stride")
        }
        constexprs = {(fn.arg_names.index(n),): v for n, v in consts.items()}
        src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
        kernel = triton.compile(src, target=target, options={"num_warps": num_warps, **options})
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run(
            [str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True, text=True
        ).stdout
        os.unlink(f.name)
        line = next((ln for ln in usage.splitlines() if "REG:" in ln), "?")
        return " ".join(w for w in line.split() if w.startswith(("REG:", "STACK:")))

    print(f"| kernel | dtype | head_dim | registers / spill bytes (sm_{arch}) |")
    print("|---|---|---:|---|")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        t = tl_dtype[dtype]
        for D in (64, 80, 96, 128, 256):
            bh, bn, bd, nw = triton_decode._launch_config(D, 4, dtype)
            types = dict.fromkeys(("q_ptr", "k_cache_ptr", "v_cache_ptr"), f"*{t}")
            types |= {"block_table_ptr": "*i32", "seq_lens_ptr": "*i32", "scale_log2": "fp32"}
            types |= {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}
            consts = {"GROUP": 4, "HEAD_DIM": D, "PAGE_SIZE": 16, "UPCAST_DOT": False}
            consts |= {"BLOCK_H": bh, "BLOCK_N": bn, "BLOCK_D": bd}
            res = compile_one(triton_decode._decode_split_kernel, types, consts, nw)
            print(f"| decode | {t} | {D} | {res} |")
            bm, bn, bd, nw = triton_extend._launch_config(D, dtype)
            types = dict.fromkeys(("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"), f"*{t}")
            types |= dict.fromkeys(("block_table_ptr", "cu_seqlens_q_ptr", "seq_lens_ptr"), "*i32")
            types["scale_log2"] = "fp32"
            consts = {"GROUP": 4, "HEAD_DIM": D, "PAGE_SIZE": 16, "UPCAST_DOT": False}
            consts |= {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": bd}
            for sliding in (False, True):
                consts["SLIDING"] = sliding
                res = compile_one(triton_extend._extend_kernel, types, consts, nw)
                print(f"| extend{' (window)' if sliding else ''} | {t} | {D} | {res} |")
        types = dict.fromkeys(("k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr"), f"*{t}")
        types["slot_mapping_ptr"] = "*i64"
        consts = {"NUM_KV_HEADS": 8, "HEAD_DIM": 128, "PAGE_SIZE": 16, "BLOCK_H": 8, "BLOCK_D": 128}
        res = compile_one(triton_store._store_kv_kernel, types, consts, 4)
        print(f"| store_kv | {t} | 128 | {res} |")
        _compile_rope_store(compile_one, triton_rope_store, t)


def _compile_rope_store(compile_one, rs, t: str) -> None:
    """RoPE + KV store at SmolLM2's heads (9/3 x 64), Qwen3-8B's with its qk-norm (32/8 x 128)
    and 64 query heads (two inner head blocks), as the wrapper launches it (no FMA)."""
    types = dict.fromkeys(("qkv_ptr", "q_norm_ptr", "k_norm_ptr", "q_out_ptr"), f"*{t}")
    types |= dict.fromkeys(("k_cache_ptr", "v_cache_ptr"), f"*{t}")
    types |= dict.fromkeys(("positions_ptr", "slot_mapping_ptr"), "*i64")
    types |= {"cos_ptr": "*fp32", "sin_ptr": "*fp32", "eps": "fp32"}
    for Hq, Hkv, D, qk_norm in ((9, 3, 64, False), (32, 8, 128, True), (64, 8, 128, False)):
        block_h, block_half, num_warps = rs.launch_config(max(Hq, Hkv), D)
        consts = {"NUM_Q_HEADS": Hq, "NUM_KV_HEADS": Hkv, "HALF": D // 2, "PAGE_SIZE": 16}
        consts |= {"QK_NORM": qk_norm, "BLOCK_H": block_h, "BLOCK_HALF": block_half}
        res = compile_one(rs._rope_store_kernel, types, consts, num_warps, enable_fp_fusion=False)
        what = f"rope_store {Hq}/{Hkv} heads{' qk-norm' if qk_norm else ''}"
        print(f"| {what} | {t} | {D} | {res} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="run the CPU part only")
    parser.add_argument(
        "--compile-check",
        type=int,
        metavar="SM",
        help="compile every Triton kernel config for sm_SM (e.g. 90) offline; report spills",
    )
    parser.add_argument(
        "--window",
        type=int,
        metavar="W",
        help="the CPU part with a sliding window of W tokens against full attention, long contexts",
    )
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per shape")
    parser.add_argument("--no-check", action="store_true", help="skip the reference checks")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: what a Ray worker with num_cpus=1 gets, as Ray sets "
        "OMP_NUM_THREADS=1; more threads on a shared CPU can be far slower)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: the CPU part, one shape, 1 rep"
    )
    args = parser.parse_args()
    if args.quick:
        global CPU_BATCHES, CPU_CONTEXTS
        CPU_BATCHES, CPU_CONTEXTS = CPU_BATCHES[:1], CPU_CONTEXTS[:1]
        args.cpu, args.reps = True, args.reps or 1
    torch.set_num_threads(args.threads)
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, python {platform.python_version()}")
    if args.compile_check:
        run_compile_check(args.compile_check)
    elif args.window:
        run_cpu_window(args.window, args.reps or 5)
    elif torch.cuda.is_available() and not args.cpu:
        torch.backends.cuda.matmul.allow_tf32 = False
        run_gpu(args.reps or 20, check=not args.no_check)
    else:
        run_cpu(args.reps or 7)


if __name__ == "__main__":
    main()
