"""The simulator's timing model fitted on this card at an 8B model's shapes (issue 43).

    python benchmarks/gpu/sim_timing.py --out DIR            # CUDA: Llama-3.1-8B's shapes
    python benchmarks/gpu/sim_timing.py --quick --out DIR    # CPU, tiny model: a dry run

``radixray sim calibrate`` fits the simulator's step time (``TimingModel``) to a live engine on
the CPU; this runs the same probes and fit (``radixray.sim.calibrate``: ``probe_and_fit`` with
``PROBES["gpu"]``, then ``probe_copies`` for the host tier's load-back) on an engine at
Llama-3.1-8B's shapes with random bf16 weights made on the device, time-boxed (``--budget``,
75 s by default: the probes left at the deadline are skipped). ``big_check.py`` calls
:func:`fit_and_write` on the 8B model it has loaded, so ``run.sh big`` leaves the file in $OUT.

The file, ``timing_<card>_<date>_<shapes>.json``, is what ``radixray sim --timing FILE`` reads:
the ``TimingModel`` fields, then ``fit`` (the fit's errors, the card, the date, the shapes, the
probes) and the step samples. The ``gpu`` preset in ``radixray/sim/timing.py`` takes its five
step coefficients and the load-back figures from such a file (that module's docstring says how).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixray.sim.calibrate import (  # noqa: E402
    PROBES,
    ProbeSizes,
    probe_and_fit,
    probe_copies,
    step_clock,
    timing_record,
)
from radixray.sim.timing import load_timing  # noqa: E402
from radixray.worker import Engine, EngineConfig  # noqa: E402

# The dry run's probes: the tiny model on the CPU in float32, a few seconds. Its per-token cost
# is a few microseconds, so it shows only beside the decode probes' batched prompts (16 x 64
# tokens: many tokens, little context). One round's fit found a positive per-token cost in 12
# of 12 tries on a busy 2-core machine (in bf16, where the CPU's attention outweighs it, 6 of
# 12; in float32 without batch 16, 10 of 12); probe_and_fit measures again up to 3 rounds
QUICK_PROBES = ProbeSizes((64, 256, 512, 1024), (1, 4, 16), (64,), 4, 2)
HOST_PAGES = 64  # the host tier the copies are timed on (as `radixray sim calibrate`'s)


def card_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"


def file_name(card: str, date: str, shapes: str) -> str:
    """``timing_<card>_<date>_<shapes>.json`` in letters, digits, ``.``, ``_`` and ``-`` only
    (the device tool leaves out files with other characters)."""
    clean = lambda s: re.sub(r"[^A-Za-z0-9.-]+", "-", s).strip("-")  # noqa: E731
    return f"timing_{clean(card)}_{clean(date)}_{clean(shapes)}.json"


def fit_and_write(loaded, device: str, quick: bool, out_dir: Path, budget_s: float = 75) -> dict:
    """Probe an engine on ``loaded`` (model, config, tokenizer), fit, write the file into
    ``out_dir``; return the file, the fitted ``timing`` and the file's ``fit`` entries."""
    t0 = time.monotonic()
    mcfg = loaded[1]
    gpu = device.startswith("cuda")
    sizes = QUICK_PROBES if quick else PROBES["gpu"]
    # the probes' largest batch and chunk; pages for the decode probes' 32 x (2048 + 16)
    # tokens and the cached prefixes beside them (128 KiB a token at 8B: 12 GiB)
    dtype = str(next(loaded[0].parameters()).dtype).removeprefix("torch.")
    config = EngineConfig(
        model=mcfg.name,
        device=device,
        dtype=dtype,
        page_size=16,
        num_pages=6000 if gpu else 512,
        host_pages=HOST_PAGES,
        max_batch_tokens=8192 if gpu else 1024,
        max_running=max(sizes.batches),
        seed=0,
        enable_events=False,
    )
    engine = Engine(config, loaded=loaded)
    say = lambda m: print(f"  {m}", flush=True)  # noqa: E731
    try:
        samples, model, report = probe_and_fit(engine, sizes, say, t0 + budget_s)
        model = model.with_(**probe_copies(engine, quick))
    finally:
        engine.shutdown()
    card, date = card_name(device), time.strftime("%Y-%m-%d", time.gmtime())
    shapes = mcfg.name
    record = timing_record(
        model,
        report,
        samples,
        model=shapes,
        device=card,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        config={k: getattr(mcfg, k) for k in ("num_layers", "hidden_size", "num_kv_heads")},
        dtype=dtype,
        clock=step_clock(engine),  # on CUDA each step's period: see step_clock
        probes=sizes._asdict(),
        seconds=round(time.monotonic() - t0, 1),
    )
    path = out_dir / file_name(card, date, shapes)
    path.write_text(json.dumps(record, indent=1) + "\n")
    load_timing(str(path))  # what `radixray sim --timing` does with it: fails here if unreadable
    return {"file": str(path), "timing": model.to_dict(), **record["fit"]}


def report(r: dict) -> str:
    m = r["timing"]
    return (
        f"simulator timing fitted on {r['device']} at {r['model']}'s shapes "
        f"({r['samples']} steps, median error {r['median_rel_error']:.1%}, p90 "
        f"{r['p90_rel_error']:.1%}, {r['seconds']:.0f} s): overhead "
        f"{1e3 * m['step_overhead_s']:.2f} ms, decode {1e6 * m['decode_seq_s']:.1f} us a "
        f"sequence + {1e9 * m['decode_ctx_s']:.2f} ns a context token, prefill "
        f"{1e6 * m['prefill_token_s']:.1f} us a token ({1 / m['prefill_token_s']:.0f}/s) + "
        f"{1e12 * m['prefill_attn_s']:.2f} ps a token x context; load-back "
        f"{m['load_bytes_per_s'] / 1e9:.1f} GB/s. `radixray sim --timing {r['file']}` reads it"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CPU, tiny model, few probes")
    ap.add_argument("--out", type=Path, required=True, help="the folder for the JSON file")
    ap.add_argument("--budget", type=float, default=75, help="seconds for the probes")
    args = ap.parse_args()
    from big_check import LLAMA_8B, load  # here, not above: big_check imports this module

    from radixray.model_meta import tiny_config

    device = "cpu" if args.quick else "cuda"
    loaded = load(tiny_config(), device, torch.float32) if args.quick else load(LLAMA_8B, device)
    r = fit_and_write(loaded, device, args.quick, args.out, args.budget)
    print(report(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
