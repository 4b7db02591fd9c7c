"""``radixray sim calibrate``: fit the simulator's timing model to a live engine on this machine.

The engine logs every step it runs as ``(decode_batch, decode_ctx, prefill_tokens,
prefill_ctx_sum, seconds)`` (``EngineStats.step_log``: its own measurements, the same terms as
``TimingModel.step_time``). This command drives a real engine through a designed set of steps,
takes that log and fits the five coefficients by least squares (none negative), so that the
simulator can stand for the workers a user actually has:

* cold prefills of several lengths (prefill tokens and the attention term over their own
  context), chunked as the engine chunks them;
* a prefill over a long cached prefix (the attention term again, with few new tokens);
* decode batches of several sizes and context lengths (per-sequence and per-context cost).

With a host tier (``--host-pages``; 64 pages unless given, 0: none) it also times the engine's
own copy path (``KVPool.run_copies``) on runs of 1 to 64 pages, both directions, records each
as the engine records a step's copies and takes the engine's own load-back fit
(``EngineStats.load_cost``: overhead + bytes / rate), with the pool's KV bytes per token and
how the copies meet the forward (``overlap_layers``: the model's layers on CUDA, 0 on the CPU).

Each probe runs once to warm up, then is measured (``--quick``, for tests: the fastest of three
runs, the least disturbed on a busy machine). The output is a JSON file of
``TimingModel`` fields plus a fit report; ``radixray sim --timing FILE`` reads it. The GPU kit
(``benchmarks/gpu/sim_timing.py``) runs the same probes and fit at an 8B model's shapes on a
card (``PROBES["gpu"]``, with a deadline past which the probes left are skipped).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from radixray.settings import add_arguments, from_args
from radixray.worker.engine_config import EngineConfig
from radixray.worker.stats import STEP_FIELDS

from .timing import TimingModel

# The engine settings a calibration takes, with EngineConfig's flags and defaults.
_ENGINE_FLAGS = ("model", "max_batch_tokens", "max_running", "cpu_threads", "device", "host_pages")
_PROBE_HOST_PAGES = 64  # the host tier a calibration gives the engine unless told

__all__ = ["PROBES", "ProbeSizes", "fit_timing", "main", "probe_and_fit", "probe_engine",
           "probe_copies", "step_clock", "timing_record"]  # fmt: skip

Sample = tuple[int, int, int, int, float]


class ProbeSizes(NamedTuple):
    """What :func:`probe_engine` runs: cold prefills of ``lengths`` tokens (and 64 new tokens on
    each but the first cached), decode batches of ``batches`` x ``contexts`` for
    ``decode_tokens`` tokens; each probe measured ``runs`` times (the fastest kept)."""

    lengths: tuple[int, ...]
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    decode_tokens: int
    runs: int


PROBES = {
    # still four prefill sizes, so that one disturbed measurement cannot decide the per-token
    # slope; and the fastest of three runs (the least disturbed on a busy machine)
    "quick": ProbeSizes((64, 256, 512, 1024), (1, 4), (64,), 8, 3),
    "full": ProbeSizes((64, 256, 512, 1024, 2048), (1, 4, 8, 16, 32), (64, 512), 16, 1),
    # an 8B model on one GPU (benchmarks/gpu/big_check.py, ~1 minute): prompts to 6k (its
    # context is 8k), decode batches to 32 over 512 and 2k tokens (a step at 8B is ~10 ms: the
    # terms show above its fixed cost only at such sizes); one run each, as a GPU is not shared.
    # Most of the time is the decode probes' prompts: ~260k prefill tokens in all
    "gpu": ProbeSizes((256, 1024, 2048, 4096, 6144), (1, 8, 32), (512, 2048), 16, 1),
}


def fit_timing(
    samples: Sequence[Sample], max_batch_tokens: int, max_running: int
) -> tuple[TimingModel, dict]:
    """Least squares of ``seconds ~ overhead + decode_seq * batch + decode_ctx * ctx +
    prefill_token * tokens + prefill_attn * ctx_sum`` with no coefficient negative (a
    coefficient the data would make negative is dropped and the rest refitted). Returns the
    model and a report (samples, median and p90 relative error of the fit)."""
    import numpy as np

    if len(samples) < 5:
        raise ValueError(f"need at least 5 step samples to fit 5 coefficients, got {len(samples)}")
    a = np.array([[1.0, s[0], s[1], s[2], s[3]] for s in samples])
    y = np.array([s[4] for s in samples])
    # Columns on very different scales (1 vs context sums of 1e6): fit on scaled columns.
    scale = np.maximum(np.abs(a).max(axis=0), 1e-12)
    active = [j for j in range(5) if a[:, j].any()]
    coef = np.zeros(5)
    while True:
        sol, *_ = np.linalg.lstsq(a[:, active] / scale[active], y, rcond=None)
        sol = sol / scale[active]
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    if coef[3] <= 0:
        raise ValueError("the samples do not determine a positive cost per prefill token")
    pred = a @ coef
    rel = np.abs(pred - y) / np.maximum(y, 1e-9)
    model = TimingModel(
        step_overhead_s=float(coef[0]),
        decode_seq_s=float(coef[1]),
        decode_ctx_s=float(coef[2]),
        prefill_token_s=float(coef[3]),
        prefill_attn_s=float(coef[4]),
        max_batch_tokens=max_batch_tokens,
        max_running=max_running,
    )
    report = {
        "samples": len(samples),
        "median_rel_error": float(np.median(rel)),
        "p90_rel_error": float(np.percentile(rel, 90)),
    }
    return model, report


def step_clock(engine) -> str:
    """Which of a logged step's times the fit takes: ``"forward"`` (``EngineStats.step_log``'s
    seconds) on the CPU, where the forward computes as it is called; ``"period"`` (the step's
    whole share of the engine's time) on CUDA, where the forward's clock stops once its kernels
    are queued (the host reads the sampled ids after it: in the serial loop's emit, on a worker
    thread when steps overlap), so only the period holds the device's time."""
    return "period" if engine.device.type == "cuda" else "forward"


def probe_engine(
    engine,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
    sizes: ProbeSizes | None = None,
    deadline: float | None = None,
) -> list[Sample]:
    """Drive ``engine`` (an idle ``radixray.worker.Engine``) through the probes (``sizes``, else
    ``PROBES["quick"]`` or ``["full"]``); return the step samples of each probe's measured runs
    (after a warm-up run), each timed by :func:`step_clock`'s clock. Past ``deadline``
    (``time.monotonic()``) the probes left are skipped: they alternate prefill and decode, so a
    cut list still spans both."""
    from radixray.protocol import SamplingParams

    sizes = sizes or PROBES["quick" if quick else "full"]
    col = STEP_FIELDS.index("seconds" if step_clock(engine) == "forward" else "period_s")
    vocab = engine.model_config.vocab_size
    limit = engine.max_model_len - 32
    rng = random.Random(0)

    def fresh(n: int) -> list[int]:  # token ids no earlier prompt started with: no cache hits
        return [rng.randrange(10, vocab) for _ in range(min(n, limit))]

    one = SamplingParams(max_tokens=1, temperature=0.0)
    decode = SamplingParams(max_tokens=sizes.decode_tokens, temperature=0.0, ignore_eos=True)
    prefills: list[tuple[str, Callable[[], None]]] = []
    for n in sizes.lengths:
        prefills.append((f"prefill {n}", lambda n=n: engine.generate_batch([fresh(n)], one)))
    for n in sizes.lengths[1:]:

        def cached(n=n):
            prefix = fresh(n)
            engine.generate_batch([prefix], one)
            engine.generate_batch([prefix + fresh(64)], one)

        prefills.append((f"64 new on {n} cached", cached))
    decodes = [
        (f"decode {b} x {ctx}", lambda b=b, ctx=ctx: engine.generate_batch(
            [fresh(ctx) for _ in range(b)], decode))
        for b in sizes.batches for ctx in sizes.contexts
    ]  # fmt: skip
    # alternated (the same probes as one list after the other, in another order)
    probes = [p for pair in itertools.zip_longest(prefills, decodes) for p in pair if p]
    samples: list[Sample] = []
    log = engine.meter.step_log
    for i, (name, run) in enumerate(probes):
        if deadline is not None and time.monotonic() > deadline:
            if progress:
                progress(f"out of time: {len(probes) - i} of {len(probes)} probes skipped")
            break
        run()  # warm-up
        best: tuple[float, list[Sample]] | None = None
        for _ in range(sizes.runs):
            log.clear()
            t0 = time.perf_counter()
            run()
            took = time.perf_counter() - t0
            if best is None or took < best[0]:
                best = (took, [(*entry[:4], entry[col]) for entry in log])
        samples.extend(best[1])
        if progress:
            progress(f"{name}: {len(best[1])} steps, {best[0]:.2f} s")
    return samples


def probe_copies(engine, quick: bool = False) -> dict[str, float]:
    """Time the engine's host-tier copies (runs of pages each way, the fastest of a few runs of
    each), record them in its stats as its steps would, and return the timing model's fields
    from its load-back fit; empty without a host tier or a fit."""
    from radixray.cache_index.host_tier import PageCopy

    pool = engine.pool
    if pool.host is None:
        return {}
    most = min(pool.host_pages, pool.allocator.num_pages, 64)
    sizes = sorted({n for n in (1, 4, 16, 64) if n <= most} | {most})
    for n in sizes:
        for to_host in (True, False):
            copies = [PageCopy(to_host, list(range(n)), list(range(n)))]
            best = None
            for _ in range(3 if quick else 5):
                t0 = time.perf_counter()
                moved = pool.run_copies(copies)
                if engine.device.type == "cuda":
                    import torch

                    torch.cuda.synchronize()
                took = time.perf_counter() - t0
                best = took if best is None else min(best, took)
            engine.meter.record_copies(copies, moved, best)
    fit = engine.meter.load_cost.fit()
    if fit is None:
        return {}
    return {
        "kv_bytes_per_token": pool.page_bytes // engine.page_size,
        "load_bytes_per_s": fit[1],
        "load_overhead_s": fit[0],
        # on CUDA the engine's copies run on their own stream, layer by layer with the forward;
        # on the CPU they are synchronous: copies, then forward
        "overlap_layers": engine.model_config.num_layers if engine.device.type == "cuda" else 0,
    }


def timing_record(timing: TimingModel, report: dict, samples: Sequence, **about) -> dict:
    """The JSON that ``radixray sim --timing FILE`` reads: ``timing``'s fields, the fit's report
    with ``about`` (what was measured, where and when) and the step samples it was fitted to."""
    return timing.to_dict() | {"fit": report | about, "samples": [list(s) for s in samples]}


_ROUNDS = 3  # measurements of every probe before a fit that still fails is an error


def probe_and_fit(
    engine,
    sizes: ProbeSizes,
    say: Callable[[str], None],
    deadline: float | None = None,
) -> tuple[list[Sample], TimingModel, dict]:
    """Probe ``engine`` and fit (with its config's batch limits); measure again (up to
    ``_ROUNDS`` in all) when the samples fit no positive cost per prefill token: on a busy
    machine another process's burst can outweigh the slope between prefill sizes, and a later
    round usually sees it. The last round's ValueError stands."""
    limits = engine.config.max_batch_tokens, engine.config.max_running
    for attempt in range(1, _ROUNDS):
        samples = probe_engine(engine, progress=say, sizes=sizes, deadline=deadline)
        try:
            return samples, *fit_timing(samples, *limits)
        except ValueError as e:
            say(f"{e} (a busy machine?): measuring again, round {attempt + 1} of {_ROUNDS}")
    samples = probe_engine(engine, progress=say, sizes=sizes, deadline=deadline)
    return samples, *fit_timing(samples, *limits)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="radixray sim calibrate",
        description="Fit the simulator's timing model to a live engine on this machine.",
    )
    p.add_argument("--out", required=True, help="the JSON file to write")
    add_arguments(p, EngineConfig, only=_ENGINE_FLAGS)
    p.add_argument("--quick", action="store_true", help="fewer, smaller probes (tests)")
    args = p.parse_args(argv)
    from radixray.sysinfo import cpu_model
    from radixray.worker import Engine

    config = from_args(EngineConfig, args, only=_ENGINE_FLAGS, enable_events=False)
    if config.host_pages is None:
        config = dataclasses.replace(config, host_pages=_PROBE_HOST_PAGES)
    engine = Engine(config)
    try:
        say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        sizes = PROBES["quick" if args.quick else "full"]
        samples, model, report = probe_and_fit(engine, sizes, say)
        model = model.with_(**probe_copies(engine, args.quick))
    finally:
        engine.shutdown()
    out = timing_record(
        model,
        report,
        samples,
        model=args.model,
        machine=engine.perf_class,
        cpu=cpu_model(),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        clock=step_clock(engine),
    )
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(
        f"wrote {args.out}: {json.dumps(model.to_dict())}; fit over {report['samples']} steps, "
        f"median error {report['median_rel_error']:.1%}, p90 {report['p90_rel_error']:.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
