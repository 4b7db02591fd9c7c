"""The recurrent-state kernels' decode path on CUDA: Triton (radixray/kernels/triton_state.py)
against the plain-PyTorch reference's plan, at Granite-4.0-H's shapes, batch 1/8/64.

    python benchmarks/gpu/state_kernels.py                    # on CUDA: check, then time
    python benchmarks/gpu/state_kernels.py --compile-check 90 # registers/spills for sm_90, no GPU
    python benchmarks/gpu/state_kernels.py --quick            # sm_90 compile check, then a
                                                              # short GPU run (no CUDA: CPU ref)

One Mamba2 layer's decode step: the conv update (8448 channels = 128 heads x 64 + 2 x 128,
kernel 4; bf16 activations and conv state) and the SSD update (128 heads x 64 head dim x 128
state, ssm state float32), each sequence at a random slot of a 96-slot pool. The reference
runs as state_layers did before the Triton dispatch: gather the slots' states
(``index_select``), update them (state_reference), scatter them back (``index_copy_``).
Each shape is checked first (outputs within bf16's rounding, states within float32's), then
timed with CUDA events: median of --reps, L2 flushed before each rep (Granite-4.0-H-Small's 36
Mamba2 layers never find their states in L2). GB/s: the SSM state read and written, over time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: bench_kernels

from bench_kernels import _L2_FLUSH_BYTES, _cuda_time_ms  # noqa: E402

from radixray.kernels.state_reference import causal_conv1d_update, ssd_update  # noqa: E402

H, P, N, G, K = 128, 64, 128, 1, 4  # Granite-4.0-H's Mamba2 layer
CHANNELS = H * P + 2 * G * N
SLOTS = 96
BATCHES = (1, 8, 64)


def _inputs(batch: int, device: str, heads: int = H, gen_seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(gen_seed + batch)
    C = heads * P + 2 * G * N
    bf = torch.bfloat16

    def r(*shape, dtype=bf):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    slots = torch.randperm(SLOTS, generator=g)[:batch].to(device)
    return {
        "u": r(batch, C),
        "w": r(C, K),
        "bias": r(C),
        "conv": r(SLOTS, C, K - 1),
        "x": r(batch, heads, P),
        "dt": torch.nn.functional.softplus(r(batch, heads, dtype=torch.float32)),
        "A": -torch.rand(heads, generator=g).add(0.5).to(device),
        "B": r(batch, G, N) * 0.3,
        "C": r(batch, G, N) * 0.3,
        "D": r(heads, dtype=torch.float32),
        "ssm": r(SLOTS, heads, P, N, dtype=torch.float32),
        "rows": torch.arange(batch, device=device),
        "slots": slots,
    }


def ref_conv(t: dict) -> torch.Tensor:
    state = t["conv"].index_select(0, t["slots"])
    out = causal_conv1d_update(t["u"], t["w"], t["bias"], state, True)
    t["conv"].index_copy_(0, t["slots"], state)
    return out


def ref_ssd(t: dict) -> torch.Tensor:
    state = t["ssm"].index_select(0, t["slots"])
    y = ssd_update(state, t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"])
    t["ssm"].index_copy_(0, t["slots"], state)
    return y


def _triton_fns():
    from radixray.kernels import triton_state

    def conv(t: dict) -> torch.Tensor:
        out = torch.empty_like(t["u"])
        args = (t["conv"], out, t["rows"], t["slots"], len(t["rows"]), 1, True)
        triton_state._launch_conv(t["u"], t["w"], t["bias"], True, *args)
        return out

    def ssd(t: dict) -> torch.Tensor:
        y = torch.empty_like(t["x"])
        args = (t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"], t["rows"], t["slots"], y)
        triton_state.ssd_decode(t["ssm"], *args)
        return y

    return conv, ssd


def _check(name: str, ref, fast, t: dict, pool: str) -> None:
    """One call of each on copies of the same inputs: outputs and pools agree."""
    a = {k: v.clone() for k, v in t.items()}
    b = {k: v.clone() for k, v in t.items()}
    want, got = ref(a), fast(b)
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(b[pool], a[pool], atol=1e-5, rtol=1e-5)
    print(f"check {name} batch {len(t['rows'])}: ok")


def run_gpu(reps: int) -> None:
    conv, ssd = _triton_fns()
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    print(torch.cuda.get_device_name(), "| Granite-4.0-H Mamba2 layer, decode update")
    rows = []
    for batch in BATCHES:
        t = _inputs(batch, "cuda")
        _check("conv", ref_conv, conv, t, "conv")
        _check("ssd", ref_ssd, ssd, t, "ssm")
        for name, ref, fast in (("conv", ref_conv, conv), ("ssd", ref_ssd, ssd)):
            r, f = (1000 * _cuda_time_ms(partial(fn, t), reps, flush) for fn in (ref, fast))
            gbs = 2 * batch * H * P * N * 4 / (f * 1e-6) / 1e9 if name == "ssd" else None
            rows.append((batch, name, r, f, gbs))
    print("\n| batch | update | reference µs | triton µs | speed-up | triton GB/s (SSM state) |")
    print("|---:|---|---:|---:|---:|---:|")
    for batch, name, r, f, gbs in rows:
        g = f"{gbs:.0f}" if gbs else "-"
        print(f"| {batch} | {name} | {r:.1f} | {f:.1f} | {r / f:.1f}x | {g} |")


def run_compile_check(arch: int) -> None:
    """Compile every configuration the wrappers launch for sm_<arch> (Triton's bundled ptxas):
    a kernel that lowers only in the interpreter fails here, without a GPU."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixray.kernels import triton_state as ts

    def compile_one(fn, types: dict, consts: dict) -> None:
        signature = {n: types.get(n, "i32") for n in fn.arg_names}
        signature.update(dict.fromkeys(consts, "constexpr"))
        constexprs = {(fn.arg_names.index(n),): v for n, v in consts.items()}
        src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4})
        assert kernel.asm["cubin"], fn

    for dt in ("bf16", "fp32"):
        types = dict.fromkeys(("u_ptr", "w_ptr", "bias_ptr", "out_ptr", "state_ptr"), f"*{dt}")
        for decode in (True, False):
            types |= {"seq_ptr": "*i64" if decode else "*i32", "slot_ptr": "*i64"}
            consts = {"K": K, "HAS_BIAS": True, "SILU": True, "DECODE": decode, "BLOCK_S": 4}
            consts |= {"BLOCK_T": 2 if decode else ts._CONV_BLOCK_T, "BLOCK_C": 128}
            compile_one(ts._conv_kernel, types, consts)
            print(f"compiled conv ({dt}, {'decode' if decode else 'prefill'}) for sm_{arch}")
        consts |= {"K": 3, "HAS_BIAS": False, "SILU": False, "BLOCK_S": 2}  # LFM2's
        compile_one(ts._conv_kernel, types, consts)
        print(f"compiled conv ({dt}, prefill, LFM2's: K 3, no bias or SiLU) for sm_{arch}")
        types = dict.fromkeys(("x_ptr", "b_ptr", "c_ptr", "y_ptr"), f"*{dt}")
        types |= dict.fromkeys(("state_ptr", "dt_ptr", "a_ptr", "d_ptr"), "*fp32")
        types |= {"rows_ptr": "*i64", "slots_ptr": "*i64"}
        consts = {"HEADS_PER_GROUP": H // G, "HAS_D": True, "BLOCK_P": 16, "BLOCK_N": N}
        compile_one(ts._ssd_decode_kernel, types, consts)
        print(f"compiled ssd_decode ({dt}) for sm_{arch}")


def run_cpu_reference(reps: int) -> None:
    """Without CUDA: the reference's decode update on the CPU at 8 heads (a smoke run)."""
    import time

    print("| batch | update | reference µs (CPU, 8 heads) |\n|---:|---|---:|")
    for batch in (1, 8):
        t = _inputs(batch, "cpu", heads=8)
        for name, fn in (("conv", ref_conv), ("ssd", ref_ssd)):
            fn(t)  # warm up
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn(t)
                times.append((time.perf_counter() - t0) * 1e6)
            print(f"| {batch} | {name} | {statistics.median(times):.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--compile-check", type=int, metavar="ARCH", help="e.g. 90 for sm_90")
    ap.add_argument("--quick", action="store_true", help="sm_90 compile, then 5 reps")
    args = ap.parse_args()
    if args.compile_check or args.quick:
        run_compile_check(args.compile_check or 90)
    if args.compile_check:
        return
    if torch.cuda.is_available():
        run_gpu(5 if args.quick else args.reps)
    elif args.quick:
        run_cpu_reference(3)
    else:
        raise SystemExit("needs CUDA (--quick or --compile-check run without it)")


if __name__ == "__main__":
    main()
